"""A stand-in for an SGLang server, for tests, benchmarks and the demo. Never shipped as the product.

It mimics what the profiler sidecar and the canary gate look at, and nothing else:

- one scheduler process per TP rank, titled ``sglang::scheduler`` (tp=1) or ``sglang::scheduler_TP<n>``,
  whose MainThread runs SGLang's event loop with SGLang's function names
  (``event_loop_normal``/``event_loop_overlap`` -> ``recv_requests`` -> ``process_input_requests`` ->
  ``handle_generate_request`` -> ``hash_feature``/``reconstruct_on_target_device`` ->
  ``get_next_batch_to_run`` -> ``run_batch`` -> ``process_batch_result``);
- a multimodal input cost that follows the env vars and flags SGLang reads
  (``SGLANG_USE_IPC_POOL_HANDLE_CACHE``, ``SGLANG_USE_CUDA_IPC_TRANSPORT``, ``--mm-feature-transport``) with
  each version's defaults (REFERENCE.md), so the flags the operator writes into a pod decide its speed;
- SGLang-named metrics on ``--port`` (``/metrics`` with ``--enable-metrics``, ``/health``), computed from
  its own loop;
- its true time accounting at ``/standin/accounting`` (JSON), so tests can check the sidecar's estimates.

Run: ``python bench/standin/sglang_standin.py --model-path X --tp 2 --port 30000 --enable-metrics``
plus ``--standin-*`` flags (``--help`` lists them). Unknown SGLang flags are accepted and ignored.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import json
import math
import multiprocessing as mp
import os
import random
import re
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

STAGES = (
    "recv_requests",
    "process_input_requests",
    "get_next_batch_to_run",
    "run_batch",
    "process_batch_result",
    "idle",
    "other",
)
N_STAGES = len(STAGES)
# Per-rank slots in the shared accounting array: stage seconds, iterations, loop seconds, heartbeat.
RANK_SLOTS = N_STAGES + 3
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, math.inf)
# Request stats (rank 0 only): ttft buckets+sum+count, itl buckets+sum+count, tokens, running, queued, done.
NB = len(LATENCY_BUCKETS)
STATS_SLOTS = 2 * (NB + 2) + 4
DEFAULT_VERSION = "0.5.20"
_TRUE = {"true", "1", "yes", "y"}
_FALSE = {"false", "0", "no", "n"}


class StandinConfigError(ValueError):
    """The launch flags or env would make the real SGLang refuse to start."""


# ---------------------------------------------------------------------------------------------------------
# Version rules (pure)


def parse_version(text: str) -> tuple[int, int, int, int]:
    """'v0.5.10.post1' -> (0, 5, 10, 1); 'latest' and garbage raise StandinConfigError."""
    m = re.match(r"^v?(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?", text.strip())
    if not m:
        raise StandinConfigError(f"cannot parse SGLang version {text!r}")
    return (int(m[1]), int(m[2]), int(m[3]), int(m[4] or 0))


def env_bool(environ: dict[str, str], name: str, default: bool) -> bool:
    """SGLang's EnvBool: true/1/yes/y and false/0/no/n, anything else fails at start."""
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise StandinConfigError(f"{name}={raw!r} is not a boolean SGLang accepts")


@dataclass(frozen=True)
class FeaturePath:
    """How multimodal features reach the scheduler for one (version, env, flags) combination."""

    transport: str  # cpu | cuda_ipc | cuda_vmm
    cache: bool  # pool-handle cache active (only meaningful for cuda_ipc)
    reason: str


