"""A stand-in for an SGLang server, for tests, benchmarks and the demo. Never shipped as the product.

It mimics what the profiler sidecar and the canary gate look at, and nothing else:

- one scheduler process per TP rank, titled ``sglang::scheduler`` (tp=1) or ``sglang::scheduler_TP<n>``,
  whose MainThread runs SGLang's event loop with SGLang's function names
  (``event_loop_normal``/``event_loop_overlap`` -> ``recv_requests`` -> ``process_input_requests`` ->
  ``handle_generate_request`` -> ``hash_feature``/``reconstruct_on_target_device`` ->
  ``get_next_batch_to_run`` -> ``run_batch`` -> ``process_batch_result``) and the control flow of the
  release it claims (LoopShape: ``ingest_requests``, the decorators' ``wrapper`` frames, ``on_idle`` vs
  ``self_check_during_idle``, ``pop_and_process`` before ``run_batch`` for consecutive prefills), with
  image prefills several times longer than decode steps, and optionally N idle threads (py-spy's cost);
- a multimodal input cost that follows the env vars and flags SGLang reads
  (``SGLANG_USE_IPC_POOL_HANDLE_CACHE``, ``SGLANG_USE_CUDA_IPC_TRANSPORT``, ``--mm-feature-transport``) with
  each version's defaults (the IPC-cache table in docs/objects.md), so the flags the operator writes into a pod decide its speed;
- SGLang-named metrics on ``--port`` (``/metrics`` with ``--enable-metrics``, ``/health``), computed from
  its own loop;
- its true time accounting at ``/standin/accounting`` (JSON: per-iteration ring -> stage seconds and shares,
  loop mean and quantiles of any window), so tests can check the sidecar's estimates.

Run: ``python testing/vlm_testing/standin/sglang_standin.py --model-path X --tp 2 --port 30000 --enable-metrics``
plus ``--standin-*`` flags (``--help`` lists them). Unknown SGLang flags are accepted and ignored.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import importlib.util
import json
import math
import multiprocessing as mp
import os
import random
import re
import signal
import struct
import sys
import threading
import time
import types
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
# Per-rank slots in the shared accounting array: stage seconds, iterations, loop seconds, heartbeat, the
# number of rows written to the iteration ring, and the forward passes (iterations that ran a batch).
RANK_SLOTS = N_STAGES + 5
# Per-rank ring of iterations, one row each: end (unix s), duration, seconds per stage, batch kind, flags.
RING_SIZE = 1 << 16  # 30+ minutes of a 30 ms loop, ~1 minute of an idle one
RING_FIELDS = 2 + N_STAGES + 2
RING_MARGIN = 4096  # rows next to the write position that a reader skips
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, math.inf)
# Request stats (rank 0 only): ttft buckets+sum+count, itl buckets+sum+count, tokens, running, queued, done, and
# the finished requests' prompt tokens.
NB = len(LATENCY_BUCKETS)
STATS_SLOTS = 2 * (NB + 2) + 5
# A request's prompt tokens: its text and each image's placeholder tokens (SGLang counts image tokens as prompt
# tokens), so the request mix the gate adjusts for follows the images that make the stand-in's prefills longer.
TEXT_TOKENS, TOKENS_PER_IMAGE = 32, 256
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
    """Mirror of SGLang's choice of feature transport and IPC pool-handle cache, as the released wheels do."""
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
# Loop shape per version (pure): the frames py-spy sees around the stages (/tmp/sglang_shapes.md, read
# from the released wheels 0.5.9, 0.5.10, 0.5.15, 0.5.17, 0.5.20, 0.5.23; releases in between take the
# shape of the newest of those at or below them)


@dataclass(frozen=True)
class LoopShape:
    """The control flow of one release's scheduler loop, as far as a py-spy stack can tell.

    receiver: ``recv_requests`` is ``SchedulerRequestReceiver.recv_requests``, reached as
    ``self.request_receiver.recv_requests()`` (0.5.15+), else a Scheduler method. ingest: the loop calls
    ``ingest_requests()``, which calls recv_requests then ``process_input_requests`` (0.5.20+).
    wrappers: how many ``wrapper`` frames sit above each decorated stage (0.5.15/0.5.17: the nvtx one;
    0.5.20+: ``scheduler_stage_method``'s around the nvtx one); wrapped: the decorated methods.
    idle: ``self_check_during_idle`` (-> ``check_memory``) up to 0.5.10, ``on_idle`` from 0.5.15.
    handle_shim: 0.5.23's ``handle_generate_request`` calls ``_handle_generate_request``.
    reconstruct_under_hash: 0.5.9 reconstructs inside ``hash_feature``.
    Every version: the overlap loop's nested ``pop_and_process()`` runs the previous batch's
    ``process_batch_result`` after ``run_batch``, or before it when ``is_disable_overlap_for_batch``
    (SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP and two prefills in a row); then
    ``launch_batch_sample_if_needed``."""

    receiver: bool
    ingest: bool
    wrappers: int
    wrapped: frozenset[str]
    idle: str
    handle_shim: bool
    reconstruct_under_hash: bool

    def to_json(self) -> dict:
        d = asdict(self)
        d["wrapped"] = sorted(self.wrapped)
        return d


FIVE_STAGES = ("recv_requests", "process_input_requests", "get_next_batch_to_run", "run_batch",
               "process_batch_result")


def loop_shape(version: str) -> LoopShape:
    """The loop shape of an SGLang release."""
    v = parse_version(version)[:3]
    if v >= (0, 5, 20):
        wrappers, wrapped = 2, frozenset((*FIVE_STAGES, "on_idle"))
    elif v >= (0, 5, 15):
        wrappers, wrapped = 1, frozenset(FIVE_STAGES)
    else:
        wrappers, wrapped = 0, frozenset()
    return LoopShape(
        receiver=v >= (0, 5, 15), ingest=v >= (0, 5, 20), wrappers=wrappers, wrapped=wrapped,
        idle="on_idle" if v >= (0, 5, 15) else "self_check_during_idle",
        handle_shim=v >= (0, 5, 23), reconstruct_under_hash=v < (0, 5, 10),
    )


# SGLang's two stage decorators, compiled under SGLang's file names so the frames read as in a real
# profile: `wrapper (nvtx_utils.py)` and `wrapper (scheduler_stage_metrics.py)`. Real decorators: py-spy
# sees the inner function's frame, named `wrapper`, above the stage method.
_NVTX_SRC = '''
def scheduler_nvtx_method(trace_name):
    def decorator(func):
        @wraps(func)
        def wrapper(*args, **kwargs):
            return func(*args, **kwargs)
        return wrapper
    return decorator
'''
_STAGE_SRC = '''
def scheduler_stage_method(category):
    def decorator(func):
        profiled_func = scheduler_nvtx_method("scheduler." + category)(func)
        @wraps(func)
        def wrapper(self, *args, **kwargs):
            t0 = perf_counter()
            try:
                return profiled_func(self, *args, **kwargs)
            finally:
                self.stage_clock[category] = perf_counter() - t0
        return wrapper
    return decorator
'''
_DECORATORS: dict = {"wraps": functools.wraps, "perf_counter": time.perf_counter}
exec(compile(_NVTX_SRC, "sglang/srt/utils/nvtx_utils.py", "exec"), _DECORATORS)
exec(compile(_STAGE_SRC, "sglang/srt/observability/scheduler_stage_metrics.py", "exec"), _DECORATORS)
scheduler_nvtx_method = _DECORATORS["scheduler_nvtx_method"]
scheduler_stage_method = _DECORATORS["scheduler_stage_method"]


