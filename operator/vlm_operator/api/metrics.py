"""The operator's own Prometheus metrics (served on VLM_METRICS_PORT at /metrics).

    vlm_operator_reconcile_duration_seconds{result}   histogram
    vlm_operator_errors_total{reason}                 counter
    vlm_operator_api_writes_total{verb}               counter (every write request we send)
    vlm_operator_rollouts_total{result}               counter: promoted, rolled_back, aborted
    vlm_operator_managed_services                     gauge
    vlm_operator_rollout_phase{namespace,vlmservice,phase}  1 for the current phase
    vlm_operator_signal_delta{namespace,vlmservice,signal}  last relative delta canary vs baseline
    vlm_operator_ipc_cache_active{namespace,vlmservice}     1/0: the operator switched the cache on
    vlm_operator_ipc_cache_verified{namespace,vlmservice}   1/0: the pods' profiles show it working / not
    vlm_operator_canary_rollback_info{namespace,vlmservice,revision,signal,function}  1 while rolled back
    vlm_operator_autoscaling_desired_replicas / _max_replicas / _at_max{namespace,vlmservice}  spec.autoscaling's HPA
    vlm_operator_autoscaling_signal_ratio{namespace,vlmservice,signal}  each signal's value over its target

Counters and the histogram are process-wide prometheus_client metrics. Everything per VLMService is state:
`STATE` keeps the last known facts of each service, and `StateCollector` (registered once) turns them into
metric families at scrape time, so a deleted service's series go with `forget` (one dict entry), with no
series clean-up through prometheus_client's internals. `SIGNAL_DELTA`, `IPC_ACTIVE` and `MANAGED` keep the
`labels(...).set(v)` / `set(v)` shape of the gauges they replace and write into `STATE`.

`namespace` on these series is the VLMService's namespace: scrape the operator with honorLabels (the chart's
ServiceMonitor does), or the target's namespace label wins and this one moves to exported_namespace.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vlm_operator.api.names import PHASES

RECONCILE = Histogram(
    "vlm_operator_reconcile_duration_seconds",
    "Time spent in one reconcile of a VLMService.",
    ["result"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
# The injection webhook's own handling of one review (body read -> response written), by outcome (injected,
# skipped, error); the TLS handshake and the API server's side are not in it.
WEBHOOK_REVIEWS = Histogram(
    "vlm_operator_webhook_review_seconds", "Time the injection webhook took to answer one AdmissionReview.",
    ["outcome"], buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
ERRORS = Counter("vlm_operator_errors_total", "Errors by reason.", ["reason"])
API_WRITES = Counter("vlm_operator_api_writes_total", "Write requests sent to the API server.", ["verb"])
STALE_SKIPPED = Counter(
    "vlm_operator_stale_reconciles_skipped_total",
    "Reconciles skipped: the handler was given a copy of the VLMService older than this operator's last status write.",
)
ROLLOUTS = Counter("vlm_operator_rollouts_total", "Finished canary rollouts by result.", ["result"])
# Event reason -> result label. Every result exists from the start at 0, so increase() over a range
# counts an operator process's first verdict of each kind too (a counter born at 1 is invisible to it).
ROLLOUT_RESULTS = {"CanaryPromoted": "promoted", "CanaryRolledBack": "rolled_back", "CanaryAborted": "aborted"}
for _result in ROLLOUT_RESULTS.values():
    ROLLOUTS.labels(result=_result)
# What decided each canary step (evidence, the harm ceiling, or the clock at maxDuration): how often the clock
# decides is the gate's health.
STEP_DECISIONS = Counter("vlm_operator_step_decisions_total", "Canary steps decided, by what decided them.",
                         ["decided_by"])
for _by in ("evidence", "ceiling", "timeout"):
    STEP_DECISIONS.labels(decided_by=_by)
_SVC = ["namespace", "vlmservice"]


@dataclass
class ServiceFacts:
    """What the metrics say about one VLMService; None: not known (no series)."""

    phase: str | None = None
    signal_delta: dict[str, float] = field(default_factory=dict)
    ipc_cache_active: float | None = None
    rollback: tuple[str, str, str] | None = None  # revision, signal, function
    ipc_cache_verified: float | None = None  # None until a profile with feature traffic was seen
    failure: str | None = None  # the Ready condition's failure reason (status.FAILURE_REASONS), None when none
    # spec.autoscaling's HPA: (desired replicas, maxReplicas, at max and still above target) and each signal's
    # value over its target; None / empty without an HPA
    autoscaling: tuple[float, float, float] | None = None
    autoscaling_ratio: dict[str, float] = field(default_factory=dict)


class State:
    """The per-service facts, written by the reconcile loop and read at scrape time (thread-safe: the
    HTTP server's thread reads while kopf's writes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._services: dict[tuple[str, str], ServiceFacts] = {}
        self.managed = 0.0

    def update(self, namespace: str, name: str, **facts: object) -> None:
        with self._lock:
            f = self._services.setdefault((namespace, name), ServiceFacts())
            for k, v in facts.items():
                setattr(f, k, v)

    def set_signal_delta(self, namespace: str, name: str, signal: str, value: float) -> None:
        with self._lock:
            self._services.setdefault((namespace, name), ServiceFacts()).signal_delta[signal] = float(value)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._services.pop((namespace, name), None)

    def snapshot(self) -> tuple[float, dict[tuple[str, str], ServiceFacts]]:
        with self._lock:
            return self.managed, {
                k: ServiceFacts(f.phase, dict(f.signal_delta), f.ipc_cache_active, f.rollback, f.ipc_cache_verified,
                                f.failure, f.autoscaling, dict(f.autoscaling_ratio))
                for k, f in self._services.items()
            }


def families(managed: float, services: dict[tuple[str, str], ServiceFacts]) -> list[Metric]:
    """The per-service metric families of one scrape. Pure."""
    m = GaugeMetricFamily("vlm_operator_managed_services", "VLMServices this operator manages.", value=managed)
    phase = GaugeMetricFamily("vlm_operator_rollout_phase", "1 for the rollout's current phase.",
                              labels=[*_SVC, "phase"])
    delta = GaugeMetricFamily("vlm_operator_signal_delta", "Last relative change of a signal, canary vs baseline.",
                              labels=[*_SVC, "signal"])
    ipc = GaugeMetricFamily("vlm_operator_ipc_cache_active",
                            "1 when the operator switched the CUDA IPC pool-handle cache on.", labels=_SVC)
    verified = GaugeMetricFamily(
        "vlm_operator_ipc_cache_verified",
        "1 when the pods' profiles show the IPC pool-handle cache working under feature traffic, 0 when pods "
        "told to cache re-open IPC handles; no series before such a profile.", labels=_SVC)
    info = GaugeMetricFamily(
        "vlm_operator_canary_rollback_info",
        "1 while a VLMService holds a rolled-back canary: the revision, the signal and the function that grew most.",
        labels=[*_SVC, "revision", "signal", "function"],
    )
    failing = GaugeMetricFamily(
        "vlm_operator_service_failure_info",
        "1 while a VLMService's pods cannot serve for a reason that needs a person (FailedCreate, ImagePullFailed, "
        "ContainerConfigError, CrashLoopBackOff, OOMKilled, StartupBudgetExhausted); no series otherwise.",
        labels=[*_SVC, "reason"],
    )
    desired = GaugeMetricFamily("vlm_operator_autoscaling_desired_replicas",
                                "The replicas spec.autoscaling's HPA wants (it writes spec.replicas).", labels=_SVC)
    maxr = GaugeMetricFamily("vlm_operator_autoscaling_max_replicas", "spec.autoscaling.maxReplicas.", labels=_SVC)
    at_max = GaugeMetricFamily(
        "vlm_operator_autoscaling_at_max", "1 while the HPA wants maxReplicas and the signal that drives it is still "
        "above its target.", labels=_SVC)
    ratio = GaugeMetricFamily(
        "vlm_operator_autoscaling_signal_ratio",
        "Each autoscaling signal's current value over its target, as the HPA last read it (above 1: it wants more "
        "replicas).", labels=[*_SVC, "signal"])
    for (ns, name), f in sorted(services.items()):
        if f.autoscaling is not None:
            desired.add_metric([ns, name], f.autoscaling[0])
            maxr.add_metric([ns, name], f.autoscaling[1])
            at_max.add_metric([ns, name], f.autoscaling[2])
        for signal, v in sorted(f.autoscaling_ratio.items()):
            ratio.add_metric([ns, name, signal], v)
        if f.failure is not None:
            failing.add_metric([ns, name, f.failure], 1.0)
        if f.phase is not None:
            for p in PHASES:
                phase.add_metric([ns, name, p], 1.0 if p == f.phase else 0.0)
        for signal, v in sorted(f.signal_delta.items()):
            delta.add_metric([ns, name, signal], v)
        if f.ipc_cache_active is not None:
            ipc.add_metric([ns, name], f.ipc_cache_active)
        if f.ipc_cache_verified is not None:
            verified.add_metric([ns, name], f.ipc_cache_verified)
        if f.rollback is not None:
            info.add_metric([ns, name, *f.rollback], 1.0)
    return [m, phase, delta, ipc, verified, info, failing, desired, maxr, at_max, ratio]


class StateCollector(Collector):
    """prometheus_client custom collector over a `State`: every value computed at scrape time."""

    def __init__(self, state: State) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        yield from families(*self.state.snapshot())

    def describe(self) -> Iterator[Metric]:  # names only: registering must not read the state
        yield from families(0.0, {})


class _ServiceGauge:
    """`GAUGE.labels(namespace, name[, signal]).set(v)`, writing into STATE (the reconcile loop's API)."""

    def __init__(self, state: State, kind: str) -> None:
        self._state, self._kind = state, kind

    def labels(self, namespace: str, name: str, *rest: str) -> _Setter:
        return _Setter(self._state, self._kind, namespace, name, rest)


@dataclass(frozen=True)
class _Setter:
    state: State
    kind: str
    namespace: str
    name: str
    rest: tuple[str, ...]

    def set(self, value: float) -> None:
        if self.kind == "signal_delta":
            self.state.set_signal_delta(self.namespace, self.name, self.rest[0], value)
        else:
            self.state.update(self.namespace, self.name, **{self.kind: float(value)})


class _Managed:
    def __init__(self, state: State) -> None:
        self._state = state

    def set(self, value: float) -> None:
        self._state.managed = float(value)


STATE = State()
COLLECTOR = StateCollector(STATE)
SIGNAL_DELTA = _ServiceGauge(STATE, "signal_delta")
IPC_ACTIVE = _ServiceGauge(STATE, "ipc_cache_active")
MANAGED = _Managed(STATE)


def register(registry: CollectorRegistry = REGISTRY) -> None:
    """Register the state collector (done once at import for the default registry)."""
    registry.register(COLLECTOR)


register()


def set_phase(namespace: str, name: str, phase: str) -> None:
    STATE.update(namespace, name, phase=phase)


def set_rollback(namespace: str, name: str, revision: str | None, signal: str | None, function: str | None) -> None:
    """One series while rolled back; none otherwise."""
    STATE.update(namespace, name,
                 rollback=(revision, signal or "unknown", function or "unknown") if revision else None)


def set_ipc_verified(namespace: str, name: str, verified: bool | None) -> None:
    """1/0 from IPCCacheActive's ObservedInProfile/NotObserved; None (no series) while it reports the flags."""
    STATE.update(namespace, name, ipc_cache_verified=None if verified is None else float(verified))


def set_failure(namespace: str, name: str, reason: str | None) -> None:
    """One series while the service reports a failure reason; none otherwise."""
    STATE.update(namespace, name, failure=reason)


def set_autoscaling(namespace: str, name: str, st: object, ratios: dict[str, float]) -> None:
    """spec.autoscaling's series from status.autoscaling (an api.AutoscalingStatus); none while its HPA has not
    reported (no desired count) or without spec.autoscaling."""
    desired = getattr(st, "desired_replicas", None)
    facts = None if desired is None else (float(desired), float(getattr(st, "max_replicas", 0) or 0),
                                          1.0 if getattr(st, "at_max_replicas", False) else 0.0)
    STATE.update(namespace, name, autoscaling=facts, autoscaling_ratio=dict(ratios))


def forget(namespace: str, name: str) -> None:
    STATE.forget(namespace, name)