def resolve_feature_path(version: str, environ: dict[str, str], mm_feature_transport: str | None) -> FeaturePath:
    """Mirror of SGLang's choice of feature transport and IPC pool-handle cache, per REFERENCE.md."""
    v = parse_version(version)[:3]
    if mm_feature_transport is not None and v < (0, 5, 16):
        raise StandinConfigError(f"SGLang {version} has no --mm-feature-transport flag (unrecognized argument)")
    allowed = ("cpu", "cuda_ipc", "cuda_vmm") if v >= (0, 5, 18) else ("cpu", "cuda_ipc")
    if mm_feature_transport is not None and mm_feature_transport not in allowed:
        raise StandinConfigError(f"--mm-feature-transport {mm_feature_transport!r}: choose from {allowed}")
    if v < (0, 5, 10):
        ipc = env_bool(environ, "SGLANG_USE_CUDA_IPC_TRANSPORT", False)
        return FeaturePath("cuda_ipc" if ipc else "cpu", False, f"{version} predates the pool-handle cache")
    if v < (0, 5, 16):
        ipc = env_bool(environ, "SGLANG_USE_CUDA_IPC_TRANSPORT", False)
        cache = env_bool(environ, "SGLANG_USE_IPC_POOL_HANDLE_CACHE", False)
        return FeaturePath("cuda_ipc" if ipc else "cpu", cache and ipc, "env vars, both default off")
    cache = env_bool(environ, "SGLANG_USE_IPC_POOL_HANDLE_CACHE", v >= (0, 5, 17))
    if mm_feature_transport is not None:
        transport = mm_feature_transport
    else:
        transport = "cuda_ipc" if v[:3] == (0, 5, 17) else "cpu"
    return FeaturePath(transport, cache and transport == "cuda_ipc", "flag plus cache env")


# ---------------------------------------------------------------------------------------------------------
# Transports: reconstruct(n_features), optional step() and close()


def calibrate_spins(seconds: float = 0.3) -> float:
    """Spin-loop iterations per second on this CPU (the best of three short runs, to dodge contention)."""
    best = 0.0
    for _ in range(3):
        n = 1 << 62
        start = time.perf_counter()
        end = start + seconds / 3
        while n > 0 and time.perf_counter() < end:
            n -= 1
        best = max(best, ((1 << 62) - n) / (time.perf_counter() - start))
    return best


class SimTransport:
    """CPU-only stand-in for feature reconstruction: a busy wait whose length follows the feature path."""

    def __init__(self, path: FeaturePath, costs_ms: dict[str, float], spins_per_s: float | None = None) -> None:
        self.spins_per_s = spins_per_s
        if path.transport == "cpu":
            self.per_feature_s = costs_ms["cpu"] / 1e3
        elif path.cache or path.transport == "cuda_vmm":
            self.per_feature_s = costs_ms["cached"] / 1e3
        else:
            self.per_feature_s = costs_ms["uncached"] / 1e3

    def reconstruct(self, n_features: int) -> None:
        seconds = self.per_feature_s * n_features
        if self.spins_per_s is None:
            end, n = time.perf_counter() + seconds, 1 << 62
        else:
            end, n = math.inf, int(seconds * self.spins_per_s)
        while n > 0 and time.perf_counter() < end:
            n -= 1

    def step(self) -> None:
        return None

    def close(self) -> None:
        return None


def load_cuda_transport(cache: bool, feature_bytes: int, device: int):
    """Import bench/standin/cuda_transport.py lazily: torch is only needed on a GPU machine."""
    path = Path(__file__).with_name("cuda_transport.py")
    spec = importlib.util.spec_from_file_location("standin_cuda_transport", path)
    if spec is None or spec.loader is None:
        raise StandinConfigError(f"{path} not found")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CudaIpcTransport(cache=cache, feature_bytes=feature_bytes, device=device)


