"""One reconcile of one VLMService: gather, decide (pure), act, report.

Gather: the spec, the status (all rollout state lives there), the owned
objects (from kopf indexes, no API reads), free GPUs when a canary starts,
and profiler windows when an analysis or the profiler summary is due (sidecar
reads are bounded and cached per pod window: `signals.SidecarReader`). Decide:
`builders`, `rollout`, `gate`, `status` (pure). Act: `apply` writes only what
differs, then at most one status patch and Events for what changed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from . import alerts, api, builders, gate, metrics, rollout, signals
from . import conditions as C
from . import status as S
from .apply import KubeAPI
from .errors import InvalidSpec, PermanentError
from .settings import Settings
from .units import parse_duration

log = logging.getLogger("vlm_operator.reconcile")
Emit = Callable[[str, str, str], None]  # (type, reason, message)
PROFILER_SPAN_WINDOWS = 4  # status.profiler summarises the windows of the last 4 telemetry intervals
UNCONFIRMED_TTL_S = 300.0  # an object applied and not yet in the index is not re-sent for this long (Runtime.apply)


@dataclass
class Runtime:
    kube: KubeAPI
    settings: Settings
    monitoring: bool = False  # monitoring.coreos.com CRDs present (checked at start-up)
    sidecars: signals.SidecarReader | None = None  # built from the settings when not given
    # uid -> when status.profiler was last recomputed (in memory: at most one read per interval per service)
    profiler_reads: dict[str, float] = field(default_factory=dict)
    # uid -> the resourceVersion of the last status write (see `current`)
    written: dict[str, int] = field(default_factory=dict)
    # uid -> {object key: (digest, monotonic time)}: applied, not yet seen in the index (see `apply`)
    unconfirmed: dict[str, dict[tuple[str, str, str, str], tuple[str, float]]] = field(default_factory=dict)
    # uid -> the generation whose objects the API server refused (400/422): not sent again until the spec changes
    refused: dict[str, int | None] = field(default_factory=dict)
    # uid -> the last generation reconciled by this process / the newest generation seen on the watch while no
    # reconcile of it has ended: the services in `waiting` are the backlog (`backlog`)
    reconciled_generation: dict[str, int | None] = field(default_factory=dict)
    waiting: dict[str, int | None] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.sidecars is None:
            self.sidecars = signals.SidecarReader(
                timeout_s=self.settings.sidecar_timeout_seconds, workers=self.settings.sidecar_workers
            )

    def profiler_due(self, uid: str, interval: float, now: float) -> bool:
        """True (and remembered) when the service's profiler summary may be recomputed now."""
        with self._lock:
            last = self.profiler_reads.get(uid)
            if last is not None and 0 <= now - last < interval:
                return False
            self.profiler_reads[uid] = now
            return True

    def forget(self, uid: str) -> None:
        with self._lock:
            self.profiler_reads.pop(uid, None)
            self.written.pop(uid, None)
            self.unconfirmed.pop(uid, None)
            self.refused.pop(uid, None)
            self.reconciled_generation.pop(uid, None)
            self.waiting.pop(uid, None)

    def saw(self, uid: str, generation: int | None) -> None:
        """The watch showed generation `generation` of a service (called for every event, on the event loop)."""
        with self._lock:
            if self.reconciled_generation.get(uid, -1) != generation:
                self.waiting[uid] = generation
            else:
                self.waiting.pop(uid, None)

    def reconciled(self, uid: str, generation: int | None) -> None:
        """A reconcile of generation `generation` ended (whatever its result)."""
        with self._lock:
            self.reconciled_generation[uid] = generation
            if self.waiting.get(uid, -1) == generation:
                del self.waiting[uid]

    def backlog(self) -> int:
        """How many services have a generation on the watch that no reconcile of this process has handled yet:
        about 0 in steady state, the number still queued in a burst of creations (or after a restart, until
        the first resyncs)."""
        return len(self.waiting)

    def busy(self) -> bool:
        """More services wait for their first reconcile of a generation than there are handler threads."""
        return self.backlog() > self.settings.handler_threads

    def refuse(self, uid: str, generation: int | None) -> None:
        """Remember that the API server refused what this generation of the service makes."""
        with self._lock:
            self.refused[uid] = generation

    def apply(self, uid: str, obj: Mapping[str, Any], observed: Mapping[str, Any] | None,
              now: float | None = None) -> bool:
        """`kube.apply`, without re-sending what this operator applied moments ago and the index has not shown yet.

        The indexes follow the API server's watch, which lags behind our own writes, most under a burst of
        creations: the create handler and the resync timer of a new service can both be queued before either
        writes, and the second, run after the first under the service's lock, still saw no Deployment and no
        Service and applied both again (400 services created at once: 548 Deployment and 545 Service
        applies; at 1000, a Deployment the resync timer applied was still not in the index 76 s later, when the
        create handler ran). The same object, byte for byte, applied less than `UNCONFIRMED_TTL_S` ago is not sent
        again while the index has not shown it; once the index shows the object the entry goes, so a
        Deployment deleted by hand afterwards is re-created at once (one deleted before the index ever
        showed it waits for the TTL)."""
        meta = obj["metadata"]
        key = (str(obj["apiVersion"]), str(obj["kind"]), str(meta["namespace"]), str(meta["name"]))
        t = time.monotonic() if now is None else now
        if observed is not None:
            self.confirmed(uid, key)
            return self.kube.apply(obj, observed)
        digest = hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()

        def fresh(entry: tuple[str, float]) -> bool:
            return 0 <= t - entry[1] < UNCONFIRMED_TTL_S

        with self._lock:
            hit = self.unconfirmed.get(uid, {}).get(key)
            if hit is not None and hit[0] == digest and fresh(hit):
                return False
        wrote = self.kube.apply(obj, None)
        with self._lock:
            mine = {k: e for k, e in self.unconfirmed.get(uid, {}).items() if fresh(e)}
            mine[key] = (digest, t)
            self.unconfirmed[uid] = mine
        return wrote

    def confirmed(self, uid: str, key: tuple[str, str, str, str]) -> None:
        """The index shows the object `key` (apiVersion, kind, namespace, name): `apply` sends it again if asked."""
        with self._lock:
            self.unconfirmed.get(uid, {}).pop(key, None)

    def delete(self, uid: str, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """`kube.delete`; what it deletes is no longer known to exist (the next apply of it is sent)."""
        self.confirmed(uid, (api_version, kind, namespace, name))
        return self.kube.delete(api_version, kind, namespace, name)

    def note_written(self, t: Target, resource_version: str) -> None:
        rv = _rv(resource_version)
        with self._lock:
            if rv is None:
                self.written.pop(t.uid, None)
            else:
                self.written[t.uid] = rv

    def current(self, t: Target) -> bool:
        """False when `t` is a copy older than this operator's last status write of the same object.

        kopf hands each handler the body it had when the handler was queued. The create (or update) handler
        and the resync timer of one service can both be queued before the first of them writes; the second
        would then start from the status before that write and redo what was just done (a second
        CanaryStarted, a rollout restarted). Such a copy is skipped: a fresh one follows (the watch event of
        that write, the next timer). Copies that predate another writer's change (a second replica, the
        plugin) are caught by the API server instead: the status write is conditional on the copy's
        resourceVersion (`KubeAPI.patch_status`)."""
        with self._lock:
            w = self.written.get(t.uid)
        rv = _rv(t.resource_version)
        return w is None or rv is None or rv >= w


@dataclass(frozen=True)
class Target:
    name: str
    namespace: str
    uid: str
    generation: int | None
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    annotations: Mapping[str, str]
    resource_version: str | None = None  # of the body this reconcile was handed


def _rv(text: str | None) -> int | None:
    """resourceVersions are opaque strings to clients; the API server's come from etcd's revision, an
    integer that only grows, which is what ordering two copies of one object needs. None otherwise."""
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _read_windows(
    rt: Runtime, t: Target, spec: api.VLMServiceSpec, observed: S.Observed, revisions: Sequence[str], since: float, now: float
) -> list[gate.Window]:
    analysis = spec.rollout.analysis if spec.rollout else None
    url = (analysis.prometheus_url if analysis else None) or rt.settings.prometheus_url
    source = analysis.source if analysis else "Auto"
    if source == "Prometheus" or (source == "Auto" and url):
        # A third of the telemetry interval: every window is seen at least once while the scrape keeps up;
        # seeing one several times is harmless (from_prometheus keeps one observation per window).
        step = max(1.0, parse_duration(spec.telemetry.interval) / 3)
        return signals.from_prometheus(url, t.namespace, t.name, revisions, since=since, now=now, step=step)
    pods = [(p.name, p.revision, p.ip) for p in observed.pods if p.ready and p.revision in revisions]
    return signals.from_sidecars(pods, since, interval=parse_duration(spec.telemetry.interval), now=now, reader=rt.sidecars)


def _analyse(
    rt: Runtime, t: Target, spec: api.VLMServiceSpec, observed: S.Observed, prev: api.RolloutStatus, stable_rev: str, now: float
) -> gate.Decision:
    started = rollout.parse_time(prev.analysis_started_at)
    data = rollout.parse_time(prev.data_started_at) if prev.data_started_at else None
    step = spec.rollout.steps[min(prev.step, len(spec.rollout.steps) - 1)]  # type: ignore[union-attr]
    policy = gate.GatePolicy.from_spec(spec)
    step_s = parse_duration(step.analysis)
    try:
        windows = _read_windows(rt, t, spec, observed, [stable_rev, prev.revision or ""], started, now)
    except signals.SignalsUnavailable as e:
        # Still the gate's call: at maxDuration it applies onInconclusive (and never promotes without data).
        return gate.decide([], [], policy, started_at=started, now=now, step_duration_s=step_s, unavailable=str(e),
                           data_started_at=data)
    fresh = {p.name for p in observed.pods if p.role == builders.ROLE_BASELINE}
    stable = [w for w in windows if w.revision == stable_rev and w.pod not in fresh]
    can = [w for w in windows if w.revision == prev.revision]
    if prev.baseline == "Fresh":
        # Compare with the fresh pods; the long-running stable pods still tell how much pods differ.
        base = [w for w in windows if w.pod in fresh and w.revision == stable_rev]
        return gate.decide(base, can, policy, started_at=started, now=now, step_duration_s=step_s, spread_reference=stable,
                           data_started_at=data)
    return gate.decide(stable, can, policy, started_at=started, now=now, step_duration_s=step_s, data_started_at=data)


def _profiler(
    rt: Runtime, t: Target, spec: api.VLMServiceSpec, observed: S.Observed, stable_rev: str | None, now: float
) -> tuple[api.ProfilerStatus | None, list[gate.Window] | None]:
    """status.profiler: recomputed at most once per telemetry interval per service (one read of the sidecars,
    cached per window, or of Prometheus), and changed only when what a user sees changed. Also returns the
    stable pods' windows when they were read (the IPC cache is verified from them), else None."""
    current = S.parse_status({"profiler": t.status.get("profiler")}).profiler if t.status.get("profiler") else None
    if not spec.telemetry.enabled or not stable_rev:
        return current, None
    interval = parse_duration(spec.telemetry.interval)
    if not rt.profiler_due(t.uid, interval, now):
        return current, None
    try:
        windows = _read_windows(rt, t, spec, observed, [stable_rev], now - PROFILER_SPAN_WINDOWS * interval, now)
    except signals.SignalsUnavailable:
        return current, None
    return S.profiler_status(
        current, windows, tolerance=rt.settings.profiler_tolerance, refresh_s=rt.settings.profiler_refresh_seconds
    ), windows


def _ipc_cache(
    t: Target, desired: builders.Desired, stable_rev: str | None, windows: Sequence[gate.Window] | None
) -> tuple[bool | None, str, str]:
    """IPCCacheActive: the flags the operator set, verified from the stable pods' profiles once they saw
    feature traffic (status.ipc_condition)."""
    plan = desired.plan
    return S.ipc_condition(
        plan.active,
        plan.reason,
        plan.message,
        revision=desired.revision,
        stable_revision=stable_rev,
        observation=S.ipc_observation(windows) if windows is not None else None,
        current=C.find(t.status.get("conditions") or [], C.IPC_CACHE_ACTIVE),
    )


def reconcile(rt: Runtime, t: Target, observed: S.Observed, emit: Emit, *, now: float | None = None) -> None:
    if not rt.current(t):
        log.debug("skipping a stale copy of %s/%s (resourceVersion %s)", t.namespace, t.name, t.resource_version)
        metrics.STALE_SKIPPED.inc()
        return
    started = time.monotonic()
    result = "ok"
    try:
        result = _reconcile(rt, t, observed, emit, now if now is not None else time.time())
    except Exception:
        result = "error"
        raise
    finally:
        rt.reconciled(t.uid, t.generation)
        metrics.RECONCILE.labels(result=result).observe(time.monotonic() - started)


def _write_status(rt: Runtime, t: Target, new: api.VLMServiceStatus, emit: Emit) -> bool:
    """One status patch (none when nothing changed); Events for the conditions that flipped."""
    body = S.status_body(new)
    before = t.status.get("conditions") or []
    rv = rt.kube.patch_status(t.namespace, t.name, t.status, body, resource_version=t.resource_version)
    if rv is None:
        return False
    rt.note_written(t, rv)
    for ev in C.events_for(C.transitions(before, body["conditions"])):
        emit(*ev)
    return True


def _record_metrics(t: Target, plan: rollout.Plan, desired: builders.Desired, decision: gate.Decision | None) -> None:
    if decision is not None:
        for s in decision.signals:
            if s.delta is not None:
                metrics.SIGNAL_DELTA.labels(t.namespace, t.name, s.name).set(s.delta)
    for ev in plan.events:
        if ev.reason in metrics.ROLLOUT_RESULTS:
            metrics.ROLLOUTS.labels(result=metrics.ROLLOUT_RESULTS[ev.reason]).inc()
    if plan.rollout:
        metrics.set_phase(t.namespace, t.name, plan.rollout.phase)
    metrics.IPC_ACTIVE.labels(t.namespace, t.name).set(1.0 if desired.plan.active else 0.0)
    r = plan.rollout
    if r and r.phase == "RolledBack":
        failed = next((s.name for s in r.signals if s.verdict == "fail"), r.reason)
        metrics.set_rollback(t.namespace, t.name, r.revision, failed, r.regressed_function)
    else:
        metrics.set_rollback(t.namespace, t.name, None, None, None)


def _apply_plan(rt: Runtime, t: Target, spec: api.VLMServiceSpec, desired: builders.Desired, plan: rollout.Plan,
                observed: S.Observed, owner: builders.Owner) -> None:
    """Write what the plan wants: the budget and the policy once per spec generation, before the Deployments (a
    pod never runs without its NetworkPolicy), the Deployments and the Service always (each only where it
    differs), then the monitoring objects. In a burst of new services (`Runtime.busy`) a missing Service waits
    for the service's next resync, like the monitoring objects: a Service costs the API server more than
    itself (the endpoints controller makes an Endpoints object and an EndpointSlice for it), and nothing
    routes to a pod for many seconds after its Deployment anyway; the Deployments go first."""
    if plan.hands_off:
        return
    if t.status.get("observedGeneration") != t.generation:
        # Both follow the spec alone (and the operator's settings): applied once per generation, like the
        # PodMonitor; deleted when the spec no longer wants them (replicas <= 1, networkPolicy Off).
        for api_version, kind, want in (
            ("networking.k8s.io/v1", "NetworkPolicy", desired.network_policy),
            ("policy/v1", "PodDisruptionBudget", desired.pdb),
        ):
            if want is not None:
                rt.apply(t.uid, want, None)
            elif not (t.generation == 1 and "observedGeneration" not in t.status):
                # (Never reconciled, and its spec never changed: every reconcile so far saw this spec and
                # wanted none, so none was made. One DELETE answered 404 less per new service.)
                rt.delete(t.uid, api_version, kind, t.namespace, t.name)
    if plan.stable is not None:
        rt.apply(t.uid, plan.stable, observed.deployments.get(builders.ROLE_STABLE))
    for role, want in ((builders.ROLE_CANARY, plan.canary), (builders.ROLE_BASELINE, plan.baseline)):
        if want is not None:
            rt.apply(t.uid, want, observed.deployments.get(role))
        elif role in observed.deployments:
            rt.delete(t.uid, "apps/v1", "Deployment", t.namespace, builders.deployment_name(owner, role))
    if observed.service is not None or not rt.busy():
        rt.apply(t.uid, desired.service, observed.service)
    if rt.monitoring:
        _apply_monitoring(rt, t, spec, observed, owner)


def _apply_monitoring(rt: Runtime, t: Target, spec: api.VLMServiceSpec, observed: S.Observed,
                      owner: builders.Owner) -> None:
    """The PodMonitor and the PrometheusRule: re-applied at each spec generation (they follow the spec and the
    operator's settings), and created where the index does not hold them (a new service, or one deleted by
    hand: drift repair). Creation waits while the operator is `busy` with a burst of new services, like a new
    Service's (`_apply_plan`): their Deployments go first, these follow at each service's next resync (a pod
    takes longer than that to be scraped anyway). A spec change of an existing service never waits."""
    changed = t.status.get("observedGeneration") != t.generation
    for kind in observed.monitoring:  # shown by the index: one deleted from now on is re-created at once
        rt.confirmed(t.uid, (builders.MONITORING_API_VERSION, kind, t.namespace, t.name))
    wanted = [kind for kind in builders.MONITORING_KINDS
              if (kind in observed.monitoring and changed) or (kind not in observed.monitoring and not rt.busy())]
    extra = rt.settings.monitoring_labels
    if "PodMonitor" in wanted:
        rt.apply(t.uid, builders.build_pod_monitor(owner, extra, spec.telemetry.interval), None)
    if "PrometheusRule" in wanted:
        rt.apply(
            t.uid,
            alerts.build_prometheus_rule(
                t.name, t.namespace, owner.reference(), builders.common_labels(owner), extra_labels=extra,
                overrides=rt.settings.alert_overrides,
            ),
            None,
        )


def _report_invalid(rt: Runtime, t: Target, observed: S.Observed, msg: str, emit: Emit, now: datetime) -> None:
    """Ready=False/InvalidSpec with `msg` (and its Warning Event, on the flip); the last good status is kept."""
    metrics.ERRORS.labels(reason="InvalidSpec").inc()
    _report(rt, t, observed, emit, now, invalid=msg)


def _report(rt: Runtime, t: Target, observed: S.Observed, emit: Emit, now: datetime, *,
            invalid: str | None = None, refused: str | None = None) -> None:
    """The last good status with the conditions of an invalid spec or a refused apply; a refusal leaves
    observedGeneration where it was."""
    want = t.spec.get("replicas", 1)
    h = S.Health(want=want if isinstance(want, int) and want >= 0 else 1,
                 ready=observed.ready_replicas(builders.ROLE_STABLE), invalid=invalid, refused=refused)
    new = S.build_status(t.status, h, generation=t.generation, now=now, **S.carried(t.status))
    if refused:
        new = new.model_copy(update={"observed_generation": t.status.get("observedGeneration")})
    _write_status(rt, t, new, emit)


def _report_refused(rt: Runtime, t: Target, observed: S.Observed, msg: str, emit: Emit, now: datetime) -> None:
    """Ready=False (while replicas are missing) and Degraded=True, both ApplyRefused with the API server's
    answer, one Warning Event on the flip; the last good status is kept. observedGeneration stays where it
    was: the objects applied once per generation (budget, policy, monitoring) are tried again on the next
    resync, which retries the whole apply, so a freed quota or a lifted policy needs no spec change."""
    _report(rt, t, observed, emit, now, refused=msg)


def _reconcile(rt: Runtime, t: Target, observed: S.Observed, emit: Emit, now: float) -> str:
    """One reconcile; its result for the reconcile metric: "ok", or "error" when the API server refused
    an apply for a reason outside the spec (reported as a condition, not raised)."""
    if t.uid in rt.refused and rt.refused[t.uid] == t.generation:
        return "ok"  # its objects were refused (below): reported, and not sent again for the same spec
    now_dt = datetime.fromtimestamp(now, UTC)
    owner = builders.Owner(t.name, t.namespace, t.uid)
    try:
        spec = api.parse_spec(dict(t.spec))
        desired = builders.build_desired(owner, spec, rt.settings)
        if spec.rollout is not None:
            gate.GatePolicy.from_spec(spec)  # an analysis the gate cannot run is an invalid spec, found here
    except (ValidationError, InvalidSpec) as e:
        msg = S.invalid_spec_message(e) if isinstance(e, ValidationError) else str(e)
        _report_invalid(rt, t, observed, msg, emit, now_dt)
        return "ok"

    prev = api.RolloutStatus.model_validate(t.status["rollout"]) if t.status.get("rollout") else None
    stable_rev = observed.deployment_revision(builders.ROLE_STABLE)
    action = (t.annotations.get(rollout.ANNOTATION_ACTION) or "").strip().lower() or None
    if action and action not in rollout.ACTIONS:
        emit("Warning", "UnknownAction", f"{rollout.ANNOTATION_ACTION}={action}: use one of {', '.join(rollout.ACTIONS)}")
        action = None

    free = None
    starting = spec.rollout and stable_rev and stable_rev != desired.revision and (prev is None or prev.revision != desired.revision)
    if starting and spec.rollout.capacity == "Auto":  # type: ignore[union-attr]
        free = rt.kube.free_gpus(spec.gpu.product)
    decision = None
    if stable_rev and rollout.analysis_due(spec, prev, observed, desired.revision, now):
        decision = _analyse(rt, t, spec, observed, prev, stable_rev, now)  # type: ignore[arg-type]

    plan = rollout.plan(owner, spec, desired, observed, prev, now=now, free_gpus=free, decision=decision, action=action)

    try:
        _apply_plan(rt, t, spec, desired, plan, observed, owner)
    except PermanentError as e:
        if e.reason not in ("Http400", "Http422"):
            # Refused for a reason outside the spec: RBAC, an admission policy or webhook, a ResourceQuota
            # (403), a namespace being deleted. Reported on the VLMService (the user's `kubectl get vlms`),
            # counted (vlm_operator_errors_total, by the apply), and tried again at every resync.
            log.warning("%s/%s: %s", t.namespace, t.name, e)
            _report_refused(rt, t, observed, f"the API server refused an object this spec makes: {e}", emit, now_dt)
            return "error"
        # The API server refused an object built from this spec (a value the schema lets through but the
        # object's own validation does not): the spec is at fault, so it is reported as one, once, and the
        # same generation is not sent again (an operator restart tries once more).
        rt.refuse(t.uid, t.generation)
        _report_invalid(rt, t, observed, f"the API server refused what this spec makes: {e}", emit, now_dt)
        return "ok"

    if action:
        rv = rt.kube.clear_annotation(t.namespace, t.name, rollout.ANNOTATION_ACTION)
        if rv:  # our own write: the status below is conditional on the copy after it
            t = replace(t, resource_version=rv)

    _record_metrics(t, plan, desired, decision)

    profiler, windows = _profiler(rt, t, spec, observed, stable_rev, now)
    ipc_active, ipc_reason, ipc_message = _ipc_cache(t, desired, stable_rev, windows)
    metrics.set_ipc_verified(t.namespace, t.name, ipc_active if ipc_reason in S.IPC_VERIFIED_REASONS else None)
    h = S.running_health(
        observed,
        want=plan.want_ready,
        rollout=plan.rollout,
        ipc_active=ipc_active,
        ipc_reason=ipc_reason,
        ipc_message=ipc_message,
    )
    if t.status.get("observedGeneration") != t.generation:
        for w in desired.plan.warnings:
            emit("Warning", "IPCCacheWarning", w)
    new = S.build_status(
        t.status,
        h,
        generation=t.generation,
        now=now_dt,
        selector=builders.selector(owner),
        stable_revision=plan.stable_revision,
        canary_revision=plan.canary_revision,
        rollout=plan.rollout,
        profiler=profiler,
        sglang=S.sglang_status(desired.image, desired.version),
    )
    _write_status(rt, t, new, emit)
    # The rollout's Events after its status: an operator stopped in between loses the Event rather than posting
    # it twice (a restart recomputes the plan from the status it finds and posts what that plan says).
    for ev in plan.events:
        emit(ev.type, ev.reason, ev.message)
    return "ok"
