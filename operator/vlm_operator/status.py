"""Pure: observed objects -> the VLMService status (conditions, replicas, profiler summary).

`Observed` is what the operator knows about the cluster (from kopf indexes or
a list call); `build_status` is deterministic given it and `now`, and returns the
typed `api.VLMServiceStatus` (validated); `status_body` is what is written.
`profiler_status` decides whether new profiler windows change what a user sees.
"""

from __future__ import annotations

import logging
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from . import api
from . import conditions as C
from .builders import LABEL_REVISION, LABEL_ROLE, ROLE_CANARY, ROLE_STABLE

log = logging.getLogger("vlm_operator.status")


@dataclass(frozen=True, slots=True)
class PodInfo:
    name: str
    role: str
    revision: str
    phase: str
    ready: bool
    unschedulable: str | None = None  # the scheduler's message when PodScheduled=False/Unschedulable
    ip: str | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PodInfo:
        meta = body.get("metadata", {}) or {}
        labels = meta.get("labels", {}) or {}
        st = body.get("status", {}) or {}
        conds = st.get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
        unsched = next(
            (
                c.get("message") or "Unschedulable"
                for c in conds
                if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
            ),
            None,
        )
        return cls(
            name=meta.get("name", ""),
            role=labels.get(LABEL_ROLE, ""),
            revision=labels.get(LABEL_REVISION, ""),
            phase=st.get("phase", "Unknown"),
            ready=ready,
            unschedulable=unsched,
            ip=st.get("podIP"),
        )


@dataclass(frozen=True)
class Observed:
    deployments: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # role -> body
    pods: Sequence[PodInfo] = ()
    service: Mapping[str, Any] | None = None
    monitoring: frozenset[str] = frozenset()  # kinds of the service's monitoring objects that exist (PodMonitor, ...)

    def deployment_revision(self, role: str) -> str | None:
        d = self.deployments.get(role)
        if not d:
            return None
        return ((d.get("metadata") or {}).get("labels") or {}).get(LABEL_REVISION)

    def ready_replicas(self, role: str) -> int:
        d = self.deployments.get(role) or {}
        return int((d.get("status") or {}).get("readyReplicas") or 0)

    def updated_ready(self, role: str, revision: str) -> int:
        return sum(1 for p in self.pods if p.role == role and p.revision == revision and p.ready)

    def unschedulable(self, role: str | None = None) -> PodInfo | None:
        """The first unschedulable pod by name: deterministic, so a resync does not rewrite the message."""
        stuck = [p for p in self.pods if p.unschedulable and (role is None or p.role == role)]
        return min(stuck, key=lambda p: p.name) if stuck else None


@dataclass(frozen=True)
class Health:
    """The facts the conditions are made of; also handy for tests."""

    want: int
    ready: int
    invalid: str | None = None  # message when the spec is invalid
    refused: str | None = None  # message when the API server refused (403 & co.) an object this spec makes
    unschedulable: str | None = None
    rolling: bool = False
    rollout_phase: str | None = None
    rollout_message: str | None = None
    rollout_analyses: int = 0
    rollout_warning: str | None = None  # the gate's: the pods' spread keeps it from resolving the margin
    ipc_active: bool | None = None
    ipc_reason: str = "Unknown"
    ipc_message: str = ""


