"""Estimators over one parsed window: stage shares, function shares, loop-iteration time.

All pure. Time-weighted: a chrometrace segment lasts from the sample where its stack first appeared to
the sample where it changed, so a segment's duration estimates the time spent in that stack to within
about one sampling interval at each end.

Loop iterations follow the loop's own structure (SGLang's `event_loop_overlap` / `event_loop_normal`):
recv_requests -> process_input_requests -> get_next_batch_to_run, then run_batch and the result of a
batch (process_batch_result) in either order (with overlap disabled for a batch, the previous batch's
result comes out before run_batch), or the idle work (on_idle / self_check_during_idle) when there is no
batch. A new iteration starts where the thread returns to an earlier part of that sequence: to the first
call (recv_requests, or ingest_requests on 0.5.20+), or to a later input stage whose predecessors went
unsampled; and between the batch stages and idle, which never share an iteration. run_batch <->
process_batch_result is never a boundary. Frames that are not stages (the decorators' `wrapper`,
ingest_requests) are looked through. A boundary is seen up to one sampling interval late, and it hides
only when the input stages between two iterations fall inside one sampling gap. `estimate_loop` adds
such boundaries back only where a gap could have held them:

- in a batch iteration, a second visit to run_batch (or process_batch_result): an iteration runs each
  at most once;
- between batch iterations whose input stages and batch stages both hid it (no second visit), by count:
  the share of the boundaries that show either way found only by a second visit says how often an
  iteration's input stages go unsampled, and as many more are added to the boundaries that needed them
  (capture-recapture, `_split_hidden_batch_boundaries`);
- among idle-only iterations, as many as the sample rate and the time seen in the input stages imply
  (a boundary shows unless no sample lands in the next iteration's input stages, or the sample before
  them does not lie later in the loop), refined with the length of one idle-only iteration.

A long run of one stage is never split for its length: an image prefill's 60 ms run_batch is work, and
a missed boundary shows as a sampling gap, not as a long run. Missed boundaries make the loop read long,
so the estimate leans high when py-spy's effective rate drops. Measured errors per loop shape, from the
simulator in testing/vlm_testing/loopsim.py, are in docs/sidecar.md.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vlm_sidecar import ipc
from vlm_sidecar.model import EDGE_SEP, LOOP_STAGES, STAGES, LoopEstimate, ParsedTrace, Segment, WindowSummary
from vlm_sidecar.parser import collapse_segments, function_name

# SGLang's scheduler event loops, 0.5.10..0.5.23 (scheduler.py, disaggregation/, scheduler_pp_mixin.py,
# multiplexing_mixin.py; event_loop_overlap_mlx from 0.5.15, Apple MLX only).
LOOP_FUNCTIONS = frozenset({"event_loop_normal", "event_loop_overlap", "event_loop_pp", "event_loop_normal_disagg_prefill",
                            "event_loop_overlap_disagg_prefill", "event_loop_normal_disagg_decode",
                            "event_loop_overlap_disagg_decode", "event_loop_pp_disagg_prefill",
                            "event_loop_pp_disagg_decode", "event_loop_pdmux", "event_loop_overlap_mlx"})
# Idle work when there is no batch: self_check_during_idle (-> check_memory) up to 0.5.10, on_idle from
# 0.5.15. (The watchdog, `_watchdog_thread`, runs on its own thread and never under the loop.)
IDLE_FUNCTIONS = frozenset({"self_check_during_idle", "on_idle", "check_memory"})
# The first call of every iteration: recv_requests, or (0.5.20+) ingest_requests, which calls
# request_receiver.recv_requests and process_input_requests. ingest_requests is not a stage; its children are.
ITERATION_START_FUNCTIONS = frozenset({"recv_requests", "ingest_requests"})
# Frames between the loop and a stage that are not one: the decorators' inner functions (0.5.15+
# nvtx_utils `wrapper`; 0.5.20+ also scheduler_stage_metrics `wrapper` around it: two frames).
WRAPPER_FUNCTIONS = frozenset({"wrapper"})
# Stages whose order inside one iteration varies (overlap on or off); each runs at most once.
BATCH_STAGES = ("run_batch", "process_batch_result")
# Position of each stage in one iteration; the batch stages share one, idle replaces them.
STAGE_POSITION = {"recv_requests": 0, "process_input_requests": 1, "get_next_batch_to_run": 2,
                  "run_batch": 3, "process_batch_result": 3, "idle": 4}
DEFAULT_RATE_HZ = 1000.0
_STAGE_SET = frozenset(LOOP_STAGES)
_INPUT_POSITIONS = (0, 1, 2)
_BATCH_POS, _IDLE_POS = 3, 4


def classify(stack: Sequence[str]) -> str:
    """The stage a stack is in: the outermost SGLang stage frame, else idle, else other.

    Frames that are not stages (the loop, `wrapper`, ingest_requests) are looked through, so
    `event_loop_overlap > ingest_requests > wrapper > wrapper > recv_requests` (0.5.20+) is recv_requests;
    a stack that ends in such a frame (the decorators' or ingest_requests' own code) is other."""
    idle = False
    for label in stack:
        fn = function_name(label)
        if fn in WRAPPER_FUNCTIONS:
            continue
        if fn in _STAGE_SET:
            return fn
        if fn in IDLE_FUNCTIONS:
            idle = True
    return "idle" if idle else "other"


def _starts_iteration(stack: Sequence[str]) -> bool:
    """Inside the iteration's first call (recv_requests / ingest_requests), outside any other stage."""
    for label in stack:
        fn = function_name(label)
        if fn in ITERATION_START_FUNCTIONS:
            return True
        if fn in _STAGE_SET:
            return False
    return False


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
    totals = dict.fromkeys(STAGES, 0.0)
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


