"""The rollout state machine: pure, so each phase change is checked on constructed inputs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from vlm_operator import analysis, api, builders, rollout, units
from vlm_operator.gate import Decision
from vlm_operator.observed import Observed, PodInfo
from vlm_operator.settings import Settings

OWNER = builders.Owner("svc", "ns", "uid-1")
SETTINGS = Settings()
T0 = 1_800_000_000.0


def spec(**over) -> api.VLMServiceSpec:
    """Most tests here compare with the stable pods (baseline Stable); the fresh-baseline tests say Fresh."""
    base = {
        "model": {"path": "m"},
        "replicas": 3,
        "rollout": {"steps": [{"replicas": 1, "analysis": "5m"}], "analysis": {"interval": "1m", "maxDuration": "30m"}},
    }
    base.update(over)
    if isinstance(base["rollout"], dict):
        base["rollout"] = {"baseline": "Stable", **base["rollout"]}
    return api.parse_spec(base)


def desired(s: api.VLMServiceSpec) -> builders.Desired:
    return builders.build_desired(OWNER, s, SETTINGS)


def observed_with_stable(d: builders.Desired, replicas: int = 3, canary: builders.Desired | None = None, canary_ready=0,
                         baseline_ready: int | None = None) -> Observed:
    deps = {builders.ROLE_STABLE: builders.build_deployment(OWNER, d.template, d.revision, builders.ROLE_STABLE, replicas)}
    pods = [PodInfo(f"s{i}", builders.ROLE_STABLE, d.revision, "Running", True) for i in range(replicas)]
    if baseline_ready is not None:
        deps[builders.ROLE_BASELINE] = builders.build_deployment(OWNER, d.template, d.revision, builders.ROLE_BASELINE, 1)
        pods += [PodInfo(f"b{i}", builders.ROLE_BASELINE, d.revision, "Running", True) for i in range(baseline_ready)]
    if canary is not None:
        deps[builders.ROLE_CANARY] = builders.build_deployment(OWNER, canary.template, canary.revision, builders.ROLE_CANARY, 1)
        pods += [PodInfo(f"c{i}", builders.ROLE_CANARY, canary.revision, "Running", True) for i in range(canary_ready)]
    return Observed(deployments=deps, pods=tuple(pods))


def decision(verdict: str, **kw) -> Decision:
    return Decision(verdict=verdict, reason=kw.pop("reason", verdict), message=kw.pop("message", verdict), **kw)


def test_first_deploy_creates_stable_without_canary():
    s = spec()
    d = desired(s)
    p = rollout.plan(OWNER, s, d, Observed(), None, now=T0, free_gpus=16)
    assert p.stable["spec"]["replicas"] == 3 and p.canary is None and p.stable_revision == d.revision


def test_without_rollout_block_a_change_rolls_in_place():
    old = spec(rollout=None)
    new = spec(rollout=None, sglang={"ipcCache": {"mode": "Off"}})
    p = rollout.plan(OWNER, new, desired(new), observed_with_stable(desired(old)), None, now=T0, free_gpus=0)
    assert p.canary is None
    assert p.stable["spec"]["template"]["metadata"]["labels"][builders.LABEL_REVISION] == desired(new).revision


def test_new_revision_starts_a_canary_and_surges_when_gpus_are_free():
    old, new = spec(), spec(sglang={"ipcCache": {"mode": "Off"}})
    obs = observed_with_stable(desired(old))
    p = rollout.plan(OWNER, new, desired(new), obs, None, now=T0, free_gpus=8)
    assert p.rollout.phase == "Progressing" and p.rollout.capacity == "Surge"
    assert p.canary["spec"]["replicas"] == 1 and p.stable["spec"]["replicas"] == 3
    # The stable Deployment keeps its own template.
    assert p.stable["spec"]["template"]["metadata"]["labels"][builders.LABEL_REVISION] == desired(old).revision
    assert [e.reason for e in p.events] == ["CanaryStarted"]


def test_no_free_gpu_borrows_a_stable_replica():
    old, new = spec(), spec(sglang={"ipcCache": {"mode": "Off"}})
    p = rollout.plan(OWNER, new, desired(new), observed_with_stable(desired(old)), None, now=T0, free_gpus=0)
    assert p.rollout.capacity == "Borrow"
    assert p.stable["spec"]["replicas"] == 2 and p.canary["spec"]["replicas"] == 1


def test_surge_stuck_unschedulable_falls_back_to_borrow():
    old, new = spec(), spec(sglang={"ipcCache": {"mode": "Off"}})
    p0 = rollout.plan(OWNER, new, desired(new), observed_with_stable(desired(old)), None, now=T0, free_gpus=8)
    obs = observed_with_stable(desired(old), canary=desired(new))
    obs = replace(obs, pods=(*obs.pods, PodInfo("c0", "canary", desired(new).revision, "Pending", False, "0/2 nodes: Insufficient nvidia.com/gpu")))
    p1 = rollout.plan(OWNER, new, desired(new), obs, p0.rollout, now=T0 + rollout.SURGE_PATIENCE_S + 1, free_gpus=None)
    assert p1.rollout.capacity == "Borrow" and p1.stable["spec"]["replicas"] == 2


def _ready(old, new, now=T0 + 10, canary_ready=1):
    """The canary started at T0 and its pods were Ready at `now`: the step's analysis starts then."""
    p0 = rollout.plan(OWNER, new, desired(new), observed_with_stable(desired(old)), None, now=T0, free_gpus=8)
    obs = observed_with_stable(desired(old), canary=desired(new), canary_ready=canary_ready)
    assert not analysis.due(new, p0.rollout, obs, desired(new).revision, T0 + 1)  # not Analysing yet
    p1 = rollout.plan(OWNER, new, desired(new), obs, p0.rollout, now=now, free_gpus=None)
    return p1, obs


