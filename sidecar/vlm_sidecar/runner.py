"""The sidecar's loop: every interval, find the schedulers, sample each for one window, store the result.

The front-end processes the discovery returns (roles other than scheduler) are sampled in the same window,
concurrently, by their own sampler (a lower rate); at most `max_pool_workers` multimodal pool workers per
window, rotating through the pool. Their faults are counted per role and never fail the schedulers' window.

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

from vlm_sidecar import roles as role_estimators
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
                 clock: Callable[[], float] = time.time, frontend_sampler=None) -> None:
        self.cfg = cfg
        self.store = store
        self.sampler = sampler
        self.frontend_sampler = frontend_sampler or sampler
        self.known_frontend: dict[str, int] = {}
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
                                  throughput=req.get("throughput"), request_rate=req.get("request_rate"),
                                  forward_pass_rate=req.get("forward_pass_rate"),
                                  queued_requests=req.get("queued_requests"),
                                  prompt_tokens_per_request=req.get("prompt_tokens_per_request"))
        self.store.add_window(summary, stacks, rate, agreement)
        if result != "ok":
            event("Profiling window failed" if result == "error" else "Profiling window partial",
                  tp_rank=target.tp_rank, pid=target.pid, result=result, errors=kinds, error=msg)
        return summary

    def sample_frontend(self, target: Target) -> role_estimators.ProcessWindow | None:
        """One front-end process's window; None when nothing usable came back (counted per role)."""
        outcome = self.frontend_sampler.record(target.pid)
        trace = parse_chrometrace(outcome.output) if outcome.output else None
        result, kinds, _msg = judge(outcome, trace)
        for kind in kinds:
            self.store.count_frontend_error(target.role, kind)
        if trace is None or result == "error":
            return None
        return role_estimators.process_window(trace, target.role, target.pid, result, outcome.ended)

    def _pick_frontend(self, front: list[Target]) -> list[Target]:
        """Every front-end process except the pool's workers beyond max_pool_workers, rotating per window."""
        pool = [t for t in front if t.role == "mm_processor"]
        rest = [t for t in front if t.role != "mm_processor"]
        n = min(len(pool), self.cfg.max_pool_workers)
        if n == 0:
            return rest
        k = (self.windows_done * n) % len(pool)
        return rest + (pool[k:] + pool[:k])[:n]

    def _note_frontend(self, front: list[Target]) -> None:
        counts = {r: sum(1 for t in front if t.role == r) for r in self.cfg.frontend_roles}
        if counts != self.known_frontend:
            event("Found front end", **{r: c for r, c in counts.items()})
        self.known_frontend = counts

    def run_window(self) -> list[WindowSummary]:
        found = self.discover()
        targets = [t for t in found if t.role == "scheduler"]
        front = [t for t in found if t.role != "scheduler" and t.role in self.cfg.frontend_roles]
        self._note_targets(targets)
        if not targets:
            self.store.count_window("no_target")
            self.store.count_error("no_target")
            return []
        if front:
            self._note_frontend(front)
        sampled = self._pick_frontend(front)
        before = self._scrape()
        started = self.clock()
        with ThreadPoolExecutor(max_workers=len(targets) + len(sampled), thread_name_prefix="pyspy") as pool:
            front_futures = [(t, pool.submit(self.sample_frontend, t)) for t in sampled]
            results = list(pool.map(lambda t: self.sample_target(t, before), targets))
            front_windows = [(t, f.result()) for t, f in front_futures]
        if front:
            results = self._attach_frontend(results, front, front_windows, started)
        self.windows_done += 1
        return results

    def _attach_frontend(self, results: list[WindowSummary], front: list[Target],
                         front_windows: list[tuple[Target, role_estimators.ProcessWindow | None]],
                         started: float) -> list[WindowSummary]:
        summaries, stacks = {}, {}
        for role in self.cfg.frontend_roles:
            found = sum(1 for t in front if t.role == role)
            ws = [w for t, w in front_windows if t.role == role and w is not None]
            summaries[role], stacks[role] = role_estimators.summarize_role(role, found, ws, self.cfg.top_n)
        idle = [w.stage_shares["idle"] for w in results if w.result == "ok" and "idle" in w.stage_shares]
        fw = role_estimators.frontend_window(self.store.new_id(), started, self.clock(), summaries, idle)
        return self.store.add_frontend(fw, stacks, [w.id for w in results])

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
        if self.frontend_sampler is not self.sampler:
            self.frontend_sampler.stop_all()

    def kill(self) -> None:
        """After `stop` and a grace period: py-spy processes still running are killed (their windows are lost)."""
        self.sampler.kill_all()
        if self.frontend_sampler is not self.sampler:
            self.frontend_sampler.kill_all()