# Callers exported per exported function, the largest first: enough to say which caller of a shared helper (a
# copy, a lock, a serializer) made it grow, few enough that /windows.json stays small.
EDGE_CALLERS = 3


def edge_shares(segments: Iterable[Segment]) -> dict[tuple[str, str], float]:
    """Inclusive share of time per call edge (caller, callee): two adjacent frames of a stack, counted once per
    stack however often it repeats there. A function calling itself is no edge (it says nothing of who called)."""
    edges: dict[tuple[str, str], float] = {}
    total = 0.0
    for s in segments:
        d = s.duration_us
        total += d
        names = [function_name(f) for f in s.stack]
        for e in {(a, b) for a, b in itertools.pairwise(names) if a != b}:
            edges[e] = edges.get(e, 0.0) + d
    return {k: v / total for k, v in edges.items()} if total > 0 else {}


def select_edges(edges: dict[tuple[str, str], float], chosen: Sequence[str],
                 per_callee: int = EDGE_CALLERS) -> dict[str, float]:
    """The edges into the exported functions, the `per_callee` largest callers of each, keyed "caller;callee".
    An edge left out of a window had at most the smallest share exported into the same callee."""
    kept = set(chosen)
    into: dict[str, list[tuple[float, str]]] = {}
    for (caller, callee), v in edges.items():
        if callee in kept:
            into.setdefault(callee, []).append((v, caller))
    out = {}
    for callee, callers in into.items():
        for v, caller in sorted(callers, key=lambda x: (-x[0], x[1]))[:per_callee]:
            out[f"{caller}{EDGE_SEP}{callee}"] = v
    return out


def unexported_max(self_: dict[str, float], chosen: Sequence[str]) -> float | None:
    """The largest self share among the functions not exported (0.0 when none was left out; None with no
    stack at all): every function missing from a window's export had at most this much of its time."""
    if not self_:
        return None
    kept = set(chosen)
    return max((v for k, v in self_.items() if k not in kept), default=0.0)


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
    out: list[tuple[str, float, float]] = []
    for r in _runs(list(segments)):
        if r.stage == "other":  # ingest_requests' own code: kept by _runs only to mark an iteration start
            continue
        if out and out[-1][0] == r.stage:
            out[-1] = (r.stage, out[-1][1], r.end)
        else:
            out.append((r.stage, r.start, r.end))
    return out