def _analysing(old, new, verdict, now):
    p1, obs = _ready(old, new)
    assert p1.rollout.phase == "Analysing" and p1.rollout.analysis_started_at
    assert analysis.due(new, p1.rollout, obs, desired(new).revision, T0 + 11)
    return rollout.plan(OWNER, new, desired(new), obs, p1.rollout, now=now, free_gpus=None, decision=verdict)


def test_rollback_deletes_the_canary_and_names_the_function():
    old, new = spec(), spec(sglang={"ipcCache": {"mode": "Off"}})
    d = decision("Rollback", reason="StageTimeRegressed", regressed_function="reconstruct_on_target_device", regressed_stage="process_input_requests")
    p = _analysing(old, new, d, T0 + 120)
    assert p.rollout.phase == "RolledBack" and p.canary is None
    assert p.rollout.regressed_function == "reconstruct_on_target_device"
    assert p.stable["spec"]["replicas"] == 3
    ev = [e for e in p.events if e.reason == "CanaryRolledBack"]
    assert ev and ev[0].type == "Warning" and "reconstruct_on_target_device" in ev[0].message
    # Held: the same revision does not start again.
    again = rollout.plan(OWNER, new, desired(new), observed_with_stable(desired(old)), p.rollout, now=T0 + 200, free_gpus=8)
    assert again.canary is None and again.rollout.phase == "RolledBack" and not again.events


def test_promote_on_the_last_step_takes_the_canary_template():
    old, new = spec(), spec(sglang={"ipcCache": {"mode": "Off"}})
    late = _analysing(old, new, decision("Promote"), T0 + 301)
    assert late.rollout.phase == "Promoted" and late.canary is None
    assert late.stable_revision == desired(new).revision
    assert late.stable["spec"]["template"]["metadata"]["labels"][builders.LABEL_REVISION] == desired(new).revision


@pytest.mark.parametrize("verdict", ["Continue", "Inconclusive"])
def test_the_rollout_never_rederives_a_verdict(verdict):
    """Only the gate decides: long past maxDuration, Continue or Inconclusive changes nothing, whatever
    onInconclusive says (it used to become Promoted/MaxDurationReached with onInconclusive Promote)."""
    old = spec()
    for action in ("Rollback", "Promote", "Pause"):
        new = spec(
            sglang={"ipcCache": {"mode": "Off"}},
            rollout={"steps": [{"replicas": 1}], "analysis": {"maxDuration": "30m", "onInconclusive": action}},
        )
        p = _analysing(old, new, decision(verdict, reason="SignalsUnavailable"), T0 + 7200)
        assert p.rollout.phase == "Analysing" and p.canary is not None, action


