"""status.py (pure): the typed status and its round trip, conditions from health, the profiler summary and
when it changes what a user sees."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from vlm_operator.analysis import profile as P
from vlm_operator.analysis.gate import Window
from vlm_operator.api import v1alpha1 as api
from vlm_operator.cluster import observed as O
from vlm_operator.status import build as S
from vlm_operator.status import conditions as C

NOW = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)


def full_status() -> api.VLMServiceStatus:
    rollout = api.RolloutStatus(
        phase="Analysing", revision="abc", step=1, capacity="Surge", baseline="Fresh", analyses=3,
        started_at="2027-01-15T07:50:00Z", analysis_started_at="2027-01-15T07:55:00Z",
        signals=[api.SignalStatus(name="loop_latency", baseline=0.02, canary=0.021, delta=0.05, p_value=0.2,
                                  verdict="pending")],
    )
    return S.build_status(
        {}, S.Health(want=3, ready=2, rollout_phase="Analysing", rollout_message="3 of 5 windows", ipc_active=True,
                     ipc_reason="Enabled", ipc_message="on"),
        generation=4, now=NOW, selector="s=x", stable_revision="old", canary_revision="abc", rollout=rollout,
        profiler=api.ProfilerStatus(last_sample_time="2027-01-15T07:59:45Z", loop_p50="21.4ms", top_function="f"),
        sglang=S.sglang_status("img:v0.5.23", "0.5.23"),
    )


def test_status_round_trips_model_dict_model():
    st = full_status()
    body = S.status_body(st)
    assert api.VLMServiceStatus.model_validate(body) == st
    assert S.status_body(api.VLMServiceStatus.model_validate(body)) == body
    assert body["readyReplicas"] == 2 and body["rollout"]["analysisStartedAt"] == "2027-01-15T07:55:00Z"
    assert body["phase"] == "Canary" and "loopP95" not in body["profiler"]  # unset fields are left out


def test_status_body_is_camelcase_with_conditions_in_order():
    body = S.status_body(full_status())
    assert [c["type"] for c in body["conditions"]] == ["Ready", "Progressing", "Degraded", "IPCCacheActive",
                                                   "MarginResolvable"]
    ready = body["conditions"][0]
    assert ready == {"type": "Ready", "status": "False", "reason": "ReplicasNotReady", "message": "2/3 replicas ready",
                     "observedGeneration": 4, "lastTransitionTime": "2027-01-15T08:00:00Z"}
    assert body["conditions"][1]["reason"] == "CanaryAnalysing"


def test_the_model_refuses_a_bad_status():
    with pytest.raises(ValidationError):
        api.VLMServiceStatus.model_validate({"conditions": [{"type": "Ready", "status": "Maybe", "reason": "X",
                                                              "lastTransitionTime": "t"}]})
    with pytest.raises(ValidationError):
        api.VLMServiceStatus.model_validate({"rollout": {"phase": "Exploding"}})


def test_a_long_message_is_cut_to_what_the_schema_allows():
    st = S.build_status({}, S.Health(want=1, ready=0, invalid="x" * 40000), generation=1, now=NOW)
    assert len(st.conditions[0].message) == S.MAX_MESSAGE and st.conditions[0].message.endswith("...")


def test_a_foreign_condition_the_model_refuses_is_dropped_not_raised():
    current = {"conditions": [{"type": "Other", "status": "Perhaps", "reason": "?", "lastTransitionTime": "x"}]}
    st = S.build_status(current, S.Health(want=1, ready=1), generation=1, now=NOW)
    assert [c.type for c in st.conditions] == ["Ready", "Progressing", "Degraded"]


def test_parse_status_keeps_the_good_fields_of_a_garbled_status():
    st = S.parse_status({"stableRevision": "abc", "profiler": {"loopP50": 3}, "rollout": {"phase": "Nope"},
                         "replicas": 2, "unknown": 1})
    assert st.stable_revision == "abc" and st.replicas == 2 and st.profiler is None and st.rollout is None
    kept = S.carried({"stableRevision": "abc", "selector": "s", "sglang": {"image": "i"}})
    assert kept["stable_revision"] == "abc" and kept["sglang"] == api.SGLangStatus(image="i") and kept["rollout"] is None


def test_invalid_spec_message_names_fields():
    with pytest.raises(ValidationError) as e:
        api.parse_spec({"model": {}, "replicas": -1})
    msg = S.invalid_spec_message(e.value)
    assert "spec.model.path" in msg and "spec.replicas" in msg


@pytest.mark.parametrize(
    ("health", "phase", "ready", "degraded"),
    [
        (S.Health(want=2, ready=2), "Ready", ("True", "AllReplicasReady"), ("False", "AsExpected")),
        (S.Health(want=2, ready=1), "Pending", ("False", "ReplicasNotReady"), ("False", "AsExpected")),
        (S.Health(want=2, ready=1, unschedulable="pod a: 0/3 nodes"), "Pending", ("False", "Unschedulable"),
         ("True", "Unschedulable")),
        (S.Health(want=1, ready=1, rollout_phase="RolledBack", rollout_message="slower"), "RolledBack",
         ("True", "AllReplicasReady"), ("True", "CanaryRolledBack")),
        (S.Health(want=1, ready=0, invalid="bad"), "Failed", ("False", "InvalidSpec"), ("True", "InvalidSpec")),
    ],
)
def test_health_to_phase_and_conditions(health, phase, ready, degraded):
    st = S.build_status({}, health, generation=1, now=NOW)
    by = {c.type: (c.status, c.reason) for c in st.conditions}
    assert st.phase == phase and by["Ready"] == ready and by["Degraded"] == degraded


def test_running_health_counts_ready_pods_and_names_the_first_unschedulable():
    obs = O.Observed(pods=(O.PodInfo("b", "stable", "r", "Pending", False, unschedulable="no GPU"),
                           O.PodInfo("a", "stable", "r", "Pending", False, unschedulable="no node"),
                           O.PodInfo("c", "stable", "r", "Running", True)))
    h = S.running_health(obs, want=3, rollout=None, ipc_active=None)
    assert h.ready == 1 and h.unschedulable == "pod a: no node" and h.rollout_phase is None


# ---------------------------------------------------------------- profiler


def win(end: float, loop: float = 0.0214, p95: float | None = 0.030, shares=None, stale=False, pod="p") -> Window:
    return Window(revision="r", pod=pod, id=str(end), end=end, samples=500, loop_mean_seconds=loop,
                  loop_p95_seconds=p95, stage_shares={},
                  function_shares=shares if shares is not None else {"event_loop_overlap": 1.0, "run_batch": 0.5,
                                                                     "process_input_requests": 0.2},
                  stale=stale)


T = 1_800_000_000.0


def test_profiler_summary_skips_stale_windows_and_loop_wrappers():
    s = P.profiler_summary([win(T, 0.02), win(T + 15, 0.03), win(T + 30, 0.5, stale=True)])
    assert s is not None and s.last_end == T + 15 and s.loop_p50_s == pytest.approx(0.025)
    assert s.top_function == "run_batch"  # event_loop_overlap wraps the whole loop
    st = s.to_status()
    assert st.loop_p50 == "25.0ms" and st.loop_p95 == "30.0ms" and st.last_sample_time == "2027-01-15T08:00:15Z"
    assert P.profiler_summary([win(T, stale=True)]) is None


def test_profiler_status_first_summary_then_only_real_changes():
    first = P.profiler_status(None, [win(T)])
    assert first is not None and first.loop_p50 == "21.4ms"
    # 2% noise and a newer window: what is shown stays (no write).
    assert P.profiler_status(first, [win(T + 15, 0.0218)]) is first
    # 10% slower: news.
    moved = P.profiler_status(first, [win(T + 30, 0.0236)])
    assert moved is not first and moved.loop_p50 == "23.6ms" and moved.last_sample_time == "2027-01-15T08:00:30Z"
    # p95 appearing or vanishing is news too.
    assert P.profiler_status(first, [win(T + 15, p95=None)]).loop_p95 is None


def test_profiler_status_top_function_needs_a_margin():
    first = P.profiler_status(None, [win(T, shares={"run_batch": 0.30, "hash_feature": 0.29})])
    assert first.top_function == "run_batch"
    close = P.profiler_status(first, [win(T + 15, shares={"run_batch": 0.30, "hash_feature": 0.31})])
    assert close is first
    far = P.profiler_status(first, [win(T + 15, shares={"run_batch": 0.30, "hash_feature": 0.40})])
    assert far.top_function == "hash_feature"
    gone = P.profiler_status(first, [win(T + 15, shares={"hash_feature": 0.31})])
    assert gone.top_function == "hash_feature"


def test_profiler_status_refreshes_and_handles_what_it_cannot_read():
    first = P.profiler_status(None, [win(T)], refresh_s=600)
    assert P.profiler_status(first, [win(T + 599)], refresh_s=600) is first
    assert P.profiler_status(first, [win(T + 600)], refresh_s=600).last_sample_time == "2027-01-15T08:10:00Z"
    odd = api.ProfilerStatus(last_sample_time="2027-01-15T08:00:00Z", loop_p50="fast", top_function="run_batch")
    assert P.profiler_status(odd, [win(T + 15)]).loop_p50 == "21.4ms"
    assert P.profiler_status(first, []) is first and P.profiler_status(None, []) is None


def test_margin_resolvable_follows_the_gate_s_warning_during_a_rollout():
    def cond(**kw):
        conds = S.health_conditions(S.Health(want=2, ready=2, **kw))
        return next(((c.status, c.reason, c.message) for c in conds if c.type == "MarginResolvable"), None)

    assert cond() is None  # no rollout: no condition
    assert cond(rollout_phase="Analysing", rollout_analyses=0)[:2] == (None, "NotAnalysing")
    assert cond(rollout_phase="Analysing", rollout_analyses=3)[:2] == (True, "WithinResolution")
    warned = cond(rollout_phase="Analysing", rollout_analyses=3, rollout_warning="pods differ by 3.0% (sd)")
    assert warned == (False, "PodSpreadTooLarge", "pods differ by 3.0% (sd)")
    assert cond(rollout_phase="Promoted", rollout_analyses=9, rollout_warning="x")[:2] == (None, "NotAnalysing")


def test_an_expand_ceiling_warning_says_nothing_of_the_margin():
    cap = "expandCeiling.loopLatency 3.0% is below the 14.9% one canary pod's measured noise calls for: ..."

    def margin(warning: str) -> tuple:
        r = api.RolloutStatus(revision="r2", phase="Analysing", analyses=3, warning=warning)
        h = S.running_health(O.Observed(pods=()), want=1, rollout=r, ipc_active=None)
        return next((c.status, c.reason, c.message) for c in S.health_conditions(h) if c.type == "MarginResolvable")

    assert margin(cap)[:2] == (True, "WithinResolution")
    assert margin(f"pods differ by 3.0% (sd)\n{cap}") == (False, "PodSpreadTooLarge", "pods differ by 3.0% (sd)")


# ---- failure reasons: what keeps pods from serving, from their real status shapes


def _pod(name: str, *, waiting: str | None = None, message: str = "", last: dict | None = None, restarts: int = 0,
         ready: bool = False) -> O.PodInfo:
    cs = {"name": "sglang", "ready": ready, "restartCount": restarts,
          "state": {"waiting": {"reason": waiting, "message": message}} if waiting else {"running": {}}}
    if last:
        cs["lastState"] = {"terminated": last}
    body = {"metadata": {"name": name, "labels": {}},
            "status": {"phase": "Pending" if not ready else "Running", "containerStatuses": [
                {"name": "profiler", "ready": True, "restartCount": 0, "state": {"running": {}}}, cs],
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
    return O.PodInfo.from_body(body)


def test_an_image_that_cannot_be_pulled_is_ready_false_and_degraded_with_the_kubelets_message():
    obs = O.Observed(pods=(_pod("p0", waiting="ImagePullBackOff", message='Back-off pulling image "lmsys/sglang:nope"'),))
    h = S.running_health(obs, want=1, rollout=None, ipc_active=None)
    conds = {c.type: c for c in S.health_conditions(h)}
    assert (conds["Ready"].status, conds["Ready"].reason) == (False, "ImagePullFailed")
    assert (conds["Degraded"].status, conds["Degraded"].reason) == (True, "ImagePullFailed")
    assert conds["Ready"].message == 'pod p0: container sglang: ImagePullBackOff: Back-off pulling image "lmsys/sglang:nope"'
    assert S.summary_phase(h) == "Failed"


def test_a_crash_loop_names_the_last_exit_and_the_last_log_line_and_oomkilled_is_its_own_reason():
    log = "Loading weights...\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    crash = _pod("p1", waiting="CrashLoopBackOff", restarts=4,
                 last={"reason": "Error", "exitCode": 1, "message": log,
                       "startedAt": "2026-12-04T10:00:00Z", "finishedAt": "2026-12-04T10:01:00Z"})
    assert crash.problem == ("CrashLoopBackOff", "container sglang restarted 4 times; last exit: Error (exit code 1): "
                             "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert crash.last_run_s == 60.0
    oom = _pod("p2", waiting="CrashLoopBackOff", restarts=1, last={"reason": "OOMKilled", "exitCode": 137})
    assert oom.problem is not None and oom.problem[0] == "OOMKilled"
    h = S.running_health(O.Observed(pods=(oom, crash)), want=2, rollout=None, ipc_active=None)
    assert h.failure is not None and h.failure[0] == "CrashLoopBackOff"  # the first failing pod by name: p1


def test_a_container_killed_after_its_whole_startup_budget_is_startup_budget_exhausted():
    slow = _pod("p0", waiting="CrashLoopBackOff", restarts=2,
                last={"reason": "Error", "exitCode": 137,
                      "startedAt": "2026-12-04T10:00:00Z", "finishedAt": "2026-12-04T10:20:05Z"})
    assert S.failure(O.Observed(pods=(slow,)), startup_budget_s=1200)[0] == "StartupBudgetExhausted"
    assert S.failure(O.Observed(pods=(slow,)), startup_budget_s=3600)[0] == "CrashLoopBackOff"  # died on its own
    quick = _pod("p0", waiting="CrashLoopBackOff", restarts=2,
                 last={"reason": "Error", "exitCode": 137,
                       "startedAt": "2026-12-04T10:00:00Z", "finishedAt": "2026-12-04T10:00:30Z"})
    assert S.failure(O.Observed(pods=(quick,)), startup_budget_s=1200)[0] == "CrashLoopBackOff"


def test_a_replicaset_that_cannot_create_pods_is_failed_create_before_anything_a_pod_says():
    dep = {"status": {"conditions": [
        {"type": "Available", "status": "False"},
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
         "message": 'pods "svc-7d9f-x" is forbidden: violates PodSecurity "baseline:latest": non-default '
                    'capabilities (container "profiler" must not include "SYS_PTRACE")'}]}}
    obs = O.Observed(deployments={"stable": dep}, pods=(_pod("p0", waiting="ImagePullBackOff"),))
    h = S.running_health(obs, want=1, rollout=None, ipc_active=None)
    assert h.failure is not None and h.failure[0] == "FailedCreate" and "SYS_PTRACE" in h.failure[1]
    ready = next(c for c in S.health_conditions(h) if c.type == "Ready")
    assert ready.reason == "FailedCreate"


def test_a_ready_pod_or_one_still_starting_reports_no_failure():
    assert _pod("p0", ready=True).problem is None
    assert _pod("p0", waiting="ContainerCreating").problem is None
    h = S.running_health(O.Observed(pods=(_pod("p0", waiting="ContainerCreating"),)), want=1, rollout=None,
                         ipc_active=None)
    assert h.failure is None and next(c for c in S.health_conditions(h) if c.type == "Ready").reason == "ReplicasNotReady"


def test_a_failure_flip_posts_one_warning_event_and_the_recovery_a_normal_one():
    now = datetime(2026, 12, 4, tzinfo=UTC)
    bad = S.running_health(O.Observed(pods=(_pod("p0", waiting="ErrImagePull", message="not found"),)), want=1,
                           rollout=None, ipc_active=None)
    st = S.status_body(S.build_status({}, bad, generation=1, now=now))
    events = C.events_for(C.transitions([], st["conditions"]))
    assert [e[:2] for e in events if e[0] == "Warning"] == [("Warning", "ImagePullFailed")]
