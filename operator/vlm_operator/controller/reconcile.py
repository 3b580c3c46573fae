"""One reconcile of one VLMService, in one pass: gather -> decide -> act.

Gather: the spec (parsed and validated once, with the gate's policy), the status (all rollout state lives
there), the owned objects (`cluster.observed.Observed`, from kopf indexes, no API reads), and the signals this
round needs, through the one hand-off (`analysis.handoff.gather`). Decide (pure, but for one read of the nodes'
free GPUs when `rollout.steps.needs_rooms` says a move may surge): the rollout's plan, once (`rollout.steps`),
the Deployments it asks for (`desired.builders.revision_deployments`), every write of the round in order
(`controller.act.intended`) and the status (`status.build`). Act: the writes in one call
(`cluster.writer.Writer.write`, each only where it differs), then at most one status patch, then Events.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from vlm_operator.analysis import gate
from vlm_operator.analysis import handoff as analysis
from vlm_operator.analysis import profile as P
from vlm_operator.analysis.sources import SidecarReader
from vlm_operator.api import metrics
from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.errors import InvalidSpec, PermanentError, TemporaryError
from vlm_operator.api.names import ACTIVE_PHASES, ANNOTATION_ROLLOUT_ACTION, ROLLOUT_ACTIONS
from vlm_operator.api.settings import Settings
from vlm_operator.cluster.client import KubeAPI
from vlm_operator.cluster.observed import Observed
from vlm_operator.cluster.writer import UNCONFIRMED_TTL_S, Writer
from vlm_operator.controller import act
from vlm_operator.desired import autoscaling, builders
from vlm_operator.rollout import placement
from vlm_operator.rollout import steps as rollout
from vlm_operator.status import build as S
from vlm_operator.status import conditions as C

log = logging.getLogger("vlm_operator.controller.reconcile")
Emit = act.Emit

__all__ = ["UNCONFIRMED_TTL_S", "Runtime", "Target", "reconcile"]


@dataclass
class Runtime:
    """What the operator's process keeps between reconciles: the API client behind its write cache and the
    sidecar reader."""

    kube: KubeAPI
    settings: Settings
    monitoring: bool = False  # monitoring.coreos.com CRDs present (checked at start-up)
    keda: bool = False  # KEDA's ScaledObject CRD present (checked at start-up): spec.autoscaling's writes
    sidecars: SidecarReader | None = None  # built from the settings when not given
    writer: Writer | None = None  # over `kube`, built when not given
    # uid -> when status.profiler was last recomputed (in memory: at most one read per interval per service)
    profiler_reads: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.sidecars is None:
            self.sidecars = SidecarReader(
                timeout_s=self.settings.sidecar_timeout_seconds, workers=self.settings.sidecar_workers
            )
        if self.writer is None:
            self.writer = Writer(self.kube)

    @property
    def w(self) -> Writer:
        assert self.writer is not None
        return self.writer

    def context(self) -> analysis.Context:
        assert self.sidecars is not None
        return analysis.Context(
            reader=self.sidecars,
            prometheus_url=self.settings.prometheus_url,
            profiler_tolerance=self.settings.profiler_tolerance,
            profiler_refresh_s=self.settings.profiler_refresh_seconds,
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
        self.w.forget(uid)
        with self._lock:
            self.profiler_reads.pop(uid, None)


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



def reconcile(rt: Runtime, t: Target, observed: Observed, emit: Emit, *, now: float | None = None) -> None:
    if not rt.w.current(t.uid, t.resource_version):
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
        metrics.RECONCILE.labels(result=result).observe(time.monotonic() - started)


def _reconcile(rt: Runtime, t: Target, observed: Observed, emit: Emit, now: float) -> str:
    """One reconcile; its result for the reconcile metric: "ok", or "error" when the API server refused
    an apply for a reason outside the spec (reported as a condition, not raised)."""
    if rt.w.is_refused(t.uid, t.generation):
        return "ok"  # its objects were refused (below): reported, and not sent again for the same spec
    now_dt = datetime.fromtimestamp(now, UTC)
    owner = builders.Owner(t.name, t.namespace, t.uid)

    # ---- gather
    try:
        spec = api.parse_spec(dict(t.spec))
        desired = builders.build_desired(owner, spec, rt.settings)
        policy = analysis.policy_for(spec)  # an analysis the gate cannot run is an invalid spec, found here
    except (ValidationError, InvalidSpec) as e:
        msg = S.invalid_spec_message(e) if isinstance(e, ValidationError) else str(e)
        metrics.ERRORS.labels(reason="InvalidSpec").inc()
        _report(rt, t, observed, emit, now_dt, invalid=msg)
        return "ok"
    prev = api.RolloutStatus.model_validate(t.status["rollout"]) if t.status.get("rollout") else None
    stable_rev = observed.stable_revision(t.status.get("stableRevision"))
    canary_seen = prev.revision if prev and prev.phase in ACTIVE_PHASES and prev.revision != stable_rev else None
    observed = observed.with_roles(stable_rev, canary_seen)
    action = (t.annotations.get(ANNOTATION_ROLLOUT_ACTION) or "").strip().lower() or None
    if action and action not in ROLLOUT_ACTIONS:
        emit("Warning", "UnknownAction", f"{ANNOTATION_ROLLOUT_ACTION}={action}: use one of {', '.join(ROLLOUT_ACTIONS)}")
        action = None
    shown = S.parse_status({"profiler": t.status.get("profiler")}).profiler if t.status.get("profiler") else None
    calib_status = S.parse_status({"calibration": t.status.get("calibration")}).calibration
    calibration = analysis.calibration_of(calib_status)
    got = analysis.gather(
        rt.context(), spec, policy, observed, namespace=t.namespace, name=t.name, prev=prev,
        revision=desired.revision, stable_rev=stable_rev, current_profiler=shown,
        profiler_due=lambda interval: rt.profiler_due(t.uid, interval, now), now=now, calibration=calibration,
    )

    # ---- decide
    model = rollout.weights(owner, spec, rt.settings, observed)
    # A running service whose new spec needs weights not yet in the cache changes nothing until they are (as if
    # paused): no canary pod would start, and a replaced stable pod would be lost meanwhile.
    plan_spec = spec if model.ready is not False or stable_rev in (None, desired.revision) else spec.model_copy(
        update={"paused": True})

    rooms: dict[str, placement.Room] | None = None
    if rollout.needs_rooms(plan_spec, desired, observed, prev, stable_rev):  # a move may add pods: GPUs free where?
        try:
            rooms = {n: placement.Room(free, zone) for n, (free, zone) in rt.kube.rooms(spec.gpu.product).items()}
        except (PermanentError, TemporaryError) as e:
            log.warning("%s/%s: cannot read the nodes' free GPUs (%s): replacing pods instead of surging", t.namespace, t.name, e)
            rooms = {}
    plan = rollout.plan(owner, plan_spec, desired, observed, prev, stable=stable_rev, now=now, rooms=rooms,
                        decision=got.decision, action=action,
                        before=(b.pods, b.resolvable, b.margin, b.ceiling) if (b := got.before) else None)
    if plan.wants_rooms:  # needs_rooms covers every move that surges: this is a bug, and the round writes nothing
        log.error("%s/%s: the plan wanted the nodes' free GPUs that needs_rooms did not ask for", t.namespace, t.name)
    if model.ready is False:
        plan = rollout.held(plan, desired.revision, observed)
    load_job = rollout.load_job(owner, spec, rt.settings, plan, observed)
    calib_status = _calibrated(calib_status, calibration, prev, spec, got.decision)
    ipc_active, ipc_reason, ipc_message = _ipc_cache(t, desired, stable_rev, got.stable_windows)
    scaler = autoscaling.autoscaler(owner, spec, rt.settings, keda=rt.keda)
    h = S.running_health(
        observed, want=plan.want_ready, rollout=plan.rollout,
        ipc_active=ipc_active, ipc_reason=ipc_reason, ipc_message=ipc_message,
        startup_budget_s=_startup_budget_s(desired.template),
        model=(model.ready, model.reason, model.message) if model.ready is not None else None,
        autoscaling=scaler.condition,
    )
    new = S.build_status(
        t.status, h, generation=t.generation, now=now_dt, selector=builders.selector(owner),
        stable_revision=plan.stable_revision, canary_revision=plan.canary_revision, rollout=plan.rollout,
        profiler=got.profiler, sglang=S.sglang_status(desired.image, desired.version), calibration=calib_status,
        autoscaling=autoscaling.status_of(spec, observed.hpa),
    )
    # every write of this round, decided here: the Deployments built from the plan's replicas, then in order
    deployments, baseline = builders.revision_deployments(owner, desired, observed.deployments, plan.replicas,
                                                          plan.baseline)
    writes = act.intended(
        t.uid, t.status, t.generation, spec, plan, observed, owner, service=desired.service, deployments=deployments,
        baseline=baseline, network_policy=desired.network_policy, pdb=desired.pdb,
        monitoring=rt.monitoring, monitoring_labels=rt.settings.monitoring_labels,
        alert_overrides=rt.settings.alert_overrides, load_job=load_job, weights_job=model.job,
        keda=rt.keda, scaled_object=scaler.want,
    )

    # ---- act
    try:
        rt.w.write(t.uid, writes)
    except PermanentError as e:
        if e.reason not in ("Http400", "Http422"):
            # Refused for a reason outside the spec: RBAC, an admission policy or webhook, a ResourceQuota
            # (403), a namespace being deleted. Reported on the VLMService (the user's `kubectl get vlms`),
            # counted (vlm_operator_errors_total, by the apply), and tried again at every resync.
            log.warning("%s/%s: %s", t.namespace, t.name, e)
            _report(rt, t, observed, emit, now_dt, refused=f"the API server refused an object this spec makes: {e}")
            return "error"
        # The API server refused an object built from this spec (a value the schema lets through but the
        # object's own validation does not): the spec is at fault, so it is reported as one, once, and the
        # same generation is not sent again (an operator restart tries once more).
        rt.w.refuse(t.uid, t.generation)
        metrics.ERRORS.labels(reason="InvalidSpec").inc()
        _report(rt, t, observed, emit, now_dt, invalid=f"the API server refused what this spec makes: {e}")
        return "ok"
    if action:
        rv = rt.kube.clear_annotation(t.namespace, t.name, ANNOTATION_ROLLOUT_ACTION)
        if rv:  # our own write: the status below is conditional on the copy after it
            t = replace(t, resource_version=rv)
    _record_metrics(t, plan, desired, got.decision, ipc_active if ipc_reason in P.IPC_VERIFIED_REASONS else None)
    metrics.set_autoscaling(t.namespace, t.name, new.autoscaling, autoscaling.ratios(spec, observed.hpa))
    failing = "DownloadFailed" if model.reason == "DownloadFailed" else h.failure[0] if h.failure else None
    metrics.set_failure(t.namespace, t.name, failing if h.ready < h.want else None)
    if t.status.get("observedGeneration") != t.generation:
        for w in desired.plan.warnings:
            emit("Warning", "IPCCacheWarning", w)
    before = S.parse_status({"autoscaling": t.status.get("autoscaling")}).autoscaling
    act.write_status(rt.w, t.uid, t.namespace, t.name, t.status, t.resource_version, new, emit)
    act.post_events(plan, emit)
    if (ev := autoscaling.scale_event(before, new.autoscaling)) is not None:
        emit(*ev)
    return "ok"


def _calibrated(current: api.CalibrationStatus | None, calibration: gate.Calibration, prev: api.RolloutStatus | None,
                spec: api.VLMServiceSpec, decision: gate.Decision | None) -> api.CalibrationStatus | None:
    """status.calibration with the evidence of a rollout that ended on this look (a rollback, or the last step's
    promotion): what its stable pods and its same-node pairs showed about the service's pods."""
    if decision is None or decision.evidence is None or prev is None or prev.phase != "Analysing" or spec.rollout is None:
        return current
    last = prev.step >= len(spec.steps()) - 1
    if not (decision.verdict == "Rollback" or (decision.verdict == "Promote" and last)):
        return current
    return analysis.calibration_status(calibration.add(decision.evidence), (current.rollouts if current else 0) + 1)