def health_conditions(h: Health) -> list[C.Cond]:
    conds: list[C.Cond] = []
    if h.invalid:
        conds.append(C.Cond(C.READY, False, "InvalidSpec", h.invalid))
        conds.append(C.Cond(C.DEGRADED, True, "InvalidSpec", h.invalid))
        conds.append(C.Cond(C.PROGRESSING, False, "InvalidSpec", "fix the spec to continue"))
        return conds
    if h.refused and h.ready < h.want:
        conds.append(C.Cond(C.READY, False, "ApplyRefused", h.refused))
    elif h.unschedulable and h.ready < h.want:
        conds.append(C.Cond(C.READY, False, "Unschedulable", h.unschedulable))
    elif h.ready >= h.want:
        conds.append(C.Cond(C.READY, True, "AllReplicasReady", f"{h.ready}/{h.want} replicas ready"))
    else:
        conds.append(C.Cond(C.READY, False, "ReplicasNotReady", f"{h.ready}/{h.want} replicas ready"))
    if h.rollout_phase in ("Progressing", "Analysing", "Paused"):
        conds.append(C.Cond(C.PROGRESSING, True, f"Canary{h.rollout_phase}", h.rollout_message or ""))
    elif h.rolling:
        conds.append(C.Cond(C.PROGRESSING, True, "RollingUpdate", "the Deployment is rolling to a new revision"))
    else:
        conds.append(C.Cond(C.PROGRESSING, False, "Complete", "no rollout in progress"))
    if h.refused:
        conds.append(C.Cond(C.DEGRADED, True, "ApplyRefused", h.refused))
    elif h.unschedulable:
        conds.append(C.Cond(C.DEGRADED, True, "Unschedulable", h.unschedulable))
    elif h.rollout_phase == "RolledBack":
        conds.append(C.Cond(C.DEGRADED, True, "CanaryRolledBack", h.rollout_message or ""))
    else:
        conds.append(C.Cond(C.DEGRADED, False, "AsExpected", ""))
    if h.ipc_active is not None:
        conds.append(C.Cond(C.IPC_CACHE_ACTIVE, h.ipc_active, h.ipc_reason, h.ipc_message))
    if h.rollout_phase is not None:
        conds.append(margin_condition(h))
    return conds


def margin_condition(h: Health) -> C.Cond:
    """MarginResolvable: can the gate resolve the loop-latency margin with the pods it compares? False
    (PodSpreadTooLarge) when the pods' own spread alone exceeds what the margin allows; Unknown while no
    analysis of a rollout in progress has run (and after the rollout ended)."""
    if h.rollout_phase not in ("Progressing", "Analysing", "Paused") or h.rollout_analyses == 0:
        return C.Cond(C.MARGIN_RESOLVABLE, None, "NotAnalysing", "no canary analysis in progress")
    if h.rollout_warning:
        return C.Cond(C.MARGIN_RESOLVABLE, False, "PodSpreadTooLarge", h.rollout_warning)
    return C.Cond(C.MARGIN_RESOLVABLE, True, "WithinResolution",
                  "the pods' spread lets the gate resolve the loop-latency margin")


def summary_phase(h: Health) -> str:
    if h.invalid or (h.refused and h.ready < h.want):
        return "Failed"
    if h.rollout_phase in ("Progressing", "Analysing", "Paused"):
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
) -> api.VLMServiceStatus:
    """The full status (as written through the status subresource), validated by the model."""
    merged = C.merge(current.get("conditions") or [], health_conditions(h), generation=generation, now=now)
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
        sglang=sglang,
    )


def status_body(st: api.VLMServiceStatus) -> dict[str, Any]:
    """The status as the API server stores it (camelCase, unset fields left out, so the patch nulls them)."""
    return st.model_dump(by_alias=True, exclude_none=True, mode="json")


def _lenient(model: type[BaseModel], value: Any, what: str) -> Any:
    if value is None:
        return None
    try:
        return model.model_validate(value)
    except ValidationError as e:
        log.warning("ignoring status.%s the model refuses: %s", what, e.errors()[:1])
        return None


CARRIED = ("selector", "stable_revision", "canary_revision", "rollout", "profiler", "sglang")


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


def running_health(
    observed: Observed,
    *,
    want: int,
    rollout: api.RolloutStatus | None,
    ipc_active: bool | None,
    ipc_reason: str = "Unknown",
    ipc_message: str = "",
) -> Health:
    """The health of a service with a valid spec: ready pods of every role against what the plan wants."""
    unsched = observed.unschedulable()
    return Health(
        want=want,
        ready=sum(1 for p in observed.pods if p.ready),
        unschedulable=f"pod {unsched.name}: {unsched.unschedulable}" if unsched else None,
        rolling=rolling(observed),
        rollout_phase=rollout.phase if rollout else None,
        rollout_message=rollout.message if rollout else None,
        rollout_analyses=rollout.analyses if rollout else 0,
        rollout_warning=rollout.warning if rollout else None,
        ipc_active=ipc_active,
        ipc_reason=ipc_reason,
        ipc_message=ipc_message,
    )


def sglang_status(image: str, version: str | None) -> api.SGLangStatus:
    """status.sglang: the image the pods run (the spec's or the operator's default) and its version."""
    return api.SGLangStatus(image=image, version=version)


# ---------------------------------------------------------------- profiler summary

