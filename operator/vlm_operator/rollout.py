"""Pure: what the Deployments should be, and the rollout's next state.

Every fact the canary needs lives in `status.rollout` (revision, step, capacity,
times, verdict), so a restarted operator computes the same plan from the same
status and cluster. Inputs are plain values; `now` is unix seconds.

Without a `rollout` block a template change rolls the stable Deployment in
place (maxSurge 0). With one, a new revision gets a canary Deployment:

    Progressing --step's canary pods Ready--> Analysing --Promote (last step)--> Promoted
         |                                        |  \\--Promote (more steps)--> Progressing (next step)
         |--not Ready within startupTimeout        |--Rollback--> RolledBack (held until the spec changes)
         |  --> RolledBack (CanaryStartTimeout)    |--Pause--> Paused (resume restarts the step's analysis)
    annotations: promote / abort / pause / resume

The gate decides every verdict, maxDuration and onInconclusive included; this module only maps the
verdict to an action (as Argo Rollouts maps an AnalysisRun's phase) and never re-derives one. The
analysis of a step starts when its canary pods are all Ready (`analysisStartedAt`) and its clock with
the canary's first profiler window after that (`dataStartedAt`, found by the gate), so start-up (up to
the startup probe's 20 minutes for a large model) has its own timeout and never eats the analysis time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import builders as B
from .api import RolloutStatus, SignalStatus, VLMServiceSpec
from .gate import Decision
from .names import ACTIVE_PHASES as ACTIVE
from .names import HELD_PHASES
from .observed import Observed
from .units import format_time as _iso
from .units import parse_duration, parse_time

# A surged canary pod that stays unschedulable this long falls back to borrowing a stable replica.
SURGE_PATIENCE_S = 120.0


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    stable: dict[str, Any] | None  # desired Deployment, or None to leave it alone
    canary: dict[str, Any] | None  # desired Deployment, or None to delete it
    stable_revision: str | None
    canary_revision: str | None
    rollout: RolloutStatus | None
    events: tuple[Event, ...] = field(default=())
    baseline: dict[str, Any] | None = None  # desired fresh-baseline Deployment, or None to delete it
    want_ready: int = 0
    hands_off: bool = False  # spec.paused: change no Deployment


def _strip_role(template: Mapping[str, Any]) -> dict[str, Any]:
    t = {k: v for k, v in template.items()}
    meta = dict(t.get("metadata") or {})
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in (B.LABEL_ROLE, B.LABEL_REVISION)}
    meta["labels"] = labels
    t["metadata"] = meta
    return t


def _observed_stable(owner: B.Owner, observed: Observed, replicas: int, role: str = B.ROLE_STABLE) -> dict[str, Any] | None:
    """Re-apply the stable Deployment as it is (its template untouched), only its replicas change; with
    role baseline, the same template as the fresh-baseline Deployment."""
    d = observed.deployments.get(B.ROLE_STABLE)
    if not d:
        return None
    rev = observed.deployment_revision(B.ROLE_STABLE) or ""
    return B.build_deployment(owner, _strip_role(d["spec"]["template"]), rev, role, replicas)


def _fresh_fits(capacity: str, full: int, canary_replicas: int) -> bool:
    """A fresh baseline as large as the canary: spare GPUs (Surge), or borrowed from stable, which then lends
    twice the canary's replicas (only while it has them)."""
    return capacity == "Surge" or full >= 2 * canary_replicas


def _upd(r: RolloutStatus, **changes: Any) -> RolloutStatus:
    return r.model_copy(update=changes)


def _signals(d: Decision) -> list[SignalStatus]:
    return [
        SignalStatus(
            name=s.name,
            baseline=s.baseline,
            canary=s.canary,
            delta=s.delta,
            ci_low=s.ci_low,
            ci_high=s.ci_high,
            p_value=s.p_value,
            verdict=s.verdict,
        )
        for s in d.signals
    ]