# ---------------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class StandinConfig:
    """Everything a scheduler process needs; picklable so spawned children get it."""

    model_path: str
    tp: int
    host: str
    port: int
    enable_metrics: bool
    version: str
    path: FeaturePath
    transport: str  # sim | cuda
    loop: str  # normal | overlap
    request_rate: float
    images_per_request: int
    features_per_image: int
    output_tokens: int
    max_running: int
    recv_ms: float
    schedule_ms: float
    batch_ms: float
    batch_per_req_ms: float
    result_ms: float
    hash_feature_ms: float
    feature_costs_ms: dict
    idle_ms: float
    jitter: float
    feature_bytes: int
    seed: int
    restart: bool
    stage_metrics: bool
    cost_model: str = "wall"
    arrivals: str = "poisson"  # poisson | fixed (the overhead benchmark wants no arrival noise)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    a = p.add_argument
    # SGLang's own launch flags the operator writes (others are accepted and ignored).
    a("--model-path", "--model", default="stand-in/model")
    a("--tp", "--tp-size", "--tensor-parallel-size", dest="tp", type=int, default=1)
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--enable-metrics", action="store_true")
    a("--mm-feature-transport", default=None)
    # Stand-in flags.
    a("--standin-version", default=os.environ.get("STANDIN_SGLANG_VERSION", DEFAULT_VERSION),
      help="SGLang version whose defaults to mimic (env STANDIN_SGLANG_VERSION)")
    a("--standin-transport", choices=("sim", "cuda"), default="sim")
    a("--standin-loop", choices=("normal", "overlap"), default="overlap")
    a("--standin-request-rate", type=float, default=20.0, help="requests per second")
    a("--standin-arrivals", choices=("poisson", "fixed"), default="poisson",
      help="inter-arrival times: exponential (default) or constant 1/rate")
    a("--standin-images-per-request", type=int, default=2)
    a("--standin-features-per-image", type=int, default=4)
    a("--standin-output-tokens", type=int, default=64)
    a("--standin-max-running", type=int, default=64)
    a("--standin-recv-ms", type=float, default=0.5)
    a("--standin-schedule-ms", type=float, default=0.8)
    a("--standin-batch-ms", type=float, default=14.0, help="run_batch base cost")
    a("--standin-batch-per-req-ms", type=float, default=0.05)
    a("--standin-result-ms", type=float, default=1.5)
    a("--standin-hash-feature-ms", type=float, default=0.3)
    a("--standin-cached-feature-ms", type=float, default=0.03, help="reconstruct, cuda_ipc with cache")
    a("--standin-uncached-feature-ms", type=float, default=1.2, help="reconstruct, cuda_ipc re-opening handles")
    a("--standin-cpu-feature-ms", type=float, default=0.4, help="reconstruct, cpu transport")
    a("--standin-idle-ms", type=float, default=1.0, help="sleep per idle iteration")
    a("--standin-jitter", type=float, default=0.05, help="relative uniform jitter on every cost")
    a("--standin-feature-bytes", type=int, default=5 << 20)
    a("--standin-seed", type=int, default=0)
    a("--standin-cost-model", choices=("wall", "work"), default="wall",
      help="wall: stages last exact wall time; work: fixed CPU work per stage (overhead benchmark)")
    a("--standin-restart", action="store_true", help="respawn a scheduler that exits (restart tests)")
    a("--standin-stage-metrics", choices=("auto", "on", "off"), default="auto",
      help="serve sglang:scheduler_stage_seconds_total (auto: SGLang >= 0.5.20)")
    return p


