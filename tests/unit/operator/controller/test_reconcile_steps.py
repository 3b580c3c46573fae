"""Multi-step rollouts walked end to end through reconcile and the real gate (fake Kube with its pod simulation,
fake sidecars): every step starts its own canary pods and its own analysis clock, an early TooFewSamples in a later
step is just a look too soon, and a regression that only shows in a later step is rolled back there. Pods are named
`<svc>-<revision>-<n>`: a pod is the canary's by its revision (status.rollout.revision)."""

from __future__ import annotations

from vlm_testing.fakekube import T0, SidecarCluster
from vlm_testing.steps import CHANGE, STEPS, canary_revision, finish, is_canary, start, walk


def test_three_steps_each_with_its_own_pods_and_clock_end_promoted():
    """Step 3's canary pods see no traffic for their first 3 minutes (windows without samples, left out): the
    earlier steps' canary pods carry the evidence meanwhile, and with maxDuration 5m per step that is no
    timeout, though the rollout as a whole has run well past 5 minutes by then (it became
    RolledBack/MaxDurationReached when maxDuration counted from the rollout's start)."""
    spec = {**STEPS, "rollout": {**STEPS["rollout"], "analysis": {**STEPS["rollout"]["analysis"],
                                                                  "maxDuration": "5m"}}}
    quiet: dict[str, float] = {}  # when step 3's canary pods see no traffic (window ends, unix seconds)
    before_look: list[dict] = []  # the rollout's status before the gate's first look

    def on_look(t: float, r: dict) -> None:
        if r.get("beforeAt") and not r.get("analyses") and not before_look:
            before_look.append(r)
        if r.get("step") == 2 and r["phase"] == "Analysing" and not quiet:  # step 3's pods just became Ready
            quiet.update({"from": t - 15, "until": t + 195})

    def traffic(pod: str, k: int) -> dict:
        return {"samples": 0} if is_canary(c, pod) and quiet and quiet["from"] <= k * 15.0 <= quiet["until"] else {}

    c = SidecarCluster(spec, gpus=16, extra=traffic)
    c.run(T0)
    old_rev = c.status["stableRevision"]
    looks = walk(c, start(c), on_look=on_look)
    assert looks[-1]["phase"] == "Promoted", looks
    # Steps in order, each with its own canary size, and each step's analysis started when its pods were Ready;
    # after the last step the remaining stable pods are replaced (Promoting), still looked at.
    by_step: dict[int, list[dict]] = {}
    for look in looks[:-1]:
        if look["phase"] != "Promoting":
            by_step.setdefault(look["step"], []).append(look)
    promoting = [x for x in looks if x["phase"] == "Promoting"]
    assert promoting and looks.index(promoting[0]) > looks.index(by_step[2][-1]), looks
    assert min(x["ready"] for x in looks) >= 3, "Ready replicas never below replicas - maxUnavailable"
    assert sorted(by_step) == [0, 1, 2], looks
    assert [{x["canary"] for x in by_step[s]} for s in (0, 1, 2)] == [{1}, {2}, {3}], looks
    starts = [next(x["started"] for x in by_step[s] if x["started"]) for s in (0, 1, 2)]
    assert starts == sorted(set(starts)), f"each step restarts the clock: {starts}"
    # Until a step's pods are Ready its clock is not running, and the status does not show the last step's.
    assert all(x["started"] is None for x in looks if x["phase"] == "Progressing"), looks
    # Step 1's first look comes before one pod has minSamples windows; step 3's looks in its quiet minutes have
    # too few windows with traffic: Inconclusive, never a timeout.
    assert any(x["reason"] == "TooFewSamples" for x in by_step[0]), by_step[0]
    # Step 3's own pods are quiet, but the evidence of the earlier steps' canary pods (still running) keeps
    # counting: no look of step 3 is held for want of traffic.
    early = [x for x in by_step[2] if x["phase"] == "Analysing"]
    assert early and not any(x["reason"] in ("TooFewSamples", "NoTraffic") for x in early), "\n".join(
        str((x["t"], x["step"], x["phase"], x["reason"], x["canary"], x["ready"], x["started"])) for x in looks)
    assert looks[-1]["t"] > 5 * 60 + 240, "the rollout as a whole ran past one maxDuration"
    # Promoted: the new revision is stable, its Deployment (the canary's, never restarted) runs every replica;
    # the old revision's Deployment and the fresh baseline are gone.
    new_rev = canary_revision(c)
    assert new_rev != old_rev and c.status["stableRevision"] == new_rev
    canary_pods = {p.name for p in c.kube.pods("svc") if p.revision == new_rev and p.ready}
    finish(c, T0 + 10 + looks[-1]["t"])
    deps = c.kube.deployments("ns", "svc")
    assert set(deps) == {new_rev} and deps[new_rev]["spec"]["replicas"] == 4
    pods = c.kube.pods("svc")
    assert len(pods) == 4 and canary_pods <= {p.name for p in pods}
    assert {p.labelled_role for p in pods} == {"stable"}
    reasons = [e[1] for e in c.events]
    assert reasons.count("CanaryStarted") == 1 and reasons.count("CanaryPromoted") == 1, reasons
    assert "CanaryRolledBack" not in reasons
    # The gate's record of the rollout: the stable pods' pre-period read once at its start (before any pod was
    # replaced), the margin it could resolve, evidence pooled from the first step, and what it learned about
    # the pods kept in status.calibration for the next rollout.
    r = c.status["rollout"]
    assert {b["pod"] for b in r["before"]} >= {p["replaced"] for p in r["pairs"] if p.get("replaced")}, r["before"]
    assert all(b["loopSeconds"] > 0 and b["windows"] > 0 for b in r["before"]) and r["beforeAt"]
    assert r["resolvableMargin"]["loopLatency"] > 0 and r["evidenceSince"] <= starts[0]
    # The harm ceiling the first step is held to, shown before the gate's first look (no fixed one: the default
    # at one canary pod's spread, never below the margin), then each look's own for every gated signal.
    margin = 3.0  # maxRegression.loopLatency's default (percent); STEPS leaves it
    assert before_look and before_look[0]["expandCeiling"]["loopLatency"] >= margin, before_look
    assert set(r["expandCeiling"]) >= {"loopLatency"} and r["expandCeiling"]["loopLatency"] >= margin, r
    cal = c.status["calibration"]
    assert cal["rollouts"] == 1 and cal["podDf"] > 0 and cal["podSpread"] >= 0, cal


