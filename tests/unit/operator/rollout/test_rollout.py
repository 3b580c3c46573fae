"""The rollout state machine (pure), walked over a small fake cluster: every plan is applied as the reconcile
applies it (pods marked, released and labelled, revision Deployments scaled or deleted) and the cluster settles
(FakeKube: ReplicaSets, scheduler, kubelets) before the next round."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vlm_operator.analysis import handoff as analysis
from vlm_operator.api import units
from vlm_operator.cluster.observed import BASELINE_KEY, Observed
from vlm_operator.desired import builders
from vlm_operator.rollout import steps as rollout
from vlm_testing.rollout_world import (
    CHANGE,
    OWNER,
    T0,
    TIGHT,
    World,
    decision,
    desired,
    fail_signal,
    spec,
    stored,
)


def canary_world(new_spec=None, *, nodes=None, old=None) -> tuple[World, str, str]:
    w = World(old or spec(), nodes=nodes or dict(TIGHT))
    old_rev = w.deploy()
    return w, old_rev, w.change(new_spec or spec(**CHANGE))


def analysing(w: World, now: float = T0) -> float:
    """The canary walked to Analysing (its step's pods placed and Ready)."""
    return w.until(now, lambda w: w.rollout.phase == "Analysing")


# -- first deploy, updates without a rollout block -----------------------------------------------------------


def test_first_deploy_creates_one_deployment_of_the_revision():
    s = spec()
    d = desired(s)
    p = rollout.plan(OWNER, s, d, Observed(), None, stable=None, now=T0)
    assert p.stable_revision == d.revision and p.canary_revision is None and p.rollout is None
    deps, base = builders.revision_deployments(OWNER, d, {}, p.replicas, p.baseline)
    dep = deps[d.revision]
    assert list(deps) == [d.revision] and base is None and dep["metadata"]["name"] == f"svc-{d.revision}"
    assert dep["spec"]["replicas"] == 3 and dep["spec"]["template"]["spec"]["schedulingGates"]
    # Its pods start gated, are released where the scheduler likes and labelled stable on the pod itself.
    w = World(s)
    w.step(T0)
    assert all(p.gated for p in w.serving()) and len(w.serving()) == 3
    second = w.step(T0 + 1)
    assert all(n is None for _, n in second.releases)
    assert len(second.releases) == 3 and {r for _, r in second.labels} == {"stable"}
    assert all(p.ready and p.name.startswith(f"svc-{d.revision}-") for p in w.serving())


def test_without_rollout_block_a_change_replaces_pods_node_by_node():
    old = spec(rollout=None)
    w = World(old)
    old_rev = w.deploy()
    old_nodes = sorted(p.node for p in w.serving())
    old_template = w.kube.deployments("ns", "svc")[old_rev]["spec"]["template"]
    new_rev = w.change(spec(rollout=None, **CHANGE))
    first = w.step(T0)
    assert (first.rollout.phase, first.rollout.revision, first.rollout.from_revision) == ("Updating", new_rev, old_rev)
    assert first.stable_revision == old_rev and first.canary_revision is None and len(first.victims) == 1
    w.until(T0 + 10, lambda w: w.rollout is None)
    assert w.stable == new_rev and set(w.kube.deployments("ns", "svc")) == {new_rev}
    assert sorted(p.node for p in w.serving()) == old_nodes and all(p.revision == new_rev for p in w.serving())
    assert min(w.ready_seen) == 2  # never below replicas - 1
    assert w.reasons().count("Updated") == 1
    # The old Deployment was only ever scaled, never rolled in place.
    assert all(x.body["spec"]["template"] == old_template for x in w.kube.written("apply", "Deployment")
               if x.name == f"svc-{old_rev}")


def test_update_of_one_replica_without_a_free_gpu_warns_before_the_outage():
    one = {"node-0": 1}
    w = World(spec(replicas=1, rollout=None), nodes=one)
    old_rev = w.deploy()
    new_rev = w.change(spec(replicas=1, rollout=None, **CHANGE))
    warned = w.step(T0)
    assert [e.reason for e in warned.events] == ["UpdateCausesOutage"] and warned.rollout.warning
    assert warned.victims == () and new_rev not in warned.replicas and w.pods_of(old_rev)[0].ready
    nxt = w.step(T0 + 10)
    assert len(nxt.victims) == 1
    assert "UpdateCausesOutage" not in [e.reason for e in nxt.events]
    w.until(T0 + 20, lambda w: w.rollout is None)
    assert w.stable == new_rev and w.reasons().count("UpdateCausesOutage") == 1


def test_update_of_one_replica_with_a_free_gpu_surges_without_an_outage():
    w = World(spec(replicas=1, rollout=None), nodes={"node-0": 2})
    w.deploy()
    new_rev = w.change(spec(replicas=1, rollout=None, **CHANGE))
    w.until(T0, lambda w: w.rollout is None)
    assert w.stable == new_rev and min(w.ready_seen) == 1 and "UpdateCausesOutage" not in w.reasons()


# -- a canary starts ----------------------------------------------------------------------------------------


def test_new_revision_starts_a_canary_and_surges_next_to_a_stable_pod():
    w, old_rev, new_rev = canary_world()
    for n in w.kube.nodes:
        w.kube.nodes[n] = 2  # a GPU free next to every stable pod
    old_template = w.kube.deployments("ns", "svc")[old_rev]["spec"]["template"]
    p = w.step(T0)
    assert (p.rollout.phase, p.rollout.revision, p.rollout.from_revision) == ("Progressing", new_rev, old_rev)
    assert p.rollout.capacity is None and p.rollout.steps == 1 and [e.reason for e in p.events] == ["CanaryStarted"]
    assert p.replicas[old_rev] == 3 and p.replicas[new_rev] == 1
    assert w.built[0][old_rev]["spec"]["template"] == old_template  # the stable Deployment keeps its own
    assert p.victims == () and [x.kind for x in p.rollout.pairs] == ["Surge"]
    assert (p.stable_revision, p.canary_revision) == (old_rev, new_rev)
    analysing(w, T0 + 10)
    canary = w.pods_of(new_rev)
    assert len(canary) == 1 and canary[0].node == w.rollout.pairs[0].node and canary[0].labelled_role == "canary"
    assert len(w.pods_of(old_rev)) == 3 and min(w.ready_seen) == 3  # a concurrent pair: nothing dipped


def test_no_free_gpu_replaces_a_stable_pod_on_its_node():
    w, old_rev, new_rev = canary_world()
    where = {x.name: x.node for x in w.serving()}
    p = w.step(T0)
    assert p.rollout.capacity is None and [x.kind for x in p.rollout.pairs] == ["Replace"]
    victim = p.victims[0]
    victim_node = where[victim]
    assert p.rollout.pairs[0].replaced == victim and p.rollout.pairs[0].node == victim_node
    assert p.replicas[old_rev] == 2 and p.replicas[new_rev] == 1
    analysing(w, T0 + 10)
    assert [x.node for x in w.pods_of(new_rev)] == [victim_node] and min(w.ready_seen) == 2


def test_capacity_borrow_never_surges():
    new = spec(**CHANGE, rollout={"capacity": "Borrow", "steps": [{"replicas": 1}]})
    w, _old_rev, _new_rev = canary_world(new, nodes={"node-0": 8})
    p = w.step(T0)
    assert p.rollout.capacity == "Borrow" and [x.kind for x in p.rollout.pairs] == ["Replace"] and len(p.victims) == 1


def test_one_replica_without_a_free_gpu_waits_for_one_and_says_so_once():
    """keep_old: the only stable pod is what the canary is compared with, so it is never taken; the canary
    waits (rollout.waiting, one CanaryWaitingForGPU), and its start-up clock does not run while it waits."""
    one = spec(replicas=1, rollout={"steps": [{"replicas": 1}], "startupTimeout": "10m"})
    w = World(spec(replicas=1), nodes={"node-0": 1})
    old_rev = w.deploy()
    new_rev = w.change(one.model_copy(update={"sglang": spec(**CHANGE).sglang}))
    now = T0
    for _ in range(5):
        p = w.step(now)
        assert p.victims == () and p.rollout.phase == "Progressing" and p.rollout.waiting
        assert [x.ready for x in w.pods_of(old_rev)] == [True] and not w.pods_of(new_rev)
        now += 600  # well past startupTimeout: no CanaryStartTimeout while it waits for a GPU
    assert w.reasons().count("CanaryWaitingForGPU") == 1, w.reasons()
    w.kube.nodes["node-0"] = 2  # a GPU is added
    analysing(w, now)
    assert w.rollout.waiting is None and len(w.pods_of(new_rev)) == 1 and min(w.ready_seen) == 1


# -- the gate's verdicts --------------------------------------------------------------------------------------


def test_rollback_replaces_the_canary_pods_and_names_the_function():
    w, old_rev, new_rev = canary_world()
    t = analysing(w)
    canary_node = w.pods_of(new_rev)[0].node
    d = decision("Rollback", reason="StageTimeRegressed", regressed_function="reconstruct_on_target_device",
                 regressed_stage="process_input_requests")
    p = w.step(t + 120, decision=d)
    assert p.rollout.phase == "RolledBack" and p.canary_revision is None and p.stable_revision == old_rev
    assert p.rollout.regressed_function == "reconstruct_on_target_device"
    ev = [e for e in p.events if e.reason == "CanaryRolledBack"]
    assert ev and ev[0].type == "Warning" and "reconstruct_on_target_device" in ev[0].message
    # The canary's pod is replaced by a stable one on its node; its Deployment goes once it has no pod.
    t = w.until(t + 130, lambda w: new_rev not in w.kube.deployments("ns", "svc") and
                len([x for x in w.pods_of(old_rev) if x.ready]) == 3)
    assert not w.pods_of(new_rev) and canary_node in {x.node for x in w.pods_of(old_rev)}
    assert min(w.ready_seen) == 2
    # Held: the same revision does not start again.
    again = w.step(t + 200)
    assert again.canary_revision is None and again.rollout.phase == "RolledBack" and not again.events
    assert set(again.replicas) == {old_rev}


def test_promote_on_the_last_step_replaces_the_rest_and_keeps_the_canary_pods():
    w, old_rev, new_rev = canary_world()
    t = analysing(w)
    canary_pods = {p.name for p in w.pods_of(new_rev)}
    p = w.step(t + 301, decision=decision("Promote"))
    assert p.rollout.phase == "Promoting" and [e.reason for e in p.events] == ["CanaryPromoting"]
    assert p.stable_revision == old_rev and p.canary_revision == new_rev
    w.until(t + 310, lambda w: w.rollout.phase == "Promoted")
    assert w.stable == new_rev and w.reasons().count("CanaryPromoted") == 1
    assert set(w.kube.deployments("ns", "svc")) == {new_rev}
    pods = w.serving()
    assert len(pods) == 3 and all(x.revision == new_rev and x.ready for x in pods)
    assert canary_pods <= {x.name for x in pods}  # never restarted: the canary's pods are now stable pods
    w.step(t + 400)
    assert all(x.labelled_role == "stable" for x in w.serving())
    assert min(w.ready_seen) == 2  # replaced within maxUnavailable 1
    assert sorted(x.node for x in w.serving()) == sorted(TIGHT)


def test_promoting_rolls_back_only_on_a_confident_regression():
    w, _old_rev, _new_rev = canary_world()
    t = analysing(w)
    w.step(t + 301, decision=decision("Promote"))
    vague = w.step(t + 320, decision=decision("Rollback", reason="MaxDurationReached"))
    assert vague.rollout.phase == "Promoting" and vague.rollout.analyses >= 2
    assert vague.rollout.reason != "MaxDurationReached"
    sure = w.step(t + 380, decision=decision("Rollback", reason="LoopLatencyRegressed", signals=(fail_signal(),)))
    assert (sure.rollout.phase, sure.rollout.reason) == ("RolledBack", "LoopLatencyRegressed")
    assert "CanaryRolledBack" in [e.reason for e in sure.events]


@pytest.mark.parametrize("verdict", ["Continue", "Inconclusive"])
def test_the_rollout_never_rederives_a_verdict(verdict):
    """Only the gate decides: long past maxDuration, Continue or Inconclusive changes nothing, whatever
    onInconclusive says."""
    for action in ("Rollback", "Promote", "Pause"):
        new = spec(**CHANGE, rollout={"steps": [{"replicas": 1}],
                                      "analysis": {"maxDuration": "30m", "onInconclusive": action}})
        w, _, new_rev = canary_world(new)
        t = analysing(w)
        p = w.step(t + 7200, decision=decision(verdict, reason="SignalsUnavailable"))
        assert p.rollout.phase == "Analysing" and p.canary_revision == new_rev, action


def test_gate_verdicts_map_to_actions():
    w, _, new_rev = canary_world()
    t = analysing(w)
    rolled = w.plan(t + 1900, decision=decision("Rollback", reason="MaxDurationReached"))
    assert rolled.rollout.phase == "RolledBack" and rolled.rollout.reason == "MaxDurationReached"
    assert rolled.canary_revision is None
    paused = w.plan(t + 1900, decision=decision("Pause", reason="MaxDurationReached"))
    assert paused.rollout.phase == "Paused" and paused.canary_revision == new_rev
    assert [e.reason for e in paused.events] == ["CanaryPaused"]
    promoted = w.plan(t + 1900, decision=decision("Promote"))
    assert promoted.rollout.phase == "Promoting"
    w.step(t + 1900, decision=decision("Pause", reason="MaxDurationReached"))
    assert not analysis.due(w.spec, w.rollout, w.observed(), new_rev, t + 2000)


def test_multi_step_each_step_has_its_own_analysis_clock():
    """Step 2 starts its analysis when its pods are Ready; its maxDuration never counts step 1's time."""
    three = {"steps": [{"replicas": 1}, {"replicas": 2}, {"replicas": 3}], "analysis": {"maxDuration": "30m"}}
    nodes = {f"node-{i}": 1 for i in range(4)}
    w, _, new_rev = canary_world(spec(replicas=4, rollout=three, **CHANGE), nodes=nodes, old=spec(replicas=4))
    t = analysing(w)
    assert w.rollout.steps == 3
    step1 = w.step(t + 1500, decision=decision("Promote"))
    r = step1.rollout
    assert (r.phase, r.step, r.analysis_started_at) == ("Progressing", 1, None)
    assert step1.replicas[new_rev] == 2
    # The second canary pod is still gated: Progressing, no analysis.
    assert len([p for p in w.pods_of(new_rev) if p.ready]) == 1
    assert not analysis.due(w.spec, w.rollout, w.observed(), new_rev, t + 1600)
    ready_at = w.until(t + 1600, lambda w: w.rollout.phase == "Analysing")
    assert units.parse_time(w.rollout.analysis_started_at) == ready_at and ready_at > t + 1600
    later = w.step(ready_at + 100, decision=decision("Inconclusive", reason="TooFewSamples"))
    assert later.rollout.phase == "Analysing" and later.rollout.step == 1
    # Step 2 of 3 keeps a stable pod to compare with as step 3 does (3 of 4).
    w.step(ready_at + 400, decision=decision("Promote"))
    w.until(ready_at + 410, lambda w: w.rollout.phase == "Analysing")
    assert (w.rollout.step, len(w.pods_of(new_rev)), min(w.ready_seen)) == (2, 3, 3)


def test_canary_that_never_gets_ready_rolls_back_after_its_startup_timeout():
    new = spec(**CHANGE, rollout={"steps": [{"replicas": 1}], "startupTimeout": "20m"})
    w, _old_rev, new_rev = canary_world(new)

    def no_canary_ready():
        for p in w.kube.pod_store.values():
            if p["labels"].get(builders.LABEL_REVISION) == new_rev:
                p["ready"] = False

    for i in range(4):  # victim, release, placed (never Ready)
        w.step(T0 + i)
        no_canary_ready()
    placed = units.parse_time(w.rollout.step_started_at)
    assert w.rollout.phase == "Progressing" and [p.node for p in w.pods_of(new_rev)] != [None]
    mid = w.step(placed + 1100)
    no_canary_ready()
    assert mid.rollout.phase == "Progressing"
    end = w.step(placed + 1201)
    assert (end.rollout.phase, end.rollout.reason) == ("RolledBack", "CanaryStartTimeout")
    assert end.canary_revision is None and "CanaryRolledBack" in [e.reason for e in end.events]


def test_manual_actions():
    w, _old_rev, new_rev = canary_world()
    t = analysing(w)
    aborted = w.plan(t + 5, action="abort")
    assert aborted.rollout.phase == "Aborted" and [e.reason for e in aborted.events] == ["CanaryAborted"]
    assert aborted.canary_revision is None
    promoted = w.plan(t + 5, action="promote")
    assert (promoted.rollout.phase, promoted.rollout.reason) == ("Promoting", "PromotedByUser")
    assert [e.reason for e in promoted.events] == ["CanaryPromoting"]
    # The user's promotion wins over this round's verdict.
    assert w.plan(t + 5, action="promote", decision=decision("Pause")).rollout.phase == "Promoting"
    paused = w.step(t + 5, action="pause")
    assert paused.rollout.phase == "Paused" and paused.canary_revision == new_rev
    assert not analysis.due(w.spec, w.rollout, w.observed(), new_rev, t + 500)
    resumed = w.step(t + 600, action="resume")
    # The step's analysis starts afresh: its pods are still Ready, so a new clock from now.
    assert (resumed.rollout.phase, resumed.rollout.reason) == ("Analysing", "Resumed")
    assert units.parse_time(resumed.rollout.analysis_started_at) == t + 600
    w.step(t + 610, action="promote")
    w.until(t + 620, lambda w: w.rollout.phase == "Promoted")
    assert w.rollout.reason == "PromotedByUser" and w.stable == new_rev


def test_abort_replaces_the_canary_with_stable_pods():
    w, old_rev, new_rev = canary_world()
    t = analysing(w)
    w.step(t + 5, action="abort")
    w.until(t + 10, lambda w: new_rev not in w.kube.deployments("ns", "svc") and len(w.pods_of(old_rev)) == 3
            and all(p.ready for p in w.serving()))
    assert w.rollout.phase == "Aborted" and w.stable == old_rev and min(w.ready_seen) == 2


def test_same_inputs_same_plan_after_a_restart():
    """All state is in status and the cluster: replaying the stored rollout status gives the same plan, in the
    middle of a move too (pairs recorded, a gated canary pod waiting for its release)."""
    w, _, _ = canary_world(spec(replicas=3, rollout={"steps": [{"replicas": 2}]}, **CHANGE))
    pinned = []
    for i in range(3):
        w.step(T0 + i)
        live = w.plan(T0 + 30)
        again = w.plan(T0 + 30, prev=stored(w.rollout))
        assert live == again and w.rollout.pairs
        pinned += [n for _, n in live.releases if n]
    assert pinned  # the pinned releases come from the stored pairs


def test_a_promotion_applied_before_a_restart_is_recorded_as_promoted():
    """Killed between applying the promotion's last round (the old revision's Deployment deleted) and writing the
    status: the restarted operator finds the rollout Promoting and only the canary's revision running. That is
    the promotion it made, not a spec reverted by the user."""
    w, old_rev, new_rev = canary_world()
    t = analysing(w)
    w.step(t + 301, decision=decision("Promote"))
    t = w.until(t + 310, lambda w: w.rollout.phase == "Promoted")
    # That round deleted the old revision's Deployment; its status write (Promoted, stableRevision) is lost:
    assert [x.name for x in w.kube.written("delete", "Deployment")] == [f"svc-{old_rev}"]
    lost = World(w.spec)
    lost.kube, lost.stable = w.kube, old_rev
    lost.rollout = stored(w.rollout.model_copy(update={"phase": "Promoting", "reason": None, "message": None}))
    p = lost.step(t + 10)
    assert (p.rollout.phase, p.rollout.verdict, p.rollout.reason) == ("Promoted", "Promote", "PromotionApplied")
    assert [e.reason for e in p.events] == ["CanaryPromoted"] and p.stable_revision == new_rev
    again = lost.step(t + 25)
    assert again.rollout.phase == "Promoted" and not again.events
    # A spec really put back at the stable revision mid-rollout is still an abort.
    w2, _old2, _ = canary_world()
    t2 = analysing(w2)
    w2.change(spec())
    reverted = w2.step(t2 + 10)
    assert (reverted.rollout.phase, reverted.rollout.reason) == ("Aborted", "SpecReverted")


def test_an_unresolvable_margin_is_a_warning_event_once():
    w, _, _ = canary_world()
    t = analysing(w)
    d = decision("Continue", reason="AwaitingEvidence", warning="pods of the baseline differ by 3.0% (sd)")
    first = w.step(t + 60, decision=d)
    assert [e.reason for e in first.events] == ["CanaryMarginUnresolvable"] and first.rollout.warning
    again = w.step(t + 120, decision=d)
    assert not again.events


def test_a_capped_expand_ceiling_is_a_warning_event_once_beside_the_margin_warning():
    w, _, _ = canary_world()
    t = analysing(w)
    cap = ("expandCeiling.loopLatency 3.0% is below the 7.1% one canary pod's measured noise calls for: a harmless "
           "canary passes the expand test at a look about 20% of the time (99% at the default), so steps may wait "
           "for maxDuration and onInconclusive: raise the ceiling or remove it")
    stage = cap.replace("expandCeiling.loopLatency", "expandCeiling.stageTime (run_batch)")
    d = decision("Continue", reason="AwaitingEvidence", ceiling_warning=cap)
    first = w.step(t + 60, decision=d)
    assert [e.reason for e in first.events] == ["CanaryExpandCeilingCapped"] and first.rollout.warning == cap
    again = w.step(t + 120, decision=replace(d, ceiling_warning=cap.replace("20%", "25%")))
    assert not again.events and again.rollout.warning == cap  # once per setting, whatever the look's numbers
    both = w.step(t + 150, decision=replace(d, ceiling_warning=f"{cap}\n{stage}"))  # a second setting: told
    assert [e.reason for e in both.events] == ["CanaryExpandCeilingCapped"] and stage in both.events[0].message
    assert both.rollout.warning == f"{cap}\n{stage}"
    margin = replace(d, warning="pods of the baseline differ by 3.0% (sd); add pods or widen the margin")
    later = w.step(t + 180, decision=margin)  # the margin warning is still told, beside the ceilings'
    assert [e.reason for e in later.events] == ["CanaryMarginUnresolvable"]
    assert later.rollout.warning == f"{margin.warning}\n{cap}\n{stage}"
    assert not w.step(t + 240, decision=margin).events


def test_the_clock_the_gate_found_is_kept_and_each_step_starts_without_one():
    two = {"steps": [{"replicas": 1}, {"replicas": 2}]}
    nodes = {f"node-{i}": 1 for i in range(4)}
    w, _, _ = canary_world(spec(replicas=4, rollout=two, **CHANGE), nodes=nodes, old=spec(replicas=4))
    t = analysing(w)
    assert w.rollout.data_started_at is None
    first = w.step(t + 60, decision=decision("Continue", reason="StepInProgress", clock_started_at=t + 40))
    assert units.parse_time(first.rollout.data_started_at) == t + 40
    # A later look that reports another clock (the first window fell out of the sidecar's history) moves nothing.
    later = w.step(t + 120, decision=decision("Continue", reason="StepInProgress", clock_started_at=t + 100))
    assert later.rollout.data_started_at == first.rollout.data_started_at
    step2 = w.step(t + 400, decision=decision("Promote", clock_started_at=t + 40))
    assert (step2.rollout.step, step2.rollout.analysis_started_at, step2.rollout.data_started_at) == (1, None, None)


# -- fresh baseline ----------------------------------------------------------------------------------


def fresh(**over):
    return spec(rollout={"baseline": "Fresh", "steps": [{"replicas": 1}]}, **over)


# node-0 runs the 3 stable pods with 2 GPUs left (the canary's surge and the ungated baseline pod both fit there)
ROOMY = {"node-0": 5, "node-1": 4}


def test_fresh_baseline_runs_next_to_the_canary_with_the_stable_template():
    w, old_rev, _new_rev = canary_world(fresh(**CHANGE), nodes=ROOMY)
    p = w.step(T0)
    assert (p.rollout.baseline, p.rollout.capacity) == ("Fresh", None)
    base = w.built[1]
    assert p.baseline == (old_rev, 1)
    assert base["metadata"]["name"] == "svc-baseline" and base["spec"]["replicas"] == 1
    labels = base["spec"]["template"]["metadata"]["labels"]
    assert labels[builders.LABEL_REVISION] == old_rev and labels[builders.LABEL_ROLE] == builders.ROLE_BASELINE
    stable_t = w.kube.deployments("ns", "svc")[old_rev]["spec"]["template"]["spec"]
    assert base["spec"]["template"]["spec"] == stable_t  # the stable template, gated like it
    assert p.replicas[old_rev] == 3 and p.want_ready == 3


def test_fresh_baseline_waits_for_its_pods_before_the_analysis_starts():
    w, _old_rev, new_rev = canary_world(fresh(**CHANGE), nodes=ROOMY)

    def hold_baseline():
        for p in w.kube.pod_store.values():
            if p["labels"].get(builders.LABEL_ROLE) == builders.ROLE_BASELINE:
                p["ready"] = False

    for i in range(4):
        w.step(T0 + i)
        hold_baseline()
    assert [p.ready for p in w.pods_of(new_rev)] == [True]
    assert w.step(T0 + 10).rollout.phase == "Progressing"  # the canary is Ready, its baseline is not
    assert w.step(T0 + 11).rollout.phase == "Analysing"
    p = w.step(T0 + 400, decision=decision("Promote"))
    assert p.rollout.phase == "Promoting" and p.baseline is None
    assert BASELINE_KEY not in w.kube.deployments("ns", "svc")
    w.until(T0 + 410, lambda w: w.rollout.phase == "Promoted")


def test_no_free_gpus_for_a_fresh_baseline_falls_back_to_stable_and_says_so():
    w, _, _ = canary_world(fresh(**CHANGE))
    p = w.step(T0)
    assert p.rollout.baseline == "Stable" and p.baseline is None
    assert "no free GPUs for a fresh baseline" in p.events[0].message


def test_a_fresh_baseline_that_cannot_be_placed_gives_way_to_the_stable_pods():
    """Free GPUs were counted at the start, then taken by others before the pods were placed: the baseline pod
    stays unschedulable, and after FRESH_BASELINE_PATIENCE_S the canary is compared with the stable pods instead."""
    w, _old_rev, _new_rev = canary_world(fresh(**CHANGE), nodes=ROOMY)
    first = w.step(T0, settle=False)
    assert first.rollout.baseline == "Fresh" and first.baseline is not None
    w.kube.nodes.update({"node-0": 3, "node-1": 0})  # taken by someone else's pods
    w.kube.settle("svc")
    # the canary pod (its surge pinned to a node now full: given up after SURGED_POD_PATIENCE_S) takes a stable pod's
    # GPU on its node; the baseline's pod, released only after it, has none
    seen = w.until(T0 + 1, lambda w: any(p.unschedulable for p in w.kube.pods("svc")
                                         if p.labelled_role == BASELINE_KEY), limit=30, dt=10)
    early = w.step(seen + 30)
    assert early.rollout.baseline == "Fresh" and early.rollout.phase == "Progressing"
    w.until(seen + 40, lambda w: w.rollout.baseline == "Stable")
    assert "CanaryBaselineStable" in w.reasons() and BASELINE_KEY not in w.kube.deployments("ns", "svc")
    assert w.until(w_now := T0 + 400, lambda w: w.rollout.phase == "Analysing") >= w_now


def test_the_fresh_baseline_does_not_take_the_gpu_of_the_canarys_pair():
    """node-0 runs the 3 stable pods and has 1 GPU left, node-1 has 4: the canary surges next to a stable pod on
    node-0 and the fresh baseline belongs elsewhere; the canary should be Ready within a minute, with no stable pod
    replaced while free GPUs are left."""
    w, old_rev, _new_rev = canary_world(fresh(**CHANGE), nodes={"node-0": 4, "node-1": 4})
    w.until(T0, lambda w: w.rollout.phase == "Analysing", limit=6)
    assert len(w.pods_of(old_rev)) == 3


def test_fewer_replicas_of_the_stable_revision_is_a_plain_scale_down():
    """Replicas lowered, template unchanged: the stable Deployment is scaled down (move() crashed on the surplus
    of its own revision: no old pod to take)."""
    w = World(spec())
    rev = w.deploy()
    assert w.change(spec(replicas=2)) == rev
    p = w.step(T0)
    assert p.replicas[rev] == 2 and p.victims == () and p.rollout is None
    assert len(w.serving()) == 2 and all(x.ready for x in w.serving())


def test_a_look_records_how_far_the_sidecar_and_sglang_stage_accounting_are_apart():
    """status.rollout.sglangAgreement: per side, in points, from each look that could measure it; a look that
    could not (an SGLang that does not count its stages) keeps the last one."""
    from vlm_operator.analysis.gate import Decision
    from vlm_operator.api.v1alpha1 import RolloutStatus

    r = RolloutStatus(phase="Analysing")
    d = Decision("Continue", "StepInProgress", "", sglang_disagreement={"baseline": 0.0123, "canary": 0.031})
    r = rollout._recorded_look(r, d, "2026-12-06T18:00:00Z", confident=False)
    assert r.sglang_agreement == {"baseline": 1.23, "canary": 3.1}
    assert r.model_dump(by_alias=True)["sglangAgreement"] == {"baseline": 1.23, "canary": 3.1}
    r = rollout._recorded_look(r, Decision("Continue", "StepInProgress", ""), "2026-12-06T18:01:00Z", confident=False)
    assert r.sglang_agreement == {"baseline": 1.23, "canary": 3.1}