def build_config(argv: list[str], environ: dict[str, str]) -> StandinConfig:
    """Parse launch args (unknown ones ignored, like a forgiving SGLang) and resolve the feature path."""
    ns, _unknown = build_parser().parse_known_args(argv)
    path = resolve_feature_path(ns.standin_version, environ, ns.mm_feature_transport)
    v = parse_version(ns.standin_version)[:3]
    stage = ns.standin_stage_metrics == "on" or (ns.standin_stage_metrics == "auto" and v >= (0, 5, 20))
    return StandinConfig(
        model_path=ns.model_path, tp=max(1, ns.tp), host=ns.host, port=ns.port,
        enable_metrics=ns.enable_metrics, version=ns.standin_version, path=path,
        transport=ns.standin_transport, loop=ns.standin_loop, request_rate=ns.standin_request_rate,
        arrivals=ns.standin_arrivals,
        images_per_request=ns.standin_images_per_request, features_per_image=ns.standin_features_per_image,
        output_tokens=max(1, ns.standin_output_tokens), max_running=ns.standin_max_running,
        recv_ms=ns.standin_recv_ms, schedule_ms=ns.standin_schedule_ms, batch_ms=ns.standin_batch_ms,
        batch_per_req_ms=ns.standin_batch_per_req_ms, result_ms=ns.standin_result_ms,
        hash_feature_ms=ns.standin_hash_feature_ms,
        feature_costs_ms={"cached": ns.standin_cached_feature_ms, "uncached": ns.standin_uncached_feature_ms,
                          "cpu": ns.standin_cpu_feature_ms},
        idle_ms=ns.standin_idle_ms, jitter=ns.standin_jitter, feature_bytes=ns.standin_feature_bytes,
        seed=ns.standin_seed, restart=ns.standin_restart, stage_metrics=stage, cost_model=ns.standin_cost_model,
    )


# ---------------------------------------------------------------------------------------------------------
# The scheduler process


def set_title(title: str) -> None:
    """setproctitle rewrites /proc/PID/cmdline (what the sidecar matches); prctl alone only sets comm."""
    try:
        import setproctitle

        setproctitle.setproctitle(title)
    except ImportError:
        libc = ctypes.CDLL(None)
        libc.prctl(15, title.encode()[:15], 0, 0, 0)  # PR_SET_NAME


@dataclass
class Req:
    rid: int
    arrival: float
    n_features: int
    output_tokens: int
    generated: int = 0
    last_token: float = 0.0


