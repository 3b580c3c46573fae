"""What the stable pods' profiles say, for status: the profiler summary (status.profiler) and whether the
CUDA IPC pool-handle cache is seen working (the IPCCacheActive condition). Pure: windows in, status out."""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vlm_operator.analysis.window import Window, loop_wide
from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.units import format_time, parse_time_or_none

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
            last_sample_time=format_time(self.last_end),
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


def profiler_summary(windows: Sequence[Window]) -> ProfilerSummary | None:
    """Loop latency and the hottest function below the loop wrappers over usable (non-stale) windows."""
    ws = [w for w in windows if w.loop_mean_seconds and not w.stale]
    if not ws:
        return None
    shares: dict[str, list[float]] = {}
    for w in ws:
        for fn, v in w.function_shares.items():
            if not fn.startswith(LOOP_ROOTS):
                shares.setdefault(fn, []).append(v)
    wide = loop_wide([w.function_shares for w in ws])  # not news; the hottest function below them is
    means = {f: statistics.fmean(v) for f, v in shares.items() if f not in wide}
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
    windows: Sequence[Window],
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
    shown_at = parse_time_or_none(current.last_sample_time)
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


def ipc_observation(windows: Sequence[Window]) -> IPCObservation | None:
    """None until a usable window has seen feature traffic (a text-only window says nothing about the cache);
    windows whose sidecar does not report the IPC fields are unknown and left out."""
    per_pod: dict[str, list[float]] = {}
    n = 0
    for w in windows:
        feature, reopen, samples = w.feature_transport_share, w.ipc_handle_reopen_share, w.feature_transport_samples
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