def decorate_stage(func, name: str, wrappers: int):
    """`func` as the release decorates it: bare, nvtx-wrapped (1) or stage- around nvtx-wrapped (2)."""
    category = "idle" if name == "on_idle" else name
    if wrappers >= 2:
        return scheduler_stage_method(category)(func)
    if wrappers == 1:
        return scheduler_nvtx_method("scheduler." + category)(func)
    return func


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


# Cost model "hybrid": the part of each scheduler stage spun to its deadline after its nap (a sleep alone wakes up to
# a scheduler tick late, later on a loaded host: loop-latency noise a node-paired gate cannot tell from a 3%
# regression, as the "sleep" model showed). Stages shorter than this spin whole.
HYBRID_SPIN_S = 0.0002


def _precise_sleeps() -> None:
    """This thread's timer slack 1 us instead of Linux's 50 us (prctl PR_SET_TIMERSLACK): a nap then ends within
    the spin tail on a busy host too. Best effort: elsewhere the spin tail absorbs the default slack."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(29, 1000, 0, 0, 0)


def _sleep(seconds: float) -> tuple[float, int]:
    """Cost model "sleep": the stage's time passes asleep in this frame (called from the stage, so a sampler
    with --idle sees the stage's frame above it: its inclusive share is right, its self time shows here), and
    the caller's spin loop then runs no round."""
    time.sleep(seconds)
    return 0.0, 0


class SimTransport:
    """CPU-only stand-in for feature reconstruction: a busy wait whose length follows the feature path.

    The cuda_ipc path goes through `ipc_module`'s SGLang-shaped proxy instead of `reconstruct`: a feature
    costs `copy_feature` (the cached cost), plus opening the pool handle (`open_budget`, uncached - cached)
    each time the proxy re-opens it (cache off) or once (cache on, its one miss)."""

    ipc_open = None  # no real CUDA IPC open: the proxy spins on open_budget() instead
    ipc_handle = ("sim-pool",)
    device = 0

    def __init__(self, path: FeaturePath, costs_ms: dict[str, float], spins_per_s: float | None = None,
                 sleep: bool = False) -> None:
        self.spins_per_s = spins_per_s
        self.sleep = sleep
        if path.transport == "cpu":
            self.per_feature_s = costs_ms["cpu"] / 1e3
        elif path.cache or path.transport == "cuda_vmm":
            self.per_feature_s = costs_ms["cached"] / 1e3
        else:
            self.per_feature_s = costs_ms["uncached"] / 1e3
        self.copy_s = costs_ms["cached"] / 1e3
        self.open_s = max(0.0, costs_ms["uncached"] - costs_ms["cached"]) / 1e3

    def _budget(self, seconds: float) -> tuple[float, int, float]:
        """(deadline, spin count, nap 0): the transport spins (or sleeps in _sleep), "hybrid" included."""
        if self.sleep:
            return (*_sleep(seconds), 0.0)
        if self.spins_per_s is None:
            return time.perf_counter() + seconds, 1 << 62, 0.0
        return math.inf, int(seconds * self.spins_per_s), 0.0

    def reconstruct(self, n_features: int) -> None:
        end, n, nap = self._budget(self.per_feature_s * n_features)
        if nap:
            time.sleep(nap)
        while n > 0 and time.perf_counter() < end:
            n -= 1

    def open_budget(self) -> tuple[float, int]:
        """(deadline, spins) of one IPC handle open; the proxy spins inline, as _new_shared_cuda is a C call."""
        return self._budget(self.open_s)[:2]

    def copy_feature(self, storage) -> None:
        end, n, nap = self._budget(self.copy_s)
        if nap:
            time.sleep(nap)
        while n > 0 and time.perf_counter() < end:
            n -= 1

    def step(self) -> None:
        return None

    def close(self) -> None:
        return None


# SGLang's consumer side of the CUDA IPC feature transport, compiled under the file names the releases use
# (0.5.10-0.5.17: sglang/srt/utils/cuda_ipc_transport_utils.py; 0.5.20+: sglang/srt/multimodal/transport/
# cuda_ipc.py) and with their function names, so a py-spy profile of the stand-in shows the frames the
# sidecar's re-open detection (vlm_sidecar/ipc.py) reads in a real one: cache on, every feature goes
# reconstruct_on_target_device > _reconstruct_from_ipc_extra > _pool_handle_cache_get_or_open (the pool is
# opened once, on the cache's miss); cache off, up to 0.5.17 the feature's own handle is opened inline in
# reconstruct_on_target_device (torch's _new_shared_cuda is a C call), from 0.5.20 through
# _open_pool_slice > _reconstruct_from_ipc_extra > _open_pooled_storage_uncached for every feature.
# cache_broken: a cached handle always fails, so every feature takes SGLang's uncached retry (invalidate,
# _reconstruct_from_ipc_extra(use_cache=False), store again), re-opening the handle despite the cache flag.
# `transport` gives ipc_open (a C callable, e.g. torch.UntypedStorage._new_shared_cuda) and ipc_handle,
# or ipc_open None and open_budget() for a simulated open; and copy_feature(storage).
_IPC_SRC = '''
_pool_storage_cache = {}


def _open_pooled_storage_uncached(transport):
    if transport.ipc_open is not None:
        return transport.ipc_open(*transport.ipc_handle)
    end, n = transport.open_budget()
    while n > 0 and perf_counter() < end:
        n -= 1
    return transport.ipc_handle


def _pool_handle_cache_get_or_open(cache_key, transport):
    storage = _pool_storage_cache.get(cache_key)
    if storage is None:
        storage = _open_pooled_storage_uncached(transport)
        _pool_storage_cache[cache_key] = storage
    return storage


class CudaIpcTensorTransportProxy:
    def __init__(self, transport, use_cache, pool_only, cache_broken=False):
        self.transport = transport
        self.use_cache = use_cache
        self.pool_only = pool_only
        self.cache_broken = cache_broken
        self.cache_key = (transport.device, id(transport))

    def _reconstruct_from_ipc_extra(self, use_cache):
        if use_cache:
            storage = _pool_handle_cache_get_or_open(self.cache_key, self.transport)
            if self.cache_broken:
                raise RuntimeError("cached pool handle unusable")
            return storage
        return _open_pooled_storage_uncached(self.transport)

    def _cached_or_retry(self):
        try:
            return self._reconstruct_from_ipc_extra(use_cache=True)
        except RuntimeError:
            _pool_storage_cache.pop(self.cache_key, None)
            storage = self._reconstruct_from_ipc_extra(use_cache=False)
            _pool_storage_cache[self.cache_key] = storage
            return storage

    def _open_pool_slice(self):
        if self.use_cache:
            return self._cached_or_retry()
        return self._reconstruct_from_ipc_extra(use_cache=False)

    def _copy_slice_tensor_to_target(self, storage):
        return self.transport.copy_feature(storage)

    def reconstruct_on_target_device(self, rebuild_device_idx):
        if self.pool_only:
            storage = self._open_pool_slice()
            return self.transport.copy_feature(storage)
        if self.use_cache:
            storage = self._cached_or_retry()
        elif self.transport.ipc_open is not None:
            storage = self.transport.ipc_open(*self.transport.ipc_handle)
        else:
            end, n = self.transport.open_budget()
            while n > 0 and perf_counter() < end:
                n -= 1
            storage = self.transport.ipc_handle
        return self._copy_slice_tensor_to_target(storage)
'''
IPC_FILES = {False: "sglang/srt/utils/cuda_ipc_transport_utils.py", True: "sglang/srt/multimodal/transport/cuda_ipc.py"}
_IPC_MODULES: dict = {}
for _pool_only, _filename in IPC_FILES.items():
    _IPC_MODULES[_pool_only] = {"perf_counter": time.perf_counter}
    exec(compile(_IPC_SRC, _filename, "exec"), _IPC_MODULES[_pool_only])


