"""State the sidecar keeps between windows, and the Prometheus collector that reads it at scrape time.

`ProfileStore` is written by the runner and read by the collector and the HTTP server (thread-safe).
`build_families` is pure: store snapshot + labels + now -> metric families. The text it yields looks like

    vlm_scheduler_stage_share_ratio{namespace="ml",vlmservice="qwen",pod="qwen-abc",revision="7d9",tp_rank="0",stage="run_batch"} 0.71
    vlm_scheduler_function_share_ratio{...,tp_rank="0",function="hash_feature",kind="inclusive"} 0.042
    vlm_scheduler_unexported_self_share_max_ratio{...,tp_rank="0"} 0.011
    vlm_scheduler_edge_share_ratio{...,tp_rank="0",caller="process_input_requests",callee="hash_feature"} 0.041
    vlm_profiler_windows_total{...,tp_rank="0",result="ok"} 12.0
    vlm_profiler_stale{...,tp_rank="0"} 0.0

Series without a rank (no target found yet) carry tp_rank="", which Prometheus reads as no label.
The front-end series (vlm_sidecar.roles) carry tp_rank="" and a `role`:

    vlm_process_busy_share_ratio{...,tp_rank="",role="mm_processor"} 0.97
    vlm_process_unexported_self_share_max_ratio{...,tp_rank="",role="mm_processor"} 0.004
    vlm_frontend_saturated{...,tp_rank="",role="frontend"} 1.0

Every field of a /windows.json entry the operator reads has a series (the per-window gauges describe the
window `vlm_profiler_last_window_timestamp_seconds` names), so the operator's Prometheus source builds the
same windows as its sidecar source (tests/unit/operator/analysis/test_sources_parity.py).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field, replace

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from vlm_sidecar.model import EDGE_SEP, FRONTEND_ROLES, STAGES, WindowSummary
from vlm_sidecar.roles import FrontendWindow

LOOP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5,
                math.inf)


@dataclass
class RankState:
    bucket_counts: list[int] = field(default_factory=lambda: [0] * len(LOOP_BUCKETS))
    loop_sum: float = 0.0
    loop_count: int = 0
    samples_total: float = 0.0
    last_ok: WindowSummary | None = None
    last: WindowSummary | None = None
    effective_rate_hz: float = 0.0
    agreement: dict[str, float] = field(default_factory=dict)


@dataclass
class StoreSnapshot:
    ranks: dict[int, RankState]
    windows_total: dict[tuple[str, str], float]
    errors_total: dict[tuple[str, str], float]
    windows: list[WindowSummary]
    frontend: FrontendWindow | None = None
    frontend_errors_total: dict[tuple[str, str], float] = field(default_factory=dict)


class ProfileStore:
    """Windows and counters; stacks of the last `history` windows are kept for baselines and diffs."""

    def __init__(self, history: int = 64) -> None:
        self._lock = threading.Lock()
        self._next_id = 1
        self._windows: deque[WindowSummary] = deque(maxlen=history)
        self._stacks: dict[int, dict[tuple[str, ...], float]] = {}
        self._ranks: dict[int, RankState] = {}
        self._windows_total: dict[tuple[str, str], float] = {}
        self._errors_total: dict[tuple[str, str], float] = {}
        self._frontend: deque[FrontendWindow] = deque(maxlen=history)
        self._role_stacks: dict[tuple[int, str], dict[tuple[str, ...], float]] = {}
        self._frontend_errors: dict[tuple[str, str], float] = {}

    def new_id(self) -> int:
        with self._lock:
            wid = self._next_id
            self._next_id += 1
            return wid

    def count_error(self, kind: str, tp_rank: int | None = None) -> None:
        key = ("" if tp_rank is None else str(tp_rank), kind)
        with self._lock:
            self._errors_total[key] = self._errors_total.get(key, 0.0) + 1

    def count_window(self, result: str, tp_rank: int | None = None) -> None:
        key = ("" if tp_rank is None else str(tp_rank), result)
        with self._lock:
            self._windows_total[key] = self._windows_total.get(key, 0.0) + 1

    def add_window(self, w: WindowSummary, stacks: dict[tuple[str, ...], float] | None,
                   effective_rate_hz: float, agreement: dict[str, float] | None = None) -> None:
        """Record a finished window (any result). Only usable (ok) windows move the histogram and shares."""
        key = (str(w.tp_rank), w.result)
        with self._lock:
            self._windows_total[key] = self._windows_total.get(key, 0.0) + 1
            rs = self._ranks.setdefault(w.tp_rank, RankState())
            rs.last = w
            rs.samples_total += w.samples
            if w.result == "ok":
                rs.last_ok = w
                rs.effective_rate_hz = effective_rate_hz
                for v in w.loop_samples:
                    rs.loop_sum += v
                    rs.loop_count += 1
                    for i, le in enumerate(LOOP_BUCKETS):
                        if v <= le:
                            rs.bucket_counts[i] += 1
                            break
                if agreement is not None:
                    rs.agreement = dict(agreement)
            if len(self._windows) == self._windows.maxlen:
                self._stacks.pop(self._windows[0].id, None)
            self._windows.append(w)
            if stacks:
                self._stacks[w.id] = dict(stacks)

    def count_frontend_error(self, role: str, kind: str) -> None:
        with self._lock:
            self._frontend_errors[(role, kind)] = self._frontend_errors.get((role, kind), 0.0) + 1

    def add_frontend(self, fw: FrontendWindow, stacks: dict[str, dict[tuple[str, ...], float]],
                     window_ids: list[int]) -> list[WindowSummary]:
        """Record the front end of one window and attach it to that window's scheduler windows (returned)."""
        fields = {"frontend": fw.to_json(), "frontend_busy_share": fw.busy_share,
                  "frontend_saturated": fw.saturated}
        ids = set(window_ids)
        with self._lock:
            if len(self._frontend) == self._frontend.maxlen:
                old = self._frontend[0].id
                for key in [k for k in self._role_stacks if k[0] == old]:
                    del self._role_stacks[key]
            self._frontend.append(fw)
            for role, st in stacks.items():
                if st:
                    self._role_stacks[(fw.id, role)] = dict(st)
            for i, w in enumerate(self._windows):
                if w.id in ids:
                    self._windows[i] = replace(w, **fields)
            for rs in self._ranks.values():
                if rs.last is not None and rs.last.id in ids:
                    rs.last = replace(rs.last, **fields)
                if rs.last_ok is not None and rs.last_ok.id in ids:
                    rs.last_ok = replace(rs.last_ok, **fields)
            return [w for w in self._windows if w.id in ids]

    def frontend_windows(self) -> list[FrontendWindow]:
        with self._lock:
            return list(self._frontend)

    def latest_role_stacks(self, role: str) -> tuple[FrontendWindow, dict[tuple[str, ...], float]] | None:
        """The newest front-end window with stacks for `role` (its processes' role threads merged)."""
        with self._lock:
            for fw in reversed(self._frontend):
                if (fw.id, role) in self._role_stacks:
                    return fw, self._role_stacks[(fw.id, role)]
        return None

    def windows(self) -> list[WindowSummary]:
        with self._lock:
            return list(self._windows)

    def stacks(self, window_id: int) -> dict[tuple[str, ...], float] | None:
        with self._lock:
            return self._stacks.get(window_id)

    def latest_with_stacks(self, tp_rank: int = 0) -> tuple[WindowSummary, dict[tuple[str, ...], float]] | None:
        with self._lock:
            for w in reversed(self._windows):
                if w.tp_rank == tp_rank and w.id in self._stacks:
                    return w, self._stacks[w.id]
        return None

    def snapshot(self) -> StoreSnapshot:
        with self._lock:
            ranks = {r: RankState(list(s.bucket_counts), s.loop_sum, s.loop_count, s.samples_total, s.last_ok,
                                  s.last, s.effective_rate_hz, dict(s.agreement)) for r, s in self._ranks.items()}
            return StoreSnapshot(ranks, dict(self._windows_total), dict(self._errors_total), list(self._windows),
                                 self._frontend[-1] if self._frontend else None, dict(self._frontend_errors))