WRAPPER_SHARE = 0.9  # functions around (almost) the whole loop are not news; the hottest one below them is
LOOP_ROOTS = ("event_loop", "run_scheduler_process", "<module>", "main", "run_event_loop")
TOP_MARGIN = 0.02  # share (of loop time) by which another function must beat the shown topFunction
PROFILER_TOLERANCE = 0.05
PROFILER_REFRESH_S = 1800.0


@dataclass(frozen=True)
class ProfilerSummary:
    """The exact numbers behind status.profiler (the status shows them rounded)."""

    last_end: float  # unix seconds: end of the newest window
    loop_p50_s: float  # median over windows of the loop mean
    loop_p95_s: float | None  # median over windows of the loop p95
    top_function: str | None
    shares: Mapping[str, float]  # mean inclusive share per function below the loop wrappers

    def to_status(self) -> api.ProfilerStatus:
        return api.ProfilerStatus(
            last_sample_time=datetime.fromtimestamp(self.last_end, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            loop_p50=_ms(self.loop_p50_s),
            loop_p95=_ms(self.loop_p95_s) if self.loop_p95_s else None,
            top_function=self.top_function,
        )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}ms"


_MS = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*ms\s*$")


def _parse_ms(text: str | None) -> float | None:
    m = _MS.match(text or "")
    return float(m.group(1)) / 1000 if m else None


def profiler_summary(windows: Sequence[Any]) -> ProfilerSummary | None:
    """Loop latency and the hottest function below the loop wrappers over usable (non-stale) windows."""
    ws = [w for w in windows if w.loop_mean_seconds and not w.stale]
    if not ws:
        return None
    shares: dict[str, list[float]] = {}
    for w in ws:
        for fn, v in w.function_shares.items():
            if not fn.startswith(LOOP_ROOTS):
                shares.setdefault(fn, []).append(v)
    means = {f: statistics.fmean(v) for f, v in shares.items()}
    means = {f: m for f, m in means.items() if m < WRAPPER_SHARE}
    top = max(sorted(means), key=means.__getitem__) if means else None  # sorted: ties break the same way
    p95s = [w.loop_p95_seconds for w in ws if w.loop_p95_seconds]
    return ProfilerSummary(
        last_end=max(w.end for w in ws),
        loop_p50_s=statistics.median(w.loop_mean_seconds for w in ws),
        loop_p95_s=statistics.median(p95s) if p95s else None,
        top_function=top,
        shares=means,
    )


def _moved(shown: str | None, value: float | None, tolerance: float) -> bool:
    if value is None:
        return shown is not None
    old = _parse_ms(shown)
    if old is None:
        return True
    if _ms(value) == shown:
        return False
    return old == 0 or abs(value - old) / old > tolerance


def profiler_status(
    current: api.ProfilerStatus | None,
    windows: Sequence[Any],
    *,
    tolerance: float = PROFILER_TOLERANCE,
    refresh_s: float = PROFILER_REFRESH_S,
) -> api.ProfilerStatus | None:
    """status.profiler after new windows: the current one unless what a user sees changed.

    A new summary replaces the shown one when loopP50 or loopP95 moved by more than `tolerance`
    (relative), when another function leads the shown topFunction by more than TOP_MARGIN of the loop
    (so two close functions do not flap), or when the shown lastSampleTime is `refresh_s` older than the
    newest window (the profiler is still alive). No usable window: the current one is kept.
    """
    s = profiler_summary(windows)
    if s is None:
        return current
    fresh = s.to_status()
    if current is None:
        return fresh
    shown_at = _parse_time(current.last_sample_time)
    if shown_at is None or s.last_end - shown_at >= refresh_s or s.last_end < shown_at:
        return fresh
    if _moved(current.loop_p50, s.loop_p50_s, tolerance) or _moved(current.loop_p95, s.loop_p95_s, tolerance):
        return fresh
    if current.top_function != s.top_function:
        if s.top_function is None or current.top_function not in s.shares:
            return fresh
        if s.shares[s.top_function] - s.shares[current.top_function] > TOP_MARGIN:
            return fresh
    return current


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# ---------------------------------------------------------------- the IPC cache, seen in the profile

IPC_OBSERVED = "ObservedInProfile"
IPC_NOT_OBSERVED = "NotObserved"
IPC_VERIFIED_REASONS = (IPC_OBSERVED, IPC_NOT_OBSERVED)
REOPEN_FRACTION = 0.2  # of a pod's feature-transport time spent re-opening IPC handles: the cache is not working
MIN_FEATURE_SAMPLES = 3  # a window with fewer samples in the feature transport says nothing about the cache
_OBSERVED_MESSAGE = re.compile(r"^revision (\S+): ")