def test_gate_verdicts_map_to_actions():
    old, new = spec(), spec(sglang={"ipcCache": {"mode": "Off"}})
    rolled = _analysing(old, new, decision("Rollback", reason="MaxDurationReached"), T0 + 1900)
    assert rolled.rollout.phase == "RolledBack" and rolled.rollout.reason == "MaxDurationReached"
    paused = _analysing(old, new, decision("Pause", reason="MaxDurationReached"), T0 + 1900)
    assert paused.rollout.phase == "Paused" and paused.canary is not None
    assert [e.reason for e in paused.events] == ["CanaryPaused"]
    assert not analysis.due(new, paused.rollout, observed_with_stable(desired(old), canary=desired(new), canary_ready=1), desired(new).revision, T0 + 2000)


def test_multi_step_each_step_has_its_own_analysis_clock():
    """Step 2 starts its analysis when its pods are Ready; its maxDuration never counts step 1's time."""
    three = {"steps": [{"replicas": 1}, {"replicas": 2}, {"replicas": 3}], "analysis": {"maxDuration": "30m"}}
    old, new = spec(replicas=4), spec(replicas=4, sglang={"ipcCache": {"mode": "Off"}}, rollout=three)
    p1, obs1 = _ready(old, new)
    step1 = rollout.plan(OWNER, new, desired(new), obs1, p1.rollout, now=T0 + 1500, free_gpus=None, decision=decision("Promote"))
    r = step1.rollout
    assert (r.phase, r.step, r.analysis_started_at) == ("Progressing", 1, None)
    assert step1.canary["spec"]["replicas"] == 2
    # One of two canary pods Ready: still starting, no analysis.
    obs_one = observed_with_stable(desired(old), 4, canary=desired(new), canary_ready=1)
    waiting = rollout.plan(OWNER, new, desired(new), obs_one, r, now=T0 + 1600, free_gpus=None)
    assert waiting.rollout.phase == "Progressing"
    assert not analysis.due(new, waiting.rollout, obs_one, desired(new).revision, T0 + 1600)
    obs_two = observed_with_stable(desired(old), 4, canary=desired(new), canary_ready=2)
    ready = rollout.plan(OWNER, new, desired(new), obs_two, waiting.rollout, now=T0 + 1700, free_gpus=None)
    assert ready.rollout.phase == "Analysing" and units.parse_time(ready.rollout.analysis_started_at) == T0 + 1700
    # The operator hands the gate that start time; an early Inconclusive keeps the step going.
    later = rollout.plan(OWNER, new, desired(new), obs_two, ready.rollout, now=T0 + 1800, free_gpus=None,
                         decision=decision("Inconclusive", reason="TooFewSamples"))
    assert later.rollout.phase == "Analysing" and later.rollout.step == 1


def test_canary_that_never_gets_ready_rolls_back_after_its_startup_timeout():
    old = spec()
    new = spec(sglang={"ipcCache": {"mode": "Off"}}, rollout={"steps": [{"replicas": 1}], "startupTimeout": "20m"})
    p0 = rollout.plan(OWNER, new, desired(new), observed_with_stable(desired(old)), None, now=T0, free_gpus=8)
    obs = observed_with_stable(desired(old), canary=desired(new), canary_ready=0)
    mid = rollout.plan(OWNER, new, desired(new), obs, p0.rollout, now=T0 + 1100, free_gpus=None)
    assert mid.rollout.phase == "Progressing"
    end = rollout.plan(OWNER, new, desired(new), obs, mid.rollout, now=T0 + 1201, free_gpus=None)
    assert (end.rollout.phase, end.rollout.reason) == ("RolledBack", "CanaryStartTimeout") and end.canary is None