class Scheduler:
    """SGLang's scheduler loop, with busy waits in place of the work. Method names match SGLang's."""

    def __init__(self, cfg: StandinConfig, rank: int, acct, stats) -> None:
        self.cfg = cfg
        self.rank = rank
        self.acct = acct  # shared array, this rank's slots at base
        self.base = rank * RANK_SLOTS
        self.stats = stats if rank == 0 else None
        self.rng = random.Random(cfg.seed)  # same seed on every rank: TP ranks see the same requests
        self.jrng = random.Random(cfg.seed * 1000 + rank)
        self.running = True
        self.waiting: deque[Req] = deque()
        self.batch: list[Req] = []
        self.next_rid = 0
        self.stage_s = [0.0] * N_STAGES
        self.iterations = 0
        self.loop_s = 0.0
        self.last_result = None
        self.spins_per_s = calibrate_spins() if cfg.cost_model == "work" else None
        self.version = parse_version(cfg.version)[:3]
        if cfg.transport == "cuda":
            self.transport = load_cuda_transport(cfg.path.cache, cfg.feature_bytes, rank)
        else:
            self.transport = SimTransport(cfg.path, cfg.feature_costs_ms, self.spins_per_s)
        # Requests start arriving once the transport is up (a CUDA one takes seconds), not before:
        # otherwise every run would begin with a backlog.
        self.start = time.perf_counter()
        self.next_arrival = self.start + self._gap()

    def _gap(self) -> float:
        if self.cfg.request_rate <= 0:
            return math.inf
        if self.cfg.arrivals == "fixed":
            return 1.0 / self.cfg.request_rate
        return self.rng.expovariate(self.cfg.request_rate)

    def _budget(self, ms: float) -> tuple[float, int]:
        """(deadline, spin count) for a stage costing `ms`.

        Each stage spins inline, so its self time lands in the SGLang-named frame (like SGLang's C calls,
        which show on the calling line). cost model "wall": spin until a deadline (stage lengths exact,
        what the accuracy tests want). "work": spin a fixed count calibrated at start, so anything that
        pauses or slows the process (py-spy in blocking mode, CPU contention) stretches the loop, which
        is what the overhead benchmark must see."""
        j = self.cfg.jitter
        seconds = ms / 1e3 * (1.0 + self.jrng.uniform(-j, j))
        if self.spins_per_s is None:
            return time.perf_counter() + seconds, 1 << 62
        return math.inf, int(seconds * self.spins_per_s)

    # --- the SGLang stages -------------------------------------------------------------------------------
    def recv_requests(self) -> list[Req]:
        end, n = self._budget(self.cfg.recv_ms)
        while n > 0 and time.perf_counter() < end:
            n -= 1
        now = time.perf_counter()
        reqs = []
        while self.next_arrival <= now:
            n = self.cfg.images_per_request * self.cfg.features_per_image
            reqs.append(Req(self.next_rid, self.next_arrival, n, self.cfg.output_tokens))
            self.next_rid += 1
            self.next_arrival += self._gap()
        return reqs

    def process_input_requests(self, reqs: list[Req]) -> None:
        for req in reqs:
            self.handle_generate_request(req)

    def handle_generate_request(self, req: Req) -> None:
        if self.version < (0, 5, 10):
            self.hash_feature(req, reconstruct_inside=True)  # 0.5.9: the reconstruct sat under hash_feature
        else:
            self.reconstruct_on_target_device(req)
            self.hash_feature(req, reconstruct_inside=False)
        self.waiting.append(req)

    def reconstruct_on_target_device(self, req: Req) -> None:
        self.transport.reconstruct(req.n_features)

    def hash_feature(self, req: Req, reconstruct_inside: bool) -> None:
        if reconstruct_inside:
            self.reconstruct_on_target_device(req)
        end, n = self._budget(self.cfg.hash_feature_ms * req.n_features)
        while n > 0 and time.perf_counter() < end:
            n -= 1

    def get_next_batch_to_run(self) -> list[Req] | None:
        end, n = self._budget(self.cfg.schedule_ms)
        while n > 0 and time.perf_counter() < end:
            n -= 1
        while self.waiting and len(self.batch) < self.cfg.max_running:
            self.batch.append(self.waiting.popleft())
        return list(self.batch) if self.batch else None

    def run_batch(self, batch: list[Req]) -> list[Req]:
        end, n = self._budget(self.cfg.batch_ms + self.cfg.batch_per_req_ms * len(batch))
        while n > 0 and time.perf_counter() < end:
            n -= 1
        step = getattr(self.transport, "step", None)
        if step is not None:
            step()
        return batch

    def process_batch_result(self, batch: list[Req], result) -> None:
        end, n = self._budget(self.cfg.result_ms + 0.02 * len(batch))
        while n > 0 and time.perf_counter() < end:
            n -= 1
        now = time.perf_counter()
        done = set()
        for req in batch:
            if req.generated >= req.output_tokens:
                continue  # overlap loop: finished with the previous result, still in the launched batch
            req.generated += 1
            if req.generated == 1:
                self._observe(0, now - req.arrival, 1)
            else:
                self._observe(1, now - req.last_token, 1)
            req.last_token = now
            if req.generated >= req.output_tokens:
                done.add(req.rid)
        if done:
            self.batch = [r for r in self.batch if r.rid not in done]
        if self.stats is not None:
            s = self.stats
            off = 2 * (NB + 2)
            s[off] += len(batch)
            s[off + 1] = len(self.batch)
            s[off + 2] = len(self.waiting)
            s[off + 3] += len(done)

    def self_check_during_idle(self) -> None:
        time.sleep(self.cfg.idle_ms / 1e3)

    # --- bookkeeping -------------------------------------------------------------------------------------
    def _observe(self, which: int, value: float, count: int) -> None:
        s = self.stats
        if s is None:
            return
        off = which * (NB + 2)
        for i, le in enumerate(LATENCY_BUCKETS):
            if value <= le:
                s[off + i] += count
                break
        s[off + NB] += value * count
        s[off + NB + 1] += count

    def _publish(self, t_iter_start: float, t_end: float) -> None:
        dt = t_end - t_iter_start
        self.iterations += 1
        self.loop_s += dt
        # "other" is loop time spent outside the five stages and idle (the loop's own overhead).
        self.stage_s[6] = max(0.0, self.loop_s - sum(self.stage_s[:6]))
        a, b = self.acct, self.base
        for i in range(N_STAGES):
            a[b + i] = self.stage_s[i]
        a[b + N_STAGES] = self.iterations
        a[b + N_STAGES + 1] = self.loop_s
        a[b + N_STAGES + 2] = time.time()

    # The stages are called straight from the loop, as in SGLang: a timing wrapper would be a frame of its
    # own in every stack, and the sidecar would (rightly) report it as the function that grew.
    def event_loop_normal(self) -> None:
        clock, acc = time.perf_counter, self.stage_s
        t = clock()
        while self.running:
            t0 = clock()
            reqs = self.recv_requests()
            t1 = clock()
            self.process_input_requests(reqs)
            t2 = clock()
            batch = self.get_next_batch_to_run()
            t3 = clock()
            acc[0] += t1 - t0
            acc[1] += t2 - t1
            acc[2] += t3 - t2
            if batch:
                result = self.run_batch(batch)
                t4 = clock()
                self.process_batch_result(batch, result)
                t5 = clock()
                acc[3] += t4 - t3
                acc[4] += t5 - t4
            else:
                self.self_check_during_idle()
                acc[5] += clock() - t3
            now = clock()
            self._publish(t, now)
            t = now

    def event_loop_overlap(self) -> None:
        # SGLang's overlap loop launches batch k, then processes the result of batch k-1.
        clock, acc = time.perf_counter, self.stage_s
        t = clock()
        while self.running:
            t0 = clock()
            reqs = self.recv_requests()
            t1 = clock()
            self.process_input_requests(reqs)
            t2 = clock()
            batch = self.get_next_batch_to_run()
            t3 = clock()
            acc[0] += t1 - t0
            acc[1] += t2 - t1
            acc[2] += t3 - t2
            result = self.run_batch(batch) if batch else None
            t4 = clock()
            acc[3] += t4 - t3
            if self.last_result is not None:
                self.process_batch_result(*self.last_result)
            t5 = clock()
            acc[4] += t5 - t4
            self.last_result = (batch, result) if batch else None
            if not batch:
                self.self_check_during_idle()
                acc[5] += clock() - t5
            now = clock()
            self._publish(t, now)
            t = now