@dataclass
class _Run:
    stage: str
    pos: int | None  # STAGE_POSITION; None: ingest_requests' own code (position known from its neighbours)
    start: float
    end: float
    first: int  # index of its first segment
    entry: bool  # inside the iteration's first call


def _runs(segs: Sequence[Segment]) -> list[_Run]:
    runs: list[_Run] = []
    for i, s in enumerate(segs):
        stage = classify(s.stack)
        entry = _starts_iteration(s.stack)
        if stage == "other" and not entry:
            continue  # loop overhead, wrappers, startup: say nothing about the position in the loop
        if runs and runs[-1].stage == stage and runs[-1].entry == entry:
            runs[-1].end = s.end_us
        else:
            runs.append(_Run(stage, STAGE_POSITION.get(stage), s.start_us, s.end_us, i, entry))
    return runs


def _boundary_runs(runs: Sequence[_Run]) -> list[int]:
    """Indices of the runs that open an iteration: entering the first call, any return to an earlier
    position than the last one seen, and batch <-> idle (an iteration has one or the other)."""
    out: list[int] = []
    last_pos: int | None = None
    for k, cur in enumerate(runs):
        if k == 0:
            last_pos = cur.pos
            continue
        prev = runs[k - 1]
        if (cur.entry and not prev.entry) or (cur.pos is not None and last_pos is not None and (
                cur.pos < last_pos or {cur.pos, last_pos} == {_BATCH_POS, _IDLE_POS})):
            out.append(k)
        if cur.pos is not None:
            last_pos = cur.pos
        elif cur.entry:  # ingest_requests' own code: the top of the iteration
            last_pos = 0
    return out


def loop_boundaries(runs: Sequence[tuple[str, float, float]]) -> list[float]:
    """Times (us) where an iteration starts, seen late by < 1 sample, from `stage_runs` output
    (which has no stacks: only recv_requests marks the first call)."""
    rs = [_Run(st, STAGE_POSITION.get(st), a, b, 0, st == "recv_requests") for st, a, b in runs if st != "other"]
    return [rs[k].start for k in _boundary_runs(rs)]


def _low_quantile(vals: list[float], q: float = 0.1) -> float:
    return _quantile(sorted(vals), q) if vals else 0.0


def _seen_fraction(n: float, x: Sequence[float], y: float) -> float:
    """Chance that the boundary between two of n like idle-only iterations shows under Poisson sampling.

    x: samples expected in each input stage (recv, process_input, get_next_batch) over all n
    iterations, y: in the idle stage. The boundary shows when the first sample in the next iteration's
    input stages sits at an earlier position than the sample before it: always when that one is in
    the idle stage in between; otherwise the last input sample of the iteration before must be later."""
    hit = [-math.expm1(-v / n) for v in x]  # P(a stage of one iteration holds a sample)
    first, last = [], []  # P(first / last sampled input stage of an iteration is stage i)
    miss = 1.0
    for h in hit:
        first.append(miss * h)
        miss *= 1 - h
    miss = 1.0
    for h in reversed(hit):
        last.append(miss * h)
        miss *= 1 - h
    last.reverse()
    shown = sum(first)
    not_later = sum(first[q] * sum(last[: q + 1]) for q in range(len(hit)))
    return shown - math.exp(-y / n) * not_later