def is_stale(rs: RankState | None, now: float, stale_after_s: float) -> bool:
    """No usable window yet, the last window failed, or the last usable one is too old."""
    if rs is None or rs.last_ok is None or rs.last is None:
        return True
    return rs.last.result != "ok" or now - rs.last_ok.end > stale_after_s


def build_families(snap: StoreSnapshot, labels: dict[str, str], now: float, stale_after_s: float):
    """Metric families for one scrape. Pure."""
    names = [*labels, "tp_rank"]
    base = list(labels.values())

    def lv(rank: str, *extra: str) -> list[str]:
        return [*base, rank, *extra]

    hist = HistogramMetricFamily("vlm_scheduler_loop_seconds",
                                 "Estimated scheduler loop iteration time (from py-spy stage transitions).",
                                 labels=names)
    stage = GaugeMetricFamily("vlm_scheduler_stage_share_ratio", "Share of scheduler time per loop stage, last window.",
                              labels=[*names, "stage"])
    func = GaugeMetricFamily("vlm_scheduler_function_share_ratio",
                             "Share of scheduler time in a function (inclusive or self), last window.",
                             labels=[*names, "function", "kind"])
    edge = GaugeMetricFamily("vlm_scheduler_edge_share_ratio",
                             "Share of scheduler time under a call from caller to callee (an exported function; "
                             "its few largest callers), last window.", labels=[*names, "caller", "callee"])
    windows = CounterMetricFamily("vlm_profiler_windows", "Profiling windows by result.",
                                  labels=[*names, "result"])
    samples = CounterMetricFamily("vlm_profiler_samples", "py-spy samples taken.", labels=names)
    last_ts = GaugeMetricFamily("vlm_profiler_last_window_timestamp_seconds",
                                "End of the last usable window (unix seconds).", labels=names)
    errors = CounterMetricFamily("vlm_profiler_errors", "Sampling errors by kind.", labels=[*names, "kind"])
    rate = GaugeMetricFamily("vlm_profiler_effective_rate_hz", "Samples per second py-spy achieved, last window.",
                             labels=names)
    stale = GaugeMetricFamily("vlm_profiler_stale", "1 when the exported profile is not current.", labels=names)
    sglang_stage = GaugeMetricFamily(
        "vlm_sglang_stage_share_ratio",
        "SGLang's own share of the scheduler's wall time per stage (sglang:scheduler_stage_seconds_total and the idle "
        "counter, their deltas over the window; idle included), last window: the gate's profiler-free stage signal.",
        labels=[*names, "stage"])
    agree = GaugeMetricFamily("vlm_profiler_sglang_stage_share_abs_diff_ratio",
                              "|sidecar - SGLang scheduler_stage_seconds_total| stage share, last window.",
                              labels=[*names, "stage"])
    agree_max = GaugeMetricFamily("vlm_profiler_sglang_agreement_max_abs_diff_ratio",
                                  "Largest stage-share difference between the sidecar and SGLang's own counters.",
                                  labels=names)
    # One value per window, all from the last usable window (the one vlm_profiler_last_window_timestamp_seconds
    # names): the canary gate reads these from Prometheus as one observation per window, keyed by that timestamp.
    per_window = {
        "loop_mean_seconds": GaugeMetricFamily("vlm_scheduler_window_loop_mean_seconds",
                                               "Mean loop iteration time, last window.", labels=names),
        "loop_p95_seconds": GaugeMetricFamily("vlm_scheduler_window_loop_p95_seconds",
                                              "p95 loop iteration time, last window.", labels=names),
        "iterations": GaugeMetricFamily("vlm_scheduler_window_iterations",
                                        "Loop iterations seen, last window.", labels=names),
        "samples": GaugeMetricFamily("vlm_scheduler_window_samples",
                                     "py-spy samples taken, last window.", labels=names),
        "ttft_seconds": GaugeMetricFamily("vlm_sglang_window_ttft_seconds",
                                          "Mean time to first token (SGLang's histogram), last window.", labels=names),
        "itl_seconds": GaugeMetricFamily("vlm_sglang_window_itl_seconds",
                                         "Mean inter-token latency (SGLang's histogram), last window.", labels=names),
        "throughput": GaugeMetricFamily("vlm_sglang_window_generation_tokens_per_second",
                                        "Generation throughput (SGLang's token counter), last window.", labels=names),
        "forward_pass_rate": GaugeMetricFamily("vlm_sglang_window_forward_passes_per_second",
                                               "Forward passes (batches) SGLang's scheduler ran per second "
                                               "(sglang:cuda_graph_passes_total), last window.", labels=names),
        "queued_requests": GaugeMetricFamily("vlm_sglang_window_queued_requests",
                                             "Requests waiting in SGLang's queue (sglang:num_queue_reqs), the smaller "
                                             "of the two readings at the window's edges (a backlog of a second's "
                                             "arrivals or more: the pod was saturated), last window.", labels=names),
        "prompt_tokens_per_request": GaugeMetricFamily(
            "vlm_sglang_window_prompt_tokens_per_request",
            "Prompt tokens per request of the requests that finished (SGLang's prompt token and request counters), "
            "last window.", labels=names),
        "request_rate": GaugeMetricFamily("vlm_sglang_window_requests_per_second",
                                          "Requests that reached their first token per second (SGLang's TTFT "
                                          "histogram count), last window.", labels=names),
        "feature_transport_share": GaugeMetricFamily(
            "vlm_scheduler_feature_transport_share_ratio",
            "Share of scheduler time in the CUDA IPC multimodal feature transport, last window.", labels=names),
        "ipc_handle_reopen_share": GaugeMetricFamily(
            "vlm_scheduler_ipc_handle_reopen_share_ratio",
            "Share of scheduler time re-opening CUDA IPC handles (pool-handle cache not working), last window.",
            labels=names),
        "feature_transport_samples": GaugeMetricFamily(
            "vlm_scheduler_window_feature_transport_samples",
            "Samples in the CUDA IPC multimodal feature transport, last window.", labels=names),
        "unexported_self_share_max": GaugeMetricFamily(
            "vlm_scheduler_unexported_self_share_max_ratio",
            "Largest self share of a function the last window did not export (0: none was left out): the bound "
            "for a function missing from vlm_scheduler_function_share_ratio.", labels=names),
    }
    for rank, rs in sorted(snap.ranks.items()):
        r = str(rank)
        cum, buckets = 0, []
        for le, c in zip(LOOP_BUCKETS, rs.bucket_counts, strict=True):
            cum += c
            buckets.append(("+Inf" if math.isinf(le) else repr(le), cum))
        hist.add_metric(lv(r), buckets, rs.loop_sum)
        samples.add_metric(lv(r), rs.samples_total)
        stale.add_metric(lv(r), 1.0 if is_stale(rs, now, stale_after_s) else 0.0)
        if rs.last_ok is not None:
            w = rs.last_ok
            for st in STAGES:
                stage.add_metric(lv(r, st), w.stage_shares.get(st, 0.0))
            for st, v in sorted((w.sglang_stage_shares or {}).items()):
                sglang_stage.add_metric(lv(r, st), v)
            for fn, v in w.function_shares.items():
                func.add_metric(lv(r, fn, "inclusive"), v)
            for fn, v in w.self_shares.items():
                func.add_metric(lv(r, fn, "self"), v)
            for key, v in w.edge_shares.items():
                edge.add_metric(lv(r, *key.split(EDGE_SEP, 1)), v)
            last_ts.add_metric(lv(r), w.end)
            rate.add_metric(lv(r), rs.effective_rate_hz)
            for attr, fam in per_window.items():
                v = getattr(w, attr)
                if v is not None:
                    fam.add_metric(lv(r), float(v))
        for st, v in sorted(rs.agreement.items()):
            agree.add_metric(lv(r, st), v)
        if rs.agreement:
            agree_max.add_metric(lv(r), max(rs.agreement.values()))
    if not snap.ranks:
        stale.add_metric(lv(""), 1.0)
    for (r, result), v in sorted(snap.windows_total.items()):
        windows.add_metric(lv(r, result), v)
    for (r, kind), v in sorted(snap.errors_total.items()):
        errors.add_metric(lv(r, kind), v)
    return [hist, stage, func, edge, windows, samples, last_ts, errors, rate, stale, sglang_stage, agree, agree_max,
            *per_window.values(), *frontend_families(snap, labels)]


