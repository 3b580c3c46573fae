"""The kopf wiring in handlers: the resync timer's first run is spread over one interval per service, a
full interval after creation (the create handler reconciles then) and soon after an operator restart."""

from __future__ import annotations

import asyncio
import json
import os

import kopf
import pytest

from vlm_operator.api.names import PREFIX
from vlm_operator.controller import handlers as H
from vlm_operator.desired import builders as B

UIDS = [f"0000{i:04d}-5d2c-4a8e-9c1f-{i * 7919:012d}" for i in range(1000)]


@pytest.mark.parametrize("interval", [2.0, 15.0, 600.0])
def test_new_service_waits_one_interval_plus_its_phase(interval: float) -> None:
    delays = [H.first_resync_delay(u, interval, handled=False) for u in UIDS]
    assert all(interval <= d < 2 * interval for d in delays)


@pytest.mark.parametrize("interval", [2.0, 15.0, 600.0])
def test_restart_resyncs_within_one_interval(interval: float) -> None:
    delays = [H.first_resync_delay(u, interval, handled=True) for u in UIDS]
    lo = H.RESTART_RESYNC_DELAY_S
    assert all(lo <= d < lo + interval for d in delays)


def test_phase_is_fixed_per_uid_and_spread_over_the_interval() -> None:
    interval = 15.0
    again = [H.first_resync_delay(u, interval, handled=False) for u in UIDS]
    assert again == [H.first_resync_delay(u, interval, handled=False) for u in UIDS]
    # 1000 services created in the same second: every tenth of the interval gets about a tenth of the
    # first resyncs (a shared offset would put all 1000 in one bin).
    bins = [0] * 10
    for d in again:
        bins[int((d - interval) / interval * 10)] += 1
    assert min(bins) >= 60 and max(bins) <= 140, bins
    assert len({round(d, 6) for d in again}) > 990


def _body(annotations: dict[str, str]) -> kopf.Body:
    return kopf.Body({
        "apiVersion": "serving.vlmops.dev/v1alpha1", "kind": "VLMService",
        "metadata": {"name": "svc", "namespace": "ns", "uid": UIDS[0], "annotations": annotations},
        "spec": {"model": {"path": "m"}},
    })


def test_handled_is_read_from_kopfs_diffbase_annotation() -> None:
    key = f"{PREFIX}/last-applied-spec"
    fresh = _body({})
    seen = _body({key: json.dumps({"spec": {"model": {"path": "m"}}})})
    assert H.DIFFBASE.fetch(body=seen) is not None  # the key kopf itself writes
    interval = H.SETTINGS.resync_seconds
    assert H._first_resync_delay(uid=UIDS[0], body=fresh) == H.first_resync_delay(UIDS[0], interval, handled=False)
    assert H._first_resync_delay(uid=UIDS[0], body=seen) == H.first_resync_delay(UIDS[0], interval, handled=True)
    assert H._first_resync_delay(uid=UIDS[0], body=seen) < H._first_resync_delay(uid=UIDS[0], body=fresh)


def test_the_resync_timer_uses_the_spread_delay() -> None:
    timers = [h for h in kopf.get_default_registry()._spawning.get_all_handlers()
              if getattr(h, "interval", None) is not None and h.fn is H.reconcile_vlmservice]
    assert len(timers) == 1
    assert timers[0].initial_delay is H._first_resync_delay
    assert timers[0].interval == H.SETTINGS.resync_seconds


def test_no_handler_needs_a_finalizer() -> None:
    """The resync timer is registered without kopf's finalizer (kopf marks every timer as needing one): no
    VLMService gets `kopf.zalando.org/KopfFinalizerMarker`, so none is left Terminating without an operator."""
    reg = kopf.get_default_registry()
    spawning = reg._spawning.get_all_handlers()
    assert [h.fn for h in spawning] == [H.reconcile_vlmservice]
    assert all(not getattr(h, "requires_finalizer", None)
               for r in (reg._spawning, reg._changing, reg._watching) for h in r.get_all_handlers())
    assert H._without_finalizer(reg, H.reconcile_vlmservice) == 0  # already done at import