def _solve_iterations(seen: int, x: Sequence[float], y: float) -> float:
    """n with (n - 1) * _seen_fraction(n, x, y) = seen - 1 (boundaries between the n iterations).
    Capped at 4x seen: shorter iterations than that hide among the samples and cannot be counted."""
    if seen <= 1 or sum(x) <= 0:
        return float(seen)

    def shown(n: float) -> float:
        return (n - 1) * _seen_fraction(n, x, y)

    lo, hi = float(seen), 4.0 * seen
    if shown(lo) >= seen - 1:
        return lo
    if shown(hi) < seen - 1:
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        if shown(mid) < seen - 1:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _batch_sequences(iv: Sequence[_Run], edges: Sequence[float]) -> list[list[str]]:
    """The batch stages of each piece of one interval (cut at `edges`), adjacent equal ones merged."""
    out: list[list[str]] = [[] for _ in range(len(edges) + 1)]
    for r in iv:
        if r.stage in BATCH_STAGES:
            seq = out[bisect.bisect_right(edges, r.start)]
            if not seq or seq[-1] != r.stage:
                seq.append(r.stage)
    return out


def _split_hidden_batch_boundaries(runs: Sequence[_Run], bound_idx: Sequence[int], intervals: Sequence[Sequence[_Run]],
                                   splits: Sequence[Sequence[float]], pieces: list[list[float]],
                                   idle_only: Sequence[int]) -> int:
    """Add back the boundaries between batch iterations that neither their input stages nor a second visit
    to a batch stage showed; returns how many. In place, on `pieces`.

    A boundary between two batch iterations shows through a sample in the next iteration's input stages
    (B), or, when those went unsampled, through a second visit to run_batch or process_batch_result, which
    needs the batch stages on both sides to repeat once the input stages are taken away (R: with overlap on,
    the previous result's processing between the two run_batch calls sampled). Boundaries with neither hide.
    The chance that an iteration's input stages go unsampled, p, is read off the boundaries that would show
    either way (R): the share of them found by a second visit. Of the boundaries that needed their input
    stages (B, not R), p / (1 - p) as many more hid: a capture-recapture estimate, which needs no model
    of py-spy's sampling gaps (a decode iteration's input stages are short enough that py-spy's varying gaps
    leave some of them unsampled: docs/benchmarks.md, "Hidden batch boundaries by capture-recapture").
    It assumes the two signs go unsampled independently: long gaps (a busy host) swallow both at once and
    the correction errs short; near-regular gaps (an idle host) rarely miss both and it errs long (the same
    entry; docs/sidecar.md).

    The hidden boundaries go where they can be: in a piece with one run_batch visit, the ones closest to
    twice the median piece (two merged iterations), each cut in half."""
    idle = set(idle_only)
    seqs = [_batch_sequences(iv, splits[j]) for j, iv in enumerate(intervals)]
    shown_by_visit = sum(len(splits[j]) for j in range(len(intervals)) if j not in idle)
    shown_both = needed_input = 0
    for j in range(len(intervals) - 1):
        if j in idle or j + 1 in idle:
            continue
        opening = runs[bound_idx[j + 1]]
        if not (opening.entry or (opening.pos is not None and opening.pos < _BATCH_POS)):
            continue  # not shown by an input stage (a batch <-> idle change)
        both_sides = seqs[j][-1] + seqs[j + 1][0]
        joined = [st for k, st in enumerate(both_sides) if k == 0 or st != both_sides[k - 1]]
        if len(joined) != len(set(joined)):
            shown_both += 1
        else:
            needed_input += 1
    if needed_input == 0 or shown_by_visit == 0:
        return 0
    p = shown_by_visit / (shown_by_visit + shown_both)
    hidden = needed_input if p >= 0.5 else min(needed_input, round(needed_input * p / (1 - p)))
    # Two iterations merged into one piece last about twice a typical one: cut those closest to that.
    typical = _quantile(sorted(x for j in range(len(intervals)) if j not in idle for x in pieces[j]), 0.5)
    cands = sorted(((abs(length - 2 * typical), j, k) for j in range(len(intervals)) if j not in idle
                    for k, length in enumerate(pieces[j]) if seqs[j][k].count("run_batch") == 1))
    cuts = {(j, k) for _, j, k in cands[:hidden]}
    for j in {j for j, _ in cuts}:
        out: list[float] = []
        for k, length in enumerate(pieces[j]):
            out.extend([length / 2] * 2 if (j, k) in cuts else [length])
        pieces[j] = out
    return len(cuts)