def run_scheduler_process(cfg: StandinConfig, rank: int, acct, stats) -> None:
    """Entry point of one scheduler process (spawned, like SGLang's)."""
    set_title("sglang::scheduler" if cfg.tp == 1 else f"sglang::scheduler_TP{rank}")
    sched = Scheduler(cfg, rank, acct, stats)

    def stop(_signum, _frame):
        sched.running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; Ctrl-C reaches the whole group
    try:
        if cfg.loop == "overlap":
            sched.event_loop_overlap()
        else:
            sched.event_loop_normal()
    finally:
        close = getattr(sched.transport, "close", None)
        if close is not None:
            close()


# ---------------------------------------------------------------------------------------------------------
# The server process: spawns schedulers, keeps accounting snapshots, serves HTTP


def window_accounting(snaps: list[tuple], tp: int, start: float | None, end: float | None):
    """Per-rank stage seconds, shares, iterations and mean loop time between two snapshot times."""
    if not snaps:
        return []
    lo = snaps[0]
    hi = snaps[-1]
    if start is not None:
        lo = next((s for s in snaps if s[0] >= start), snaps[-1])
    if end is not None:
        hi = next((s for s in reversed(snaps) if s[0] <= end), snaps[0])
    out = []
    for r in range(tp):
        b = r * RANK_SLOTS
        d = [hi[1][b + i] - lo[1][b + i] for i in range(RANK_SLOTS - 1)]
        stage = dict(zip(STAGES, d[:N_STAGES], strict=True))
        total = d[N_STAGES + 1]
        iters = int(d[N_STAGES])
        out.append({
            "tp_rank": r, "start": lo[0], "end": hi[0],
            "stage_seconds": stage,
            "stage_shares": {k: (v / total if total > 0 else 0.0) for k, v in stage.items()},
            "iterations": iters, "loop_seconds": total,
            "loop_mean_seconds": total / iters if iters else None,
        })
    return out


