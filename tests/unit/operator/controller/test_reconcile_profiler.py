"""status.profiler and canary analysis through reconcile, with fake sidecars behind the SidecarReader:
sidecars are read about once per window, a dead one costs one timeout per window (backing off), and the
profiler status is rewritten only when what a user sees changes."""

from __future__ import annotations

from prometheus_client import REGISTRY

from vlm_operator.api.settings import Settings
from vlm_operator.desired import builders
from vlm_testing.fakekube import ROLLOUT, T0, SidecarCluster, place, ready


def names(c: SidecarCluster) -> list[str]:
    return [p.name for p in c.kube.pods("svc")]


def test_profiler_summary_is_written_once_and_a_steady_service_writes_nothing_after():
    c = SidecarCluster()
    t = ready(c)
    p = c.status["profiler"]
    assert p["loopP50"] == "20.0ms" and p["loopP95"] == "26.0ms" and p["topFunction"] == "run_batch"
    c.kube.reset_writes()
    for i in range(1, 41):  # 10 minutes of resyncs: new windows every 15 s, values within +-1%
        c.run(t + 15 * i)
    assert c.kube.writes == []
    # Each pod's sidecar read about once per window (40 windows), never once per resync plus retries.
    assert all(35 <= n <= 42 for n in c.sidecars.calls.values()), c.sidecars.calls


def test_a_real_change_is_written_within_one_interval_and_at_most_once_per_interval():
    slow = {"on": False}
    c = SidecarCluster(loop=lambda pod: 0.030 if slow["on"] else 0.020)
    t = ready(c)
    c.kube.reset_writes()
    slow["on"] = True
    for i in range(1, 9):
        c.run(t + 7.5 * i)  # resync twice per telemetry interval
    writes = [w for w in c.kube.written("status") if "profiler" in w.body]
    assert 1 <= len(writes) <= 3  # the median over 4 windows moves in steps as the slow windows come in
    assert 29.0 <= float(c.status["profiler"]["loopP50"].removesuffix("ms")) <= 31.0
    times = [w.body["profiler"]["lastSampleTime"] for w in writes]
    assert len(set(times)) == len(times)  # never two writes for the same window


def test_two_close_functions_do_not_flap_topfunction():
    # The hottest function alternates between two that differ by 1 point of loop time.
    c = SidecarCluster(top=lambda k: ("run_batch", 0.30) if k % 2 else ("hash_feature", 0.31))
    t = ready(c)
    first = c.status["profiler"]["topFunction"]
    c.kube.reset_writes()
    for i in range(1, 21):
        c.run(t + 15 * i)
    assert c.profiler_writes() == 0 and c.status["profiler"]["topFunction"] == first


def test_lastsampletime_is_refreshed_at_the_refresh_setting():
    c = SidecarCluster(settings=Settings(profiler_refresh_seconds=120))
    t = ready(c)
    c.kube.reset_writes()
    for i in range(1, 21):  # 300 s
        c.run(t + 15 * i)
    assert c.profiler_writes() == 2  # at ~120 s and ~240 s


def test_dead_sidecars_cost_one_timeout_per_window_then_back_off_and_the_status_says_nothing_new():
    c = SidecarCluster()
    c.run(T0 - 30)
    place(c, T0 - 20)
    c.sidecars.dead = set(names(c))
    assert len(c.sidecars.dead) == 2 and c.sidecars.calls == {}
    for i in range(40):  # 10 minutes of 15 s resyncs
        c.run(T0 + 1 + 15 * i)
    # Tried at 0, 15, 45, 105, 225, 345, 465, 585 s (1, 2, 4, 8, 8, ... intervals): 8 per pod, not 40.
    assert c.sidecars.calls == {n: 8 for n in names(c)}
    assert "profiler" not in c.status  # unavailable is not a summary


