"""One revision's windows made into analysis units: a pod's TP ranks over one time slice averaged, idle and
stale windows left out, and what keeps a side from being judged (stale, no traffic, too few windows)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from vlm_operator.analysis.gate.policy import GatePolicy
from vlm_operator.analysis.window import Window

# What a service without traffic can do (the NoTraffic reason's message carries it): at maxDuration such a step
# pauses, it is never rolled back for want of traffic (decide._at_max_duration).
NO_TRAFFIC_ADVICE = ("send traffic to the service, or set spec.rollout.load to have the operator send it while a "
                     "step is analysed; at maxDuration the rollout pauses (kubectl vlm promote or abort)")


class Unit:
    """The analysis unit: one pod over one window, its TP ranks averaged (computed on first use,
    since function shares are only needed when gated or when a rollback names the culprit)."""

    def __init__(self, windows: Sequence[Window]):
        self.windows = tuple(windows)
        self.pod = self.windows[0].pod
        self.end = max(w.end for w in self.windows)

    @cached_property
    def values(self) -> Mapping[str, float | None]:
        return {
            name: mean([getattr(w, attr) for w in self.windows]) for name, attr in SCALAR_FIELDS.items()
        }

    @cached_property
    def stage_shares(self) -> Mapping[str, float]:
        return _mean_shares([w.stage_shares for w in self.windows])

    @cached_property
    def sglang_stage_shares(self) -> Mapping[str, float]:
        """SGLang's own stage shares of wall time (its stage counters), TP ranks averaged; empty: not exported."""
        return _mean_shares([w.sglang_stage_shares for w in self.windows if w.sglang_stage_shares]) \
            if any(w.sglang_stage_shares for w in self.windows) else {}

    @cached_property
    def function_shares(self) -> Mapping[str, float]:
        # The keys of a window's function_shares are what its sidecar exported (the watch list plus the
        # top N by self time, a set that changes from window to window): a missing key is unknown, not 0.
        return mean_present([w.function_shares for w in self.windows])

    @cached_property
    def stage_seconds(self) -> Mapping[str, float]:
        """Seconds per loop iteration spent in each stage: share x loop mean."""
        loop = self.values["loop_latency"]
        return {k: v * loop for k, v in self.stage_shares.items()} if loop else {}

    @cached_property
    def function_seconds(self) -> Mapping[str, float]:
        """Seconds per loop iteration inside each exported function (inclusive share x loop mean)."""
        loop = self.values["loop_latency"]
        return {k: v * loop for k, v in self.function_shares.items()} if loop else {}

    @cached_property
    def self_seconds(self) -> Mapping[str, float]:
        """Seconds per loop iteration in each exported function's own code (self share x loop mean)."""
        loop = self.values["loop_latency"]
        return {k: v * loop for k, v in mean_present([w.self_shares for w in self.windows]).items()} if loop else {}

    @cached_property
    def unexported_self_seconds(self) -> float | None:
        """At most this many seconds per iteration in the own code of any function this unit's sidecar did
        not export (the largest bound over its windows); None when a window did not say."""
        loop = self.values["loop_latency"]
        cuts = [w.unexported_self_share_max for w in self.windows]
        return max(cuts) * loop if loop and cuts and None not in cuts else None


    @cached_property
    def fns(self) -> Fns:
        """The scheduler's exported functions, in seconds per loop iteration."""
        return Fns(self.function_seconds, self.self_seconds, self.unexported_self_seconds, self.function_shares)

    @cached_property
    def request_rate(self) -> float | None:
        """Requests per second in this pod's window (its TP ranks read the same SGLang counters)."""
        return mean([w.request_rate for w in self.windows])

    @cached_property
    def forward_pass_rate(self) -> float | None:
        """SGLang's forward passes per second in this pod's window (TP ranks read the same counter)."""
        return mean([w.forward_pass_rate for w in self.windows])

    @cached_property
    def frontend_busy(self) -> Mapping[str, float]:
        """Busy share per sampled front-end role (TP ranks' copies of one front-end window averaged)."""
        return mean_present([{r: x.busy_share for r, x in w.frontend.items()} for w in self.windows])

    def role_fns(self, role: str) -> Fns | None:
        """One front-end role's exported functions, as shares of its threads' time; None: not sampled."""
        got = [w.frontend[role] for w in self.windows if role in w.frontend]
        if not got:
            return None
        incl = mean_present([x.function_shares for x in got])
        cuts = [x.unexported_self_share_max for x in got]
        return Fns(incl, mean_present([x.self_shares for x in got]), None if None in cuts else max(cuts), incl)

    @cached_property
    def edge_seconds(self) -> Mapping[str, float]:
        """Seconds per loop iteration under each exported call edge, "caller;callee" (edge share x loop mean)."""
        loop = self.values["loop_latency"]
        return {k: v * loop for k, v in mean_present([w.edge_shares for w in self.windows]).items()} if loop else {}


@dataclass(frozen=True)
class Fns:
    """One unit's exported functions for attribution: inclusive and self time, in one unit of time per side
    (scheduler: seconds per loop iteration; front-end role: share of its time); `cut`: at most this much self
    time in any function left out of the export (None: unknown); `shares`: inclusive shares (loop-wide test)."""

    incl: Mapping[str, float]
    self_: Mapping[str, float]
    cut: float | None
    shares: Mapping[str, float]


