"""The sidecar's loop: every interval, find the schedulers, sample each for one window, store the result.

Every fault ends as a counted error and a window marked stale, never as an exception out of the loop:
py-spy missing, denied, crashing or hanging; the target exiting mid-window (its partial data is kept
but marked stale) or restarting (the next window re-discovers it by title); truncated or garbage output.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from vlm_sidecar import sglang_metrics
from vlm_sidecar.collector import ProfileStore
from vlm_sidecar.config import SidecarConfig
from vlm_sidecar.estimators import summarize
from vlm_sidecar.log import event
from vlm_sidecar.model import ParsedTrace, Target, WindowSummary
from vlm_sidecar.parser import parse_chrometrace
from vlm_sidecar.sampler import SampleOutcome

log = logging.getLogger("vlm_sidecar")



def judge(outcome: SampleOutcome, trace: ParsedTrace | None) -> tuple[str, list[str], str | None]:
    """(result, error kinds to count, error message) for one window. Pure.

    ok: clean run, usable data. partial: usable data but the run was cut (target exited, timeout, crash
    after writing, truncated file) - shown, but stale and kept out of the histogram. error: nothing usable.
    """
    kinds: list[str] = []
    msg = outcome.error
    usable = trace is not None and trace.error is None and bool(trace.threads)
    if outcome.error_kind:
        kinds.append(outcome.error_kind)
    if trace is not None and not usable:
        kinds.append("parse")
        msg = msg or f"py-spy output unreadable: {trace.error}"
    elif trace is not None and trace.truncated:
        kinds.append("truncated")
        msg = msg or "py-spy output truncated"
    if not usable:
        if not kinds:
            kinds.append("empty_output")
            msg = msg or "no samples"
        return "error", kinds, msg
    return ("partial" if kinds else "ok"), kinds, msg


def effective_rate(trace: ParsedTrace, samples: int | None) -> float:
    """Sampling rounds per second over the span py-spy actually covered.

    py-spy's "Samples" counts one stack per thread per round (with --idle every thread is in every round),
    so it is divided by the threads in the trace: a scheduler with 60 Python threads otherwise reads 60x.
    """
    spans = [segs[-1].end_us - segs[0].start_us for segs in trace.threads.values() if segs]
    span_s = max(spans, default=0.0) / 1e6
    threads = max(1, len(trace.threads))
    return samples / threads / span_s if samples and span_s > 0 else 0.0


class Runner:
    def __init__(self, cfg: SidecarConfig, store: ProfileStore, sampler,
                 discover: Callable[[], list[Target]],
                 scrape: Callable[[str], str] | None = sglang_metrics.fetch,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.store = store
        self.sampler = sampler
        self.discover = discover
        self.scrape = scrape if cfg.sglang_metrics_url else None
        self.clock = clock
        self.stop_event = threading.Event()
        self.known: dict[int, Target] = {}
        self.windows_done = 0

    # --- one window ------------------------------------------------------------------------------------
    def _scrape(self) -> dict[str, float] | None:
        """SGLang's /metrics, parsed (stage and request counters); None when not configured or failed."""
        if self.scrape is None or not self.cfg.sglang_metrics_url:
            return None
        try:
            return sglang_metrics.parse(self.scrape(self.cfg.sglang_metrics_url))
        except sglang_metrics.ScrapeError as e:
            self.store.count_error("sglang_scrape")
            event("SGLang metrics scrape failed", error=str(e)[:200])
            return None

    def _note_targets(self, targets: list[Target]) -> None:
        current = {t.tp_rank: t for t in targets}
        for rank, t in current.items():
            old = self.known.get(rank)
            if old is None or (old.pid, old.start_ticks) != (t.pid, t.start_ticks):
                event("Found scheduler" if old is None else "Scheduler restarted", title=t.title, pid=t.pid,
                      tp_rank=rank, previous_pid=old.pid if old else None)
        for rank, t in self.known.items():
            if rank not in current:
                event("Lost scheduler", title=t.title, pid=t.pid, tp_rank=rank)
        self.known = current

    def sample_target(self, target: Target, sglang_before: dict[str, float] | None) -> WindowSummary:
        outcome = self.sampler.record(target.pid)
        trace = parse_chrometrace(outcome.output) if outcome.output else None
        result, kinds, msg = judge(outcome, trace)
        for kind in kinds:
            self.store.count_error(kind, target.tp_rank)
        wid = self.store.new_id()
        if trace is not None and result != "error":
            summary, stacks = summarize(
                trace, window_id=wid, tp_rank=target.tp_rank, pid=target.pid, start=outcome.started,
                end=outcome.ended, samples=outcome.samples, watch=self.cfg.watch_functions,
                top_n=self.cfg.top_n, error=msg, result=result)
            rate = effective_rate(trace, outcome.samples)
        else:
            summary = WindowSummary(
                id=wid, tp_rank=target.tp_rank, pid=target.pid, start=outcome.started, end=outcome.ended,
                samples=outcome.samples or 0, loop_mean_seconds=None, loop_p50_seconds=None,
                loop_p95_seconds=None, iterations=0, stage_shares={}, function_shares={}, self_shares={},
                top_function=None, stale=True, error=msg, result="error")
            stacks, rate = None, 0.0
        agreement = None
        if sglang_before is not None and result == "ok":
            after = self._scrape()
            if after:
                st_before, st_after = sglang_metrics.stages_of(sglang_before), sglang_metrics.stages_of(after)
                shares = sglang_metrics.window_shares(st_before, st_after) if st_before and st_after else None
                if shares:
                    agreement = sglang_metrics.agreement(summary.stage_shares, shares)
                    summary = replace(summary, sglang_stage_shares=shares)
                req = sglang_metrics.request_signals(sglang_before, after, outcome.ended - outcome.started)
                summary = replace(summary, ttft_seconds=req.get("ttft_seconds"), itl_seconds=req.get("itl_seconds"),
                                  throughput=req.get("throughput"))
        self.store.add_window(summary, stacks, rate, agreement)
        if result != "ok":
            event("Profiling window failed" if result == "error" else "Profiling window partial",
                  tp_rank=target.tp_rank, pid=target.pid, result=result, errors=kinds, error=msg)
        return summary

    def run_window(self) -> list[WindowSummary]:
        targets = self.discover()
        self._note_targets(targets)
        if not targets:
            self.store.count_window("no_target")
            self.store.count_error("no_target")
            return []
        before = self._scrape()
        with ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="pyspy") as pool:
            results = list(pool.map(lambda t: self.sample_target(t, before), targets))
        self.windows_done += 1
        return results

    # --- the loop ---------------------------------------------------------------------------------------
    def run_forever(self) -> None:
        event("Profiler started", interval_s=self.cfg.interval_s, duration_s=self.cfg.duration_s,
              rate_hz=self.cfg.rate_hz, pattern=self.cfg.process_pattern, pyspy=self.sampler.pyspy)
        next_start = self.clock()
        while not self.stop_event.is_set():
            try:
                self.run_window()
            except Exception as e:  # the loop must survive a bug in one window; it is counted and logged
                self.store.count_error("crash")
                log.exception("Profiling window raised: %s", e)
            next_start += self.cfg.interval_s
            now = self.clock()
            if next_start < now:  # a window overran the interval: start the next one now, don't pile up
                next_start = now
            self.stop_event.wait(max(0.0, next_start - now))

    def stop(self) -> None:
        self.stop_event.set()
        self.sampler.stop_all()