def test_a_regression_that_shows_only_in_step_two_is_rolled_back_there():
    """One canary pod of two is slow (a node it lands on, a load it only meets at more replicas): step 1 passes
    on the fast pod, step 2 sees the revision-wide mean grow and rolls back, naming step 2."""
    two = {**STEPS, "rollout": {**STEPS["rollout"], "steps": STEPS["rollout"]["steps"][:2]}}
    first: list[str] = []  # the canary pod of step 1

    def loop(pod: str) -> float:
        if not is_canary(c, pod):
            return 0.020
        if not first:
            first.append(pod)
        return 0.020 if pod == first[0] else 0.032

    c = SidecarCluster(two, gpus=16, loop=loop)
    c.run(T0)
    old_rev = c.status["stableRevision"]
    looks = walk(c, start(c))
    last = looks[-1]
    assert (last["phase"], last["step"]) == ("RolledBack", 1), looks
    assert any(x["step"] == 1 and x["phase"] == "Analysing" for x in looks), looks
    r = c.status["rollout"]
    assert r["reason"] in ("LoopLatencyRegressed", "LoopP95Regressed", "StageTimeRegressed"), r
    assert c.status["stableRevision"] == old_rev and c.status.get("canaryRevision") is None
    # The canary's pods are replaced by stable ones; its Deployment and the fresh baseline go.
    finish(c, T0 + 10 + looks[-1]["t"])
    deps = c.kube.deployments("ns", "svc")
    assert set(deps) == {old_rev} and deps[old_rev]["spec"]["replicas"] == 4
    assert {p.revision for p in c.kube.pods("svc")} == {old_rev} and len(c.kube.pods("svc")) == 4
    assert first and first[0] not in {p.name for p in c.kube.pods("svc")}
    reasons = [e[1] for e in c.events]
    assert reasons.count("CanaryRolledBack") == 1 and "CanaryPromoted" not in reasons, reasons


def test_an_autoscaler_moving_replicas_mid_rollout_moves_the_stable_revision_and_the_rollout_ends():
    """spec.autoscaling (docs/autoscaling.md, "Rollouts"): the HPA KEDA makes writes spec.replicas through the scale
    subresource while a step is analysed. The canary keeps its step's pods (the steps are planned for minReplicas,
    never for the moving count), the stable revision takes the change, no rollout waits for a replica that was
    scaled away, and promotion moves every replica of the count at that time."""
    auto = {**STEPS, "autoscaling": {"minReplicas": 2, "maxReplicas": 8},
            "rollout": {**STEPS["rollout"], "steps": [{"replicas": 1, "analysis": "2m"}, {"replicas": 2,
                                                                                          "analysis": "2m"}]}}
    c = SidecarCluster(auto, gpus=16)
    t = start(c, auto)
    spec = {**auto, **CHANGE}
    scaled: dict[int, int] = {}  # step -> the replica count the autoscaler set during it
    looks = []
    for _ in range(60):
        t += 60
        c.run(t)
        r = c.status["rollout"]
        deps = c.kube.deployments("ns", "svc")
        canary = deps.get(r["revision"])
        stable = deps.get(c.status["stableRevision"])
        looks.append((r.get("step"), r["phase"], canary["spec"]["replicas"] if canary else None,
                      stable["spec"]["replicas"] if stable else None, c.kube.vlmservice("svc")["spec"]["replicas"]))
        if r["phase"] in ("Promoted", "RolledBack", "Aborted"):
            break
        if r["phase"] == "Analysing" and r.get("step") not in scaled:  # the HPA scales once per step: up, then down
            n = 6 if r.get("step") == 0 else 3
            spec = {**spec, "replicas": n}
            c.kube.update_spec("svc", spec)
            scaled[r["step"]] = n
        c.kube.settle("svc")
    assert looks[-1][1] == "Promoted", looks
    assert scaled == {0: 6, 1: 3}, looks
    for step, phase, can, stab, _want in looks:
        if phase == "Analysing" and stab is not None and can is not None:
            assert can == step + 1, looks  # the canary keeps its step's pods
    # After each scale event the stable revision followed the new count (less the canary's pods).
    assert any(x[0] == 0 and x[4] == 6 and x[3] == 5 for x in looks), looks
    assert any(x[0] == 1 and x[4] == 3 and x[3] == 1 for x in looks), looks
    finish(c, t)
    deps = c.kube.deployments("ns", "svc")
    assert next(iter(deps.values()))["spec"]["replicas"] == 3 and len(c.kube.pods("svc")) == 3
