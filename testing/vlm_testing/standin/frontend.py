"""The stand-in's front end, shaped like SGLang's (test and benchmark tool, never shipped).

Loaded by sglang_standin.py with `--standin-frontend`. In SGLang the main server process runs the HTTP server
and the TokenizerManager on one asyncio loop (uvloop there, the stdlib loop here); the multimodal processor
(`multimodal/processors/base_processor.py`) hands image loading to an IO ThreadPoolExecutor and the CPU work
(resize, normalize) to a forked ProcessPoolExecutor (`SGLANG_CPU_WORKERS` workers); the tokenized request goes
to the schedulers; the scheduler's outputs go to the detokenizer process (`sglang::detokenizer`). Here:

- the stand-in's main process is the front end: its MainThread runs the loop (`TokenizerManager.serve`), an
  HTTP/1.1 server for `POST /generate` (`{"text": ..., "images": N}`) whose handler tokenizes
  (`_tokenize_one_request`, CPU on the loop), runs the processor's synchronous code on the loop (per image,
  in `base_processor.py`), loads each image in the IO pool and preprocesses it in the process pool
  (`preprocess_image` -> `resize`, `normalize`: numpy work until the image's cost is spent), then writes the
  request to every scheduler's pipe (what the scheduler stand-in's `recv_requests` reads, instead of its own
  arrivals) and answers;
- a load generator process (`standin::loadgen`) posts requests at the stand-in's request rate;
- a detokenizer process titled `sglang::detokenizer` runs `DetokenizerManager.event_loop`, blocked in
  `sock_recv` (io_struct.py, as 0.5.15+) on a pipe the rank-0 scheduler writes one record per batch result to,
  and spends `detokenize-ms` per request of each batch.

Truth: every busy or idle interval (unix start, end, tag) goes to one shared ring: the loop's waits in its
selector (so the loop's busy time is the window minus them), its tokenizing and its image-processing code,
each pool task, each detokenizer batch. `accounting(start, end)` turns them into shares of a window.
The knob that makes the front end the bottleneck: `--standin-image-cost-ms` (pool CPU per image) against
`--standin-cpu-workers`, or `--standin-tokenize-ms` (the loop itself).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import multiprocessing as mp
import os
import random
import selectors
import struct
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np  # imported here, before the pool forks: a worker's first image must not pay the import

REQ = struct.Struct("<qdi")  # rid, arrival (perf_counter, system-wide on Linux), images
DETOK = struct.Struct("<qi")  # batch number, requests in it
TAG_IDLE, TAG_IMAGE, TAG_TOKENIZE, TAG_POOL, TAG_DETOK, TAG_POOL_WAIT = range(6)
RING_SIZE = 1 << 16


@dataclass(frozen=True)
class FrontendConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port (announced in the stand-in's first stdout line)
    request_rate: float = 20.0
    arrivals: str = "poisson"
    images_per_request: int = 2
    cpu_workers: int = 2  # SGLANG_CPU_WORKERS
    io_workers: int = 4  # SGLANG_IO_WORKERS
    image_cost_ms: float = 5.0  # pool CPU per image
    convert_ms: float = 0.0  # pool CPU per image in convert_color, after resize/normalize (a planted regression)
    io_ms: float = 1.0  # IO pool per image (a wait)
    tokenize_ms: float = 0.3  # loop CPU per request
    mm_loop_ms: float = 0.2  # loop CPU per image in the processor's own code
    detokenize_ms: float = 0.02  # detokenizer CPU per request of a batch
    max_in_flight: int = 512  # load generator
    seed: int = 0


class IntervalRing:
    """(start, end, tag) intervals in shared memory, written by every process of the stand-in."""

    def __init__(self, ctx, size: int = RING_SIZE) -> None:
        self.size = size
        self.arr = ctx.Array("d", 1 + 3 * size, lock=False)
        self.lock = ctx.Lock()

    def add(self, start: float, end: float, tag: int) -> int:
        """Record an interval; `end` may be math.inf for one still running (then `close` it). Returns its slot."""
        with self.lock:
            n = int(self.arr[0])
            i = 1 + 3 * (n % self.size)
            self.arr[i], self.arr[i + 1], self.arr[i + 2] = start, end, float(tag)
            self.arr[0] = n + 1
            return i

    def close(self, slot: int, end: float) -> None:
        with self.lock:
            self.arr[slot + 1] = end

    def seconds(self, start: float, end: float) -> tuple[dict[int, float], bool]:
        """Seconds of each tag inside [start, end]; False when the ring no longer reaches back to start."""
        with self.lock:
            data = self.arr[:]
        n = int(data[0])
        count = min(n, self.size)
        out: dict[int, float] = {}
        oldest = math.inf
        for k in range(count):
            i = 1 + 3 * k
            s, e, tag = data[i], data[i + 1], int(data[i + 2])
            oldest = min(oldest, s)
            d = min(e, end) - max(s, start)
            if d > 0:
                out[tag] = out.get(tag, 0.0) + d
        return out, n <= self.size or oldest <= start


def spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


# --- the process pool's work (runs in forked workers) -------------------------------------------------------
_RING: IntervalRing | None = None


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG, as SGLang's kill_itself_when_parent_died: a killed stand-in leaves no orphans."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)


def _init_worker(ring: IntervalRing) -> None:
    """Each pool worker: the ring, and its waits for the next call item timed (the truth for the pool's busy
    share: a worker is busy whenever it is not waiting for work, its own bookkeeping included)."""
    import multiprocessing.queues

    global _RING
    _RING = ring
    die_with_parent()
    get = multiprocessing.queues.Queue.get  # the call queue's (concurrent.futures' _SafeQueue)

    def _timed_get(self, block=True, timeout=None):
        slot = ring.add(time.time(), math.inf, TAG_POOL_WAIT)
        try:
            return get(self, block, timeout)
        finally:
            ring.close(slot, time.time())

    multiprocessing.queues.Queue.get = _timed_get


def resize(img):
    return img[::2, ::2].repeat(2, axis=0).repeat(2, axis=1)


def normalize(img):
    return (img - img.mean()) / (img.std() + 1e-6)


def convert_color(img, ms: float) -> int:
    """An extra per-image step (a colour conversion a release adds): numpy work for `ms` of wall time."""
    end = time.perf_counter() + ms / 1e3
    rounds = 0
    while time.perf_counter() < end:
        img = img[..., ::-1] * np.float32(0.5) + np.float32(0.25)
        rounds += 1
    return rounds


def preprocess_image(cost_ms: float, seed: int, convert_ms: float = 0.0) -> int:
    """Resize and normalize a small image until the image's cost is spent (wall time: exact under contention),
    then `convert_ms` in convert_color. A running task is in the ring from its start (end open), so a window's
    truth counts it."""
    slot = _RING.add(time.time(), math.inf, TAG_POOL) if _RING is not None else None
    end = time.perf_counter() + cost_ms / 1e3
    img = np.random.default_rng(seed).random((96, 96, 3), dtype=np.float32)
    rounds = 0
    while time.perf_counter() < end:
        img = normalize(resize(img))
        rounds += 1
    if convert_ms > 0:
        rounds += convert_color(img, convert_ms)
    if slot is not None:
        _RING.close(slot, time.time())
    return rounds


def _warm(_i: int) -> int:
    return os.getpid()


def _load_single_item(io_ms: float) -> bytes:
    time.sleep(io_ms / 1e3)  # fetching / decoding the image bytes: a wait the IO pool absorbs
    return b"image"


# --- code under SGLang's file names (py-spy shows these frames) ---------------------------------------------
_BASE_PROCESSOR_SRC = '''
import asyncio, time

class BaseMultimodalProcessor:
    def __init__(self, cfg, ring, io_executor, cpu_executor, spin, load, preprocess, tag):
        self.cfg, self.ring, self.io_executor, self.cpu_executor = cfg, ring, io_executor, cpu_executor
        self.spin, self.load, self.preprocess, self.tag = spin, load, preprocess, tag

    async def process_mm_data_async(self, n_images, seed):
        # Every synchronous stretch on the loop is timed (the truth for image_processing_share); the awaits
        # are not: the coroutine is off the loop's stack while it waits.
        t0 = time.time()
        loop = asyncio.get_running_loop()
        loads = [loop.run_in_executor(self.io_executor, self.load, self.cfg.io_ms) for _ in range(n_images)]
        self.ring.add(t0, time.time(), self.tag)
        await asyncio.gather(*loads)
        t0 = time.time()
        self._process_and_collect_mm_items(n_images)
        futs = [asyncio.wrap_future(self.cpu_executor.submit(self.preprocess, self.cfg.image_cost_ms, seed + i,
                                                               self.cfg.convert_ms))
                for i in range(n_images)]
        self.ring.add(t0, time.time(), self.tag)
        out = await asyncio.gather(*futs)
        return out

    def _process_and_collect_mm_items(self, n):
        self.spin(self.cfg.mm_loop_ms * n)
'''
_DETOKENIZER_SRC = '''
import time

class DetokenizerManager:
    def __init__(self, fd, cost_ms, ring, spin, record, tag):
        self.fd, self.cost_ms, self.ring, self.spin, self.record, self.tag = fd, cost_ms, ring, spin, record, tag
        self.buf = b""

    def handle_batch_token_id_out(self, n_reqs):
        t0 = time.time()
        self.spin(self.cost_ms * n_reqs)
        self.ring.add(t0, time.time(), self.tag)

    def event_loop(self):
        while True:
            data = sock_recv(self.fd)
            if not data:
                return
            self.buf += data
            size = self.record.size
            while len(self.buf) >= size:
                _, n = self.record.unpack_from(self.buf)
                self.buf = self.buf[size:]
                self.handle_batch_token_id_out(n)
'''


def _compile(src: str, filename: str) -> dict:
    ns: dict = {"__name__": filename.rsplit("/", 1)[-1][:-3]}
    exec(compile(src, filename, "exec"), ns)  # our own source, under SGLang's file name
    return ns


def set_title(title: str) -> None:
    try:
        import setproctitle
    except ImportError:  # comm only (the sidecar's fallback)
        import ctypes

        ctypes.CDLL(None).prctl(15, title.encode()[:15], 0, 0, 0)
    else:
        setproctitle.setproctitle(title)


def run_detokenizer(ring: IntervalRing, conn, cost_ms: float) -> None:
    """Entry point of the detokenizer process (spawned, as SGLang's)."""
    import signal

    set_title("sglang::detokenizer")
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ns = _compile(_DETOKENIZER_SRC, "sglang/srt/managers/detokenizer_manager.py")
    io = _compile("import os\ndef sock_recv(fd):\n    return os.read(fd, 4096)\n", "sglang/srt/managers/io_struct.py")
    ns["sock_recv"] = io["sock_recv"]  # its frame carries io_struct.py, as SGLang's helper (0.5.15+)
    ns["DetokenizerManager"](conn.fileno(), cost_ms, ring, spin, DETOK, TAG_DETOK).event_loop()


def run_loadgen(cfg: FrontendConfig, port: int) -> None:
    """Entry point of the load generator: POST /generate at the request rate, at most max_in_flight open."""
    import signal

    set_title("standin::loadgen")
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rng = random.Random(cfg.seed + 7)

    async def one(rid: int, sem: asyncio.Semaphore) -> None:
        body = json.dumps({"rid": rid, "text": "describe the image", "images": cfg.images_per_request}).encode()
        try:
            reader, writer = await asyncio.open_connection(cfg.host, port)
            writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
            await reader.read()
            writer.close()
        except OSError:
            pass
        finally:
            sem.release()

    async def main() -> None:
        sem = asyncio.Semaphore(cfg.max_in_flight)
        rid = 0
        nxt = time.perf_counter()
        tasks = set()
        while True:
            gap = 1.0 / cfg.request_rate if cfg.arrivals == "fixed" else rng.expovariate(cfg.request_rate)
            nxt += gap
            await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
            await sem.acquire()
            t = asyncio.ensure_future(one(rid, sem))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            rid += 1

    if cfg.request_rate > 0:
        asyncio.run(main())


class TimedSelector(selectors.DefaultSelector):
    """The loop's selector, timing its waits: the loop's idle time (the truth for its busy share)."""

    def __init__(self, ring: IntervalRing) -> None:
        super().__init__()
        self.ring = ring

    def select(self, timeout=None):
        t0 = time.time()
        try:
            return super().select(timeout)
        finally:
            self.ring.add(t0, time.time(), TAG_IDLE)


class TokenizerManager:
    """The main process's asyncio loop: HTTP, tokenizing, the multimodal processor, sending to the schedulers."""

    def __init__(self, cfg: FrontendConfig, ring: IntervalRing, scheduler_fds: list[int]) -> None:
        self.cfg = cfg
        self.ring = ring
        self.scheduler_fds = scheduler_fds
        self.received = self.sent = 0
        self.port: int | None = None
        self.io_executor = concurrent.futures.ThreadPoolExecutor(max_workers=cfg.io_workers)
        self.cpu_executor = concurrent.futures.ProcessPoolExecutor(
            max_workers=cfg.cpu_workers, mp_context=mp.get_context("fork"), initializer=_init_worker,
            initargs=(ring,))
        # Fork every worker now (SGLang's pool forks them at its first image): discovery sees the whole pool.
        list(self.cpu_executor.map(_warm, range(cfg.cpu_workers * 4)))
        self.worker_pids = sorted(self.cpu_executor._processes)  # every worker, not only those that ran one
        ns = _compile(_BASE_PROCESSOR_SRC, "sglang/srt/multimodal/processors/base_processor.py")
        this = sys.modules[__name__]
        self.mm_processor = ns["BaseMultimodalProcessor"](cfg, ring, self.io_executor, self.cpu_executor, spin,
                                                          this._load_single_item, this.preprocess_image, TAG_IMAGE)

    # --- the request path -----------------------------------------------------------------------------------
    async def handle_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                length = 0
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    if k.strip().lower() == "content-length":
                        length = int(v.strip() or 0)
                body = await reader.readexactly(length) if length else b"{}"
                await self.generate_request(json.loads(body))
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                             b"Connection: close\r\n\r\n{}")
                await writer.drain()
                break
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def generate_request(self, obj: dict) -> None:
        arrival = time.perf_counter()
        self.received += 1
        rid, images = await self._tokenize_one_request(obj)
        self._send_one_request(rid, arrival, images)

    async def _tokenize_one_request(self, obj: dict) -> tuple[int, int]:
        t0 = time.time()
        spin(self.cfg.tokenize_ms)
        self.ring.add(t0, time.time(), TAG_TOKENIZE)
        images = int(obj.get("images", 0))
        if images:
            await self.mm_processor.process_mm_data_async(images, int(obj.get("rid", 0)) * 16)
        return int(obj.get("rid", self.received)), images

    def _send_one_request(self, rid: int, arrival: float, images: int) -> None:
        rec = REQ.pack(rid, arrival, images)
        for fd in self.scheduler_fds:
            os.write(fd, rec)
        self.sent += 1

    # --- running --------------------------------------------------------------------------------------------
    def bind(self) -> int:
        """Listen before the loop runs, so the port can be announced (and the load generator pointed at it)."""
        import socket

        self.sock = socket.create_server((self.cfg.host, self.cfg.port), backlog=1024)
        self.port = self.sock.getsockname()[1]
        return self.port

    def run(self, stopping: threading.Event) -> None:
        """Run the loop on the calling thread (the process's MainThread) until `stopping` is set."""
        loop = asyncio.SelectorEventLoop(TimedSelector(self.ring))
        asyncio.set_event_loop(loop)

        async def serve() -> None:
            server = await asyncio.start_server(self.handle_connection, sock=self.sock)
            while not stopping.is_set():
                await asyncio.sleep(0.1)
            server.close()

        try:
            loop.run_until_complete(serve())
        finally:
            # Running items end within their cost and post their results to the loop: close it after them.
            self.io_executor.shutdown(wait=True, cancel_futures=True)
            self.cpu_executor.shutdown(wait=True, cancel_futures=True)
            loop.close()

    def accounting(self, start: float, end: float, detokenizer_pid: int | None) -> dict:
        """Truth for a window: each role's busy share, from the intervals its code recorded."""
        secs, complete = self.ring.seconds(start, end)
        span = max(1e-9, end - start)
        return {
            "start": start, "end": end, "complete": complete, "received": self.received, "sent": self.sent,
            "tokenizer_manager": {"pid": os.getpid(), "busy_share": 1.0 - secs.get(TAG_IDLE, 0.0) / span,
                                  "image_processing_share": secs.get(TAG_IMAGE, 0.0) / span,
                                  "tokenize_share": secs.get(TAG_TOKENIZE, 0.0) / span},
            "mm_processor": {"pids": self.worker_pids, "workers": self.cfg.cpu_workers,
                             "busy_share": 1.0 - secs.get(TAG_POOL_WAIT, 0.0) / (span * self.cfg.cpu_workers),
                             "image_share": secs.get(TAG_POOL, 0.0) / (span * self.cfg.cpu_workers)},
            "detokenizer": {"pid": detokenizer_pid, "busy_share": secs.get(TAG_DETOK, 0.0) / span},
        }