def plan(
    owner: B.Owner,
    spec: VLMServiceSpec,
    desired: B.Desired,
    observed: Observed,
    prev: RolloutStatus | None,
    *,
    now: float,
    free_gpus: int | None,
    decision: Decision | None = None,
    action: str | None = None,
) -> Plan:
    rev = desired.revision
    full = spec.replicas
    stable_obs_rev = observed.deployment_revision(B.ROLE_STABLE)

    # The two shapes without a canary: the stable Deployment takes the desired template (first deploy,
    # no rollout block, promotion), or it keeps the template it has (rolled back, aborted, held).
    def take_desired(r: RolloutStatus | None, events: Sequence[Event] = ()) -> Plan:
        return Plan(
            stable=B.build_deployment(owner, desired.template, rev, B.ROLE_STABLE, full),
            canary=None,
            stable_revision=rev,
            canary_revision=None,
            rollout=r,
            events=tuple(events),
            want_ready=full,
        )

    def keep_stable(r: RolloutStatus | None, events: Sequence[Event] = ()) -> Plan:
        return Plan(
            stable=_observed_stable(owner, observed, full),
            canary=None,
            stable_revision=stable_obs_rev,
            canary_revision=None,
            rollout=r,
            events=tuple(events),
            want_ready=full,
        )

    if spec.paused:
        return Plan(None, None, stable_obs_rev, observed.deployment_revision(B.ROLE_CANARY), prev, want_ready=full, hands_off=True)
    if spec.rollout is None or stable_obs_rev is None or stable_obs_rev == rev:
        # No canary wanted, or nothing to compare with yet (first deploy), or the spec is the stable one.
        if prev and prev.phase in ACTIVE and stable_obs_rev == rev:
            if prev.revision == rev:
                # The stable Deployment already carries this rollout's canary template: only a promotion puts it
                # there, and the operator stopped (or its status write failed) between applying it and recording
                # it. Record the promotion it made instead of reading the spec as reverted.
                msg = f"canary {rev} promoted to stable (the promotion was applied before the operator restarted)"
                return take_desired(
                    _upd(prev, phase="Promoted", verdict="Promote", reason="PromotionApplied", message=msg),
                    [Event("Normal", "CanaryPromoted", msg)],
                )
            return take_desired(_upd(prev, phase="Aborted", reason="SpecReverted", message="spec is back at the stable revision"))
        return take_desired(prev if prev and prev.phase not in ACTIVE else None)

    held = prev is not None and prev.revision == rev and prev.phase in HELD_PHASES
    if held:
        return keep_stable(prev)

    steps = spec.rollout.steps
    events: list[Event] = []
    if prev is None or prev.revision != rev or prev.phase not in ACTIVE:
        k = steps[0].replicas
        need = k * spec.gpus_per_replica
        want_fresh = spec.rollout.baseline == "Fresh"
        capacity = spec.rollout.capacity
        baseline = "Fresh" if want_fresh and _fresh_fits(capacity, full, k) else "Stable"
        if capacity == "Auto":
            free = free_gpus if free_gpus is not None else -1
            if want_fresh and free >= 2 * need:
                capacity, baseline = "Surge", "Fresh"
            elif want_fresh and full >= 2 * k:
                # A fresh baseline is worth more than a surged canary compared with old pods.
                capacity, baseline = "Borrow", "Fresh"
            else:
                capacity, baseline = ("Surge" if free >= need else "Borrow"), "Stable"
        r = RolloutStatus(
            phase="Progressing",
            revision=rev,
            step=0,
            capacity=capacity,
            baseline=baseline,
            started_at=_iso(now),
            step_started_at=_iso(now),
            message=f"canary {rev} started ({capacity.lower()}, {baseline.lower()} baseline), stable {stable_obs_rev}",
        )
        detail = "" if baseline == spec.rollout.baseline else "; no capacity for a fresh baseline, comparing with the stable pods"
        events.append(Event("Normal", "CanaryStarted", f"canary revision {rev} against stable {stable_obs_rev} ({capacity}, {baseline} baseline{detail})"))
    else:
        r = prev

    # The decision point: the user's action (the rollout-action annotation), the canary's start-up and the
    # gate's verdict are its inputs, each mapped to one transition below; nothing here re-derives a verdict.
    if action == "abort":
        r = _upd(r, phase="Aborted", reason="AbortedByUser", message="aborted by annotation")
        events.append(Event("Warning", "CanaryAborted", f"canary {rev} aborted by annotation"))
    elif action == "pause" and r.phase != "Paused":
        r = _upd(r, phase="Paused", reason="PausedByUser", message="paused by annotation")
    elif action == "resume" and r.phase == "Paused":
        # The step's analysis starts afresh (a new clock), once its canary pods are Ready again.
        r = _upd(r, phase="Progressing", analysis_started_at=None, data_started_at=None, step_started_at=_iso(now), reason="Resumed", message="resumed by annotation")
    elif action == "promote":
        # The user's promotion is an input like the gate's verdict, and wins over it: the remaining steps are
        # skipped, and this round's analysis (if any) is not recorded as the reason.
        r = _upd(r, step=len(steps) - 1, phase="Promoted", verdict="Promote", reason="PromotedByUser",
                 message="promoted by annotation")
        events.append(Event("Normal", "CanaryPromoted", f"canary {rev} promoted to stable: promoted by annotation"))

    # Canary pods that cannot be placed on spare GPUs: borrow a stable replica instead of waiting.
    step_replicas = steps[min(r.step, len(steps) - 1)].replicas
    if r.phase == "Progressing" and r.capacity == "Surge":
        stuck = observed.unschedulable(B.ROLE_CANARY) or observed.unschedulable(B.ROLE_BASELINE)
        if stuck and now - parse_time(r.step_started_at) >= SURGE_PATIENCE_S:
            r = _upd(r, capacity="Borrow", message=f"no spare GPU for the canary ({stuck.unschedulable}); borrowing")
            events.append(Event("Normal", "CanaryBorrowing", "no spare GPU for the canary: borrowing a stable replica"))
    fresh = r.baseline == "Fresh"
    if fresh and r.phase in ACTIVE and not _fresh_fits(r.capacity or "Borrow", full, step_replicas):
        r = _upd(r, baseline="Stable", message=f"{full} replicas cannot lend {2 * step_replicas}: comparing with the stable pods")
        events.append(Event("Normal", "CanaryBaselineStable", f"no capacity for a fresh baseline of {step_replicas}: comparing with the stable pods"))
        fresh = False

    if r.phase == "Progressing":
        baseline_ready = not fresh or observed.updated_ready(B.ROLE_BASELINE, stable_obs_rev) >= step_replicas
        if observed.updated_ready(B.ROLE_CANARY, rev) >= step_replicas and baseline_ready:
            r = _upd(r, phase="Analysing", analysis_started_at=_iso(now), data_started_at=None)
        elif now - parse_time(r.step_started_at) >= parse_duration(spec.rollout.startup_timeout):
            msg = f"canary pods of step {r.step + 1} not Ready within startupTimeout {spec.rollout.startup_timeout}"
            r = _upd(r, phase="RolledBack", verdict="Rollback", reason="CanaryStartTimeout", message=msg)
            events.append(Event("Warning", "CanaryRolledBack", f"canary {rev} rolled back: {msg}"))

    if decision is not None and r.phase == "Analysing":
        if decision.warning and not r.warning:
            events.append(Event("Warning", "CanaryMarginUnresolvable", decision.warning))
        r = _upd(
            r,
            last_analysis_at=_iso(now),
            analyses=r.analyses + 1,
            signals=_signals(decision) or r.signals,
            verdict=decision.verdict,
            reason=decision.reason,
            message=decision.message,
            warning=decision.warning,
            data_started_at=r.data_started_at or (
                _iso(decision.clock_started_at) if decision.clock_started_at is not None else None),
        )
        if decision.verdict == "Rollback":
            r = _upd(r, phase="RolledBack", regressed_function=decision.regressed_function, regressed_stage=decision.regressed_stage)
            fn = f"; function {decision.regressed_function} grew most" if decision.regressed_function else ""
            events.append(Event("Warning", "CanaryRolledBack", f"canary {rev} rolled back: {decision.message}{fn}"))
        elif decision.verdict == "Pause":
            r = _upd(r, phase="Paused")
            events.append(Event("Warning", "CanaryPaused", f"canary {rev} paused: {decision.message}"))
        elif decision.verdict == "Promote":
            if r.step + 1 < len(steps):
                r = _upd(r, step=r.step + 1, step_started_at=_iso(now), analysis_started_at=None, data_started_at=None,
                         phase="Progressing")
                events.append(Event("Normal", "CanaryStep", f"canary {rev} passed step {r.step}; moving on"))
            else:
                r = _upd(r, phase="Promoted")
                events.append(Event("Normal", "CanaryPromoted", f"canary {rev} promoted to stable: {decision.message}"))

    if r.phase == "Promoted":
        return take_desired(r, events)
    if r.phase in HELD_PHASES:
        return keep_stable(r, events)
    canary_replicas = steps[min(r.step, len(steps) - 1)].replicas
    fresh = r.baseline == "Fresh"
    baseline_replicas = canary_replicas if fresh else 0
    lent = canary_replicas + baseline_replicas
    stable_replicas = full if r.capacity == "Surge" else max(full - lent, 0)
    return Plan(
        stable=_observed_stable(owner, observed, stable_replicas),
        canary=B.build_deployment(owner, desired.template, rev, B.ROLE_CANARY, canary_replicas),
        baseline=_observed_stable(owner, observed, baseline_replicas, B.ROLE_BASELINE) if fresh else None,
        stable_revision=stable_obs_rev,
        canary_revision=rev,
        rollout=r,
        events=tuple(events),
        want_ready=stable_replicas + canary_replicas + baseline_replicas,
    )