def test_a_deleted_service_is_forgotten_on_the_watch_event(monkeypatch: pytest.MonkeyPatch) -> None:
    forgotten = []
    monkeypatch.setattr(H.metrics, "forget", lambda ns, name: forgotten.append((ns, name)))

    class RT:
        def forget(self, uid: str) -> None:
            forgotten.append(uid)

    memo = kopf.Memo(rt=RT())
    H._locks["u1"] = H.threading.Lock()
    for type_, generation in ((None, 1), ("MODIFIED", 2)):
        asyncio.run(H.count_vlmservices(type=type_, name="svc", namespace="ns", memo=memo, uid="u1",
                                        meta=kopf.Meta({"metadata": {"generation": generation}})))
    assert memo.seen == {"u1"} and forgotten == []
    asyncio.run(H.count_vlmservices(type="DELETED", name="svc", namespace="ns", memo=memo, uid="u1",
                                    meta=kopf.Meta({"metadata": {"generation": 2}})))
    assert memo.seen == set() and forgotten == [("ns", "svc"), "u1"] and "u1" not in H._locks


def test_indexed_bodies_drop_managed_fields_and_keep_what_the_reconcile_compares() -> None:
    raw = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "svc", "namespace": "ns", "labels": {"a": "b"}, "annotations": {"x": "y"},
                     "managedFields": [{"manager": "vlm-operator", "fieldsV1": {"f:spec": {}}}]},
        "spec": {"replicas": 1}, "status": {"readyReplicas": 1},
    }
    packed = H.indexed(kopf.Body(raw))
    assert isinstance(packed, bytes) and len(packed) < len(json.dumps(raw))  # held compressed
    out = packed.unpack()
    assert "managedFields" not in out["metadata"]
    assert out["metadata"] == {k: v for k, v in raw["metadata"].items() if k != "managedFields"}
    assert out["spec"] == raw["spec"] and out["status"] == raw["status"]
    assert "managedFields" in raw["metadata"]  # kopf's own body is left as it was


def test_index_handlers_run_on_the_event_loop_not_behind_the_reconciles() -> None:
    """kopf sends a plain function to its handler thread pool, where index events waited behind every queued
    reconcile; a coroutine runs as the event arrives. Each returns its index entry."""
    import asyncio
    import inspect

    pod = {"metadata": {"name": "svc-0", "namespace": "ns", "labels": {B.LABEL_SERVICE: "svc"}},
           "spec": {}, "status": {}}
    dep = {"metadata": {"name": "svc-abc", "namespace": "ns", "labels": {B.LABEL_SERVICE: "svc",
                                                                        B.LABEL_REVISION: "abc"}}, "spec": {}}
    base = {"metadata": {"name": "svc-baseline", "namespace": "ns", "labels": {
        B.LABEL_SERVICE: "svc", B.LABEL_REVISION: "abc", B.LABEL_ROLE: B.ROLE_BASELINE}}, "spec": {}}
    for fn in (H.vlm_deployments, H.vlm_pods, H.vlm_services):
        assert inspect.iscoroutinefunction(fn), fn.__name__
    got = asyncio.run(H.vlm_deployments(namespace="ns", labels=dep["metadata"]["labels"], body=kopf.Body(dep)))
    (key, (rev, packed)), = got.items()  # a revision's Deployment: keyed by its revision
    assert key == ("ns", "svc") and rev == "abc" and packed.unpack()["metadata"]["name"] == "svc-abc"
    got = asyncio.run(H.vlm_deployments(namespace="ns", labels=base["metadata"]["labels"], body=kopf.Body(base)))
    (key, (rev, packed)), = got.items()  # the fresh baseline's (the stable revision's too): keyed by its role
    assert key == ("ns", "svc") and rev == B.ROLE_BASELINE and packed.unpack()["metadata"]["name"] == "svc-baseline"
    got = asyncio.run(H.vlm_pods(namespace="ns", labels=pod["metadata"]["labels"], body=kopf.Body(pod)))
    assert list(got) == [("ns", "svc")] and got[("ns", "svc")].name == "svc-0"
    got = asyncio.run(H.vlm_services(namespace="ns", name="svc", body=kopf.Body(dep)))
    assert list(got) == [("ns", "svc")]


