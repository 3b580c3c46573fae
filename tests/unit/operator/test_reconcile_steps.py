"""Multi-step rollouts walked end to end through reconcile and the real gate (fake Kube, fake sidecars): every
step starts its own canary pods and its own analysis clock, an early TooFewSamples in a later step is just a
look too soon, and a regression that only shows in a later step is rolled back there."""

from __future__ import annotations

from vlm_operator import builders

from .test_reconcile import SPEC
from .test_reconcile_profiler import T0, Cluster

STEPS = {
    **SPEC,
    "replicas": 4,
    "rollout": {"baseline": "Fresh",
                "steps": [{"replicas": 1, "analysis": "2m"}, {"replicas": 2, "analysis": "2m"},
                          {"replicas": 3, "analysis": "2m"}],
                "analysis": {"interval": "1m", "maxDuration": "10m", "minSamples": 5}},
}
CHANGE = {"sglang": {"env": [{"name": "HARMLESS", "value": "1"}]}}


def walk(c: Cluster, start: float, limit: int = 60, on_look=None) -> list[dict]:
    """A reconcile every minute, the cluster settling after each (new pods Ready), until a verdict: each
    look's (step, phase, reason, canary replicas, analysisStartedAt)."""
    looks = []
    t = start
    for _ in range(limit):
        t += 60
        c.run(t)
        r = c.status["rollout"]
        if on_look:
            on_look(t, r)
        canary = c.kube.deployments().get(builders.ROLE_CANARY)
        looks.append({"t": t - start, "step": r.get("step"), "phase": r["phase"], "reason": r.get("reason"),
                      "canary": canary["spec"]["replicas"] if canary else None,
                      "started": r.get("analysisStartedAt")})
        if r["phase"] in ("Promoted", "RolledBack", "Aborted"):
            return looks
        c.kube.settle("svc")
    raise AssertionError(f"no verdict after {limit} looks: {looks[-5:]}")


def start(c: Cluster) -> float:
    c.run(T0)
    c.kube.settle("svc")
    c.run(T0 + 1)
    c.kube.update_spec("svc", {**STEPS, **CHANGE})
    c.run(T0 + 10)
    return T0 + 10


def test_three_steps_each_with_its_own_pods_and_clock_end_promoted():
    """Step 3's canary pods see no traffic for their first 3 minutes (windows without samples, left out): its
    early looks are Inconclusive, and with maxDuration 5m per step that is no timeout, though the rollout
    as a whole has run well past 5 minutes by then (it became RolledBack/MaxDurationReached when maxDuration
    counted from the rollout's start)."""
    spec = {**STEPS, "rollout": {**STEPS["rollout"], "analysis": {**STEPS["rollout"]["analysis"],
                                                                  "maxDuration": "5m"}}}
    quiet: dict[str, float] = {}  # when step 3's canary pods see no traffic (window ends, unix seconds)

    def on_look(t: float, r: dict) -> None:
        if r.get("step") == 2 and not quiet:
            quiet.update({"from": t - 15, "until": t + 195})

    def traffic(pod: str, k: int) -> dict:
        return {"samples": 0} if "canary" in pod and quiet and quiet["from"] <= k * 15.0 <= quiet["until"] else {}

    c = Cluster(spec, gpus=16, extra=traffic)
    c.run(T0)
    old_rev = c.status["stableRevision"]
    looks = walk(c, start(c), on_look=on_look)
    assert looks[-1]["phase"] == "Promoted", looks
    # Steps in order, each with its own canary size, and each step's analysis started when its pods were Ready.
    by_step: dict[int, list[dict]] = {}
    for look in looks[:-1]:
        by_step.setdefault(look["step"], []).append(look)
    assert sorted(by_step) == [0, 1, 2], looks
    assert [{x["canary"] for x in by_step[s]} for s in (0, 1, 2)] == [{1}, {2}, {3}], looks
    starts = [next(x["started"] for x in by_step[s] if x["started"]) for s in (0, 1, 2)]
    assert starts == sorted(set(starts)), f"each step restarts the clock: {starts}"
    # Until a step's pods are Ready its clock is not running, and the status does not show the last step's.
    assert all(x["started"] is None for x in looks if x["phase"] == "Progressing"), looks
    # Step 1's first look comes before one pod has minSamples windows; step 3's looks in its quiet minutes have
    # too few windows with traffic: Inconclusive, never a timeout.
    assert any(x["reason"] == "TooFewSamples" for x in by_step[0]), by_step[0]
    early = [x for x in by_step[2] if x["phase"] == "Analysing" and x["reason"] in ("TooFewSamples", "NoTraffic")]
    assert len(early) >= 2, by_step[2]
    assert looks[-1]["t"] > 5 * 60 + 240, "the rollout as a whole ran past one maxDuration"
    # Promoted: the stable Deployment runs the new revision, the canary and the fresh baseline are gone.
    deps = c.kube.deployments()
    assert set(deps) == {builders.ROLE_STABLE}
    new_rev = deps[builders.ROLE_STABLE]["metadata"]["labels"][builders.LABEL_REVISION]
    assert new_rev != old_rev and c.status["stableRevision"] == new_rev
    assert deps[builders.ROLE_STABLE]["spec"]["replicas"] == 4
    reasons = [e[1] for e in c.events]
    assert reasons.count("CanaryStarted") == 1 and reasons.count("CanaryPromoted") == 1, reasons
    assert "CanaryRolledBack" not in reasons


def test_a_regression_that_shows_only_in_step_two_is_rolled_back_there():
    """One canary pod of two is slow (a node it lands on, a load it only meets at more replicas): step 1 passes
    on the fast pod, step 2 sees the revision-wide mean grow and rolls back, naming step 2."""
    two = {**STEPS, "rollout": {**STEPS["rollout"], "steps": STEPS["rollout"]["steps"][:2]}}
    c = Cluster(two, gpus=16, loop=lambda pod: 0.032 if pod == "svc-canary-1" else 0.020)
    c.run(T0)
    old_rev = c.status["stableRevision"]
    looks = walk(c, start(c))
    last = looks[-1]
    assert (last["phase"], last["step"]) == ("RolledBack", 1), looks
    assert any(x["step"] == 1 and x["phase"] == "Analysing" for x in looks), looks
    r = c.status["rollout"]
    assert r["reason"] in ("LoopLatencyRegressed", "LoopP95Regressed", "StageTimeRegressed"), r
    deps = c.kube.deployments()
    assert set(deps) == {builders.ROLE_STABLE}
    assert deps[builders.ROLE_STABLE]["metadata"]["labels"][builders.LABEL_REVISION] == old_rev
    reasons = [e[1] for e in c.events]
    assert reasons.count("CanaryRolledBack") == 1 and "CanaryPromoted" not in reasons, reasons
