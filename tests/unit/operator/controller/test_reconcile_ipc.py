"""IPCCacheActive from what the pods do: the flags' reason until a window with feature traffic, then
ObservedInProfile or NotObserved (a Warning Event and vlm_operator_ipc_cache_verified 0), through reconcile
with fake sidecars; the pure pieces (window parsing, the observation, the carry rules) below."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY

from vlm_operator.analysis import gate
from vlm_operator.analysis import profile as P
from vlm_operator.status import conditions as C
from vlm_testing.fakekube import SPEC, SidecarCluster, ready


def traffic(state: dict):
    """Sidecar windows' IPC fields from `state`: features (bool), reopen (the pods re-opening handles, by the number
    their ReplicaSet gave them: `<svc>-<revision>-<n>`, 1 and 2 for the first two)."""

    def extra(pod: str, k: int) -> dict:
        if not state["features"]:
            return {"feature_transport_share": 0.0, "ipc_handle_reopen_share": 0.0, "feature_transport_samples": 0}
        reopen = any(pod.endswith(f"-{n}") for n in state["reopen"])
        return {"feature_transport_share": 0.12, "ipc_handle_reopen_share": 0.11 if reopen else 0.0,
                "feature_transport_samples": 600}

    return extra


def ipc(c: SidecarCluster) -> dict:
    return next(x for x in c.status["conditions"] if x["type"] == C.IPC_CACHE_ACTIVE)


def verified(name: str = "svc") -> float | None:
    return REGISTRY.get_sample_value("vlm_operator_ipc_cache_verified", {"namespace": "ns", "vlmservice": name})


def test_flags_reason_until_feature_traffic_then_observed_in_profile_and_kept_through_quiet_windows():
    state = {"features": False, "reopen": set()}
    c = SidecarCluster(extra=traffic(state))
    t = ready(c)
    assert (ipc(c)["status"], ipc(c)["reason"]) == ("True", "Enabled")  # text only: nothing seen yet
    assert verified() is None
    state["features"] = True
    c.run(t + 15)
    cond = ipc(c)
    assert (cond["status"], cond["reason"]) == ("True", "ObservedInProfile"), cond
    assert cond["message"].startswith(f"revision {c.status['stableRevision']}: ")
    assert verified() == 1.0
    state["features"] = False  # a text-only minute, then unreachable sidecars: the verdict stands
    for i in range(2, 8):
        c.run(t + 15 * i)
    c.sidecars.dead = {p.name for p in c.kube.pods("svc")}
    for i in range(8, 12):
        c.run(t + 15 * i)
    assert ipc(c)["reason"] == "ObservedInProfile"
    assert not [e for e in c.events if e[1] == C.IPC_NOT_OBSERVED_EVENT]


def test_a_pod_told_to_cache_that_reopens_handles_is_not_observed_with_one_warning():
    state = {"features": True, "reopen": {2}}
    c = SidecarCluster(extra=traffic(state))
    t = ready(c)
    good, bad = (p.name for p in c.kube.pods("svc"))
    assert bad.endswith("-2") and not good.endswith("-2")
    c.run(t + 15)
    cond = ipc(c)
    assert (cond["status"], cond["reason"]) == ("False", "NotObserved"), cond
    assert bad in cond["message"] and good not in cond["message"]
    warnings = [e for e in c.events if e[1] == C.IPC_NOT_OBSERVED_EVENT]
    assert len(warnings) == 1 and warnings[0][0] == "Warning" and bad in warnings[0][2]
    assert verified() == 0.0
    c.kube.reset_writes()
    for i in range(2, 10):  # steady: the verdict is not rewritten and the Warning not repeated
        c.run(t + 15 * i)
    assert c.kube.writes == []
    assert len([e for e in c.events if e[1] == C.IPC_NOT_OBSERVED_EVENT]) == 1
    state["reopen"] = set()  # fixed (e.g. the image's env): observed again
    c.run(t + 15 * 10)
    assert (ipc(c)["status"], ipc(c)["reason"]) == ("True", "ObservedInProfile")
    assert verified() == 1.0


def test_cache_switched_off_by_spec_keeps_the_flags_reason_whatever_the_profile():
    c = SidecarCluster({**SPEC, "sglang": {"ipcCache": {"mode": "Off"}}}, extra=traffic({"features": True, "reopen": {1}}))
    t = ready(c)
    c.run(t + 15)
    assert (ipc(c)["status"], ipc(c)["reason"]) == ("False", "DisabledBySpec")
    assert not [e for e in c.events if e[1] == C.IPC_NOT_OBSERVED_EVENT]


def test_sidecars_without_the_ipc_fields_leave_the_flags_reason():
    c = SidecarCluster()  # today's windows: no IPC keys at all
    t = ready(c)
    c.run(t + 15)
    assert ipc(c)["reason"] == "Enabled"


@pytest.mark.parametrize("bad", [None, "x", -0.1, 3.0, float("nan"), True, [], {}])
def test_window_parses_the_ipc_fields_tolerantly(bad):
    samples = -1 if bad == 3.0 else bad  # 3 samples is a count; a share of 3 is not
    w = gate.Window.from_sidecar("r", "p", {"feature_transport_share": bad, "ipc_handle_reopen_share": bad,
                                            "feature_transport_samples": samples})
    assert (w.feature_transport_share, w.ipc_handle_reopen_share, w.feature_transport_samples) == (None, None, None)
    good = gate.Window.from_sidecar("r", "p", {"feature_transport_share": 1.004, "ipc_handle_reopen_share": "0.5",
                                               "feature_transport_samples": 12.0})
    assert (good.feature_transport_share, good.ipc_handle_reopen_share, good.feature_transport_samples) == (1.0, 0.5, 12)
    assert gate.Window.from_sidecar("r", "p", {}).feature_transport_share is None


def win(pod: str, feature: float | None, reopen: float | None, samples: int | None = 100, stale: bool = False):
    return gate.Window(revision="r", pod=pod, id="1", end=1.0, samples=1000, loop_mean_seconds=0.02,
                       loop_p95_seconds=0.03, stage_shares={}, function_shares={}, stale=stale,
                       feature_transport_share=feature, ipc_handle_reopen_share=reopen,
                       feature_transport_samples=samples)


def test_observation_needs_feature_traffic_and_averages_per_pod():
    assert P.ipc_observation([]) is None
    assert P.ipc_observation([win("a", 0.0, 0.0), win("a", None, None), win("a", 0.2, 0.2, stale=True),
                              win("a", 0.2, 0.2, samples=2)]) is None
    obs = P.ipc_observation([win("a", 0.1, 0.0), win("a", 0.1, 0.01), win("b", 0.1, 0.09), win("c", 0.1, 0.0, None)])
    assert obs.windows == 4 and obs.reopening == ["b"]
    assert obs.reopen_fraction["a"] == pytest.approx(0.05)


def test_condition_carry_rules():
    obs_ok = P.ipc_observation([win("a", 0.1, 0.0)])
    obs_bad = P.ipc_observation([win("a", 0.1, 0.1)])
    flags = (True, "Enabled", "cache on.")
    kw = {"revision": "r2", "stable_revision": "r2", "current": None}
    assert P.ipc_condition(*flags, observation=None, **kw) == flags
    assert P.ipc_condition(*flags, observation=obs_ok, **kw)[:2] == (True, "ObservedInProfile")
    bad = P.ipc_condition(*flags, observation=obs_bad, **kw)
    assert bad[:2] == (False, "NotObserved") and bad[2].startswith("revision r2: ")
    current = {"type": C.IPC_CACHE_ACTIVE, "status": "False", "reason": "NotObserved", "message": bad[2]}
    assert P.ipc_condition(*flags, observation=None, **{**kw, "current": current}) == bad  # kept
    # another revision's verdict, a rollout in progress, the cache not switched on: the flags
    assert P.ipc_condition(*flags, observation=None, **{**kw, "revision": "r3", "stable_revision": "r3",
                                                        "current": current}) == flags
    assert P.ipc_condition(*flags, observation=obs_bad, **{**kw, "stable_revision": "r1"}) == flags
    off = (False, "DisabledBySpec", "off.")
    assert P.ipc_condition(*off, observation=obs_bad, **kw) == off


def test_not_observed_is_a_warning_event():
    now = datetime(2027, 1, 1, tzinfo=UTC)
    before = C.merge([], [C.Cond(C.IPC_CACHE_ACTIVE, True, "Enabled", "on")], generation=1, now=now)
    after = C.merge(before, [C.Cond(C.IPC_CACHE_ACTIVE, False, "NotObserved", "revision r: pod a re-opens")],
                    generation=1, now=now)
    assert C.events_for(C.transitions(before, after)) == [
        ("Warning", "IPCCacheNotObserved", "IPCCacheActive=False: revision r: pod a re-opens")]
    back = C.merge(after, [C.Cond(C.IPC_CACHE_ACTIVE, True, "ObservedInProfile", "revision r: fine")],
                   generation=1, now=now)
    assert C.events_for(C.transitions(after, back)) == []