@dataclass(frozen=True)
class IPCObservation:
    """What the stable pods' windows say about the pool-handle cache (windows with feature traffic only)."""

    windows: int  # usable windows that saw multimodal feature traffic
    reopen_fraction: Mapping[str, float]  # pod -> share of its feature-transport time re-opening IPC handles

    @property
    def reopening(self) -> list[str]:
        return sorted(p for p, f in self.reopen_fraction.items() if f >= REOPEN_FRACTION)


def ipc_observation(windows: Sequence[Any]) -> IPCObservation | None:
    """None until a usable window has seen feature traffic (a text-only window says nothing about the cache);
    windows whose sidecar does not report the IPC fields are unknown and left out."""
    per_pod: dict[str, list[float]] = {}
    n = 0
    for w in windows:
        feature, reopen = getattr(w, "feature_transport_share", None), getattr(w, "ipc_handle_reopen_share", None)
        samples = getattr(w, "feature_transport_samples", None)
        if w.stale or feature is None or reopen is None or feature <= 0:
            continue
        if samples is not None and samples < MIN_FEATURE_SAMPLES:
            continue
        n += 1
        acc = per_pod.setdefault(w.pod, [0.0, 0.0])
        acc[0] += feature
        acc[1] += min(reopen, feature)
    if not per_pod:
        return None
    return IPCObservation(windows=n, reopen_fraction={p: r / f for p, (f, r) in sorted(per_pod.items())})


def ipc_condition(
    active: bool,
    reason: str,
    message: str,
    *,
    revision: str,
    stable_revision: str | None,
    observation: IPCObservation | None,
    current: Mapping[str, Any] | None,
) -> tuple[bool | None, str, str]:
    """IPCCacheActive (status, reason, message) from what the pods do where the operator switched the cache on.

    The flags' reason (`active`, `reason`, `message`: the plan) stands while the cache is not switched on,
    while the stable pods run another revision than the spec's (a rollout: their flags may differ), and until
    a window of the stable pods has seen feature traffic. Then ObservedInProfile (True: no pod re-opens IPC
    handles) or NotObserved (False: a pod re-opens them although told to cache). Without a new observation the
    last verdict of the same revision is kept (its message starts with `revision REV: `), so a quiet minute or
    an unreachable sidecar does not bring back the flags' reason.
    """
    if not active or not stable_revision or stable_revision != revision:
        return active, reason, message
    if observation is not None:
        pods = observation.reopening
        if pods:
            return False, IPC_NOT_OBSERVED, (
                f"revision {revision}: pod(s) {', '.join(pods)} re-open a CUDA IPC handle per image feature "
                f"although the pool-handle cache was switched on ({message.rstrip('.')}); the profile shows "
                "_open_pooled_storage_uncached or an inline open under reconstruct_on_target_device: check the "
                "SGLang version, the image's env and spec.sglang.args"
            )
        return True, IPC_OBSERVED, (
            f"revision {revision}: the pods' profiles show no IPC handle re-opens under image-feature traffic; "
            f"{message}"
        )
    if current and current.get("reason") in IPC_VERIFIED_REASONS:
        m = _OBSERVED_MESSAGE.match(current.get("message") or "")
        if m and m.group(1) == revision:
            return current.get("status") == "True", current["reason"], current.get("message") or ""
    return active, reason, message


def rolling(observed: Observed, role: str = ROLE_STABLE) -> bool:
    d = observed.deployments.get(role) or {}
    spec, st = d.get("spec") or {}, d.get("status") or {}
    want = int(spec.get("replicas") or 0)
    return bool(d) and (
        int(st.get("updatedReplicas") or 0) < want
        or int(st.get("replicas") or 0) > want
        or (st.get("observedGeneration") or 0) < ((d.get("metadata") or {}).get("generation") or 0)
    )


__all__ = [
    "ROLE_CANARY",
    "ROLE_STABLE",
    "Health",
    "IPCObservation",
    "Observed",
    "PodInfo",
    "ProfilerSummary",
    "build_status",
    "carried",
    "invalid_spec_message",
    "ipc_condition",
    "ipc_observation",
    "parse_status",
    "profiler_status",
    "profiler_summary",
    "rolling",
    "running_health",
    "sglang_status",
    "status_body",
]
