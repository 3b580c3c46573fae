"""Estimators for the processes around the scheduler: how busy each front-end role is, per window. Pure.

One py-spy window per process (`--idle`, so a waiting thread is sampled in its wait). For each process the
thread that does the role's work is picked, and its time is split into idle (waiting for work) and busy:

- tokenizer_manager / tokenizer_worker: the asyncio event-loop thread (SGLang's HTTP server and
  TokenizerManager share it). Idle is the loop waiting for I/O: `select (selectors.py)` anywhere on the
  stack with the stdlib loop; with uvloop (what SGLang installs) the loop is C and a waiting loop shows as
  the frame that entered it, `run (runners.py)`, innermost. Everything else is a callback or a coroutine
  step holding the loop: tokenizing, the multimodal processor's synchronous code, HTTP handling. uvloop's own
  C work (socket reads, HTTP parsing in httptools) is charged to `run` and reads as idle.
- mm_processor: a ProcessPoolExecutor worker's `_process_worker (process.py)`; idle is it waiting for its
  next call item (`get (queues.py)`); the pool's busy share is the mean over its sampled workers, the
  fraction of the pool busy.
- detokenizer: `event_loop (detokenizer_manager.py)`; idle is the ZMQ receive from the scheduler
  (`recv_pyobj (socket.py)` up to 0.5.10, `sock_recv (io_struct.py)` from 0.5.15; pyzmq's recv is Cython, so
  that frame is innermost while it waits).

`image_processing_share` is the loop thread's time in the multimodal processor's own code
(`base_processor.py`, `process_mm_data_async`): the part of image handling that holds the loop (the
executors' work shows in mm_processor and in the IO threads, not on the loop). A coroutine that awaits is
off the stack, so this is loop time, not request latency.

The front end is saturated when its busiest role is busy at least FRONTEND_BUSY_SATURATED of the window
while the scheduler spends at least SCHEDULER_IDLE_SATURATED of it idle: requests are held up before
they reach a scheduler that has room for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from vlm_sidecar.estimators import function_shares, select_functions, unexported_max
from vlm_sidecar.model import FRONTEND_ROLES, ParsedTrace, Segment
from vlm_sidecar.parser import collapse_segments, function_name

FRONTEND_BUSY_SATURATED = 0.9
SCHEDULER_IDLE_SATURATED = 0.5

# (function, file base name) pairs, as frame labels carry them.
LOOP_FRAMES = frozenset({("_run_once", "base_events.py"), ("run_forever", "base_events.py"),
                         ("run_until_complete", "base_events.py"), ("run", "runners.py")})
POOL_WORKER_FRAMES = frozenset({("_process_worker", "process.py")})
DETOKENIZER_FRAMES = frozenset({("event_loop", "detokenizer_manager.py")})
ROLE_THREAD_FRAMES = {"tokenizer_manager": LOOP_FRAMES, "tokenizer_worker": LOOP_FRAMES,
                      "mm_processor": POOL_WORKER_FRAMES, "detokenizer": DETOKENIZER_FRAMES}
# Waiting, wherever on the stack: the stdlib event loop's selector; a pool worker's call queue.
IDLE_ANYWHERE = frozenset({("select", "selectors.py"), ("get", "queues.py")})
# Waiting when innermost (a C call below it blocks): uvloop's loop entered from asyncio.run / uvloop.run;
# pyzmq's receives (recv_pyobj, recv_multipart) and SGLang's sock_recv around them; a thread waiting on a lock.
IDLE_INNERMOST = frozenset({("run", "runners.py"), ("recv_pyobj", "socket.py"), ("recv_multipart", "socket.py"),
                            ("sock_recv", "io_struct.py"), ("wait", "threading.py"), ("_worker", "thread.py")})
IMAGE_FILES = frozenset({"base_processor.py"})
IMAGE_FUNCTIONS = frozenset({"process_mm_data_async"})


def frame_key(label: str) -> tuple[str, str]:
    """'BaseEventLoop._run_once (base_events.py)' -> ('_run_once', 'base_events.py')."""
    _, _, rest = label.partition(" (")
    return function_name(label), rest[:-1] if rest.endswith(")") else ""


def is_idle(stack: Sequence[str]) -> bool:
    if not stack:
        return True
    if frame_key(stack[-1]) in IDLE_INNERMOST:
        return True
    return any(frame_key(f) in IDLE_ANYWHERE for f in stack)


def in_image_processing(stack: Sequence[str]) -> bool:
    for label in stack:
        fn, file = frame_key(label)
        if file in IMAGE_FILES or fn in IMAGE_FUNCTIONS:
            return True
    return False


def pick_role_thread(trace: ParsedTrace, role: str) -> int | None:
    """The thread running the role's loop (most time under one of its frames); None if no thread has one."""
    frames = ROLE_THREAD_FRAMES.get(role, frozenset())
    best, best_t = None, 0.0
    for tid, segs in trace.threads.items():
        t = sum(s.duration_us for s in segs if any(frame_key(f) in frames for f in s.stack))
        if t > best_t:
            best, best_t = tid, t
    return best


@dataclass(frozen=True)
class ProcessWindow:
    """One front-end process's window: its role thread's time split into busy and idle."""

    role: str
    pid: int
    observed_us: float
    busy_us: float
    image_us: float
    segments: tuple[Segment, ...] = ()
    result: str = "ok"
    ended: float | None = None  # unix time py-spy returned: its samples cover about [ended - observed, ended]

    @property
    def busy_share(self) -> float | None:
        return self.busy_us / self.observed_us if self.observed_us > 0 else None