def test_a_dead_pod_does_not_hide_the_live_one_and_comes_back_after_its_backoff():
    c = SidecarCluster(loop=lambda pod: 0.020)
    c.run(T0 - 30)
    place(c, T0 - 20)
    first, second = names(c)
    assert c.sidecars.calls == {}
    c.sidecars.dead = {second}
    c.run(T0 + 1)
    assert c.status["profiler"]["loopP50"] == "20.0ms"
    c.sidecars.dead = set()
    for i in range(1, 5):
        c.run(T0 + 1 + 15 * i)
    # Failed at 1 s, so not tried again before its next window (16 s); then read once per window like the other.
    assert c.sidecars.calls == {first: 5, second: 5}


def start_analysis(c: SidecarCluster) -> float:
    """Stable ready, then a new revision: the canary pod up next to the stable pods (a free GPU on their node:
    a surge; compared with the stable pods, the default baseline) and analysing. Returns the time."""
    t = ready(c)
    c.kube.update_spec("svc", {**ROLLOUT, "sglang": {"ipcCache": {"mode": "Off"}}})
    c.run(t + 10)
    place(c, t + 15)
    c.run(t + 20)
    assert c.status["rollout"]["phase"] == "Analysing", c.status["rollout"]
    assert c.status["rollout"]["baseline"] == "Stable"
    assert sorted(p.role for p in c.kube.pods("svc")) == [builders.ROLE_CANARY, builders.ROLE_STABLE,
                                                          builders.ROLE_STABLE]
    return t + 20


def canary_pod(c: SidecarCluster, pod: str) -> bool:
    """Is `pod` one of the canary revision's (its Deployment's name, then the pod's number)?"""
    rev = c.status.get("canaryRevision") or (c.status.get("rollout") or {}).get("revision")
    return bool(rev) and pod.rsplit("-", 1)[0] == f"svc-{rev}"


def test_unreachable_canary_sidecars_are_signals_unavailable_never_a_pass():
    c = SidecarCluster(ROLLOUT, gpus=8)
    t = start_analysis(c)
    c.sidecars.dead = {p.name for p in c.kube.pods("svc") if p.role == builders.ROLE_CANARY}
    (dead,) = c.sidecars.dead
    for i in range(1, 9):
        c.run(t + 60 * i)
    r = c.status["rollout"]
    assert r["phase"] == "Analysing" and r["analyses"] >= 1
    assert "no profiler sidecar of revision" in r["message"] and dead in r["message"]
    assert all(s.get("verdict") != "pass" for s in r.get("signals", []))


def test_a_slower_canary_is_rolled_back_through_reconcile():
    c = SidecarCluster(ROLLOUT, gpus=8)
    c.sidecars.loop = lambda pod: 0.030 if canary_pod(c, pod) else 0.020
    t = start_analysis(c)
    for i in range(1, 11):
        c.run(t + 60 * i)
        if c.status["rollout"]["phase"] == "RolledBack":
            break
    r = c.status["rollout"]
    assert r["phase"] == "RolledBack", r
    assert c.status["phase"] == "RolledBack"
    stable = c.status["stableRevision"]
    for i in range(1, 4):  # the canary's pod removed (it was a surge: the stable pods all stayed)
        c.kube.settle("svc")
        c.run(t + 600 + 15 * i)
    assert set(c.kube.deployments()) == {stable}  # the canary's Deployment deleted once it has no pod
    assert [p.revision for p in c.kube.pods("svc")] == [stable, stable]
    assert c.status["stableRevision"] == stable and c.status["rollout"]["phase"] == "RolledBack"
    # One Event per rollback: the rollout's own, not a second one for the Degraded condition's flip.
    assert [e[1] for e in c.events].count("CanaryRolledBack") == 1, c.events
    labels = {"namespace": "ns", "vlmservice": "svc", "revision": r["revision"]}
    info = [s for m in REGISTRY.collect() if m.name == "vlm_operator_canary_rollback_info" for s in m.samples
            if all(s.labels.get(k) == v for k, v in labels.items())]
    assert [s.value for s in info] == [1.0]