def test_malloc_arenas_limited_unless_the_environment_says(monkeypatch: pytest.MonkeyPatch) -> None:
    from vlm_operator import __main__ as M

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert M._limit_malloc_arenas() is False
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    assert M._limit_malloc_arenas() is True  # glibc (this image) accepts M_ARENA_MAX


def test_malloc_trim_thread_runs_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """VLM_MALLOC_TRIM_SECONDS (default 30): a daemon thread hands glibc's free pages back; 0 starts none."""
    import threading

    from vlm_operator import __main__ as M
    from vlm_operator.api.settings import Settings

    assert Settings().malloc_trim_seconds == 30.0
    before = {t.name for t in threading.enumerate()}
    assert M._trim_malloc_periodically(0) is False
    assert "vlm-malloc-trim" not in {t.name for t in threading.enumerate()} - before
    assert M._trim_malloc_periodically(3600) is True  # glibc here; the thread sleeps for the test's life
    trim = [t for t in threading.enumerate() if t.name == "vlm-malloc-trim"]
    assert trim and all(t.daemon for t in trim)


def test_startup_applies_the_operator_settings_to_kopf(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf's own settings come from the operator's: handler threads, our annotation prefix, and the peering
    lifetime (VLM_PEERING_LIFETIME_SECONDS), which decides how soon a standby replica takes over."""

    class FakeKube:
        def __init__(self, *_: object) -> None:
            pass

        def crd_exists(self, _: str) -> bool:
            return False

    monkeypatch.setattr(H, "SETTINGS", H.SETTINGS.model_copy(update={"peering_lifetime_seconds": 20}))
    monkeypatch.setattr(H.kubeconn, "Connection", lambda **_: None)
    monkeypatch.setattr(H, "Kube", FakeKube)
    from kopf._core.engines import peering

    monkeypatch.setattr(peering, "random", peering.random)  # restored after the test
    settings, memo = kopf.OperatorSettings(), kopf.Memo()
    assert settings.peering.lifetime == 60  # kopf's default, before
    H.startup(settings=settings, memo=memo)
    assert settings.peering.lifetime == 20
    assert isinstance(peering.random, H._KeepaliveCadence) and peering.random.lifetime == 20
    assert settings.execution.max_workers == H.HANDLER_THREADS
    assert memo.rt.monitoring is False
    assert memo.webhook is None  # VLM_INJECTION off
    H.stop_webhook(memo=memo)


def test_startup_starts_the_injection_webhook_and_cleanup_stops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    started, stopped = [], []

    class FakeWebhook:
        def stop(self) -> None:
            stopped.append(self)

    monkeypatch.setattr(H, "SETTINGS", H.SETTINGS.model_copy(update={"injection": True,
                                                                     "webhook_namespace": "vlm-system"}))
    monkeypatch.setattr(H.kubeconn, "Connection", lambda **_: "conn")
    monkeypatch.setattr(H, "Kube", lambda *_: type("K", (), {"crd_exists": lambda self, _: False})())
    monkeypatch.setattr(H.webhook, "start", lambda s, c: started.append((s.injection, c)) or FakeWebhook())
    from kopf._core.engines import peering

    monkeypatch.setattr(peering, "random", peering.random)
    memo = kopf.Memo()
    H.startup(settings=kopf.OperatorSettings(), memo=memo)
    assert started == [(True, "conn")]
    H.stop_webhook(memo=memo)
    assert stopped == [memo.webhook]


def _keepalive_sleeps(lifetime: int, rounds: int, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The sleeps of kopf's own keep-alive loop between keep-alives (its touch and sleep replaced)."""
    import asyncio

    from kopf._core.engines import peering

    sleeps: list[float] = []
    touches: list[int | None] = []

    async def touch(*, lifetime: int | None = None, **_: object) -> None:
        touches.append(lifetime)

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == rounds:
            raise asyncio.CancelledError

    monkeypatch.setattr(peering, "touch", touch)
    monkeypatch.setattr(peering.asyncio, "sleep", sleep)
    settings = kopf.OperatorSettings()
    settings.peering.lifetime = lifetime
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(peering.keepalive(namespace="ns", resource=None, identity="me", settings=settings))
    assert touches == [None] * rounds + [0]  # one keep-alive per round, and the goodbye
    return sleeps


@pytest.mark.parametrize("lifetime", [15, 20, 60, 3600])
def test_keepalives_every_third_of_the_lifetime(lifetime: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf's loop sleeps lifetime minus 5-10 s (a keep-alive 5 s late would let a standby take over); after
    the operator's startup, at most a third of the lifetime, and not much less (no flood of PATCHes)."""
    import random

    from kopf._core.engines import peering

    monkeypatch.setattr(peering, "random", random)  # kopf's own; whatever was there is restored after the test
    before = _keepalive_sleeps(lifetime, 50, monkeypatch)
    assert min(before) >= lifetime - 10  # kopf's own cadence, as the docstring says
    H.keepalive_every_third_of(lifetime)
    after = _keepalive_sleeps(lifetime, 200, monkeypatch)
    third = lifetime // 3
    assert max(after) <= third and min(after) >= max(1, third - lifetime // 10), (lifetime, sorted(set(after)))
    assert len(set(after)) > 1 or lifetime < 20  # jittered, so replicas do not touch in step


@pytest.mark.parametrize("frames", ["0", "1"])
def test_memory_dump_on_sigusr1(tmp_path, monkeypatch: pytest.MonkeyPatch, frames: str) -> None:
    """VLM_TRACEMALLOC_DUMP (a bench diagnostic): on SIGUSR1 the RSS, a census of live objects by type and
    pymalloc's statistics; with VLM_TRACEMALLOC_FRAMES other than 0, the traced allocation sites too."""
    import signal
    import tracemalloc

    from vlm_operator import __main__ as M

    assert M._memory_dumps(None) is False
    monkeypatch.setenv("VLM_TRACEMALLOC_FRAMES", frames)
    was_tracing, old = tracemalloc.is_tracing(), signal.getsignal(signal.SIGUSR1)

    class Marker:  # a type of this test's own, so the census must have counted these
        pass

    try:
        assert M._memory_dumps(str(tmp_path / "dump")) is True
        keep = [Marker() for _ in range(5000)]
        os.kill(os.getpid(), signal.SIGUSR1)
        text = (tmp_path / "dump.1").read_text()
    finally:
        signal.signal(signal.SIGUSR1, old)
        if not was_tracing:
            tracemalloc.stop()
    assert len(keep) == 5000
    assert int(text.splitlines()[0].split()[1]) > 0  # rss_kib
    marker = next(ln for ln in text.splitlines() if ln.endswith("Marker"))
    assert int(marker.split()[2]) >= 5000, marker
    assert ("traced_mib" in text) is (frames != "0")
    if frames == "0":  # pymalloc's arena statistics (while tracing, pymalloc is behind tracemalloc's hooks)
        assert "arenas" in text


def test_the_diff_base_is_built_for_vlmservices_only() -> None:
    """kopf builds one for every event of every watched kind; only the VLMService's handlers use it."""
    pod = kopf.Body({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}})
    assert H.DIFFBASE.build(body=pod) is None
    svc = kopf.Body({"apiVersion": "serving.vlmops.dev/v1alpha1", "kind": "VLMService",
                     "metadata": {"name": "s", "annotations": {"serving.vlmops.dev/last-applied-spec": "{}"}},
                     "spec": {"replicas": 1}, "status": {"phase": "Ready"}})
    assert H.DIFFBASE.build(body=svc) == {"spec": {"replicas": 1}}
