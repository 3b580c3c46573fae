"""A known-truth SGLang scheduler loop, sampled the way py-spy samples it.

`simulate(shape, seed=...)` lays out SGLang-shaped iterations (stage by stage, each stage a few
constant-stack pieces, as GPU waits and leaf calls look to py-spy), records every iteration's true
duration, then draws py-spy's sample times (exponential gaps, mean 1 / rate, optionally a few long
gaps as a throttled sidecar gives) and returns the `Segment` list the chrometrace parser would make:
a segment from the sample where a stack first appeared to the sample where it changed, consecutive
equal stacks merged, the last one closed at the end of the window (py-spy closes open frames when it
writes). Stacks are tuples of `parser.frame_label` strings, root first.

Pure Python, seeded, no clocks: a 5 s window at 1000 Hz takes a few tens of milliseconds.

    python -m vlm_testing.loopsim [RATE_HZ]   # error table per shape (docs/sidecar.md)
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field, replace

from vlm_sidecar.model import Segment

ROOT = ("<module> (launch_server.py)", "run_scheduler_process (scheduler.py)")


def _f(name: str, file: str = "scheduler.py") -> str:
    return f"{name} ({file})"


# Leaf pieces of each stage: (frames below the stage frame, share of the stage's time).
_PIECES: dict[str, tuple[tuple[tuple[str, ...], float], ...]] = {
    "recv_requests": (((_f("Socket.recv_pyobj", "socket.py"),), 1.0),),
    "process_input_requests": (
        ((_f("Scheduler.handle_generate_request"), _f("TokenizedGenerateReqInput.__init__", "io_struct.py")), 0.5),
        ((_f("Scheduler.handle_generate_request"), _f("Req.__init__", "schedule_batch.py")), 0.5),
    ),
    "get_next_batch_to_run": (
        ((_f("Scheduler.get_new_batch_prefill"), _f("PrefillAdder.add_one_req", "schedule_policy.py")), 0.5),
        ((_f("Scheduler.update_running_batch"), _f("ScheduleBatch.prepare_for_decode", "schedule_batch.py")), 0.5),
    ),
    "run_batch": (
        ((_f("TpModelWorker.forward_batch_generation", "tp_worker.py"),
          _f("ModelRunner.forward", "model_runner.py"), _f("CudaGraphRunner.replay", "cuda_graph_runner.py")), 0.85),
        ((_f("TpModelWorker.forward_batch_generation", "tp_worker.py"), _f("Sampler.forward", "sampler.py")), 0.15),
    ),
    "prefill": (
        ((_f("TpModelWorker.forward_batch_generation", "tp_worker.py"), _f("ModelRunner.forward", "model_runner.py"),
          _f("Qwen2VLForConditionalGeneration.get_image_feature", "qwen2_vl.py")), 0.4),
        ((_f("TpModelWorker.forward_batch_generation", "tp_worker.py"), _f("ModelRunner.forward", "model_runner.py"),
          _f("ModelRunner.forward_extend", "model_runner.py")), 0.5),
        ((_f("TpModelWorker.forward_batch_generation", "tp_worker.py"), _f("Sampler.forward", "sampler.py")), 0.1),
    ),
    "process_batch_result": (
        ((_f("Scheduler.process_batch_result_decode", "scheduler_output_processor_mixin.py"),
          _f("Event.synchronize", "streams.py")), 0.7),
        ((_f("Scheduler.process_batch_result_decode", "scheduler_output_processor_mixin.py"),
          _f("Scheduler.stream_output", "scheduler_output_processor_mixin.py")), 0.3),
    ),
    # 0.5.10: self_check_during_idle (runtime-checker mixin) -> check_memory; 0.5.15+: on_idle -> invariant checker.
    "idle": (((_f("Scheduler.check_memory", "scheduler_runtime_checker_mixin.py"),), 0.6),
             ((_f("Scheduler.check_tree_cache", "scheduler_runtime_checker_mixin.py"),), 0.4)),
    "on_idle": (((_f("InvariantChecker._check_all_pools", "invariant_checker.py"),), 0.6),
                ((_f("InvariantChecker._check_tree_cache", "invariant_checker.py"),), 0.4)),
}
# py-spy frames of the stage decorators (/tmp/sglang_shapes.md, read from the wheels): 0.5.15/0.5.17 wrap
# every stage (and recv_requests) in nvtx_utils' `wrapper`; 0.5.20+ add scheduler_stage_metrics' `wrapper`
# outside it, on on_idle too. 0.5.10 has none.
_WRAPPERS = {"0.5.10": (), "0.5.17": (_f("wrapper", "nvtx_utils.py"),),
             "0.5.23": (_f("wrapper", "scheduler_stage_metrics.py"), _f("wrapper", "nvtx_utils.py"))}


@dataclass(frozen=True)
class Shape:
    """One loop shape. Times in milliseconds; jitter is the relative +- spread of every stage."""

    name: str
    recv_ms: float = 0.3
    input_ms: float = 1.2
    schedule_ms: float = 1.0
    decode_ms: float = 12.0
    result_ms: float = 3.4
    prefill_ms: float = 60.0
    prefill_every: int = 0  # every Nth batch is an image prefill (0: never)
    reorder_every: int = 0  # overlap disabled every k-th iteration: result of the last batch runs first
    # 0.5.10: stages called from the loop; 0.5.17: + nvtx `wrapper` frames, request_receiver.recv_requests,
    # on_idle; 0.5.23: + ingest_requests() around recv/process_input and a second `wrapper` frame.
    version: str = "0.5.10"
    idle_ms: float = 1.5  # on_idle / self_check_during_idle of an idle-only iteration
    # recv + process_input + get_next_batch of an idle-only iteration, together. Busy-polling SGLang
    # spends far less; iterations much shorter than the sampling interval cannot be counted at all.
    idle_input_ms: float = 2.5
    idle_share: float = 0.0  # fraction of the window spent in idle stretches
    idle_burst: int = 40  # idle-only iterations per idle stretch (mean)
    jitter: float = 0.1
    loop: str = "event_loop_overlap"
    # Every stage one constant stack (its own frame, as the stand-in's inline spins look to py-spy; real
    # SGLang shows leaf calls). Then two calls of one stage whose in-between stages went unsampled merge
    # into one segment, with no change of stack inside to find the hidden boundary by.
    single_stack: bool = False

    def scaled(self, **factors: float) -> Shape:
        """The same shape with some times multiplied: scaled(decode_ms=1.1)."""
        return replace(self, **{k: getattr(self, k) * v for k, v in factors.items()})


SHAPES: dict[str, Shape] = {
    "decode": Shape("decode"),
    "prefill_every_10": Shape("prefill_every_10", prefill_every=10),
    "prefill_every_5": Shape("prefill_every_5", prefill_every=5),
    "prefill_every_5_slower": Shape("prefill_every_5_slower", prefill_every=5, prefill_ms=75.0),
    "reorder_every_4": Shape("reorder_every_4", reorder_every=4),
    "v0_5_17": Shape("v0_5_17", version="0.5.17", prefill_every=5, reorder_every=4),
    "v0_5_23": Shape("v0_5_23", version="0.5.23", prefill_every=5, reorder_every=4),
    "idle_heavy": Shape("idle_heavy", idle_share=0.5, prefill_every=6),
    # The stand-in's golden shapes (testing/vlm_testing/standin, tests/golden/sidecar): one stack per stage.
    "standin_v0_5_17": Shape("standin_v0_5_17", version="0.5.17", recv_ms=0.75, input_ms=2.5, schedule_ms=0.8,
                             result_ms=2.5, prefill_every=2, prefill_ms=12.0, single_stack=True),
    "standin_v0_5_23": Shape("standin_v0_5_23", version="0.5.23", recv_ms=0.9, input_ms=1.7, schedule_ms=1.0,
                             result_ms=2.5, prefill_every=3, single_stack=True),
    "idle_heavy_v0_5_23": Shape("idle_heavy_v0_5_23", idle_share=0.6, version="0.5.23", loop="event_loop_normal"),
    # The stand-in as test_acceptance runs it (its default stage costs: recv 0.5, schedule 0.8, result 1.5 ms;
    # image prefills about every second batch): a decode iteration's input stages take ~2 ms, so at 1000 Hz
    # both signs of a boundary (input stages, the previous result between two run_batch calls) go unsampled
    # in a few percent of iterations. Without the capture-recapture correction the mean read +3% here.
    "standin_acceptance_v0_5_23": Shape("standin_acceptance_v0_5_23", version="0.5.23", recv_ms=0.5, input_ms=0.5,
                                        schedule_ms=0.8, result_ms=1.5, decode_ms=13.0, prefill_every=2,
                                        single_stack=True),
    "standin_acceptance_consecutive": Shape("standin_acceptance_consecutive", version="0.5.23", recv_ms=0.5,
                                            input_ms=0.5, schedule_ms=0.8, result_ms=1.5, decode_ms=13.0,
                                            prefill_every=2, reorder_every=3, single_stack=True),
}


@dataclass
class Sim:
    """A simulated window: what the parser would give, and the truth."""

    segments: list[Segment]
    durations_s: list[float]  # true duration of every iteration wholly inside the window
    samples: int
    window_s: float
    pieces: list[tuple[float, float, tuple[str, ...]]] = field(repr=False, default_factory=list)

    @property
    def mean_s(self) -> float:
        return sum(self.durations_s) / len(self.durations_s)

    def quantile_s(self, q: float) -> float:
        v = sorted(self.durations_s)
        pos = q * (len(v) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(v) - 1)
        return v[lo] + (v[hi] - v[lo]) * (pos - lo)


class _Builder:
    def __init__(self, shape: Shape, rng: random.Random) -> None:
        self.shape, self.rng = shape, rng
        self.t = 0.0
        self.pieces: list[tuple[float, float, tuple[str, ...]]] = []
        self.loop = (*ROOT, _f(f"Scheduler.{shape.loop}"))

    def _ms(self, ms: float) -> float:
        j = self.shape.jitter
        return max(ms * (1 + self.rng.uniform(-j, j)), 0.0) * 1e3

    def put(self, stack: tuple[str, ...], us: float) -> None:
        if us > 0:
            self.pieces.append((self.t, self.t + us, stack))
            self.t += us

    def stage(self, name: str, ms: float, outer: tuple[str, ...] = (), kind: str | None = None) -> None:
        """One stage call: the stage frame (behind the version's wrappers) and its leaf pieces."""
        us = self._ms(ms)
        v = self.shape.version
        if name == "recv_requests" and v != "0.5.10":
            frame = _f("SchedulerRequestReceiver.recv_requests", "request_receiver.py")
        elif name == "self_check_during_idle":
            frame = _f("Scheduler.self_check_during_idle", "scheduler_runtime_checker_mixin.py")
        else:
            frame = _f(f"Scheduler.{name}")
        base = (*self.loop, *outer)
        wrappers = _WRAPPERS[v] if name != "on_idle" or v == "0.5.23" else ()
        for k in range(len(wrappers)):
            self.put((*base, *wrappers[: k + 1]), 10.0)  # the decorators' own code
        base = (*base, *wrappers)
        if self.shape.single_stack:
            self.put((*base, frame), us)
            return
        for leaf, share in _PIECES[kind or name]:
            self.put((*base, frame, *leaf), us * share)

    def other(self, frames: tuple[str, ...], us: float) -> None:
        self.put((*self.loop, *frames), us)

    def iteration(self, batch: str | None, reorder: bool, has_last: bool, input_ms: float | None = None) -> None:
        """recv -> process_input -> get_next_batch -> [result of last | run_batch | result of last] / idle."""
        s = self.shape
        if input_ms is None:
            recv, inp = s.recv_ms, s.input_ms
        else:  # idle-only iteration: the three stages share idle_input_ms
            recv, inp = input_ms * 0.4, input_ms * 0.2
        ingest = (_f("Scheduler.ingest_requests"),) if s.version == "0.5.23" else ()
        if ingest:
            self.other(ingest, 10.0)  # ingest_requests' own code
        self.stage("recv_requests", recv, ingest)
        self.stage("process_input_requests", inp, ingest)
        self.other((), 15.0)
        self.stage("get_next_batch_to_run", s.schedule_ms if input_ms is None else input_ms * 0.4)
        pop = (_f("Scheduler.event_loop_overlap.<locals>.pop_and_process"),) if s.loop == "event_loop_overlap" else ()
        if batch is None:
            if has_last:  # overlap: the last batch's result still comes out
                self.stage("process_batch_result", s.result_ms, pop)
            else:
                if s.version == "0.5.10":
                    self.stage("self_check_during_idle", s.idle_ms, (), kind="idle")
                else:
                    self.stage("on_idle", s.idle_ms, ())
            return
        if reorder and has_last:
            self.stage("process_batch_result", s.result_ms, pop)
        if batch == "prefill":
            self.stage("run_batch", s.prefill_ms, kind="prefill")
        else:
            self.stage("run_batch", s.decode_ms)
        if not reorder and has_last:
            self.stage("process_batch_result", s.result_ms, pop)
        self.other((_f("Scheduler.launch_batch_sample_if_needed"),), 30.0)
        if s.version != "0.5.10":
            self.other((_f("InvariantChecker.self_check_during_busy", "invariant_checker.py"),), 10.0)


def timeline(shape: Shape, window_s: float, rng: random.Random) -> tuple[list, list[float], list[float]]:
    """Pieces (start_us, end_us, stack) covering [0, window + one iteration); iteration starts and ends."""
    b = _Builder(shape, rng)
    b.t = -rng.uniform(0, 30e3)  # the window opens mid-iteration
    starts: list[float] = []
    ends: list[float] = []
    end_us = window_s * 1e6
    batches = 0
    it = 0
    has_last = False
    idle_left = 0
    idle_time = 0.0
    while b.t < end_us + 100e3:
        it += 1
        starts.append(b.t)
        if idle_left == 0 and shape.idle_share > 0 and b.t > 0 and idle_time < shape.idle_share * max(b.t, 1.0):
            idle_left = max(1, round(rng.expovariate(1 / shape.idle_burst)))
        if idle_left > 0:
            t0 = b.t
            b.iteration(None, False, has_last, input_ms=shape.idle_input_ms)
            has_last = False
            idle_left -= 1
            idle_time += b.t - t0
        else:
            batches += 1
            kind = "prefill" if shape.prefill_every and batches % shape.prefill_every == 0 else "decode"
            reorder = bool(shape.reorder_every) and it % shape.reorder_every == 0
            if shape.loop == "event_loop_normal":  # run_batch, then the same batch's result
                b.iteration(kind, False, True)
            else:
                b.iteration(kind, reorder, has_last)
                has_last = True
        ends.append(b.t)
    return b.pieces, starts, ends


def sample_times(rng: random.Random, window_us: float, rate_hz: float, long_gaps: int = 0,
                 long_gap_ms: float = 8.0) -> list[float]:
    """py-spy's sample times: exponential gaps; `long_gaps` of them stretched to about long_gap_ms."""
    mean_us = 1e6 / rate_hz
    out: list[float] = []
    t = rng.expovariate(1 / mean_us)
    stretch_at = {rng.randrange(int(window_us / mean_us)) for _ in range(long_gaps)}
    i = 0
    while t < window_us:
        out.append(t)
        gap = rng.expovariate(1 / mean_us)
        if i in stretch_at:
            gap += long_gap_ms * 1e3 * rng.uniform(0.5, 1.5)
        t += gap
        i += 1
    return out


def segments_from_samples(pieces: list, times: list[float], window_us: float) -> list[Segment]:
    """The parser's view: one segment per run of equal stacks, sample to sample."""
    starts = [p[0] for p in pieces]
    segs: list[Segment] = []
    stacks = []
    for t in times:
        i = bisect.bisect_right(starts, t) - 1
        stacks.append(pieces[i][2])
    for k, (t, st) in enumerate(zip(times, stacks, strict=True)):
        nxt = times[k + 1] if k + 1 < len(times) else window_us
        if segs and segs[-1].stack == st:
            segs[-1] = Segment(segs[-1].start_us, nxt, st)
        else:
            segs.append(Segment(t, nxt, st))
    return segs


def simulate(shape: Shape, *, seed: int = 0, window_s: float = 5.0, rate_hz: float = 1000.0,
             long_gaps: int = 0) -> Sim:
    rng = random.Random(seed)
    pieces, starts, ends = timeline(shape, window_s, rng)
    window_us = window_s * 1e6
    times = sample_times(rng, window_us, rate_hz, long_gaps)
    segs = segments_from_samples(pieces, times, window_us)
    durations = [(e - s) / 1e6 for s, e in zip(starts, ends, strict=True) if s >= 0 and e <= window_us]
    return Sim(segs, durations, len(times), window_s, pieces)


def random_shape(rng: random.Random) -> Shape:
    """A random SGLang-like shape inside the range the estimator is specified for."""
    return Shape(
        "random",
        recv_ms=rng.uniform(0.1, 0.8),
        input_ms=rng.uniform(0.5, 4.0),
        schedule_ms=rng.uniform(0.5, 2.0),
        decode_ms=rng.uniform(6.0, 30.0),
        result_ms=rng.uniform(2.0, 6.0),
        prefill_ms=rng.uniform(30.0, 150.0),
        prefill_every=rng.choice([0, 0, 3, 5, 10, 20]),
        reorder_every=rng.choice([0, 0, 2, 4, 7]),
        version=rng.choice(["0.5.10", "0.5.17", "0.5.23"]),
        idle_share=rng.choice([0.0, 0.0, 0.2, 0.5]),
        idle_ms=rng.uniform(1.0, 3.0),
        idle_input_ms=rng.uniform(2.0, 4.0),
        jitter=rng.uniform(0.0, 0.3),
        loop=rng.choice(["event_loop_overlap", "event_loop_normal"]),
    )


# A helper shared by two callers, one in each of two stages (a copy, a lock, a serializer): the attribution case
# of `shared_helper`. Frames below the loop function, root first.
_LOOP = (*ROOT, _f("Scheduler.event_loop_overlap"))
_HASH = (_f("Scheduler.process_input_requests"), _f("Scheduler.handle_generate_request"),
         _f("MultimodalCache.hash_feature", "mm_utils.py"))
_DECODE = (_f("Scheduler.run_batch"), _f("TpModelWorker.decode_batch", "tp_worker.py"))
SHARED_HELPER = _f("helper", "utils.py")


def shared_helper(*, hash_helper_ms: float, decode_helper_ms: float, seed: int = 0, window_s: float = 2.0,
                  rate_hz: float = 1000.0) -> Sim:
    """A loop in which `helper` runs under hash_feature (in process_input_requests) for `hash_helper_ms` and
    under decode_batch (in run_batch) for `decode_helper_ms` per iteration, between 1 ms stretches of the other
    stages and hash_feature's own code and 8 ms of decode_batch's (each piece jittered 10%)."""
    rng = random.Random(seed)
    iteration = [((_f("Scheduler.recv_requests"), _f("Socket.recv_pyobj", "socket.py")), 1.0),
                 (_HASH, 1.0), ((*_HASH, SHARED_HELPER), hash_helper_ms),
                 ((_f("Scheduler.get_next_batch_to_run"),), 1.0),
                 (_DECODE, 8.0), ((*_DECODE, SHARED_HELPER), decode_helper_ms),
                 ((_f("Scheduler.process_batch_result"),), 1.0)]
    window_us = window_s * 1e6
    pieces, starts, t = [], [], -rng.uniform(0, 20e3)  # the window opens mid-iteration
    while t < window_us:
        starts.append(t)
        for frames, ms in iteration:
            d = ms * 1e3 * rng.uniform(0.9, 1.1)
            if d > 0:
                pieces.append((t, t + d, (*_LOOP, *frames)))
                t += d
    ends = [*starts[1:], t]
    times = sample_times(rng, window_us, rate_hz)
    durations = [(e - s) / 1e6 for s, e in zip(starts, ends, strict=True) if s >= 0 and e <= window_us]
    return Sim(segments_from_samples(pieces, times, window_us), durations, len(times), window_s, pieces)


def error_table(seeds: int = 20, rate_hz: float = 1000.0) -> list[tuple[str, float, float, float, float, float, float]]:
    """Per shape over seeds 0..seeds-1: (name, true mean ms, mean error min, max, true p95 ms, p95 error min, max)."""
    from vlm_sidecar.estimators import estimate_loop

    rows = []
    for name, shape in SHAPES.items():
        em, ep, tm, tp = [], [], 0.0, 0.0
        for seed in range(seeds):
            sim = simulate(shape, seed=seed, rate_hz=rate_hz)
            est = estimate_loop(sim.segments, rate_hz=rate_hz)
            em.append(est.mean_s / sim.mean_s - 1)
            ep.append(est.p95_s / sim.quantile_s(0.95) - 1)
            tm += sim.mean_s * 1e3 / seeds
            tp += sim.quantile_s(0.95) * 1e3 / seeds
        rows.append((name, tm, min(em), max(em), tp, min(ep), max(ep)))
    return rows


if __name__ == "__main__":
    import sys

    rate = float(sys.argv[1]) if len(sys.argv) > 1 else 1000.0
    print(f"{rate:.0f} Hz, 5 s windows, seeds 0-19 per shape")
    print("| shape | true mean | mean error (min..max) | true p95 | p95 error (min..max) |")
    print("|---|---|---|---|---|")
    for name, tm, em0, em1, tp, ep0, ep1 in error_table(rate_hz=rate):
        print(f"| {name} | {tm:.1f} ms | {em0:+.1%} .. {em1:+.1%} | {tp:.1f} ms | {ep0:+.1%} .. {ep1:+.1%} |")
