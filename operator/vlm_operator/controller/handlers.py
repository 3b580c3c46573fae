"""kopf handlers: the only module that registers with kopf. Each handler is a few lines.

Owned Deployments, Pods and Services are held in kopf indexes (filled by
watches; of the PodMonitors and PrometheusRules, only which exist), so a
reconcile reads no object from the API server; it writes only
what differs. Every VLMService is reconciled on create, on update, and on a
timer (status refresh, drift repair, canary analysis). The timers of a fleet
are spread over the resync interval (`first_resync_delay`), so a thousand
services created at once are not all resynced at once, racing their own
creation.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import threading
import zlib
from typing import Any

import kopf

from vlm_operator.admission import webhook
from vlm_operator.api import metrics
from vlm_operator.api.errors import PermanentError, TemporaryError
from vlm_operator.api.names import (
    GROUP,
    KIND,
    LABEL_MANAGED_BY,
    LABEL_REVISION,
    LABEL_ROLE,
    LABEL_SERVICE,
    OPERATOR,
    PLURAL,
    PREFIX,
    ROLE_BASELINE,
    VERSION,
)
from vlm_operator.api.settings import Settings
from vlm_operator.cluster import connection as kubeconn
from vlm_operator.cluster.client import Kube
from vlm_operator.cluster.observed import HPAInfo, JobInfo, Observed, PodInfo
from vlm_operator.controller.reconcile import Runtime, Target, reconcile
from vlm_operator.desired import autoscaling
from vlm_operator.desired import builders as B
from vlm_operator.judge import server as judge_server

SETTINGS = Settings.from_env()
MANAGED = {LABEL_MANAGED_BY: OPERATOR}
_locks: dict[str, threading.Lock] = {}
log = logging.getLogger("vlm_operator")


class ServicesOnlyDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's record of the last spec it handled (an annotation on the service), built for VLMServices only.

    kopf builds the diff base (a deep copy of the body, less its status) for every event of every kind it
    watches, to find changes for handlers that react to changes; only the VLMService has such handlers. For the
    Pods, Deployments, Services and monitoring objects that only fill indexes the copy was thrown away, and in a
    burst of new services it was a sizeable share of the CPU of kopf's event loop (docs/benchmarks.md, "A diff
    base for VLMServices only"). kopf takes no diff base as nothing changed (and those kinds have no handler
    that would ask)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        if body.get("kind") != KIND:
            return None
        return super().build(body=body, extra_fields=extra_fields)


# Present on a service once the create handler has succeeded.
DIFFBASE = ServicesOnlyDiffBase(prefix=PREFIX, key="last-applied-spec")
RESTART_RESYNC_DELAY_S = 1.0
# Handler threads and API connections. A reconcile spends its time waiting for the API server (a few
# round trips), not on CPU, so 1000 services created at once need more than the default pool (CPUs + 4
# threads); the HTTP pool matches it, so no thread opens a connection of its own.
HANDLER_THREADS = SETTINGS.handler_threads


def first_resync_delay(uid: str, interval: float, *, handled: bool) -> float:
    """Seconds from the first sight of a service to its first timer run.

    A service not yet handled is being created: its create handler reconciles it now, so the timer waits
    one full interval more. A handled one (the operator restarted) is resynced soon. Both are offset by
    a phase in [0, interval) fixed by the uid, so the timers of services seen together fire spread over
    the interval instead of all in the same second."""
    phase = random.Random(uid).random() * interval
    return (RESTART_RESYNC_DELAY_S if handled else interval) + phase


def _first_resync_delay(uid: str, body: kopf.Body, **_: Any) -> float:
    return first_resync_delay(uid, SETTINGS.resync_seconds, handled=DIFFBASE.fetch(body=body) is not None)


class _KeepaliveCadence:
    """Stands in for the `random` module inside kopf's peering module (`keepalive_every_third_of`)."""

    def __init__(self, lifetime: int):
        self.lifetime = lifetime

    def randint(self, a: int, b: int) -> int:
        # kopf sleeps `lifetime - randint(5, 10)` between keep-alives: return what makes that a third of the
        # lifetime, less up to a tenth of it as jitter (kopf's own 5 s spread keeps replicas' keep-alives apart).
        third = max(1, self.lifetime // 3)
        return self.lifetime - max(1, third - random.randint(0, self.lifetime // 10))

    def __getattr__(self, name: str) -> Any:
        return getattr(random, name)


def keepalive_every_third_of(lifetime: int) -> None:
    """A replica's peering keep-alive every third of the lifetime, instead of kopf's lifetime minus 5-10 s.

    With kopf's cadence a keep-alive that arrives 5-10 s late (an API server under load, a CPU-throttled
    operator pod) lets a standby take over while the active replica still works: both act until the next
    keep-alive pauses the standby again, and the standby removes the active one from the KopfPeering. With a
    keep-alive every third of the lifetime, two in a row must be lost first (40 s late at the chart's 60 s).
    kopf has no setting for this: its peering module's `random` is replaced (pinned against kopf's
    keep-alive loop by tests/unit/operator/controller/test_handlers.py)."""
    from kopf._core.engines import peering

    peering.random = _KeepaliveCadence(lifetime)  # type: ignore[assignment]


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Keep kopf's own bookkeeping in annotations with our prefix; build the API client."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = DIFFBASE
    settings.posting.level = logging.WARNING  # our own Events only; kopf still reports handler failures
    settings.watching.server_timeout = 300
    settings.execution.max_workers = HANDLER_THREADS
    settings.peering.lifetime = SETTINGS.peering_lifetime_seconds  # used with --peering only
    keepalive_every_third_of(settings.peering.lifetime)
    kube = Kube(kubeconn.Connection(pool_size=HANDLER_THREADS), SETTINGS.field_manager)
    memo.rt = Runtime(kube=kube, settings=SETTINGS, monitoring=kube.crd_exists("podmonitors.monitoring.coreos.com"),
                      keda=kube.crd_exists(autoscaling.SCALED_OBJECTS_CRD))
    if SETTINGS.judge_port:
        memo.judge = judge_server.start(kube.conn, memo.rt.sidecars, SETTINGS)
    log.info("vlm-operator started (monitoring CRDs: %s, KEDA: %s)", memo.rt.monitoring, memo.rt.keda)
    # Its own connection: reviews must not wait behind reconciles for a pooled one.
    memo.webhook = webhook.start(SETTINGS, kubeconn.Connection(pool_size=2)) if SETTINGS.injection else None


@kopf.on.cleanup()
def stop_webhook(memo: kopf.Memo, **_: Any) -> None:
    """Stop answering admission reviews as the operator stops: the API server then finds the port closed and
    creates the pod without the sidecar at once (failurePolicy Ignore), instead of waiting for its timeout."""
    hook = getattr(memo, "webhook", None)
    if hook is not None:
        hook.stop()


class Packed(bytes):
    """An indexed object as the reconcile compares it, kept as compressed JSON: without
    metadata.managedFields (a large part of a Deployment's size), and packed because decoded it takes several
    times its JSON in Python objects and one is held for every owned object. Unpacked per reconcile, for that
    service only. (docs/benchmarks.md, "Indexed objects kept packed": at full scale the RSS is set by the
    imports and the allocator, not by these.)"""

    __slots__ = ()

    def unpack(self) -> dict[str, Any]:
        return json.loads(zlib.decompress(self))


def indexed(body: kopf.Body) -> Packed:
    out = dict(body)
    out["metadata"] = {k: v for k, v in body.get("metadata", {}).items() if k != "managedFields"}
    return Packed(zlib.compress(json.dumps(out, separators=(",", ":")).encode(), 1))


# The index handlers are coroutines: kopf runs a plain function in its handler thread pool, behind every
# queued reconcile, so in a burst of new services the indexes fell far behind the operator's own writes
# (docs/benchmarks.md, "Index handlers on kopf's event loop") while each waiting event held its decoded
# object. Each of these is a fraction of a millisecond of CPU and does no I/O and takes no lock, so it runs on
# the event loop as the event arrives.
@kopf.index("apps", "v1", "deployments", labels=MANAGED)
async def vlm_deployments(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict:
    # keyed by revision (the fresh baseline's by its role: it has the stable revision's)
    key = ROLE_BASELINE if labels.get(LABEL_ROLE) == ROLE_BASELINE else labels.get(LABEL_REVISION)
    return {(namespace, labels.get(LABEL_SERVICE)): (key, indexed(body))}


@kopf.index("", "v1", "pods", labels=MANAGED)
async def vlm_pods(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict:
    return {(namespace, labels.get(LABEL_SERVICE)): PodInfo.from_body(body)}


@kopf.index("batch", "v1", "jobs", labels=MANAGED)
async def vlm_jobs(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict:
    # the load hook's Jobs (spec.rollout.load): small summaries, not bodies
    return {(namespace, labels.get(LABEL_SERVICE)): JobInfo.from_body(body)}


@kopf.index("", "v1", "services", labels=MANAGED)
async def vlm_services(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict:
    return {(namespace, name): indexed(body)}


# The monitoring objects are indexed by kind alone (their bodies are not compared: they are re-applied at each
# spec generation), so the reconcile knows which exist: a missing one is created (see act._monitoring).
# kopf watches these only where the Prometheus Operator's CRDs are installed.
@kopf.index(B.MONITORING_GROUP, B.MONITORING_VERSION, "podmonitors", labels=MANAGED)
async def vlm_podmonitors(namespace: str, labels: dict, **_: Any) -> dict:
    return {(namespace, labels.get(LABEL_SERVICE)): "PodMonitor"}


@kopf.index(B.MONITORING_GROUP, B.MONITORING_VERSION, "prometheusrules", labels=MANAGED)
async def vlm_prometheusrules(namespace: str, labels: dict, **_: Any) -> dict:
    return {(namespace, labels.get(LABEL_SERVICE)): "PrometheusRule"}


# The HPA KEDA makes for a ScaledObject (spec.autoscaling) carries scaledobject.keda.sh/name: the operator's
# ScaledObject is named like its VLMService. Its counts and metrics go into status.autoscaling.
@kopf.index("autoscaling", "v2", "horizontalpodautoscalers", labels={autoscaling.HPA_LABEL: kopf.PRESENT})
async def vlm_hpas(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict:
    return {(namespace, labels.get(autoscaling.HPA_LABEL)): HPAInfo.from_body(body)}


def _observed(key: tuple[str, str], deployments: kopf.Index, pods: kopf.Index, services: kopf.Index,
              *monitoring: kopf.Index, jobs: kopf.Index, hpas: kopf.Index | None = None) -> Observed:
    service = next(iter(services.get(key, [])), None)
    return Observed(
        jobs={j.name: j for j in jobs.get(key, [])},
        deployments={rev: packed.unpack() for rev, packed in deployments.get(key, [])},
        pods=tuple(pods.get(key, [])),
        service=service.unpack() if service is not None else None,
        monitoring=frozenset(kind for index in monitoring for kind in index.get(key, [])),
        hpa=next(iter(hpas.get(key, [])), None) if hpas is not None else None,
    )


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.timer(GROUP, VERSION, PLURAL, interval=SETTINGS.resync_seconds,
            initial_delay=_first_resync_delay)
def reconcile_vlmservice(
    name: str, namespace: str, uid: str, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status, body: kopf.Body,
    memo: kopf.Memo, vlm_deployments: kopf.Index, vlm_pods: kopf.Index, vlm_services: kopf.Index,
    vlm_podmonitors: kopf.Index, vlm_prometheusrules: kopf.Index, vlm_jobs: kopf.Index, vlm_hpas: kopf.Index,
    **_: Any,
) -> None:
    """Create, update and periodic resync share one idempotent reconcile."""
    target = Target(name, namespace, uid, meta.get("generation"), dict(spec), dict(status), dict(meta.annotations),
                    meta.get("resourceVersion"))
    with _locks.setdefault(uid, threading.Lock()):
        # Inside the lock: a handler that waited for another one sees the objects that one made.
        observed = _observed((namespace, name), vlm_deployments, vlm_pods, vlm_services,
                             vlm_podmonitors, vlm_prometheusrules, jobs=vlm_jobs, hpas=vlm_hpas)
        try:
            reconcile(memo.rt, target, observed, lambda t, r, m: kopf.event(body, type=t, reason=r, message=m))
        except TemporaryError as e:
            raise kopf.TemporaryError(str(e), delay=e.delay) from e
        except PermanentError as e:
            raise kopf.PermanentError(str(e)) from e


def forget_vlmservice(namespace: str, name: str, uid: str, memo: kopf.Memo) -> None:
    """Owned objects go with the owner (garbage collection); only our metric series and the in-memory
    profiler bookkeeping need removing (the sidecar cache drops pods nobody asks about by itself)."""
    metrics.forget(namespace, name)
    _locks.pop(uid, None)
    rt = getattr(memo, "rt", None)
    if rt is not None:
        rt.forget(uid)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def count_vlmservices(type: str | None, name: str, namespace: str, memo: kopf.Memo, uid: str,
                            **_: Any) -> None:
    """Gauge of managed services (the watch's own stream, no extra reads); a deleted service is forgotten.
    The watch's DELETED event is the one sign of a deletion every service gives: VLMServices carry no
    finalizer of ours (`_without_finalizer`), so most go without ever being marked for deletion first.
    A coroutine, like the index handlers: as a plain function kopf queued every VLMService event, body
    and all, behind the reconciles in its handler threads. It does no I/O and takes only locks that are
    never held across I/O (dict updates), so it runs on the event loop as the event arrives."""
    seen = memo.setdefault("seen", set())
    if type == "DELETED":
        seen.discard(uid)
        forget_vlmservice(namespace, name, uid, memo)
    else:
        seen.add(uid)
    metrics.MANAGED.set(len(seen))


def _without_finalizer(registry: kopf.OperatorRegistry, fn: Any) -> int:
    """kopf marks every timer as needing a finalizer, so that it can stop the timer before the object goes,
    and adds `kopf.zalando.org/KopfFinalizerMarker` to each object. For the resync timer that buys nothing
    (a reconcile of a service that is gone finds nothing to do) and costs: one more write per new service, a
    VLMService deleted while the operator is down stays Terminating until it is back, and uninstalling the
    operator with its CRD left every VLMService and the CRD Terminating for good. kopf removes the finalizer
    it no longer needs from services that carry one. Returns how many handlers changed (kopf's registry
    has no public way to say this: checked by tests/unit/operator/controller/test_handlers.py)."""
    spawning = registry._spawning
    changed = 0
    for i, h in enumerate(spawning._handlers):
        if h.fn is fn and h.requires_finalizer:
            spawning._handlers[i] = dataclasses.replace(h, requires_finalizer=False)
            changed += 1
    return changed


_without_finalizer(kopf.get_default_registry(), reconcile_vlmservice)
