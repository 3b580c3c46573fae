"""Pure: what the reconcile found and decided -> the VLMService status (conditions, replicas, phase).

`Health` holds the facts the conditions are made of; `build_status` is deterministic given it and `now`, and
returns the typed `api.VLMServiceStatus` (validated); `status_body` is what is written. The profiler summary
and the IPC cache's verdict come from `vlm_operator.analysis.profile`, the cluster snapshot from
`vlm_operator.cluster.observed`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.names import ACTIVE_PHASES, UPDATING
from vlm_operator.cluster.observed import Observed
from vlm_operator.status import conditions as C

log = logging.getLogger("vlm_operator.status.build")


@dataclass(frozen=True)
class Health:
    """The facts the conditions are made of; also handy for tests."""

    want: int
    ready: int
    invalid: str | None = None  # message when the spec is invalid
    refused: str | None = None  # message when the API server refused (403 & co.) an object this spec makes
    unschedulable: str | None = None
    # Why pods cannot serve, when something will not fix itself (reason, message): FailedCreate (the ReplicaSet
    # cannot create pods: Pod Security, a quota), ImagePullFailed, ContainerConfigError, CrashLoopBackOff,
    # OOMKilled, StartupBudgetExhausted (FAILURE_REASONS).
    failure: tuple[str, str] | None = None
    rolling: bool = False
    rollout_phase: str | None = None
    rollout_message: str | None = None
    rollout_analyses: int = 0
    rollout_warning: str | None = None  # the gate's: the pods' spread keeps it from resolving the margin
    rollout_waiting: str | None = None  # why no pod is being replaced now (the budget, no free GPU)
    ipc_active: bool | None = None
    ipc_reason: str = "Unknown"
    ipc_message: str = ""
    # model.cache.download: (weights there, reason, message); None when the operator downloads nothing
    model: tuple[bool, str, str] | None = None
    # spec.autoscaling: (its ScaledObject written, reason, message); None without spec.autoscaling (no condition)
    autoscaling: tuple[bool, str, str] | None = None


def health_conditions(h: Health) -> list[C.Cond]:
    conds: list[C.Cond] = []
    if h.invalid:
        conds.append(C.Cond(C.READY, False, "InvalidSpec", h.invalid))
        conds.append(C.Cond(C.DEGRADED, True, "InvalidSpec", h.invalid))
        conds.append(C.Cond(C.PROGRESSING, False, "InvalidSpec", "fix the spec to continue"))
        return conds
    if h.refused and h.ready < h.want:
        conds.append(C.Cond(C.READY, False, "ApplyRefused", h.refused))
    elif h.model is not None and not h.model[0] and h.ready < h.want:
        conds.append(C.Cond(C.READY, False, "WaitingForModel" if h.model[1] == "Downloading" else h.model[1],
                            h.model[2]))
    elif h.failure and h.ready < h.want:
        conds.append(C.Cond(C.READY, False, *h.failure))
    elif h.unschedulable and h.ready < h.want:
        conds.append(C.Cond(C.READY, False, "Unschedulable", h.unschedulable))
    elif h.ready >= h.want:
        conds.append(C.Cond(C.READY, True, "AllReplicasReady", f"{h.ready}/{h.want} replicas ready"))
    else:
        conds.append(C.Cond(C.READY, False, "ReplicasNotReady", f"{h.ready}/{h.want} replicas ready"))
    if h.rollout_phase in ACTIVE_PHASES:
        conds.append(C.Cond(C.PROGRESSING, True, f"Canary{h.rollout_phase}", _joined(h.rollout_message, h.rollout_waiting)))
    elif h.rollout_phase == UPDATING:
        conds.append(C.Cond(C.PROGRESSING, True, "Updating",
                            _joined(h.rollout_message, h.rollout_warning, h.rollout_waiting)))
    elif h.rolling:
        conds.append(C.Cond(C.PROGRESSING, True, "RollingUpdate", "the Deployment is rolling to a new revision"))
    else:
        conds.append(C.Cond(C.PROGRESSING, False, "Complete", "no rollout in progress"))
    if h.refused:
        conds.append(C.Cond(C.DEGRADED, True, "ApplyRefused", h.refused))
    elif h.model is not None and h.model[1] == "DownloadFailed":
        conds.append(C.Cond(C.DEGRADED, True, "DownloadFailed", h.model[2]))
    elif h.failure:
        conds.append(C.Cond(C.DEGRADED, True, *h.failure))
    elif h.unschedulable:
        conds.append(C.Cond(C.DEGRADED, True, "Unschedulable", h.unschedulable))
    elif h.rollout_phase == "RolledBack":
        conds.append(C.Cond(C.DEGRADED, True, "CanaryRolledBack", h.rollout_message or ""))
    else:
        conds.append(C.Cond(C.DEGRADED, False, "AsExpected", ""))
    if h.model is not None:
        conds.append(C.Cond(C.MODEL_READY, *h.model))
    if h.ipc_active is not None:
        conds.append(C.Cond(C.IPC_CACHE_ACTIVE, h.ipc_active, h.ipc_reason, h.ipc_message))
    if h.rollout_phase is not None:
        conds.append(margin_condition(h))
    if h.autoscaling is not None:
        conds.append(C.Cond(C.AUTOSCALING, *h.autoscaling))
    return conds


def _joined(*parts: str | None) -> str:
    return "; ".join(p for p in parts if p)


def margin_condition(h: Health) -> C.Cond:
    """MarginResolvable: can the gate resolve the loop-latency margin with the pods it compares? False
    (PodSpreadTooLarge) when the pods' own spread alone exceeds what the margin allows; Unknown while no
    analysis of a rollout in progress has run (and after the rollout ended)."""
    if h.rollout_phase not in ACTIVE_PHASES or h.rollout_analyses == 0:
        return C.Cond(C.MARGIN_RESOLVABLE, None, "NotAnalysing", "no canary analysis in progress")
    if h.rollout_warning:
        return C.Cond(C.MARGIN_RESOLVABLE, False, "PodSpreadTooLarge", h.rollout_warning)
    return C.Cond(C.MARGIN_RESOLVABLE, True, "WithinResolution",
                  "the pods' spread lets the gate resolve the loop-latency margin")


def summary_phase(h: Health) -> str:
    if h.invalid or (h.refused and h.ready < h.want) or (h.failure and h.ready == 0 and h.want > 0):
        return "Failed"
    if h.rollout_phase in ACTIVE_PHASES:
        return "Canary"
    if h.rollout_phase == "RolledBack":
        return "RolledBack"
    if h.ready >= h.want:
        return "Ready"
    return "Pending"


def _condition(c: Mapping[str, Any]) -> api.Condition | None:
    """A merged condition as the model; one the model refuses (written by someone else) is dropped."""
    body = dict(c)
    if len(body.get("message") or "") > MAX_MESSAGE:
        body["message"] = body["message"][: MAX_MESSAGE - 3] + "..."
    try:
        return api.Condition.model_validate(body)
    except ValidationError as e:
        log.warning("dropping condition %s from status: %s", body.get("type"), e.errors()[:1])
        return None


MAX_MESSAGE = 32768  # api.Condition.message's max_length


def build_status(
    current: Mapping[str, Any],
    h: Health,
    *,
    generation: int | None,
    now: datetime,
    selector: str | None = None,
    stable_revision: str | None = None,
    canary_revision: str | None = None,
    rollout: api.RolloutStatus | None = None,
    profiler: api.ProfilerStatus | None = None,
    sglang: api.SGLangStatus | None = None,
    calibration: api.CalibrationStatus | None = None,
    autoscaling: api.AutoscalingStatus | None = None,
) -> api.VLMServiceStatus:
    """The full status (as written through the status subresource), validated by the model."""
    merged = C.merge(current.get("conditions") or [], health_conditions(h), generation=generation, now=now)
    if h.autoscaling is None and not h.invalid:  # spec.autoscaling removed: its condition goes with it
        merged = [c for c in merged if c.get("type") != C.AUTOSCALING]
    conditions = [c for c in (_condition(m) for m in merged) if c is not None]
    return api.VLMServiceStatus(
        observed_generation=generation,
        phase=summary_phase(h),
        conditions=conditions,
        replicas=h.want,
        ready_replicas=h.ready,
        selector=selector,
        stable_revision=stable_revision,
        canary_revision=canary_revision,
        rollout=rollout,
        profiler=profiler,
        calibration=calibration,
        sglang=sglang,
        autoscaling=autoscaling,
    )


def status_body(st: api.VLMServiceStatus) -> dict[str, Any]:
    """The status as the API server stores it (camelCase, unset fields left out, so the patch nulls them)."""
    return st.model_dump(by_alias=True, exclude_none=True, mode="json")


CARRIED = ("selector", "stable_revision", "canary_revision", "rollout", "profiler", "calibration", "sglang")


def parse_status(current: Mapping[str, Any]) -> api.VLMServiceStatus:
    """The status read from the API server as the model; a field the model refuses is left out
    (someone edited it by hand), never an exception that would stall the reconcile."""
    try:
        return api.VLMServiceStatus.model_validate(dict(current))
    except ValidationError:
        pass
    out: dict[str, Any] = {}
    for name, f in api.VLMServiceStatus.model_fields.items():
        key = f.alias or name
        if key not in current:
            continue
        try:
            api.VLMServiceStatus.model_validate({key: current[key]})
            out[key] = current[key]
        except ValidationError as e:
            log.warning("ignoring status.%s the model refuses: %s", key, e.errors()[:1])
    return api.VLMServiceStatus.model_validate(out)


def carried(current: Mapping[str, Any]) -> dict[str, Any]:
    """What an invalid spec keeps of the last good status (revisions, rollout, profiler, ...):
    keywords of `build_status`."""
    st = parse_status(current)
    return {k: getattr(st, k) for k in CARRIED}


def invalid_spec_message(e: ValidationError) -> str:
    """The first five errors of an invalid spec, each with its field path (`spec.model.path: ...`)."""
    parts = []
    for err in e.errors()[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()))
        parts.append(f"spec.{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    return "; ".join(parts)


FAILURE_REASONS = ("FailedCreate", "ImagePullFailed", "ContainerConfigError", "CrashLoopBackOff", "OOMKilled",
                   "StartupBudgetExhausted", "DownloadFailed")  # the last: the weights Job (rollout.weights)
# A container killed (SIGKILL/SIGTERM) after running at least this share of its startup budget was most likely
# killed by its startup probe: the model did not load in time.
_STARTUP_KILL_SHARE = 0.9


def failure(observed: Observed, startup_budget_s: float | None = None) -> tuple[str, str] | None:
    """Why the service's pods cannot serve, where it needs a person: the ReplicaSet cannot create them, or a pod
    (the first by name) cannot pull its image, is refused its configuration, or crash-loops."""
    refused = observed.create_failure()
    if refused:
        return "FailedCreate", refused
    pod = observed.failing()
    if pod is None or pod.problem is None:
        return None
    reason, message = pod.problem
    if (reason == "CrashLoopBackOff" and startup_budget_s and pod.last_run_s is not None
            and pod.last_run_s >= _STARTUP_KILL_SHARE * startup_budget_s and ("exit code 137" in message or "exit code 143" in message)):
        return "StartupBudgetExhausted", (
            f"pod {pod.name}: killed by its startup probe after {pod.last_run_s:.0f}s of a {startup_budget_s:.0f}s "
            f"startup budget (the model did not load in time; raise the startup budget or cache the weights); {message}")
    return reason, f"pod {pod.name}: {message}"


def running_health(
    observed: Observed,
    *,
    want: int,
    rollout: api.RolloutStatus | None,
    ipc_active: bool | None,
    ipc_reason: str = "Unknown",
    ipc_message: str = "",
    startup_budget_s: float | None = None,
    model: tuple[bool, str, str] | None = None,
    autoscaling: tuple[bool, str, str] | None = None,
) -> Health:
    """The health of a service with a valid spec: ready pods of every role against what the plan wants."""
    unsched = observed.unschedulable()
    return Health(
        want=want,
        ready=sum(1 for p in observed.pods if p.ready),
        unschedulable=f"pod {unsched.name}: {unsched.unschedulable}" if unsched else None,
        failure=failure(observed, startup_budget_s),
        rolling=observed.rolling(),
        rollout_phase=rollout.phase if rollout else None,
        rollout_message=rollout.message if rollout else None,
        rollout_analyses=rollout.analyses if rollout else 0,
        # The margin's (or the update's outage) warning; expandCeiling's lines say nothing of the margin.
        rollout_warning="\n".join(w for w in (rollout.warning or "").splitlines()
                                   if not w.startswith("expandCeiling.")) or None if rollout else None,
        rollout_waiting=rollout.waiting if rollout else None,
        ipc_active=ipc_active,
        ipc_reason=ipc_reason,
        ipc_message=ipc_message,
        model=model,
        autoscaling=autoscaling,
    )


def sglang_status(image: str, version: str | None) -> api.SGLangStatus:
    """status.sglang: the image the pods run (the spec's or the operator's default) and its version."""
    return api.SGLangStatus(image=image, version=version)
