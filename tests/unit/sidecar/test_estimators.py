"""Estimators on synthetic timelines whose truth is known exactly."""

from __future__ import annotations

import random

import pytest
from vlm_sidecar.estimators import (
    classify,
    estimate_loop,
    function_shares,
    pick_scheduler_thread,
    select_functions,
    stage_shares,
)
from vlm_sidecar.model import LOOP_STAGES, ParsedTrace, Segment

LOOP = ("<module> (<string>)", "Scheduler.event_loop_overlap (scheduler.py)")


def stack(*frames: str) -> tuple[str, ...]:
    return (*LOOP, *(f"Scheduler.{f} (scheduler.py)" for f in frames))


def sampled_timeline(stage_ms: dict[str, float], iterations: int, rate_hz: float, seed: int = 1,
                     jitter: float = 0.0) -> tuple[list[Segment], float]:
    """What py-spy's chrometrace gives for a loop: Poisson samples, a segment per change of stack.

    Returns (segments, true mean iteration in seconds)."""
    rng = random.Random(seed)
    spans, t = [], 0.0
    for _ in range(iterations):
        for st, ms in stage_ms.items():
            d = ms * 1e3 * (1 + rng.uniform(-jitter, jitter))
            spans.append((t, t + d, stack(st)))
            t += d
    samples, s = [], rng.expovariate(rate_hz) * 1e6
    i = 0
    while s < t:
        while spans[i][1] <= s:
            i += 1
        samples.append((s, spans[i][2]))
        s += rng.expovariate(rate_hz) * 1e6
    segs: list[Segment] = []
    for (ts, st), (nts, _) in zip(samples, [*samples[1:], (t, None)], strict=True):
        if segs and segs[-1].stack == st:
            segs[-1] = Segment(segs[-1].start_us, nts, st)
        else:
            segs.append(Segment(ts, nts, st))
    return segs, t / 1e6 / iterations


def test_classify():
    assert classify(stack("run_batch")) == "run_batch"
    assert classify(stack("process_input_requests", "handle_generate_request", "hash_feature")) == \
        "process_input_requests"
    assert classify(stack("self_check_during_idle")) == "idle"
    assert classify(stack("_publish")) == "other"
    assert classify(()) == "other"


def test_stage_shares_time_weighted():
    segs = [Segment(0, 30, stack("run_batch")), Segment(30, 40, stack("recv_requests")),
            Segment(40, 50, stack("_publish"))]
    shares = stage_shares(segs)
    assert shares["run_batch"] == pytest.approx(0.6)
    assert shares["recv_requests"] == pytest.approx(0.2)
    assert shares["other"] == pytest.approx(0.2)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_function_shares_inclusive_self_and_recursion():
    segs = [Segment(0, 50, stack("process_input_requests", "hash_feature", "hash_feature")),
            Segment(50, 100, stack("run_batch"))]
    incl, self_ = function_shares(segs)
    assert incl["hash_feature"] == pytest.approx(0.5)  # counted once despite recursion
    assert incl["event_loop_overlap"] == pytest.approx(1.0)
    assert self_["hash_feature"] == pytest.approx(0.5) and self_["run_batch"] == pytest.approx(0.5)
    assert "process_input_requests" not in self_
    assert select_functions(incl, self_, ["reconstruct_on_target_device"], 1)[0] == "reconstruct_on_target_device"


def test_loop_from_exact_transitions():
    # Every stage sampled: 10 iterations of 20 ms.
    segs, true = sampled_timeline({s: 4.0 for s in LOOP_STAGES}, 10, rate_hz=1e5)
    est = estimate_loop(segs)
    assert est.iterations == 8  # boundaries open iterations 2..10: 8 whole iterations between them
    assert est.mean_s == pytest.approx(true, rel=0.01)


@pytest.mark.parametrize("rate", [1000, 500, 250])
def test_loop_mean_within_tolerance_under_poisson_sampling(rate):
    """20 ms iterations dominated by run_batch (the hardest case for reversal counting)."""
    stages = {"recv_requests": 0.5, "process_input_requests": 2.0, "get_next_batch_to_run": 0.8,
              "run_batch": 14.0, "process_batch_result": 2.7}
    errs = []
    for seed in range(5):
        segs, true = sampled_timeline(stages, 250, rate_hz=rate, seed=seed, jitter=0.1)
        est = estimate_loop(segs)
        errs.append(est.mean_s / true - 1)
    assert max(abs(e) for e in errs) < 0.10, errs
    # Without the missed-boundary correction 250 Hz overestimates badly: the correction does work.
    if rate == 250:
        segs, true = sampled_timeline(stages, 250, rate_hz=rate, seed=0, jitter=0.1)
        assert estimate_loop(segs, split_missed=False).mean_s / true - 1 > 0.10


def test_long_input_burst_is_not_split():
    """A real long process_input_requests visit is work, not a sampling gap: no extra iterations."""
    stages = {"recv_requests": 1.0, "process_input_requests": 1.0, "get_next_batch_to_run": 1.0,
              "run_batch": 14.0, "process_batch_result": 3.0}
    segs, _ = sampled_timeline(stages, 50, rate_hz=1e5, seed=3)
    # Stretch one process_input visit to 60 ms.
    out, shift = [], 0.0
    hit = False
    for s in segs:
        d = s.duration_us
        if not hit and "process_input_requests" in s.stack[-1] and s.start_us > 200e3:
            d, hit = 60e3, True
        out.append(Segment(s.start_us + shift, s.start_us + shift + d, s.stack))
        shift += d - s.duration_us
    est = estimate_loop(out)
    assert est.iterations == 48  # 49 boundaries, no extra splits
    assert max(est.samples_s) > 0.075


def test_pick_scheduler_thread_prefers_event_loop():
    t = ParsedTrace(threads={
        1: [Segment(0, 1000, ("threading (x)", "worker (x)"))],
        2: [Segment(0, 10, stack("run_batch"))],
    })
    assert pick_scheduler_thread(t) == 2
    assert pick_scheduler_thread(ParsedTrace(threads={5: [Segment(0, 3, ("a",))]})) == 5
    assert pick_scheduler_thread(ParsedTrace()) is None


def test_no_boundaries_gives_no_estimate():
    est = estimate_loop([Segment(0, 100, stack("run_batch"))])
    assert est.iterations == 0 and est.mean_s is None