def test_manual_actions():
    old, new = spec(), spec(sglang={"ipcCache": {"mode": "Off"}})
    p0 = rollout.plan(OWNER, new, desired(new), observed_with_stable(desired(old)), None, now=T0, free_gpus=8)
    obs = observed_with_stable(desired(old), canary=desired(new), canary_ready=1)
    assert rollout.plan(OWNER, new, desired(new), obs, p0.rollout, now=T0 + 5, free_gpus=None, action="abort").rollout.phase == "Aborted"
    assert rollout.plan(OWNER, new, desired(new), obs, p0.rollout, now=T0 + 5, free_gpus=None, action="promote").rollout.phase == "Promoted"
    paused = rollout.plan(OWNER, new, desired(new), obs, p0.rollout, now=T0 + 5, free_gpus=None, action="pause")
    assert paused.rollout.phase == "Paused" and paused.canary is not None
    assert not analysis.due(new, paused.rollout, obs, desired(new).revision, T0 + 500)


def test_same_inputs_same_plan_after_a_restart():
    """All state is in status: replaying the stored rollout status gives the same plan."""
    old, new = spec(), spec(sglang={"ipcCache": {"mode": "Off"}})
    p0 = rollout.plan(OWNER, new, desired(new), observed_with_stable(desired(old)), None, now=T0, free_gpus=8)
    stored = api.RolloutStatus.model_validate(p0.rollout.model_dump(by_alias=True, exclude_none=True))
    obs = observed_with_stable(desired(old), canary=desired(new))
    a = rollout.plan(OWNER, new, desired(new), obs, p0.rollout, now=T0 + 30, free_gpus=None)
    b = rollout.plan(OWNER, new, desired(new), obs, stored, now=T0 + 30, free_gpus=None)
    assert a == b



def test_a_promotion_applied_before_a_restart_is_recorded_as_promoted():
    """Killed between applying the promotion (the stable Deployment took the canary template) and writing the
    status: the restarted operator finds the rollout Analysing and the stable Deployment at the canary's
    revision. That is the promotion it made, not a spec reverted by the user."""
    old, new = spec(), spec(sglang={"ipcCache": {"mode": "Off"}})
    analysing = _analysing(old, new, decision("Continue"), T0 + 100).rollout
    assert analysing.phase == "Analysing"
    promoted_obs = observed_with_stable(desired(new))  # the promotion reached the API server, the status did not
    p = rollout.plan(OWNER, new, desired(new), promoted_obs, analysing, now=T0 + 200, free_gpus=None)
    assert (p.rollout.phase, p.rollout.verdict, p.rollout.reason) == ("Promoted", "Promote", "PromotionApplied")
    assert [e.reason for e in p.events] == ["CanaryPromoted"] and p.canary is None
    # Recorded once: the next reconcile finds it Promoted and posts nothing.
    again = rollout.plan(OWNER, new, desired(new), promoted_obs, p.rollout, now=T0 + 215, free_gpus=None)
    assert again.rollout.phase == "Promoted" and not again.events
    # A spec really put back at the stable revision mid-rollout is still an abort.
    reverted = rollout.plan(OWNER, old, desired(old), observed_with_stable(desired(old)), analysing, now=T0 + 200,
                            free_gpus=None)
    assert (reverted.rollout.phase, reverted.rollout.reason) == ("Aborted", "SpecReverted")

# -- fresh baseline ----------------------------------------------------------------------------------


def fresh(**over):
    return spec(rollout={"baseline": "Fresh", "steps": [{"replicas": 1}]}, **over)


def test_fresh_baseline_surges_next_to_the_canary_with_the_stable_template():
    old, new = spec(), fresh(sglang={"ipcCache": {"mode": "Off"}})
    p = rollout.plan(OWNER, new, desired(new), observed_with_stable(desired(old)), None, now=T0, free_gpus=8)
    assert (p.rollout.capacity, p.rollout.baseline) == ("Surge", "Fresh")
    assert p.baseline["metadata"]["name"] == "svc-baseline" and p.baseline["spec"]["replicas"] == 1
    labels = p.baseline["spec"]["template"]["metadata"]["labels"]
    assert labels[builders.LABEL_REVISION] == desired(old).revision and labels[builders.LABEL_ROLE] == builders.ROLE_BASELINE
    assert p.baseline["spec"]["template"]["spec"] == p.stable["spec"]["template"]["spec"]
    assert p.stable["spec"]["replicas"] == 3 and p.want_ready == 5