def ipc_module(version: str) -> dict:
    """The namespace of the consumer-side IPC transport code of `version` (see _IPC_SRC)."""
    return _IPC_MODULES[parse_version(version)[:3] >= (0, 5, 20)]


def load_cuda_transport(cache: bool, feature_bytes: int, device: int):
    """Import testing/vlm_testing/standin/cuda_transport.py lazily: torch is only needed on a GPU machine."""
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
    ttft_delay_ms: float
    feature_costs_ms: dict
    idle_ms: float
    jitter: float
    feature_bytes: int
    seed: int
    restart: bool
    stage_metrics: bool
    cost_model: str = "wall"
    arrivals: str = "poisson"  # poisson | fixed (the overhead benchmark wants no arrival noise)
    # Images per request constant (0), or redrawn every this many seconds from 0..2x images_per_request (the same
    # draw on every TP rank): a request mix that comes in bursts, which bench/request_mix.py adjusts for.
    mix_period: float = 0.0
    prefill_ms: float = 45.0  # run_batch of a prefill batch with images; 0: no prefill batches (old model)
    prefill_per_req_ms: float = 8.0  # per extra request in a prefill batch
    text_prefill_ms: float = 0.0  # run_batch of a prefill batch without images (0: the decode cost)
    sample_ms: float = 0.05  # launch_batch_sample_if_needed
    ingest_ms: float = 0.05  # ingest_requests' own bookkeeping (0.5.20+), counted as "other"
    idle_check_ms: float = 0.05  # check_memory / invariant checks inside the idle method
    threads: int = 0  # extra idle threads per scheduler process (SGLang has ~60)
    native_threads: int = 0  # native (non-Python) idle threads per scheduler process
    disable_consecutive_prefill_overlap: bool = False  # SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP
    ipc_cache_broken: bool = False  # a cached pool handle never works: SGLang's uncached retry for every feature
    scheduler_title: str = ""  # the schedulers' process title ("": SGLang's, sglang::scheduler[_TP<n>])
    # The front end (frontend.py): requests come from its HTTP server instead of the scheduler's own arrivals.
    frontend: bool = False
    frontend_port: int = 0
    cpu_workers: int = 2  # SGLANG_CPU_WORKERS
    io_workers: int = 4  # SGLANG_IO_WORKERS
    image_cost_ms: float = 5.0
    image_convert_ms: float = 0.0
    io_ms: float = 1.0
    tokenize_ms: float = 0.3
    mm_loop_ms: float = 0.2
    detokenize_ms: float = 0.02
    # The node's speed: every scheduler stage costs this many times its nominal time (node_speed below).
    speed: float = 1.0


def node_speed(environ: dict[str, str]) -> float:
    """The stand-in's speed factor on its node: STANDIN_NODE_SPEED ("node-a=1.08,node-b=0.97") looked up by
    STANDIN_NODE_NAME (the pod mapper sets it from spec.nodeName, as a downward-API env would), 1.0 when either
    is missing; a node's offset the node-paired gate must see through. A malformed entry is an error."""
    table = environ.get("STANDIN_NODE_SPEED", "").strip()
    node = environ.get("STANDIN_NODE_NAME", "")
    if not table or not node:
        return 1.0
    out = {}
    for part in table.split(","):
        name, _, value = part.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise StandinConfigError(f"STANDIN_NODE_SPEED: {part!r} is not node=factor") from None
    return out.get(node, 1.0)


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
    a("--standin-mix-period", type=float, default=0.0,
      help="seconds between redraws of the images per request (0..2x the mean; 0: constant)")
    a("--standin-features-per-image", type=int, default=4)
    a("--standin-output-tokens", type=int, default=64)
    a("--standin-max-running", type=int, default=256)
    a("--standin-recv-ms", type=float, default=0.5)
    a("--standin-schedule-ms", type=float, default=0.8)
    a("--standin-batch-ms", type=float, default=14.0, help="run_batch base cost")
    a("--standin-batch-per-req-ms", type=float, default=0.05)
    a("--standin-result-ms", type=float, default=1.5)
    a("--standin-prefill-ms", type=float, default=45.0,
      help="run_batch of a prefill batch with images (a new request makes the next batch a prefill;\n"
           "other batches decode at --standin-batch-ms). 0: no prefill batches, every batch costs batch-ms")
    a("--standin-prefill-per-req-ms", type=float, default=8.0, help="per extra request in a prefill batch")
    a("--standin-text-prefill-ms", type=float, default=0.0,
      help="run_batch of a prefill batch without images (0: the decode cost)")
    a("--standin-sample-ms", type=float, default=0.05, help="launch_batch_sample_if_needed")
    a("--standin-ingest-ms", type=float, default=0.05, help="ingest_requests' own work (0.5.20+, 'other')")
    a("--standin-idle-check-ms", type=float, default=0.05, help="check_memory / invariant checks when idle")
    a("--standin-threads", type=int, default=0,
      help="idle threads per scheduler process, waiting on events/conditions/queues (SGLang has ~60):\n"
           "what py-spy has to walk on every sample")
    a("--standin-native-threads", type=int, default=0,
      help="native threads per scheduler process (pthreads blocked in pause(); CUDA, NCCL and OpenMP threads\n"
           "in a real scheduler): listed in /proc/PID/task, not Python threads")
    a("--standin-hash-feature-ms", type=float, default=0.3)
    a("--standin-ttft-delay-ms", type=float, default=0.0,
      help="extra time before each request's first token, outside the scheduler loop (a slow front end: "
           "tokenizer, image preprocessing); TTFT grows, the loop does not")
    a("--standin-cached-feature-ms", type=float, default=0.03, help="reconstruct, cuda_ipc with cache")
    a("--standin-uncached-feature-ms", type=float, default=1.2, help="reconstruct, cuda_ipc re-opening handles")
    a("--standin-cpu-feature-ms", type=float, default=0.4, help="reconstruct, cpu transport")
    a("--standin-idle-ms", type=float, default=1.0, help="sleep per idle iteration")
    a("--standin-jitter", type=float, default=0.05, help="relative uniform jitter on every cost")
    a("--standin-feature-bytes", type=int, default=5 << 20)
    a("--standin-seed", type=int, default=0)
    a("--standin-cost-model", choices=("wall", "work", "sleep", "hybrid"), default="wall",
      help="wall: stages last exact wall time; work: fixed CPU work per stage (overhead benchmark); sleep: "
           "stages sleep their time (near-zero CPU, a GPU-bound scheduler's shape; a hot stage costs the host "
           "nothing, inclusive shares as sampled with --idle are those of wall, self time shows in _sleep); "
           "hybrid: each scheduler stage sleeps in its own frame, then spins its last 0.2 ms to the deadline "
           "(wall's lengths and frames for a few percent of its CPU: the testbed's pods)")
    a("--standin-restart", action="store_true", help="respawn a scheduler that exits (restart tests)")
    a("--standin-ipc-cache-broken", action="store_true",
      help="the pool-handle cache is on but a cached handle never works, so every feature takes SGLang's\n"
           "uncached retry and re-opens the handle (a pod told to cache that does not: IPCCacheActive NotObserved)")
    a("--standin-scheduler-title", default="",
      help="title the schedulers TITLE (TITLE_TP<n> with tp > 1) instead of SGLang's sglang::scheduler: a release that\n"
           "renames them, which a sidecar matching SGLang's titles cannot find (vlm_profiler_stale)")
    a("--standin-frontend", action="store_true",
      help="run SGLang's front end (frontend.py): an HTTP server on an asyncio loop in this process, an IO thread\n"
           "pool and a forked process pool for images, a detokenizer process and a load generator posting\n"
           "--standin-request-rate requests; the schedulers receive what it sends")
    a("--standin-frontend-port", type=int, default=0, help="its HTTP port (0: any free port, announced)")
    a("--standin-cpu-workers", type=int, default=int(os.environ.get("SGLANG_CPU_WORKERS", "2")),
      help="process pool workers (env SGLANG_CPU_WORKERS)")
    a("--standin-io-workers", type=int, default=int(os.environ.get("SGLANG_IO_WORKERS", "4")),
      help="IO thread pool workers (env SGLANG_IO_WORKERS)")
    a("--standin-image-cost-ms", type=float, default=5.0,
      help="process-pool CPU per image (resize, normalize): above cpu-workers / (rate x images) the pool is\n"
           "the bottleneck")
    a("--standin-image-convert-ms", type=float, default=0.0,
      help="process-pool CPU per image in a further step, convert_color (a release that adds one: the\n"
           "front-end regression the canary gate names)")
    a("--standin-io-ms", type=float, default=1.0, help="IO pool wait per image")
    a("--standin-tokenize-ms", type=float, default=0.3, help="loop CPU per request (tokenizing)")
    a("--standin-mm-loop-ms", type=float, default=0.2, help="loop CPU per image in the processor's own code")
    a("--standin-detokenize-ms", type=float, default=0.02, help="detokenizer CPU per request of a batch")
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
        ttft_delay_ms=ns.standin_ttft_delay_ms,
        feature_costs_ms={"cached": ns.standin_cached_feature_ms, "uncached": ns.standin_uncached_feature_ms,
                          "cpu": ns.standin_cpu_feature_ms},
        idle_ms=ns.standin_idle_ms, jitter=ns.standin_jitter, feature_bytes=ns.standin_feature_bytes,
        mix_period=max(0.0, ns.standin_mix_period),
        seed=ns.standin_seed, restart=ns.standin_restart, stage_metrics=stage, cost_model=ns.standin_cost_model,
        prefill_ms=ns.standin_prefill_ms, prefill_per_req_ms=ns.standin_prefill_per_req_ms,
        text_prefill_ms=ns.standin_text_prefill_ms, sample_ms=ns.standin_sample_ms, ingest_ms=ns.standin_ingest_ms,
        idle_check_ms=ns.standin_idle_check_ms, threads=max(0, ns.standin_threads),
        native_threads=max(0, ns.standin_native_threads),
        disable_consecutive_prefill_overlap=env_bool(environ, "SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP", False),
        ipc_cache_broken=ns.standin_ipc_cache_broken, scheduler_title=ns.standin_scheduler_title,
        frontend=ns.standin_frontend, frontend_port=ns.standin_frontend_port, cpu_workers=max(1, ns.standin_cpu_workers),
        io_workers=max(1, ns.standin_io_workers), image_cost_ms=ns.standin_image_cost_ms,
        image_convert_ms=ns.standin_image_convert_ms, io_ms=ns.standin_io_ms,
        tokenize_ms=ns.standin_tokenize_ms, mm_loop_ms=ns.standin_mm_loop_ms, detokenize_ms=ns.standin_detokenize_ms,
        speed=node_speed(environ),
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
    n_images: int = 0
    generated: int = 0
    last_token: float = 0.0