def render_metrics(cfg: StandinConfig, snap: list[float], stats: list[float], throughput: float) -> str:
    """SGLang-named metrics, Prometheus text."""
    lab = f'model_name="{cfg.model_path}"'
    lines = []

    def hist(name: str, which: int, help_: str) -> None:
        off = which * (NB + 2)
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} histogram")
        cum = 0.0
        for i, le in enumerate(LATENCY_BUCKETS):
            cum += stats[off + i]
            les = "+Inf" if math.isinf(le) else repr(le)
            lines.append(f'{name}_bucket{{{lab},le="{les}"}} {cum:.0f}')
        lines.append(f"{name}_sum{{{lab}}} {stats[off + NB]}")
        lines.append(f"{name}_count{{{lab}}} {stats[off + NB + 1]:.0f}")

    hist("sglang:time_to_first_token_seconds", 0, "Histogram of time to first token in seconds.")
    hist("sglang:inter_token_latency_seconds", 1, "Histogram of inter-token latency in seconds.")
    off = 2 * (NB + 2)
    for name, kind, val, help_ in (
        ("sglang:gen_throughput", "gauge", throughput, "The generation throughput (token/s)."),
        ("sglang:num_running_reqs", "gauge", stats[off + 1], "The number of running requests."),
        ("sglang:num_queue_reqs", "gauge", stats[off + 2], "The number of requests in the waiting queue."),
        ("sglang:generation_tokens_total", "counter", stats[off], "Number of generation tokens processed."),
        ("sglang:num_requests_total", "counter", stats[off + 3], "Number of requests finished."),
    ):
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{lab}}} {val}"]
    if cfg.stage_metrics:
        lines.append("# HELP sglang:scheduler_stage_seconds_total Scheduler wall time by stage.")
        lines.append("# TYPE sglang:scheduler_stage_seconds_total counter")
        for i, st in enumerate(STAGES[:5]):
            lines.append(f'sglang:scheduler_stage_seconds_total{{{lab},category="{st}"}} {snap[i]}')
        lines.append("# HELP sglang:scheduler_idle_seconds_total Scheduler idle wall time.")
        lines.append("# TYPE sglang:scheduler_idle_seconds_total counter")
        lines.append(f"sglang:scheduler_idle_seconds_total{{{lab}}} {snap[5]}")
    return "\n".join(lines) + "\n"