def process_window(trace: ParsedTrace, role: str, pid: int, result: str = "ok",
                   ended: float | None = None) -> ProcessWindow:
    tid = pick_role_thread(trace, role)
    segs = tuple(trace.threads.get(tid, ())) if tid is not None else ()
    observed = busy = image = 0.0
    for s in segs:
        d = s.duration_us
        observed += d
        if not is_idle(s.stack):
            busy += d
            if in_image_processing(s.stack):
                image += d
    return ProcessWindow(role, pid, observed, busy, image, segs, result, ended)


@dataclass(frozen=True)
class RoleSummary:
    """One role over its processes in one window (shares 0-1; None where no process showed the role's thread)."""

    role: str
    processes: int  # found
    sampled: int  # sampled with a usable window
    pids: tuple[int, ...]
    busy_share: float | None  # mean over sampled processes: for mm_processor, the fraction of the pool busy
    busy_share_max: float | None
    image_processing_share: float | None  # tokenizer roles: loop time in the multimodal processor's code
    function_shares: dict[str, float] = field(default_factory=dict)  # inclusive, of the role threads' time
    self_shares: dict[str, float] = field(default_factory=dict)
    # What the samples span (mean over the processes) and when the last py-spy returned (unix): the stretch of
    # time the shares describe, shorter than the window by py-spy's start and write.
    observed_seconds: float | None = None
    sampled_until: float | None = None
    # The largest self share of a function not exported (0.0 when none was left out, None without samples):
    # the canary gate's bound for a function one revision's export left out.
    unexported_self_share_max: float | None = None

    def to_json(self) -> dict:
        return {"processes": self.processes, "sampled": self.sampled, "pids": list(self.pids),
                "observed_seconds": self.observed_seconds, "sampled_until": self.sampled_until,
                "busy_share": self.busy_share, "busy_share_max": self.busy_share_max,
                "image_processing_share": self.image_processing_share,
                "function_shares": dict(self.function_shares), "self_shares": dict(self.self_shares),
                "unexported_self_share_max": self.unexported_self_share_max}


def summarize_role(role: str, found: int, windows: Iterable[ProcessWindow], top_n: int,
                   watch: Sequence[str] = ()) -> tuple[RoleSummary, dict[tuple[str, ...], float]]:
    """A role's summary and the collapsed stacks of its role threads, all processes merged (microseconds)."""
    ws = [w for w in windows if w.busy_share is not None]
    shares = [w.busy_share for w in ws]
    segs = [s for w in ws for s in w.segments]
    incl, self_ = function_shares(segs)
    chosen = select_functions(incl, self_, watch, top_n)
    image = None
    if role in ("tokenizer_manager", "tokenizer_worker") and ws:
        image = sum(w.image_us for w in ws) / sum(w.observed_us for w in ws)
    summary = RoleSummary(
        role=role, processes=found, sampled=len(ws), pids=tuple(w.pid for w in ws),
        busy_share=sum(shares) / len(shares) if shares else None, busy_share_max=max(shares, default=None),
        image_processing_share=image, function_shares={f: incl.get(f, 0.0) for f in chosen},
        self_shares={f: self_.get(f, 0.0) for f in chosen},
        observed_seconds=sum(w.observed_us for w in ws) / len(ws) / 1e6 if ws else None,
        sampled_until=max((w.ended for w in ws if w.ended is not None), default=None),
        unexported_self_share_max=unexported_max(self_, chosen))
    return summary, collapse_segments(segs)


@dataclass(frozen=True)
class FrontendWindow:
    """The front end in one window, next to the schedulers sampled in the same window."""

    id: int
    start: float
    end: float
    roles: dict[str, RoleSummary]
    scheduler_idle_share: float | None
    busy_share: float | None  # the busiest front-end role's busy_share
    busiest_role: str | None
    saturated: bool | None  # None: the front end or the scheduler was not measured

    def to_json(self) -> dict:
        return {"id": self.id, "start": self.start, "end": self.end, "busy_share": self.busy_share,
                "busiest_role": self.busiest_role, "saturated": self.saturated,
                "scheduler_idle_share": self.scheduler_idle_share,
                "roles": {r: s.to_json() for r, s in self.roles.items()}}


def frontend_window(window_id: int, start: float, end: float, roles: dict[str, RoleSummary],
                    scheduler_idle: Sequence[float]) -> FrontendWindow:
    """Saturation: the busiest front-end role at or above FRONTEND_BUSY_SATURATED while the schedulers' mean
    idle share is at or above SCHEDULER_IDLE_SATURATED."""
    busy = {r: s.busy_share for r, s in roles.items() if r in FRONTEND_ROLES and s.busy_share is not None}
    busiest = max(busy, key=lambda r: busy[r]) if busy else None
    idle = sum(scheduler_idle) / len(scheduler_idle) if scheduler_idle else None
    saturated = None
    if busiest is not None and idle is not None:
        saturated = busy[busiest] >= FRONTEND_BUSY_SATURATED and idle >= SCHEDULER_IDLE_SATURATED
    return FrontendWindow(window_id, start, end, dict(roles), idle, busy.get(busiest) if busiest else None,
                          busiest, saturated)
