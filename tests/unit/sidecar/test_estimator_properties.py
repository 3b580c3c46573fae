"""Loop estimator against simulated SGLang loops whose truth is known (testing/vlm_testing/loopsim.py).

At py-spy's defaults here (1000 Hz, 5 s windows): loop mean within 5% and p95 within 10% on every
named shape (on the stand-in's acceptance shapes, whose ~2 ms input stages hide a few percent of the
boundaries: unbiased within 1%, per window within 8%, the median of three windows within 5%), and the
direction of a >= 5% change in the true mean is never lost. Derandomized so a run is reproducible; widen
max_examples locally to search harder.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vlm_sidecar.estimators import classify, estimate_loop, stage_shares
from vlm_sidecar.parser import function_name
from vlm_testing.loopsim import SHAPES, Shape, random_shape, simulate

PROPS = settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _est(sim, rate_hz: float = 1000.0):
    return estimate_loop(sim.segments, rate_hz=rate_hz)


# Short input stages (the stand-in as test_acceptance runs it): boundaries hide, and the capture-recapture
# correction adds them back by count, unbiased but with +-2.5% of noise per window (loopsim.py).
HIDING = ("standin_acceptance_v0_5_23", "standin_acceptance_consecutive")


@pytest.mark.parametrize("name", sorted(SHAPES))
@PROPS
@given(seed=st.integers(0, 2**31 - 1))
def test_error_bounds_per_shape(name, seed):
    sim = simulate(SHAPES[name], seed=seed)
    est = _est(sim)
    tol = 0.08 if name in HIDING else 0.05
    assert est.mean_s / sim.mean_s - 1 == pytest.approx(0, abs=tol), (est.mean_s, sim.mean_s)
    assert est.p95_s / sim.quantile_s(0.95) - 1 == pytest.approx(0, abs=0.10), (est.p95_s, sim.quantile_s(0.95))
    assert len(est.samples_s) == est.iterations
    assert est.p50_s <= est.p95_s


@pytest.mark.parametrize("name", HIDING)
def test_hidden_batch_boundaries_are_added_back_without_bias(name, monkeypatch):
    """Over 60 windows the mean is unbiased within 1% and the median of each three within 5% (what
    test_acceptance asks of live py-spy); without the correction the same windows read 3-5% long."""
    import statistics

    from vlm_sidecar import estimators

    def errors() -> list[float]:
        return [_est(sim).mean_s / sim.mean_s - 1 for sim in (simulate(SHAPES[name], seed=s) for s in range(60))]

    errs = errors()
    assert abs(statistics.mean(errs)) <= 0.01, statistics.mean(errs)
    assert max(abs(statistics.median(errs[i:i + 3])) for i in range(0, 60, 3)) <= 0.05
    monkeypatch.setattr(estimators, "_split_hidden_batch_boundaries", lambda *_: 0)
    assert statistics.mean(errors()) >= 0.03  # the bias the correction removes


@PROPS
@given(seed=st.integers(0, 2**31 - 1))
def test_a_few_long_sampling_gaps_do_not_break_it(seed):
    """A throttled sidecar: ten gaps of 4-12 ms in the window."""
    for name in ("decode", "prefill_every_5", "reorder_every_4"):
        sim = simulate(SHAPES[name], seed=seed, long_gaps=10)
        assert abs(_est(sim).mean_s / sim.mean_s - 1) <= 0.05


def test_prefill_regression_is_visible():
    """The table's case: image prefills 25% slower move the true mean +11%; the estimate must follow."""
    for seed in range(3):
        base = _est(simulate(SHAPES["prefill_every_5"], seed=seed)).mean_s
        slow = _est(simulate(SHAPES["prefill_every_5_slower"], seed=seed + 100)).mean_s
        assert slow / base - 1 == pytest.approx(0.11, abs=0.03)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), factor=st.sampled_from([0.8, 0.85, 0.9, 1.1, 1.15, 1.25]),
       what=st.sampled_from(["decode_ms", "prefill_ms", "input_ms", "result_ms", "all"]))
def test_sign_of_a_5pct_change_is_preserved(seed, factor, what):
    rng = random.Random(seed)
    a_shape = random_shape(rng)
    fields = ["decode_ms", "prefill_ms", "input_ms", "result_ms", "schedule_ms"] if what == "all" else [what]
    b_shape = a_shape.scaled(**dict.fromkeys(fields, factor))
    a = simulate(a_shape, seed=rng.randrange(2**31))
    b = simulate(b_shape, seed=rng.randrange(2**31))
    true_change = b.mean_s / a.mean_s - 1
    assume(abs(true_change) >= 0.05)
    est_change = _est(b).mean_s / _est(a).mean_s - 1
    assert math.copysign(1, est_change) == math.copysign(1, true_change), (true_change, est_change, a_shape)


# The simulator itself: its output must look like the parser's, and its truth must be right.


@pytest.mark.parametrize("name", ["decode", "v0_5_17", "v0_5_23", "idle_heavy_v0_5_23"])
def test_simulated_segments_look_like_parser_output(name):
    sim = simulate(SHAPES[name], seed=7)
    segs = sim.segments
    assert segs[0].start_us > 0 and segs[-1].end_us == pytest.approx(sim.window_s * 1e6)
    for prev, cur in itertools.pairwise(segs):
        assert prev.end_us == cur.start_us and prev.stack != cur.stack  # contiguous, equal stacks merged
    assert all(s.duration_us > 0 and s.stack[2].endswith("(scheduler.py)") for s in segs)
    names = {function_name(f) for s in segs for f in s.stack}
    if name.startswith("v0_5_23") or name.endswith("v0_5_23"):
        assert {"ingest_requests", "wrapper", "on_idle" if "idle" in name else "pop_and_process"} <= names
    elif name == "v0_5_17":
        assert "wrapper" in names and "ingest_requests" not in names
    else:
        assert "wrapper" not in names
    assert len(segs) < sim.samples <= 5500
    assert simulate(SHAPES[name], seed=7).segments == segs  # seeded


def test_simulated_truth():
    assert simulate(SHAPES["decode"], seed=1).mean_s == pytest.approx(0.0179, rel=0.02)
    assert simulate(SHAPES["prefill_every_5"], seed=1).mean_s == pytest.approx(0.0275, rel=0.03)
    sim = simulate(Shape("exact", jitter=0.0), seed=1)
    assert sim.durations_s == pytest.approx([0.0179 + 45e-6] * len(sim.durations_s))  # + the loop's own code


def test_simulated_stage_shares_match_truth():
    sim = simulate(SHAPES["v0_5_23"], seed=3)
    truth: dict[str, float] = {}
    for a, b, stack in sim.pieces:
        a, b = max(a, 0.0), min(b, sim.window_s * 1e6)
        if b > a:
            truth[classify(stack)] = truth.get(classify(stack), 0.0) + (b - a)
    total = sum(truth.values())
    shares = stage_shares(sim.segments)
    for stage, t in truth.items():
        assert shares[stage] == pytest.approx(t / total, abs=0.02), stage


@PROPS
@given(seed=st.integers(0, 2**31 - 1))
def test_single_stack_stages_with_long_gaps(seed):
    """The stand-in's stages are one stack each, so a stage's two calls around a hidden boundary merge into
    one segment; with py-spy's stalls (here 40 gaps of 4-12 ms) the loop mean must still hold."""
    for name in ("standin_v0_5_17", "standin_v0_5_23"):
        sim = simulate(SHAPES[name], seed=seed, long_gaps=40)
        assert abs(_est(sim).mean_s / sim.mean_s - 1) <= 0.05