SCALAR_FIELDS = {
    "loop_latency": "loop_mean_seconds",
    "loop_p95": "loop_p95_seconds",
    "ttft": "ttft_seconds",
    "itl": "itl_seconds",
    # Throughput only where the pod was saturated (Window.saturated_throughput): its capacity, not its traffic.
    "throughput": "saturated_throughput",
}


@dataclass(frozen=True)
class Side:
    units: tuple[Unit, ...]
    problem: tuple[str, str] | None  # (reason, message)


def _has_traffic(w: Window, max_idle: float) -> bool:
    if w.samples <= 0 or w.loop_mean_seconds is None or w.iterations == 0:
        return False
    return w.stage_shares.get("idle", 0.0) <= max_idle


def _dedup(windows: Iterable[Window]) -> list[Window]:
    # The caller may hand over overlapping scrapes of /windows.json; the last copy of a window wins. A window is
    # its pod, rank, id and end: a sidecar that restarts counts its ids from 0 again, with new ends.
    seen: dict[tuple[str, int, str, float], Window] = {}
    for w in windows:
        seen[(w.pod, w.tp_rank, w.id, w.end)] = w
    return list(seen.values())


def mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def mean_present(maps: Sequence[Mapping[str, float]]) -> Mapping[str, float]:
    """Per key, the mean over the maps that have it."""
    if len(maps) == 1:
        return maps[0]
    total: dict[str, list[float]] = {}
    for m in maps:
        for k, v in m.items():
            total.setdefault(k, []).append(v)
    return {k: sum(v) / len(v) for k, v in total.items()}


def sglang_disagreement(units: Sequence[Unit]) -> float | None:
    """How far the sidecar's stage shares and SGLang's own stage counters are apart in these units: per unit the
    largest |difference| over the stages both know (each side renormalised over those stages, as the sidecar's
    vlm_profiler_sglang_agreement_max_abs_diff_ratio), the median over units. None: no unit has both."""
    diffs = []
    for u in units:
        a, b = u.stage_shares, u.sglang_stage_shares
        common = sorted(k for k in b if k in a)  # one order of summation, whichever source built the dicts
        ta, tb = sum(a[k] for k in common), sum(b[k] for k in common)
        if ta > 0 and tb > 0:
            diffs.append(max(abs(a[k] / ta - b[k] / tb) for k in common))
    diffs.sort()
    return diffs[len(diffs) // 2] if diffs else None


def _mean_shares(maps: Sequence[Mapping[str, float]]) -> Mapping[str, float]:
    # Stage shares: every window carries every stage, so a missing key is a stage never seen (0).
    if len(maps) == 1:
        return maps[0]
    total: dict[str, float] = {}
    for m in maps:
        for k, v in m.items():
            total[k] = total.get(k, 0.0) + v
    return {k: v / len(maps) for k, v in total.items()}


def make_units(windows: Sequence[Window], merge_s: float) -> list[Unit]:
    """Group each pod's windows into time slices (one window per TP rank at most) and average them."""
    by_pod: dict[str, list[Window]] = defaultdict(list)
    for w in windows:
        by_pod[w.pod].append(w)
    units: list[Unit] = []
    for pod in sorted(by_pod):
        group: list[Window] = []
        for w in sorted(by_pod[pod], key=lambda w: (w.end, w.tp_rank, w.id)):
            if group and (w.end - group[0].end > merge_s or any(g.tp_rank == w.tp_rank for g in group)):
                units.append(Unit(group))
                group = []
            group.append(w)
        if group:
            units.append(Unit(group))
    return units


def side(name: str, windows: Sequence[Window], policy: GatePolicy, started_at: float, now: float) -> Side:
    # Only windows that end after the step started: the stable revision's older windows saw other
    # traffic, and comparing concurrent windows keeps load changes out of the difference.
    period = _dedup(w for w in windows if w.end >= started_at)
    fresh = [w for w in period if not w.stale]
    busy = [w for w in fresh if _has_traffic(w, policy.max_idle_share)]
    units = tuple(make_units(busy, policy.rank_merge_s))
    elapsed = now - started_at
    newest = max((w.end for w in fresh), default=None)
    if newest is None or now - newest > policy.stale_after_s:
        if period and not fresh:
            return Side(
                units, ("ProfilerStale", f"every {name} profiler window since the step began is stale")
            )
        if newest is not None:
            return Side(
                units, ("ProfilerStale", f"newest {name} profiler window is {now - newest:.0f}s old")
            )
        if elapsed > policy.stale_after_s:
            return Side(units, ("ProfilerStale", f"no {name} profiler window in {elapsed:.0f}s"))
        return Side(units, ("TooFewSamples", f"no {name} profiler window yet"))
    if not busy:
        return Side(
            units, ("NoTraffic", f"{name} schedulers saw no traffic in {len(fresh)} fresh window(s); "
                    f"{NO_TRAFFIC_ADVICE}")
        )
    if len(units) < policy.min_samples:
        return Side(units, ("TooFewSamples", f"{name} has {len(units)} of {policy.min_samples} windows"))
    return Side(units, None)