def _startup_budget_s(template: Mapping[str, Any]) -> float | None:
    """How long the SGLang container may take to start before its startup probe kills it (seconds)."""
    for c in (template.get("spec") or {}).get("containers") or []:
        probe = c.get("startupProbe")
        if probe:
            return float(probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3))
    return None


def _ipc_cache(
    t: Target, desired: builders.Desired, stable_rev: str | None, windows: list[gate.Window] | None
) -> tuple[bool | None, str, str]:
    """IPCCacheActive: the flags the operator set, verified from the stable pods' profiles once they saw
    feature traffic (profile_summary.ipc_condition)."""
    plan = desired.plan
    return P.ipc_condition(
        plan.active,
        plan.reason,
        plan.message,
        revision=desired.revision,
        stable_revision=stable_rev,
        observation=P.ipc_observation(windows) if windows is not None else None,
        current=C.find(t.status.get("conditions") or [], C.IPC_CACHE_ACTIVE),
    )


def _record_metrics(t: Target, plan: rollout.Plan, desired: builders.Desired, decision: gate.Decision | None,
                    ipc_verified: bool | None) -> None:
    if decision is not None:
        for s in decision.signals:
            if s.delta is not None:
                metrics.SIGNAL_DELTA.labels(t.namespace, t.name, s.name).set(s.delta)
    decided = {"CanaryStep", "CanaryPromoting", "CanaryRolledBack", "CanaryPaused"}
    if decision is not None and decision.decided_by and any(ev.reason in decided for ev in plan.events):
        metrics.STEP_DECISIONS.labels(decided_by=decision.decided_by).inc()
    for ev in plan.events:
        if ev.reason in metrics.ROLLOUT_RESULTS:
            metrics.ROLLOUTS.labels(result=metrics.ROLLOUT_RESULTS[ev.reason]).inc()
    if plan.rollout:
        metrics.set_phase(t.namespace, t.name, plan.rollout.phase)
    metrics.IPC_ACTIVE.labels(t.namespace, t.name).set(1.0 if desired.plan.active else 0.0)
    metrics.set_ipc_verified(t.namespace, t.name, ipc_verified)
    r = plan.rollout
    if r and r.phase == "RolledBack":
        failed = next((s.name for s in r.signals if s.verdict == "fail"), r.reason)
        metrics.set_rollback(t.namespace, t.name, r.revision, failed, r.regressed_function)
    else:
        metrics.set_rollback(t.namespace, t.name, None, None, None)


def _report(rt: Runtime, t: Target, observed: Observed, emit: Emit, now: datetime, *,
            invalid: str | None = None, refused: str | None = None) -> None:
    """The last good status with the conditions of an invalid spec (Ready=False/InvalidSpec) or a refused
    apply (Ready=False while replicas are missing and Degraded=True, both ApplyRefused with the API server's
    answer), one Warning Event on the flip. A refusal leaves observedGeneration where it was: the objects
    applied once per generation (budget, policy, monitoring) are tried again on the next resync, which retries
    the whole apply, so a freed quota or a lifted policy needs no spec change."""
    want = t.spec.get("replicas", 1)
    h = S.Health(want=want if isinstance(want, int) and want >= 0 else 1,
                 ready=sum(1 for p in observed.pods if p.ready), invalid=invalid, refused=refused)
    new = S.build_status(t.status, h, generation=t.generation, now=now, **S.carried(t.status))
    if refused:
        new = new.model_copy(update={"observed_generation": t.status.get("observedGeneration")})
    act.write_status(rt.w, t.uid, t.namespace, t.name, t.status, t.resource_version, new, emit)