def frontend_families(snap: StoreSnapshot, labels: dict[str, str]):
    """The roles' series, from the newest front-end window (none before the first one). Pure."""
    names = [*labels, "tp_rank", "role"]
    base = list(labels.values())

    def lv(role: str, *extra: str) -> list[str]:
        return [*base, "", role, *extra]

    busy = GaugeMetricFamily("vlm_process_busy_share_ratio",
                             "Share of the window a role's processes were busy (not waiting for work); scheduler: "
                             "1 - its idle stage share. mm_processor: the fraction of the pool busy.", labels=names)
    image = GaugeMetricFamily("vlm_frontend_image_processing_share_ratio",
                              "Share of the tokenizer loop's time in the multimodal processor's own code, last window.",
                              labels=names)
    func = GaugeMetricFamily("vlm_process_function_share_ratio",
                             "Share of a front-end role's time in a function (inclusive or self), last window.",
                             labels=[*names, "function", "kind"])
    unexported = GaugeMetricFamily("vlm_process_unexported_self_share_max_ratio",
                                   "Largest self share of a function a front-end role's export left out, last "
                                   "window (0: none was left out).", labels=names)
    procs = GaugeMetricFamily("vlm_processes", "SGLang processes found per role, last window.", labels=names)
    saturated = GaugeMetricFamily("vlm_frontend_saturated",
                                  "1 when the busiest front-end role was busy >= 90% of the window while the "
                                  "scheduler idled >= 50%.", labels=names)
    busiest = GaugeMetricFamily("vlm_frontend_busy_share_ratio",
                                "Busy share of the busiest front-end role, last window.", labels=[*names, "busiest"])
    last_ts = GaugeMetricFamily("vlm_frontend_last_window_timestamp_seconds",
                                "End of the last window that sampled the front end (unix seconds).", labels=names)
    errors = CounterMetricFamily("vlm_frontend_errors", "Front-end sampling errors by role and kind.",
                                 labels=[*names, "kind"])
    fw = snap.frontend
    if fw is not None:
        for role in FRONTEND_ROLES:
            rsum = fw.roles.get(role)
            if rsum is None:
                continue
            procs.add_metric(lv(role), rsum.processes)
            if rsum.busy_share is not None:
                busy.add_metric(lv(role), rsum.busy_share)
            if rsum.image_processing_share is not None:
                image.add_metric(lv(role), rsum.image_processing_share)
            for fn, v in rsum.function_shares.items():
                func.add_metric(lv(role, fn, "inclusive"), v)
            for fn, v in rsum.self_shares.items():
                func.add_metric(lv(role, fn, "self"), v)
            if rsum.unexported_self_share_max is not None:
                unexported.add_metric(lv(role), rsum.unexported_self_share_max)
        if fw.scheduler_idle_share is not None:
            busy.add_metric(lv("scheduler"), 1.0 - fw.scheduler_idle_share)
        procs.add_metric(lv("scheduler"), sum(1 for rs in snap.ranks.values() if rs.last is not None))
        if fw.saturated is not None:
            saturated.add_metric(lv("frontend"), 1.0 if fw.saturated else 0.0)
        if fw.busy_share is not None:
            busiest.add_metric(lv("frontend", fw.busiest_role or ""), fw.busy_share)
        last_ts.add_metric(lv("frontend"), fw.end)
    for (role, kind), v in sorted(snap.frontend_errors_total.items()):
        errors.add_metric(lv(role, kind), v)
    return [busy, image, func, unexported, procs, saturated, busiest, last_ts, errors]


class SidecarCollector:
    """prometheus_client custom collector: computes everything from the store at scrape time."""

    def __init__(self, store: ProfileStore, labels: dict[str, str], stale_after_s: float, clock) -> None:
        self.store = store
        self.labels = labels
        self.stale_after_s = stale_after_s
        self.clock = clock

    def collect(self):
        yield from build_families(self.store.snapshot(), self.labels, self.clock(), self.stale_after_s)