def test_fresh_baseline_waits_for_its_pods_before_the_analysis_starts():
    old, new = spec(), fresh(sglang={"ipcCache": {"mode": "Off"}})
    p0 = rollout.plan(OWNER, new, desired(new), observed_with_stable(desired(old)), None, now=T0, free_gpus=8)
    only_canary = observed_with_stable(desired(old), canary=desired(new), canary_ready=1, baseline_ready=0)
    assert rollout.plan(OWNER, new, desired(new), only_canary, p0.rollout, now=T0 + 5, free_gpus=None).rollout.phase == "Progressing"
    both = observed_with_stable(desired(old), canary=desired(new), canary_ready=1, baseline_ready=1)
    p1 = rollout.plan(OWNER, new, desired(new), both, p0.rollout, now=T0 + 6, free_gpus=None)
    assert p1.rollout.phase == "Analysing" and p1.baseline is not None
    done = rollout.plan(OWNER, new, desired(new), both, p1.rollout, now=T0 + 400, free_gpus=None, decision=decision("Promote"))
    assert done.rollout.phase == "Promoted" and done.baseline is None and done.canary is None


def test_fresh_baseline_borrows_two_replicas_when_no_gpu_is_spare():
    old, new = spec(), fresh(sglang={"ipcCache": {"mode": "Off"}})
    p = rollout.plan(OWNER, new, desired(new), observed_with_stable(desired(old)), None, now=T0, free_gpus=1)
    assert (p.rollout.capacity, p.rollout.baseline) == ("Borrow", "Fresh")
    assert (p.stable["spec"]["replicas"], p.baseline["spec"]["replicas"], p.canary["spec"]["replicas"]) == (1, 1, 1)


def test_no_capacity_for_a_fresh_baseline_falls_back_to_stable_and_says_so():
    old, new = spec(replicas=1), fresh(replicas=1, sglang={"ipcCache": {"mode": "Off"}})
    p = rollout.plan(OWNER, new, desired(new), observed_with_stable(desired(old), 1), None, now=T0, free_gpus=1)
    assert (p.rollout.capacity, p.rollout.baseline) == ("Surge", "Stable") and p.baseline is None
    assert "no capacity for a fresh baseline" in p.events[0].message


def test_an_unresolvable_margin_is_a_warning_event_once():
    old, new = spec(), spec(sglang={"ipcCache": {"mode": "Off"}})
    d = decision("Continue", reason="AwaitingEvidence", warning="pods of the baseline differ by 3.0% (sd)")
    first = _analysing(old, new, d, T0 + 60)
    assert [e.reason for e in first.events] == ["CanaryMarginUnresolvable"] and first.rollout.warning
    obs = observed_with_stable(desired(old), canary=desired(new), canary_ready=1)
    again = rollout.plan(OWNER, new, desired(new), obs, first.rollout, now=T0 + 120, free_gpus=None, decision=d)
    assert not again.events


def test_the_clock_the_gate_found_is_kept_and_each_step_starts_without_one():
    two = {"steps": [{"replicas": 1}, {"replicas": 2}]}
    old, new = spec(replicas=4), spec(replicas=4, sglang={"ipcCache": {"mode": "Off"}}, rollout=two)
    p1, obs1 = _ready(old, new)
    assert p1.rollout.phase == "Analysing" and p1.rollout.data_started_at is None
    first = rollout.plan(OWNER, new, desired(new), obs1, p1.rollout, now=T0 + 60, free_gpus=None,
                         decision=decision("Continue", reason="StepInProgress", clock_started_at=T0 + 40))
    assert units.parse_time(first.rollout.data_started_at) == T0 + 40
    # A later look that reports another clock (the first window fell out of the sidecar's history) moves nothing.
    later = rollout.plan(OWNER, new, desired(new), obs1, first.rollout, now=T0 + 120, free_gpus=None,
                         decision=decision("Continue", reason="StepInProgress", clock_started_at=T0 + 100))
    assert later.rollout.data_started_at == first.rollout.data_started_at
    step2 = rollout.plan(OWNER, new, desired(new), obs1, later.rollout, now=T0 + 400, free_gpus=None,
                         decision=decision("Promote", clock_started_at=T0 + 40))
    assert (step2.rollout.step, step2.rollout.analysis_started_at, step2.rollout.data_started_at) == (1, None, None)