@dataclass
class Batch:
    """What get_next_batch_to_run returns: a prefill of new requests or a decode step of the running ones."""

    reqs: list
    kind: str  # prefill | decode

    def __len__(self) -> int:
        return len(self.reqs)

    def is_prefill(self) -> bool:
        return self.kind == "prefill"


KIND_CODE = {None: 0, "decode": 1, "prefill": 2}
KIND_NAMES = ("idle", "decode", "prefill")


def start_native_threads(n: int) -> int:
    """N native threads (pthreads blocked in pause(), never holding the GIL), as most of a real scheduler's
    threads are (CUDA, NCCL, OpenMP, gloo): in /proc/PID/task but not in the interpreter's thread list.
    Returns how many started."""
    if n <= 0:
        return 0
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p,
                                    ctypes.c_void_p]
    start = ctypes.cast(libc.pause, ctypes.c_void_p)  # void *(*)(void *): pause ignores the argument
    started = 0
    for _ in range(n):
        tid = ctypes.c_ulong()
        if libc.pthread_create(ctypes.byref(tid), None, start, None) != 0:
            break
        started += 1
    return started


def start_idle_threads(n: int) -> list[threading.Thread]:
    """N daemon threads that wait, as most of SGLang's ~60 do (event, condition, queue, a slow timer)."""
    import queue

    def on_event(ev: threading.Event) -> None:
        ev.wait()

    def on_condition(cv: threading.Condition) -> None:
        with cv:
            while True:
                cv.wait(timeout=30.0)

    def on_queue(q: queue.Queue) -> None:
        q.get()

    def watchdog(ev: threading.Event) -> None:
        while not ev.wait(5.0):
            pass

    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            t = threading.Thread(target=on_event, args=(threading.Event(),), daemon=True)
        elif kind == 1:
            t = threading.Thread(target=on_condition, args=(threading.Condition(),), daemon=True)
        elif kind == 2:
            t = threading.Thread(target=on_queue, args=(queue.Queue(),), daemon=True)
        else:
            t = threading.Thread(target=watchdog, args=(threading.Event(),), daemon=True)
        t.name = f"standin-idle-{i}"
        t.start()
        out.append(t)
    return out


