"""One reconcile of one VLMService: gather, decide (pure), act, report.

Gather: the spec, the status (all rollout state lives there), the owned
objects (from kopf indexes, no API reads), free GPUs when a canary starts,
and profiler windows when an analysis is due. Decide: `builders`, `rollout`,
`gate`, `status` (pure). Act: `apply` writes only what differs, then one
status patch and Events for what changed.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from . import alerts, api, builders, gate, metrics, rollout, signals
from . import conditions as C
from . import status as S
from .apply import Kube
from .errors import InvalidSpec
from .settings import Settings
from .units import parse_duration

log = logging.getLogger("vlm_operator.reconcile")
Emit = Callable[[str, str, str], None]  # (type, reason, message)
WRAPPER_SHARE = 0.9
LOOP_ROOTS = ("event_loop", "run_scheduler_process", "<module>", "main", "run_event_loop")


@dataclass
class Runtime:
    kube: Kube
    settings: Settings
    monitoring: bool = False  # monitoring.coreos.com CRDs present (checked at start-up)


@dataclass(frozen=True)
class Target:
    name: str
    namespace: str
    uid: str
    generation: int | None
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    annotations: Mapping[str, str]


def _validation_message(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()))
        parts.append(f"spec.{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    return "; ".join(parts)


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
    return signals.from_sidecars(pods, since)


def _analyse(
    rt: Runtime, t: Target, spec: api.VLMServiceSpec, observed: S.Observed, prev: api.RolloutStatus, stable_rev: str, now: float
) -> gate.Decision:
    started = rollout.parse_time(prev.analysis_started_at)
    step = spec.rollout.steps[min(prev.step, len(spec.rollout.steps) - 1)]  # type: ignore[union-attr]
    policy = gate.GatePolicy.from_spec(spec)
    step_s = parse_duration(step.analysis)
    try:
        windows = _read_windows(rt, t, spec, observed, [stable_rev, prev.revision or ""], started, now)
    except signals.SignalsUnavailable as e:
        # Still the gate's call: at maxDuration it applies onInconclusive (and never promotes without data).
        return gate.decide([], [], policy, started_at=started, now=now, step_duration_s=step_s, unavailable=str(e))
    fresh = {p.name for p in observed.pods if p.role == builders.ROLE_BASELINE}
    stable = [w for w in windows if w.revision == stable_rev and w.pod not in fresh]
    can = [w for w in windows if w.revision == prev.revision]
    if prev.baseline == "Fresh":
        # Compare with the fresh pods; the long-running stable pods still tell how much pods differ.
        base = [w for w in windows if w.pod in fresh and w.revision == stable_rev]
        return gate.decide(base, can, policy, started_at=started, now=now, step_duration_s=step_s, spread_reference=stable)
    return gate.decide(stable, can, policy, started_at=started, now=now, step_duration_s=step_s)


def _profiler_summary(windows: Sequence[gate.Window]) -> dict[str, Any] | None:
    ws = [w for w in windows if w.loop_mean_seconds and not w.stale]
    if not ws:
        return None
    latest = max(ws, key=lambda w: w.end)
    shares: dict[str, list[float]] = {}
    for w in ws:
        for fn, v in w.function_shares.items():
            if not fn.startswith(LOOP_ROOTS):
                shares.setdefault(fn, []).append(v)
    # Wrappers around (almost) the whole loop are not news; the hottest function below them is.
    means = {f: statistics.fmean(v) for f, v in shares.items() if statistics.fmean(v) < WRAPPER_SHARE}
    top = max(means, key=means.__getitem__) if means else None
    p95s = [w.loop_p95_seconds for w in ws if w.loop_p95_seconds]
    return {
        "lastSampleTime": datetime.fromtimestamp(latest.end, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "loopP50": f"{statistics.median(w.loop_mean_seconds for w in ws) * 1000:.1f}ms",
        "loopP95": f"{statistics.median(p95s) * 1000:.1f}ms" if p95s else None,
        "topFunction": top,
    }


def _profiler(
    rt: Runtime, t: Target, spec: api.VLMServiceSpec, observed: S.Observed, stable_rev: str | None, now: float
) -> dict[str, Any] | None:
    """Refresh status.profiler at most once per sampling interval (one read of the sidecars or Prometheus)."""
    current = t.status.get("profiler")
    interval = parse_duration(spec.telemetry.interval)
    last = rollout.parse_time((current or {}).get("lastSampleTime"))
    if not spec.telemetry.enabled or not stable_rev or now - last < 2 * interval:
        return current
    try:
        windows = _read_windows(rt, t, spec, observed, [stable_rev], now - 4 * interval, now)
    except signals.SignalsUnavailable:
        return current
    return _profiler_summary(windows) or current


def reconcile(rt: Runtime, t: Target, observed: S.Observed, emit: Emit, *, now: float | None = None) -> None:
    started = time.monotonic()
    result = "ok"
    try:
        _reconcile(rt, t, observed, emit, now if now is not None else time.time())
    except Exception:
        result = "error"
        raise
    finally:
        metrics.RECONCILE.labels(result=result).observe(time.monotonic() - started)


def _events_for(transitions: Sequence[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Ready and Degraded flips become Events: Warnings for trouble, Normal for recovery."""
    out = []
    for c in transitions:
        text = f"{c['type']}={c['status']}: {c['message']}"
        if c["type"] == "Ready" and c["status"] == "True":
            out.append(("Normal", c["reason"], text))
        elif (c["type"] == "Ready" and c["status"] == "False" and c["reason"] != "ReplicasNotReady") or (
            c["type"] == "Degraded" and c["status"] == "True" and c["reason"] != "InvalidSpec"
        ):
            out.append(("Warning", c["reason"], text))
    return out