def estimate_loop(segments: Iterable[Segment], split_missed: bool = True,
                  rate_hz: float | None = None) -> LoopEstimate:
    """Iteration times from the loop's structure (module docstring).

    `rate_hz` is py-spy's effective sample rate (default 1000), used only to add back the boundaries
    hidden among idle-only iterations. Hidden boundaries are added only where a sampling gap could hold
    one: the segment before it must last at least half the shortest input stretch seen (10th percentile).
    """
    segs = list(segments)
    runs = _runs(segs)
    bound_idx = _boundary_runs(runs)
    bounds = [runs[k].start for k in bound_idx]
    if len(bounds) < 2:
        return LoopEstimate(0, None, None, None, (), len(bounds))
    rate = rate_hz if rate_hz and rate_hz > 0 else DEFAULT_RATE_HZ
    intervals = [runs[a:b] for a, b in itertools.pairwise(bound_idx)]
    # Input stretch of each iteration: from its boundary to its first batch/idle run.
    busy_in: list[float] = []
    idle_in: list[float] = []
    for iv in intervals:
        first = next((r for r in iv if r.pos is not None and r.pos >= _BATCH_POS), None)
        if first is not None:
            (busy_in if first.pos == _BATCH_POS else idle_in).append(first.start - iv[0].start)
    gap_busy = 0.5 * _low_quantile(busy_in)
    gap_idle = 0.5 * _low_quantile(idle_in)
    typical_in = _quantile(sorted(busy_in), 0.5) if busy_in else 0.0

    splits: list[list[float]] = [[] for _ in intervals]  # hidden boundary times inside each interval
    idle_only: list[int] = []
    for j, iv in enumerate(intervals):
        if not any(r.pos == _BATCH_POS for r in iv):
            idle_only.append(j)
            continue
        if not split_missed:
            continue
        # Each iteration runs run_batch and process_batch_result at most once, in either order: a
        # second visit opens a new iteration, if the sampling gap before it could hold the input stages.
        seen: set[str] = set()
        prev_run: _Run | None = None
        for r in iv:
            if r.stage not in BATCH_STAGES:
                continue
            if r.stage in seen and prev_run is not None:
                # The input stages hid in one sampling gap: either just before this visit, or inside
                # the previous run, where its stage restarted at the stack it began with (its next call).
                cands = [i for i in range(prev_run.first + 1, r.first)
                         if segs[i].stack == segs[prev_run.first].stack and segs[i - 1].stack != segs[i].stack]
                i = max([*cands, r.first], key=lambda i: segs[i - 1].duration_us)
                gap = segs[i - 1]
                if gap.duration_us >= gap_busy:
                    splits[j].append(max(gap.start_us, segs[i].start_us - typical_in))
                seen = set()  # a refused second visit does not make the next visit a third one
            seen.add(r.stage)
            prev_run = r

    pieces: list[list[float]] = []
    for j, iv in enumerate(intervals):
        edges = [iv[0].start, *splits[j], runs[bound_idx[j + 1]].start]
        pieces.append([b - a for a, b in itertools.pairwise(edges)])

    if split_missed:
        _split_hidden_batch_boundaries(runs, bound_idx, intervals, splits, pieces, idle_only)

    if split_missed and idle_only:
        per_pos = [0.0] * (_IDLE_POS + 1)
        for j in idle_only:
            for r in intervals[j]:
                per_pos[0 if r.pos is None else r.pos] += r.end - r.start
        m = len(idle_only)
        n_seen = _solve_iterations(m, [rate * per_pos[p] / 1e6 for p in _INPUT_POSITIONS],
                                   rate * per_pos[_IDLE_POS] / 1e6)
        # The count alone is noisy (docs/benchmarks.md, "Idle-only iterations counted, then refined by
        # length"): refine it with the length of one idle-only iteration, read off the intervals that hold one
        # (the shortest m / n_seen of them), kept within 15% of the count-based figure in case idle iterations
        # differ in length.
        lengths = sorted(sum(pieces[j]) for j in idle_only)
        one = _quantile(lengths, 0.5 * m / n_seen)
        n = min(max(sum(lengths) / one, 0.85 * n_seen), 1.15 * n_seen) if one > 0 else n_seen
        hidden = round(n) - m
        # Only intervals with a gap long enough to hold a boundary can hide one; the longest first.
        heap = [(-sum(pieces[j]), j) for j in idle_only
                if any(segs[i].duration_us >= gap_idle
                       for i in range(intervals[j][0].first, runs[bound_idx[j + 1]].first))]
        heapq.heapify(heap)
        counts = dict.fromkeys(idle_only, 1)
        for _ in range(max(hidden, 0)):
            if not heap:
                break
            _, j = heapq.heappop(heap)
            counts[j] += 1
            heapq.heappush(heap, (-sum(pieces[j]) / counts[j], j))
        for j, k in counts.items():
            if k > 1:
                total = sum(pieces[j])
                pieces[j] = [total / k] * k

    samples = [p / 1e6 for ps in pieces for p in ps]
    ordered = sorted(samples)
    return LoopEstimate(
        iterations=len(samples),
        mean_s=(bounds[-1] - bounds[0]) / 1e6 / len(samples),
        p50_s=_quantile(ordered, 0.5),
        p95_s=_quantile(ordered, 0.95),
        samples_s=tuple(samples),
        boundaries=len(bounds),
    )