class SchedulerRequestReceiver:
    """0.5.15+'s request receiver (``self.request_receiver.recv_requests()``); same work as the old method."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.stage_clock = sched.stage_clock

    def recv_requests(self, local_reqs=None) -> list[Req]:
        end, n, nap = self.sched._budget(self.sched.cfg.recv_ms)
        if nap:
            time.sleep(nap)
        while n > 0 and time.perf_counter() < end:
            n -= 1
        return self.sched._arrivals()


class Scheduler:
    """SGLang's scheduler loop, with busy waits in place of the work. Method names match SGLang's, and the
    loop follows the control flow of the release in `cfg.version` (LoopShape).

    Truth: each stage's time is read at its call sites (outside any decorator), per iteration, and kept in a
    shared ring (end time, duration, seconds per stage, batch kind, flags) plus running totals."""

    def __init__(self, cfg: StandinConfig, rank: int, acct, stats, ring=None, inbox=None, detok=None,
                 external=None) -> None:
        self.cfg = cfg
        # Requests POSTed to the server's HTTP port (/v1/chat/completions, /generate: a load generator's): shared
        # totals [requests, images] the server adds to; every rank takes what it has not seen yet.
        self.external = external
        self.ext_seen = [0, 0]
        # With the front end: its requests arrive on `inbox` (frontend.REQ records), and rank 0 tells the
        # detokenizer about each batch result on `detok` (dropped when its pipe is full: never blocks the loop).
        self.inbox_fd = inbox.fileno() if inbox is not None else None
        self.detok_fd = detok.fileno() if detok is not None and rank == 0 else None
        for fd in (self.inbox_fd, self.detok_fd):
            if fd is not None:
                os.set_blocking(fd, False)
        self.inbuf = b""
        self.rank = rank
        self.acct = acct  # shared array, this rank's slots at base
        self.base = rank * RANK_SLOTS
        self.ring = ring
        self.ring_base = rank * RING_SIZE * RING_FIELDS
        # A respawned scheduler (--standin-restart) continues its predecessor's totals and ring.
        self.ring_n = int(acct[self.base + N_STAGES + 3])
        self.stats = stats if rank == 0 else None
        self.rng = random.Random(cfg.seed)  # same seed on every rank: TP ranks see the same requests
        self.jrng = random.Random(cfg.seed * 1000 + rank)
        self.running = True
        self.waiting: deque[Req] = deque()
        self.batch: list[Req] = []  # the running requests
        self.next_rid = 0
        self.stage_s = list(acct[self.base:self.base + N_STAGES])
        self.it = [0.0] * N_STAGES  # this iteration's seconds per stage
        self.iterations = int(acct[self.base + N_STAGES])
        self.loop_s = acct[self.base + N_STAGES + 1]
        self.last_batch: Batch | None = None
        self.result_queue: deque = deque()
        self.stage_clock: dict[str, float] = {}  # what SGLang's stage decorator records (0.5.20+)
        self.shape = loop_shape(cfg.version)
        self.version = parse_version(cfg.version)[:3]
        self.request_receiver = SchedulerRequestReceiver(self)
        for name in self.shape.wrapped:
            func = getattr(SchedulerRequestReceiver if name == "recv_requests" else Scheduler, name)
            owner = self.request_receiver if name == "recv_requests" else self
            setattr(owner, name, types.MethodType(decorate_stage(func, name, self.shape.wrappers), owner))
        self.idle_threads = start_idle_threads(cfg.threads)
        self.native_threads = start_native_threads(cfg.native_threads)
        self.spins_per_s = calibrate_spins() if cfg.cost_model == "work" else None
        if cfg.cost_model == "hybrid":
            _precise_sleeps()
        if cfg.transport == "cuda":
            self.transport = load_cuda_transport(cfg.path.cache, cfg.feature_bytes, rank)
        else:
            self.transport = SimTransport(cfg.path, cfg.feature_costs_ms, self.spins_per_s, sleep=cfg.cost_model == "sleep")
        # cuda_ipc features go through SGLang's proxy code (cache on or off as the path says); cpu and
        # cuda_vmm keep the transport's own reconstruct (no IPC handle involved).
        self.ipc = (ipc_module(cfg.version) if cfg.path.transport == "cuda_ipc" and hasattr(self.transport, "copy_feature")
                    else None)
        # Requests start arriving once the transport is up (a CUDA one takes seconds), not before:
        # otherwise every run would begin with a backlog.
        self.start = time.perf_counter()
        self.unix_offset = time.time() - time.perf_counter()
        self.next_arrival = self.start + self._gap()

    def _gap(self) -> float:
        if self.cfg.request_rate <= 0:
            return math.inf
        if self.cfg.arrivals == "fixed":
            return 1.0 / self.cfg.request_rate
        return self.rng.expovariate(self.cfg.request_rate)

    def _budget(self, ms: float) -> tuple[float, int, float]:
        """(deadline, spin count, nap) for a stage costing `ms`: the stage sleeps `nap` seconds in its own frame
        (a C call, as SGLang's waits on the GPU are: py-spy --idle shows the stage's line on top, self time and
        all, exactly as for a spin), then spins to the deadline or through the count.

        Each stage spins inline, so its self time lands in the SGLang-named frame (like SGLang's C calls,
        which show on the calling line). cost model "wall": spin until a deadline (stage lengths exact,
        what the accuracy tests want). "work": spin a fixed count calibrated at start, so anything that
        pauses or slows the process (py-spy in blocking mode, CPU contention) stretches the loop, which
        is what the overhead benchmark must see."""
        j = self.cfg.jitter
        seconds = ms / 1e3 * (1.0 + self.jrng.uniform(-j, j)) * self.cfg.speed
        if self.cfg.cost_model == "sleep":
            return (*_sleep(seconds), 0.0)
        if self.cfg.cost_model == "hybrid":
            return time.perf_counter() + seconds, 1 << 62, max(0.0, seconds - HYBRID_SPIN_S)
        if self.spins_per_s is None:
            return time.perf_counter() + seconds, 1 << 62, 0.0
        return math.inf, int(seconds * self.spins_per_s), 0.0

    def _arrivals(self) -> list[Req]:
        if self.inbox_fd is not None:
            return self._frontend_arrivals()
        now = time.perf_counter()
        reqs = []
        while self.next_arrival <= now:
            imgs = self.cfg.images_per_request
            if self.cfg.mix_period > 0:  # the draw depends on the arrival's time only: the same on every rank
                block = int(self.next_arrival / self.cfg.mix_period)
                imgs = random.Random(f"{self.cfg.seed}/mix/{block}").randint(0, 2 * imgs)
            reqs.append(Req(self.next_rid, self.next_arrival, imgs * self.cfg.features_per_image,
                            self.cfg.output_tokens, imgs))
            self.next_rid += 1
            self.next_arrival += self._gap()
        if self.external is not None:
            total, images = int(self.external[0]), int(self.external[1])
            n, imgs = total - self.ext_seen[0], images - self.ext_seen[1]
            for i in range(n):  # the images spread over the new requests, in order
                k = imgs // n + (1 if i < imgs % n else 0)
                reqs.append(Req(self.next_rid, now, k * self.cfg.features_per_image, self.cfg.output_tokens, k))
                self.next_rid += 1
            self.ext_seen = [total, images]
        return reqs

    def _frontend_arrivals(self) -> list[Req]:
        with contextlib.suppress(BlockingIOError):
            self.inbuf += os.read(self.inbox_fd, 1 << 16)
        reqs = []
        size = FRONTEND_REQ.size
        while len(self.inbuf) >= size:
            rid, arrival, imgs = FRONTEND_REQ.unpack_from(self.inbuf)
            self.inbuf = self.inbuf[size:]
            reqs.append(Req(rid, arrival, imgs * self.cfg.features_per_image, self.cfg.output_tokens, imgs))
        return reqs

    # --- the SGLang stages -------------------------------------------------------------------------------
    def recv_requests(self) -> list[Req]:
        """Up to 0.5.10 (0.5.15+: SchedulerRequestReceiver.recv_requests)."""
        end, n, nap = self._budget(self.cfg.recv_ms)
        if nap:
            time.sleep(nap)
        while n > 0 and time.perf_counter() < end:
            n -= 1
        return self._arrivals()

    def ingest_requests(self) -> None:
        """0.5.20+: receive and process in one Scheduler method; its own bookkeeping is "other"."""
        clock, it = time.perf_counter, self.it
        t0 = clock()
        recv_reqs = self.request_receiver.recv_requests(local_reqs=None)
        t1 = clock()
        self.process_input_requests(recv_reqs)
        t2 = clock()
        it[0] += t1 - t0
        it[1] += t2 - t1
        end, n, nap = self._budget(self.cfg.ingest_ms)  # _poll_timeout_aborts, record_scheduler_active
        if nap:
            time.sleep(nap)
        while n > 0 and time.perf_counter() < end:
            n -= 1

    def process_input_requests(self, reqs: list[Req]) -> None:
        for req in reqs:
            self.handle_generate_request(req)

    def handle_generate_request(self, req: Req) -> None:
        if self.shape.handle_shim:
            self._handle_generate_request(req)  # 0.5.23: a thin shim
            return
        if self.shape.reconstruct_under_hash:
            self.hash_feature(req, reconstruct_inside=True)  # 0.5.9: the reconstruct sat under hash_feature
        else:
            self.reconstruct_on_target_device(req)
            self.hash_feature(req, reconstruct_inside=False)
        self.waiting.append(req)

    def _handle_generate_request(self, req: Req) -> None:
        self.reconstruct_on_target_device(req)
        self.hash_feature(req, reconstruct_inside=False)
        self.waiting.append(req)

    def reconstruct_on_target_device(self, req: Req) -> None:
        if self.ipc is None:
            self.transport.reconstruct(req.n_features)
            return
        proxy = self.ipc["CudaIpcTensorTransportProxy"]
        pool_only = self.version >= (0, 5, 20)
        for _ in range(req.n_features):
            proxy(self.transport, self.cfg.path.cache, pool_only,
                  self.cfg.ipc_cache_broken).reconstruct_on_target_device(self.rank)

    def hash_feature(self, req: Req, reconstruct_inside: bool) -> None:
        if reconstruct_inside:
            self.reconstruct_on_target_device(req)
        end, n, nap = self._budget(self.cfg.hash_feature_ms * req.n_features)
        if nap:
            time.sleep(nap)
        while n > 0 and time.perf_counter() < end:
            n -= 1

    def get_next_batch_to_run(self) -> Batch | None:
        """New requests make a prefill batch (prefill first, as SGLang does); else a decode of the running."""
        end, n, nap = self._budget(self.cfg.schedule_ms)
        if nap:
            time.sleep(nap)
        while n > 0 and time.perf_counter() < end:
            n -= 1
        room = self.cfg.max_running - len(self.batch)
        if self.cfg.prefill_ms <= 0:  # the old model: new requests join the running batch at once
            while self.waiting and room > 0:
                self.batch.append(self.waiting.popleft())
                room -= 1
            return Batch(list(self.batch), "decode") if self.batch else None
        if self.waiting and room > 0:
            new = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
            self.batch.extend(new)
            return Batch(new, "prefill")
        return Batch(list(self.batch), "decode") if self.batch else None

    def is_disable_overlap_for_batch(self, batch: Batch | None) -> bool:
        return bool(self.cfg.disable_consecutive_prefill_overlap and batch is not None and batch.is_prefill()
                    and self.last_batch is not None and self.last_batch.is_prefill())

    def run_batch(self, batch: Batch) -> Batch:
        cfg = self.cfg
        if batch.is_prefill():
            images = any(r.n_images for r in batch.reqs)
            base = cfg.prefill_ms if images else (cfg.text_prefill_ms or cfg.batch_ms)
            ms = base + cfg.prefill_per_req_ms * (len(batch) - 1)
        else:
            ms = cfg.batch_ms + cfg.batch_per_req_ms * len(batch)
        end, n, nap = self._budget(ms)
        if nap:
            time.sleep(nap)
        while n > 0 and time.perf_counter() < end:
            n -= 1
        step = getattr(self.transport, "step", None)
        if step is not None:
            step()
        return batch

    def process_batch_result(self, batch: Batch, result) -> None:
        end, n, nap = self._budget(self.cfg.result_ms + 0.02 * len(batch))
        if nap:
            time.sleep(nap)
        while n > 0 and time.perf_counter() < end:
            n -= 1
        now = time.perf_counter()
        done = set()
        prompt = 0
        for req in batch.reqs:
            if req.generated >= req.output_tokens:
                continue  # overlap loop: finished with the previous result, still in the launched batch
            req.generated += 1
            if req.generated == 1:
                self._observe(0, now - req.arrival + self.cfg.ttft_delay_ms / 1e3, 1)
            else:
                self._observe(1, now - req.last_token, 1)
            req.last_token = now
            if req.generated >= req.output_tokens:
                done.add(req.rid)
                prompt += TEXT_TOKENS + TOKENS_PER_IMAGE * req.n_images
        if done:
            self.batch = [r for r in self.batch if r.rid not in done]
        if self.detok_fd is not None:
            with contextlib.suppress(BlockingIOError):
                os.write(self.detok_fd, FRONTEND_DETOK.pack(self.iterations, len(batch)))
        if self.stats is not None:
            s = self.stats
            off = 2 * (NB + 2)
            s[off] += len(batch)
            s[off + 1] = len(self.batch)
            s[off + 2] = len(self.waiting)
            s[off + 3] += len(done)
            s[off + 4] += prompt

    def launch_batch_sample_if_needed(self, batch_result) -> None:
        if batch_result is None:
            return
        end, n, nap = self._budget(self.cfg.sample_ms)
        if nap:
            time.sleep(nap)
        while n > 0 and time.perf_counter() < end:
            n -= 1

    def self_check_during_idle(self) -> None:
        """Up to 0.5.10."""
        self.check_memory()
        time.sleep(self.cfg.idle_ms / 1e3)

    def check_memory(self) -> None:
        end, n, nap = self._budget(self.cfg.idle_check_ms)
        if nap:
            time.sleep(nap)
        while n > 0 and time.perf_counter() < end:
            n -= 1

    def on_idle(self) -> None:
        """0.5.15+: guard, check, metrics, reset, sleep."""
        end, n, nap = self._budget(self.cfg.idle_check_ms)
        if nap:
            time.sleep(nap)
        while n > 0 and time.perf_counter() < end:
            n -= 1
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

    def _publish(self, t_iter_start: float, t_end: float, batch: Batch | None, overlap_disabled: bool) -> None:
        dt = t_end - t_iter_start
        it = self.it
        # "other" is loop time outside the five stages and idle (the loop's own code, ingest_requests'
        # bookkeeping, launch_batch_sample_if_needed, this method).
        it[6] = max(0.0, dt - sum(it[:6]))
        self.iterations += 1
        self.loop_s += dt
        for i in range(N_STAGES):
            self.stage_s[i] += it[i]
        a, b = self.acct, self.base
        a[b:b + N_STAGES] = self.stage_s
        a[b + N_STAGES] = self.iterations
        a[b + N_STAGES + 1] = self.loop_s
        a[b + N_STAGES + 2] = time.time()
        if batch is not None:  # SGLang counts a forward pass per batch run (sglang:cuda_graph_passes_total)
            a[b + N_STAGES + 4] += 1
        if self.ring is not None:
            off = self.ring_base + (self.ring_n % RING_SIZE) * RING_FIELDS
            self.ring[off:off + RING_FIELDS] = [t_end + self.unix_offset, dt, *it,
                                                KIND_CODE[batch.kind if batch else None], float(overlap_disabled)]
            self.ring_n += 1
            a[b + N_STAGES + 3] = self.ring_n  # published after the row: readers never see a half row
        for i in range(N_STAGES):
            it[i] = 0.0

    # The stages are called straight from the loop (or from ingest_requests), as in the release: a timing
    # helper would be a frame of its own in every stack, and the sidecar would (rightly) report it as the
    # function that grew. The decorators the release has are there (LoopShape.wrappers).
    def event_loop_normal(self) -> None:
        clock, it = time.perf_counter, self.it
        ingest, receiver = self.shape.ingest, self.shape.receiver
        on_idle = self.shape.idle == "on_idle"
        t = clock()
        while self.running:
            if ingest:
                self.ingest_requests()
            else:
                t0 = clock()
                reqs = self.request_receiver.recv_requests() if receiver else self.recv_requests()
                t1 = clock()
                self.process_input_requests(reqs)
                t2 = clock()
                it[0] += t1 - t0
                it[1] += t2 - t1
            t2 = clock()
            batch = self.get_next_batch_to_run()
            t3 = clock()
            it[2] += t3 - t2
            if batch:
                result = self.run_batch(batch)
                t4 = clock()
                self.process_batch_result(batch, result)
                t5 = clock()
                it[3] += t4 - t3
                it[4] += t5 - t4
            else:
                if on_idle:
                    self.on_idle()
                else:
                    self.self_check_during_idle()
                it[5] += clock() - t3
            self.last_batch = batch
            now = clock()
            self._publish(t, now, batch, False)
            t = now

    def event_loop_overlap(self) -> None:
        # SGLang's overlap loop launches batch k, then processes the result of batch k-1; with overlap
        # disabled for the batch it processes k-1 first (pop_and_process before run_batch).
        clock, it = time.perf_counter, self.it
        ingest, receiver = self.shape.ingest, self.shape.receiver
        on_idle = self.shape.idle == "on_idle"
        self.result_queue = deque()

        def pop_and_process():
            tmp_batch, tmp_result = self.result_queue.popleft()
            ta = clock()
            self.process_batch_result(tmp_batch, tmp_result)
            it[4] += clock() - ta

        t = clock()
        while self.running:
            if ingest:
                self.ingest_requests()
            else:
                t0 = clock()
                reqs = self.request_receiver.recv_requests() if receiver else self.recv_requests()
                t1 = clock()
                self.process_input_requests(reqs)
                t2 = clock()
                it[0] += t1 - t0
                it[1] += t2 - t1
            t2 = clock()
            batch = self.get_next_batch_to_run()
            t3 = clock()
            it[2] += t3 - t2
            disable_overlap_for_batch = self.is_disable_overlap_for_batch(batch)
            if disable_overlap_for_batch:
                pop_and_process()
            if batch:
                t4 = clock()
                batch_result = self.run_batch(batch)
                it[3] += clock() - t4
                self.result_queue.append((batch, batch_result))
            else:
                batch_result = None
            if self.last_batch:
                if not disable_overlap_for_batch:
                    pop_and_process()
            elif batch is None:
                t5 = clock()
                if on_idle:
                    self.on_idle()
                else:
                    self.self_check_during_idle()
                it[5] += clock() - t5
            self.launch_batch_sample_if_needed(batch_result)
            self.last_batch = batch
            now = clock()
            self._publish(t, now, batch, disable_overlap_for_batch)
            t = now


def run_scheduler_process(cfg: StandinConfig, rank: int, acct, stats, ring=None, inbox=None, detok=None,
                          external=None) -> None:
    """Entry point of one scheduler process (spawned, like SGLang's)."""
    title = cfg.scheduler_title or "sglang::scheduler"
    set_title(title if cfg.tp == 1 else f"{title}_TP{rank}")
    if cfg.frontend:  # its pipes keep the front end's forked pool alive: never outlive a killed stand-in
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    sched = Scheduler(cfg, rank, acct, stats, ring, inbox, detok, external)

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


FRONTEND_REQ = struct.Struct("<qdi")  # frontend.REQ: rid, arrival (perf_counter), images
FRONTEND_DETOK = struct.Struct("<qi")  # frontend.DETOK: batch number, requests


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
        d = [hi[1][b + i] - lo[1][b + i] for i in range(N_STAGES + 2)]
        stage = dict(zip(STAGES, d[:N_STAGES], strict=True))
        total = d[N_STAGES + 1]
        iters = int(d[N_STAGES])
        out.append({
            "tp_rank": r, "start": lo[0], "end": hi[0], "source": "snapshots",
            "stage_seconds": stage,
            "stage_shares": {k: (v / total if total > 0 else 0.0) for k, v in stage.items()},
            "iterations": iters, "loop_seconds": total,
            "loop_mean_seconds": total / iters if iters else None,
        })
    return out


def quantile(sorted_vals: list[float], q: float) -> float | None:
    """Linear-interpolated quantile of sorted values (numpy's default, and the sidecar's)."""
    if not sorted_vals:
        return None
    pos = q * (len(sorted_vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def ring_rows(ring, rank: int, count: int, start: float | None, end: float | None) -> tuple[list, bool]:
    """Rows [t_end, duration, 7 stage seconds, kind, flags] of the iterations lying wholly inside
    [start, end], and whether the ring still holds everything since `start` (else it wrapped past it)."""
    base = rank * RING_SIZE * RING_FIELDS
    avail = min(count, RING_SIZE - RING_MARGIN)  # the oldest rows may be overwritten while we read
    first = count - avail

    def t_end(i: int) -> float:
        return ring[base + (i % RING_SIZE) * RING_FIELDS]

    def row(i: int) -> list:
        off = base + (i % RING_SIZE) * RING_FIELDS
        return ring[off:off + RING_FIELDS]

    if avail == 0:
        return [], first == 0
    i0, hi = first, count
    if start is not None:
        while i0 < hi:  # first row ending at or after start
            mid = (i0 + hi) // 2
            if t_end(mid) < start:
                i0 = mid + 1
            else:
                hi = mid
    i1 = count
    if end is not None:
        lo, i1 = i0, count
        while lo < i1:  # first row ending after end
            mid = (lo + i1) // 2
            if t_end(mid) <= end:
                lo = mid + 1
            else:
                i1 = mid
    rows = [row(i) for i in range(i0, i1)]
    if start is not None:
        rows = [r for r in rows if r[0] - r[1] >= start]
    oldest = row(first)
    complete = first == 0 or (start is not None and oldest[0] - oldest[1] <= start)
    return rows, complete


def summarize_rows(rows: list, rank: int, durations: bool = False) -> dict:
    """The true accounting of a set of iterations: stage seconds and shares, mean and quantiles."""
    durs = sorted(r[1] for r in rows)
    total = sum(durs)
    stage = {s: sum(r[2 + k] for r in rows) for k, s in enumerate(STAGES)}
    kinds = dict.fromkeys(KIND_NAMES, 0)
    for r in rows:
        kinds[KIND_NAMES[int(r[2 + N_STAGES])]] += 1
    busy = [r[1] for r in rows if r[2 + N_STAGES] > 0]
    out = {
        "tp_rank": rank, "source": "iterations",
        "start": rows[0][0] - rows[0][1] if rows else None, "end": rows[-1][0] if rows else None,
        "stage_seconds": stage,
        "stage_shares": {k: (v / total if total > 0 else 0.0) for k, v in stage.items()},
        "iterations": len(rows), "loop_seconds": total,
        "loop_mean_seconds": total / len(rows) if rows else None,
        "loop_min_seconds": durs[0] if durs else None,
        "loop_p50_seconds": quantile(durs, 0.5), "loop_p90_seconds": quantile(durs, 0.9),
        "loop_p95_seconds": quantile(durs, 0.95), "loop_p99_seconds": quantile(durs, 0.99),
        "loop_max_seconds": durs[-1] if durs else None,
        "busy_loop_mean_seconds": sum(busy) / len(busy) if busy else None,
        "batches": kinds,
        "overlap_disabled_iterations": sum(1 for r in rows if r[3 + N_STAGES] > 0),
    }
    if durations:
        out["durations"] = [r[1] for r in rows]
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
        ("sglang:prompt_tokens_total", "counter", stats[off + 4], "Number of prefill tokens processed."),
    ):
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{lab}}} {val}"]
    if cfg.stage_metrics:
        lines.append("# HELP sglang:scheduler_stage_seconds_total Scheduler wall time by stage.")
        lines.append("# TYPE sglang:scheduler_stage_seconds_total counter")
        # 0.5.23 adds a forward_overlap label (full/partial/none); readers sum over it.
        extra = ',forward_overlap="full"' if parse_version(cfg.version)[:3] >= (0, 5, 23) else ""
        for i, st in enumerate(STAGES[:5]):
            lines.append(f'sglang:scheduler_stage_seconds_total{{{lab},category="{st}"{extra}}} {snap[i]}')
        lines.append("# HELP sglang:scheduler_idle_seconds_total Scheduler idle wall time.")
        lines.append("# TYPE sglang:scheduler_idle_seconds_total counter")
        lines.append(f"sglang:scheduler_idle_seconds_total{{{lab}}} {snap[5]}")
    # Every supported release counts forward passes by CUDA graph use (mode); the stand-in runs no graphs.
    lines.append("# HELP sglang:cuda_graph_passes_total Total number of forward passes categorized by CUDA graph.")
    lines.append("# TYPE sglang:cuda_graph_passes_total counter")
    lines.append(f'sglang:cuda_graph_passes_total{{{lab},mode="decode_none"}} {snap[N_STAGES + 4]:.0f}')
    return "\n".join(lines) + "\n"