def _write_status(rt: Runtime, t: Target, new: dict[str, Any], emit: Emit) -> None:
    before = t.status.get("conditions") or []
    if rt.kube.patch_status(t.namespace, t.name, t.status, new):
        for ev in _events_for(C.transitions(before, new["conditions"])):
            emit(*ev)


def _reconcile(rt: Runtime, t: Target, observed: S.Observed, emit: Emit, now: float) -> None:
    now_dt = datetime.fromtimestamp(now, UTC)
    owner = builders.Owner(t.name, t.namespace, t.uid)
    try:
        spec = api.parse_spec(dict(t.spec))
        desired = builders.build_desired(owner, spec, rt.settings)
        if spec.rollout is not None:
            gate.GatePolicy.from_spec(spec)  # an analysis the gate cannot run is an invalid spec, found here
    except (ValidationError, InvalidSpec) as e:
        msg = _validation_message(e) if isinstance(e, ValidationError) else str(e)
        metrics.ERRORS.labels(reason="InvalidSpec").inc()
        h = S.Health(want=int(t.spec.get("replicas", 1) or 0), ready=observed.ready_replicas(builders.ROLE_STABLE), invalid=msg)
        keep = {k: v for k, v in t.status.items() if k in ("stableRevision", "canaryRevision", "rollout", "profiler", "selector", "sglang")}
        _write_status(rt, t, S.build_status(t.status, h, generation=t.generation, now=now_dt, extra=keep), emit)
        return

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
        for s in decision.signals:
            if s.delta is not None:
                metrics.SIGNAL_DELTA.labels(t.namespace, t.name, s.name).set(s.delta)

    plan = rollout.plan(owner, spec, desired, observed, prev, now=now, free_gpus=free, decision=decision, action=action)

    if not plan.hands_off:
        rt.kube.apply(desired.service, observed.service)
        if plan.stable is not None:
            rt.kube.apply(plan.stable, observed.deployments.get(builders.ROLE_STABLE))
        for role, want in ((builders.ROLE_CANARY, plan.canary), (builders.ROLE_BASELINE, plan.baseline)):
            if want is not None:
                rt.kube.apply(want, observed.deployments.get(role))
            elif role in observed.deployments:
                rt.kube.delete("apps/v1", "Deployment", t.namespace, builders.deployment_name(owner, role))
        if t.status.get("observedGeneration") != t.generation:
            # Both follow the spec alone (and the operator's settings): applied once per generation, like the
            # PodMonitor; deleted when the spec no longer wants them (replicas <= 1, networkPolicy Off).
            for api_version, kind, want in (
                ("policy/v1", "PodDisruptionBudget", desired.pdb),
                ("networking.k8s.io/v1", "NetworkPolicy", desired.network_policy),
            ):
                if want is not None:
                    rt.kube.apply(want, None)
                else:
                    rt.kube.delete(api_version, kind, t.namespace, t.name)
        if rt.monitoring and t.status.get("observedGeneration") != t.generation:
            rt.kube.apply(builders.build_pod_monitor(owner), None)
            rt.kube.apply(
                alerts.build_prometheus_rule(t.name, t.namespace, owner.reference(), builders.common_labels(owner)), None
            )
    if action:
        rt.kube.clear_annotation(t.namespace, t.name, rollout.ANNOTATION_ACTION)

    for ev in plan.events:
        emit(ev.type, ev.reason, ev.message)
        if ev.reason in ("CanaryPromoted", "CanaryRolledBack", "CanaryAborted"):
            metrics.ROLLOUTS.labels(result=ev.reason.removeprefix("Canary").lower()).inc()
    if plan.rollout:
        metrics.set_phase(t.namespace, t.name, plan.rollout.phase)
    metrics.IPC_ACTIVE.labels(t.namespace, t.name).set(1.0 if desired.plan.active else 0.0)
    r = plan.rollout
    if r and r.phase == "RolledBack":
        failed = next((s.name for s in r.signals if s.verdict == "fail"), r.reason)
        metrics.set_rollback(t.namespace, t.name, r.revision, failed, r.regressed_function)
    else:
        metrics.set_rollback(t.namespace, t.name, None, None, None)

    ready = sum(1 for p in observed.pods if p.ready)
    unsched = observed.unschedulable()
    h = S.Health(
        want=plan.want_ready,
        ready=ready,
        unschedulable=f"pod {unsched.name}: {unsched.unschedulable}" if unsched else None,
        rolling=S.rolling(observed),
        rollout_phase=plan.rollout.phase if plan.rollout else None,
        rollout_message=plan.rollout.message if plan.rollout else None,
        ipc_active=desired.plan.active,
        ipc_reason=desired.plan.reason,
        ipc_message=desired.plan.message,
    )
    extra: dict[str, Any] = {
        "selector": builders.selector(owner),
        "stableRevision": plan.stable_revision,
        "canaryRevision": plan.canary_revision,
        "rollout": plan.rollout.model_dump(by_alias=True, exclude_none=True) if plan.rollout else None,
        "profiler": _profiler(rt, t, spec, observed, stable_rev, now),
        "sglang": S.sglang_status(desired.image, desired.version),
    }
    if t.status.get("observedGeneration") != t.generation:
        for w in desired.plan.warnings:
            emit("Warning", "IPCCacheWarning", w)
    new = S.build_status(t.status, h, generation=t.generation, now=now_dt, extra={k: v for k, v in extra.items() if v is not None})
    _write_status(rt, t, new, emit)