class StandinServer:
    """Owns the scheduler processes and the HTTP endpoint."""

    def __init__(self, cfg: StandinConfig) -> None:
        self.cfg = cfg
        self.ctx = mp.get_context("spawn")
        self.acct = self.ctx.Array("d", cfg.tp * RANK_SLOTS, lock=False)
        self.stats = self.ctx.Array("d", STATS_SLOTS, lock=False)
        self.procs: list = [None] * cfg.tp
        self.snaps: deque = deque(maxlen=12000)  # 10 minutes at 50 ms
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.restarts = 0
        self.failed: str | None = None

    def spawn(self, rank: int) -> None:
        p = self.ctx.Process(target=run_scheduler_process, args=(self.cfg, rank, self.acct, self.stats),
                             name=f"scheduler-{rank}", daemon=True)
        p.start()
        self.procs[rank] = p

    def pids(self) -> list[int | None]:
        return [p.pid if p is not None else None for p in self.procs]

    def snapshot_loop(self) -> None:
        while not self.stopping.wait(0.05):
            with self.lock:
                self.snaps.append((time.time(), list(self.acct), self.stats[2 * (NB + 2)]))
            for rank, p in enumerate(self.procs):
                if p is not None and not p.is_alive() and not self.stopping.is_set():
                    if self.cfg.restart:
                        self.restarts += 1
                        self.spawn(rank)
                    else:
                        self.failed = f"scheduler rank {rank} exited with {p.exitcode}"
                        self.stopping.set()

    def throughput(self, horizon: float = 5.0) -> float:
        """Generated tokens per second over the last few seconds (rank 0 generates for the group)."""
        with self.lock:
            if len(self.snaps) < 2:
                return 0.0
            last = self.snaps[-1]
            first = next((s for s in self.snaps if s[0] >= last[0] - horizon), self.snaps[0])
        dt = last[0] - first[0]
        return (last[2] - first[2]) / dt if dt > 0 else 0.0

    def handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args) -> None:  # quiet: tests scrape often
                return None

            def _send(self, code: int, body: str, ctype: str = "application/json") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                q = parse_qs(url.query)
                alive = all(p is not None and p.is_alive() for p in server.procs)
                if url.path in ("/health", "/health_generate"):
                    self._send(200 if alive else 503, "ok" if alive else "scheduler down", "text/plain")
                elif url.path == "/metrics" and server.cfg.enable_metrics:
                    with server.lock:
                        snap = list(server.acct)
                    body = render_metrics(server.cfg, snap, list(server.stats), server.throughput())
                    self._send(200, body, "text/plain; version=0.0.4")
                elif url.path == "/standin/accounting":
                    start = float(q["start"][0]) if "start" in q else None
                    end = float(q["end"][0]) if "end" in q else None
                    with server.lock:
                        snaps = list(server.snaps)
                    body = {"now": time.time(), "ranks": window_accounting(snaps, server.cfg.tp, start, end)}
                    self._send(200, json.dumps(body))
                elif url.path in ("/standin/info", "/get_server_info"):
                    cfg = asdict(server.cfg)
                    self._send(200, json.dumps({"config": cfg, "pids": server.pids(),
                                                "restarts": server.restarts, "version": server.cfg.version}))
                else:
                    self._send(404, json.dumps({"error": "not found"}))

        return Handler

    def serve(self) -> int:
        for rank in range(self.cfg.tp):
            self.spawn(rank)
        # Announce only once every scheduler has its title and runs its loop (heartbeat written), so
        # whoever reads the first stdout line can profile at once.
        deadline = time.time() + 120
        while time.time() < deadline and not all(
                self.acct[r * RANK_SLOTS + N_STAGES + 2] > 0 for r in range(self.cfg.tp)):
            if any(p is not None and not p.is_alive() for p in self.procs):
                print("sglang stand-in: a scheduler died during start", file=sys.stderr, flush=True)
                return 1
            time.sleep(0.02)
        httpd = ThreadingHTTPServer((self.cfg.host, self.cfg.port), self.handler())
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        snapper = threading.Thread(target=self.snapshot_loop, daemon=True)
        snapper.start()
        print(json.dumps({"msg": "stand-in serving", "port": httpd.server_address[1], "pids": self.pids(),
                          "transport": self.cfg.path.transport, "cache": self.cfg.path.cache,
                          "version": self.cfg.version}), flush=True)
        self.stopping.wait()
        httpd.shutdown()
        for p in self.procs:
            if p is not None and p.is_alive():
                p.terminate()
        for p in self.procs:
            if p is not None:
                p.join(5)
                if p.is_alive():
                    p.kill()
        if self.failed:
            print(json.dumps({"msg": "stand-in stopping", "reason": self.failed}), file=sys.stderr, flush=True)
            return 1
        return 0


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = build_config(sys.argv[1:] if argv is None else argv, dict(os.environ))
    except StandinConfigError as e:
        print(f"sglang stand-in: {e}", file=sys.stderr)
        return 2
    server = StandinServer(cfg)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stopping.set())
    with contextlib.suppress(KeyboardInterrupt):
        return server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
