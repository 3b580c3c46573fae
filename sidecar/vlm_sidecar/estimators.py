"""Estimators over one parsed window: stage shares, function shares, loop-iteration time.

All pure. Time-weighted: a chrometrace segment lasts from the sample where its stack first appeared to
the sample where it changed, so a segment's duration estimates the time spent in that stack with an
error of at most one sampling period at each end (the errors cancel on average: both ends are late).

Loop iterations: the stages run in a fixed order every iteration, so a transition to an earlier stage
("reversal") marks an iteration boundary, seen up to one sampling period late. A boundary is missed
only when no sample falls between the last sampled stage of one iteration and the first of the next
that would reveal the wrap; at the default 1000 Hz that takes a loop whose non-dominant stages
together last under ~1 ms. py-spy draws sample intervals at random (exponential), so some gaps are long; under CPU
starvation (a throttled sidecar) gaps grow. `estimate_loop` adds back the boundaries hidden in
over-long runs of the dominant stage.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

from vlm_sidecar.model import LOOP_STAGES, LoopEstimate, ParsedTrace, Segment, WindowSummary
from vlm_sidecar.parser import collapse_segments, function_name

LOOP_FUNCTIONS = frozenset({"event_loop_normal", "event_loop_overlap", "event_loop_pp", "event_loop_normal_disagg_prefill",
                            "event_loop_overlap_disagg_prefill", "event_loop_normal_disagg_decode",
                            "event_loop_overlap_disagg_decode"})
IDLE_FUNCTIONS = frozenset({"self_check_during_idle", "on_idle", "check_memory", "watchdog_thread"})
_STAGE_SET = frozenset(LOOP_STAGES)
# Position of each stage in one iteration; idle comes after scheduling found nothing to run.
STAGE_ORDER = {s: i for i, s in enumerate(LOOP_STAGES)} | {"idle": len(LOOP_STAGES)}


def classify(stack: Sequence[str]) -> str:
    """The stage a stack is in: the outermost SGLang stage frame, else idle, else other."""
    idle = False
    for label in stack:
        fn = function_name(label)
        if fn in _STAGE_SET:
            return fn
        if fn in IDLE_FUNCTIONS:
            idle = True
    return "idle" if idle else "other"


def pick_scheduler_thread(trace: ParsedTrace) -> int | None:
    """The thread running the event loop (SGLang's MainThread); else the busiest thread."""
    best, best_t = None, -1.0
    for tid, segs in trace.threads.items():
        t = sum(s.duration_us for s in segs if any(function_name(f) in LOOP_FUNCTIONS for f in s.stack))
        if t > best_t:
            best, best_t = tid, t
    if best_t > 0:
        return best
    return max(trace.threads, key=lambda tid: sum(s.duration_us for s in trace.threads[tid]), default=None)


def stage_shares(segments: Iterable[Segment]) -> dict[str, float]:
    """Fraction of the thread's observed time in each stage (plus idle and other); sums to 1."""
    totals = dict.fromkeys((*LOOP_STAGES, "idle", "other"), 0.0)
    for s in segments:
        totals[classify(s.stack)] += s.duration_us
    total = sum(totals.values())
    return {k: (v / total if total > 0 else 0.0) for k, v in totals.items()}


def function_shares(segments: Iterable[Segment]) -> tuple[dict[str, float], dict[str, float]]:
    """(inclusive, self) share of time per function name. Recursion counts a function once."""
    incl: dict[str, float] = {}
    self_: dict[str, float] = {}
    total = 0.0
    for s in segments:
        d = s.duration_us
        total += d
        for fn in {function_name(f) for f in s.stack}:
            incl[fn] = incl.get(fn, 0.0) + d
        if s.stack:
            leaf = function_name(s.stack[-1])
            self_[leaf] = self_.get(leaf, 0.0) + d
    if total <= 0:
        return {}, {}
    return ({k: v / total for k, v in incl.items()}, {k: v / total for k, v in self_.items()})


def select_functions(incl: dict[str, float], self_: dict[str, float], watch: Sequence[str], top_n: int) -> list[str]:
    """Watch list (always, even at 0) plus the top N by self time: what gets exported."""
    top = sorted(self_, key=lambda k: -self_[k])[:top_n]
    return list(dict.fromkeys([*watch, *top]))


def _quantile(sorted_vals: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values."""
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    pos = q * (len(sorted_vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def stage_runs(segments: Iterable[Segment]) -> list[tuple[str, float, float]]:
    """Consecutive segments of one stage merged: (stage, start_us, end_us); "other" is skipped."""
    runs: list[list] = []
    for s in segments:
        stage = classify(s.stack)
        if stage == "other":
            continue  # loop overhead and startup say nothing about the position in the loop
        if runs and runs[-1][0] == stage:
            runs[-1][2] = s.end_us
        else:
            runs.append([stage, s.start_us, s.end_us])
    return [(a, b, c) for a, b, c in runs]


def loop_boundaries(runs: Sequence[tuple[str, float, float]]) -> list[float]:
    """Times (us) where the stage order goes backwards: iteration starts, seen late by < 1 sample."""
    out: list[float] = []
    for prev, cur in itertools.pairwise(runs):
        if STAGE_ORDER[cur[0]] < STAGE_ORDER[prev[0]]:
            out.append(cur[1])
    return out


def estimate_loop(segments: Iterable[Segment], split_missed: bool = True) -> LoopEstimate:
    """Iteration times from stage reversals.

    A boundary hides when py-spy takes no sample outside the dominant stage (the one with most time,
    usually run_batch) between two of its visits: the two visits then read as one long run. Runs of
    the dominant stage lasting >= 1.75x its median visit are split into round(run / median) visits,
    adding the hidden boundaries. Only the dominant stage is split: a long run of any other stage
    (a burst of image requests in process_input_requests) is real work, not a sampling gap.
    """
    runs = stage_runs(segments)
    bounds = loop_boundaries(runs)
    if len(bounds) < 2:
        return LoopEstimate(0, None, None, None, (), len(bounds))
    hidden_at: list[int] = [0] * (len(bounds) - 1)  # extra iterations inside each interval
    if split_missed:
        per_stage: dict[str, list[float]] = {}
        for stage, a, b in runs:
            per_stage.setdefault(stage, []).append(b - a)
        dom = max(per_stage, key=lambda k: sum(per_stage[k]))
        med = _quantile(sorted(per_stage[dom]), 0.5)
        j = 0
        for stage, a, b in runs:
            while j < len(bounds) - 1 and bounds[j + 1] <= a:
                j += 1
            if stage == dom and med > 0 and b - a >= 1.75 * med and bounds[0] <= a and b <= bounds[-1]:
                hidden_at[j] += round((b - a) / med) - 1
    samples: list[float] = []
    for (a, b), hidden in zip(itertools.pairwise(bounds), hidden_at, strict=True):
        k = 1 + hidden
        samples.extend([(b - a) / 1e6 / k] * k)
    ordered = sorted(samples)
    return LoopEstimate(
        iterations=len(samples),
        mean_s=(bounds[-1] - bounds[0]) / 1e6 / len(samples),
        p50_s=_quantile(ordered, 0.5),
        p95_s=_quantile(ordered, 0.95),
        samples_s=tuple(samples),
        boundaries=len(bounds),
    )


def summarize(trace: ParsedTrace, *, window_id: int, tp_rank: int, pid: int | None, start: float, end: float,
              samples: int | None, watch: Sequence[str], top_n: int, error: str | None = None,
              result: str = "ok") -> tuple[WindowSummary, dict[tuple[str, ...], float]]:
    """One window's summary and the scheduler thread's collapsed stacks (weights in microseconds)."""
    tid = pick_scheduler_thread(trace)
    segs = trace.threads.get(tid, []) if tid is not None else []
    shares = stage_shares(segs)
    incl, self_ = function_shares(segs)
    chosen = select_functions(incl, self_, watch, top_n)
    loop = estimate_loop(segs)
    top = max(self_, key=lambda k: self_[k]) if self_ else None
    summary = WindowSummary(
        id=window_id, tp_rank=tp_rank, pid=pid, start=start, end=end,
        samples=samples if samples is not None else len(segs),
        loop_mean_seconds=loop.mean_s, loop_p50_seconds=loop.p50_s, loop_p95_seconds=loop.p95_s,
        iterations=loop.iterations, stage_shares=shares,
        function_shares={f: incl.get(f, 0.0) for f in chosen},
        self_shares={f: self_.get(f, 0.0) for f in chosen},
        top_function=top, stale=result != "ok", error=error, result=result, loop_samples=loop.samples_s,
    )
    return summary, collapse_segments(segs)