def _effective_rate(segs: Sequence[Segment], samples: int | None) -> float | None:
    """py-spy's samples per second over the span the thread covers (as runner.effective_rate)."""
    span_s = (segs[-1].end_us - segs[0].start_us) / 1e6 if segs else 0.0
    return samples / span_s if samples and span_s > 0 else None


def summarize(trace: ParsedTrace, *, window_id: int, tp_rank: int, pid: int | None, start: float, end: float,
              samples: int | None, watch: Sequence[str], top_n: int, error: str | None = None,
              result: str = "ok") -> tuple[WindowSummary, dict[tuple[str, ...], float]]:
    """One window's summary and the scheduler thread's collapsed stacks (weights in microseconds)."""
    tid = pick_scheduler_thread(trace)
    segs = trace.threads.get(tid, []) if tid is not None else []
    shares = stage_shares(segs)
    incl, self_ = function_shares(segs)
    chosen = select_functions(incl, self_, watch, top_n)
    # py-spy counts one sample per thread per round: the scheduler thread's rate is the count over the threads.
    per_thread = samples // max(1, len(trace.threads)) if samples else samples
    rate_hz = _effective_rate(segs, per_thread)
    loop = estimate_loop(segs, rate_hz=rate_hz)
    top = max(self_, key=lambda k: self_[k]) if self_ else None
    feature_share, reopen_share, feature_us = ipc.shares(segs)
    feature_samples = round(feature_us * rate_hz / 1e6) if rate_hz and feature_share is not None else None
    summary = WindowSummary(
        id=window_id, tp_rank=tp_rank, pid=pid, start=start, end=end,
        samples=samples if samples is not None else len(segs),
        loop_mean_seconds=loop.mean_s, loop_p50_seconds=loop.p50_s, loop_p95_seconds=loop.p95_s,
        iterations=loop.iterations, stage_shares=shares,
        function_shares={f: incl.get(f, 0.0) for f in chosen},
        self_shares={f: self_.get(f, 0.0) for f in chosen},
        top_function=top, stale=result != "ok", error=error, result=result, loop_samples=loop.samples_s,
        feature_transport_share=feature_share, ipc_handle_reopen_share=reopen_share,
        feature_transport_samples=feature_samples,
        unexported_self_share_max=unexported_max(self_, chosen),
        edge_shares=select_edges(edge_shares(segs), chosen),
    )
    return summary, collapse_segments(segs)