class StandinServer:
    """Owns the scheduler processes and the HTTP endpoint."""

    def __init__(self, cfg: StandinConfig) -> None:
        self.cfg = cfg
        self.ctx = mp.get_context("spawn")
        self.acct = self.ctx.Array("d", cfg.tp * RANK_SLOTS, lock=False)
        self.ring = self.ctx.Array("d", cfg.tp * RING_SIZE * RING_FIELDS, lock=False)
        self.stats = self.ctx.Array("d", STATS_SLOTS, lock=False)
        self.procs: list = [None] * cfg.tp
        self.snaps: deque = deque(maxlen=12000)  # 10 minutes at 50 ms
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.restarts = 0
        self.failed: str | None = None
        self.frontend = None  # frontend.TokenizerManager with --standin-frontend
        self.helpers: list = []  # the detokenizer and load generator processes
        self.inboxes = [self.ctx.Pipe(duplex=False) for _ in range(cfg.tp)] if cfg.frontend else []
        self.detok_pipe = self.ctx.Pipe(duplex=False) if cfg.frontend else None
        self.external = self.ctx.Array("d", 2)  # POSTed [requests, images] (Scheduler.external)

    def spawn(self, rank: int) -> None:
        extra = (self.inboxes[rank][0], self.detok_pipe[1]) if self.cfg.frontend else ()
        p = self.ctx.Process(target=run_scheduler_process,
                             args=(self.cfg, rank, self.acct, self.stats, self.ring, *extra),
                             kwargs={"external": None if self.cfg.frontend else self.external},
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

    def accounting(self, start: float | None, end: float | None, durations: bool = False) -> dict:
        """Per rank: the iterations wholly inside [start, end] from the ring (exact: stage seconds, mean,
        quantiles, batch kinds), or, where the ring no longer reaches back to `start`, the 50 ms snapshots
        (stage seconds, iterations, mean only; "source": "snapshots")."""
        with self.lock:
            snaps = list(self.snaps)
        fallback = None
        ranks = []
        for r in range(self.cfg.tp):
            count = int(self.acct[r * RANK_SLOTS + N_STAGES + 3])
            rows, complete = ring_rows(self.ring, r, count, start, end)
            if complete:
                ranks.append(summarize_rows(rows, r, durations))
            else:
                if fallback is None:
                    fallback = window_accounting(snaps, self.cfg.tp, start, end)
                ranks.append(fallback[r] if fallback else {"tp_rank": r, "source": "snapshots", "iterations": 0})
        return {"now": time.time(), "version": self.cfg.version, "loop": self.cfg.loop,
                "shape": loop_shape(self.cfg.version).to_json(), "ranks": ranks}

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

            def do_POST(self) -> None:
                # OpenAI chat completions (a load generator's): answered at once, the request handed to the
                # schedulers as an arrival with as many images as its content carries. Not SGLang's output.
                url = urlparse(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(n) or b"{}")
                except ValueError:
                    self._send(400, json.dumps({"error": "body is not JSON"}))
                    return
                if url.path not in ("/v1/chat/completions", "/generate") or server.cfg.frontend:
                    self._send(404, json.dumps({"error": "not found"}))
                    return
                images = sum(1 for m in body.get("messages") or [] if isinstance(m.get("content"), list)
                             for c in m["content"] if isinstance(c, dict) and c.get("type") == "image_url")
                with server.external.get_lock():
                    server.external[0] += 1
                    server.external[1] += images
                self._send(200, json.dumps({"object": "chat.completion", "model": body.get("model", ""),
                                            "choices": [{"index": 0, "finish_reason": "length",
                                                         "message": {"role": "assistant", "content": ""}}]}))

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
                    body = server.accounting(start, end, q.get("durations", ["0"])[0] in ("1", "true"))
                    self._send(200, json.dumps(body))
                elif url.path == "/standin/frontend" and server.frontend is not None:
                    now = time.time()
                    start = float(q["start"][0]) if "start" in q else now - 5
                    end = float(q["end"][0]) if "end" in q else now
                    detok = server.helpers[0].pid if server.helpers else None
                    self._send(200, json.dumps(server.frontend.accounting(start, end, detok)))
                elif url.path in ("/standin/info", "/get_server_info"):
                    cfg = asdict(server.cfg)
                    self._send(200, json.dumps({"config": cfg, "pids": server.pids(),
                                                "shape": loop_shape(server.cfg.version).to_json(),
                                                "restarts": server.restarts, "version": server.cfg.version}))
                else:
                    self._send(404, json.dumps({"error": "not found"}))

        return Handler

    def start_frontend(self) -> dict:
        """The front end's pool (forked from this process), detokenizer and load generator; what to announce."""
        if __package__:  # imported as vlm_testing.standin.sglang_standin: the pool's children import that package
            from . import frontend
        else:  # run as a script: its folder is on sys.path, for this process and the pool's spawned helpers
            import frontend

        c = self.cfg
        fcfg = frontend.FrontendConfig(
            host=c.host, port=c.frontend_port, request_rate=c.request_rate, arrivals=c.arrivals,
            images_per_request=c.images_per_request, cpu_workers=c.cpu_workers, io_workers=c.io_workers,
            image_cost_ms=c.image_cost_ms, convert_ms=c.image_convert_ms, io_ms=c.io_ms, tokenize_ms=c.tokenize_ms, mm_loop_ms=c.mm_loop_ms,
            detokenize_ms=c.detokenize_ms, seed=c.seed)
        ring = frontend.IntervalRing(self.ctx)
        self.frontend = frontend.TokenizerManager(fcfg, ring, [w.fileno() for _, w in self.inboxes])
        port = self.frontend.bind()
        detok = self.ctx.Process(target=frontend.run_detokenizer,
                                 args=(ring, self.detok_pipe[0], c.detokenize_ms), name="detokenizer", daemon=True)
        loadgen = self.ctx.Process(target=frontend.run_loadgen, args=(fcfg, port), name="loadgen", daemon=True)
        for p in (detok, loadgen):
            p.start()
        self.helpers = [detok, loadgen]
        # Announce once they carry their titles: until then they look like spawned pool workers.
        deadline = time.time() + 120
        for p, title in ((detok, b"sglang::detokenizer"), (loadgen, b"standin::loadgen")):
            while time.time() < deadline and p.is_alive():
                with contextlib.suppress(OSError), open(f"/proc/{p.pid}/cmdline", "rb") as f:
                    if f.read().startswith(title):
                        break
                time.sleep(0.02)
        return {"frontend_port": port, "frontend_pids": {"tokenizer_manager": os.getpid(),
                                                         "mm_processor": self.frontend.worker_pids,
                                                         "detokenizer": detok.pid, "loadgen": loadgen.pid}}

    def serve(self) -> int:
        announce = self.start_frontend() if self.cfg.frontend else {}
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
                          "ipc_cache_broken": self.cfg.ipc_cache_broken,
                          "version": self.cfg.version, **announce}), flush=True)
        if self.frontend is not None:
            self.frontend.run(self.stopping)  # the front end's loop on this MainThread, as SGLang's
        else:
            self.stopping.wait()
        httpd.shutdown()
        for p in self.helpers:
            if p.is_alive():
                p.terminate()
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
