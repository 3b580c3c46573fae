"""vlm_operator.analysis.gate.sequential: the error bounds the gate states, checked by simulation.

Each bound is checked where it is tight: an estimate whose error is a Brownian motion in information (pods
joining the canary step by step, windows piling up between them), looked at every minute of a rollout of 8
replicas (1, 2 and 4 canary pods, 30 looks a step). The gate's own estimate on simulated rollouts, with its
estimated variances, is measured in bench/paired_gate.py; these tests fix the rule it rests on.
"""

import dataclasses
import math

import numpy as np
import pytest

from vlm_operator.analysis.gate import sequential

ALPHA = 0.05
PATHS = 20_000
MARGIN = math.log1p(0.03)
POD_SD = 0.02  # one pod's standard error on the test scale, pods' spread and windows together


def _information() -> np.ndarray:
    """The information at each look: per step, its pods' information, rising within the step as windows pile up
    (half of one pod's variance is window noise that falls as 1/looks, half the pod's spread that does not)."""
    out = []
    for pods in (1, 2, 4):
        for look in range(1, 31):
            var_one = POD_SD**2 * (0.5 + 0.5 / look)
            out.append(pods / var_one)
    return np.asarray(out)


def _paths(effect: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(estimates, standard errors) at every look of PATHS rollouts: the score is a Brownian motion with drift in
    information, the estimate the score over the information."""
    info = _information()
    rng = np.random.default_rng(seed)
    steps = np.diff(np.concatenate([[0.0], info]))
    score = np.cumsum(rng.normal(0, 1, (PATHS, info.size)) * np.sqrt(steps), axis=1) + effect * info
    return score / info, 1 / np.sqrt(info)


def _ratio(se: np.ndarray) -> np.ndarray:
    return (1 / se**2) / sequential.target_information(POD_SD**2, 4)


def test_rolling_back_a_canary_at_half_its_margin_is_bounded_by_alpha_over_all_looks():
    est, se = _paths(MARGIN / 2, 1)
    b = np.vectorize(lambda r: sequential.boundary(ALPHA, r))(_ratio(se))
    crossed = ((est - b * se) > MARGIN / 2).any(axis=1).mean()
    assert crossed <= ALPHA  # 90 looks, no split over them
    assert crossed > ALPHA / 4  # and the bound is not vacuous: it spends a fair part of its budget


def test_an_unchanged_canary_is_rolled_back_far_less_often_than_alpha():
    est, se = _paths(0.0, 2)
    b = np.vectorize(lambda r: sequential.boundary(ALPHA, r))(_ratio(se))
    assert ((est - b * se) > MARGIN / 2).any(axis=1).mean() <= ALPHA / 10


def test_promoting_a_canary_at_its_margin_is_bounded_by_alpha_over_the_last_steps_looks():
    est, se = _paths(MARGIN, 3)
    last = slice(60, 90)
    b = np.vectorize(lambda r: sequential.boundary(ALPHA, r))(_ratio(se[last]))
    assert ((est[:, last] + b * se[last]) < MARGIN).any(axis=1).mean() <= ALPHA


def test_expanding_a_canary_at_its_ceiling_is_bounded_and_a_look_at_twice_the_margin_is_as_stated():
    one_se = POD_SD
    ceiling = sequential.ceiling(sequential.EXPAND_ALPHA, one_se, 4, MARGIN)
    assert ceiling > MARGIN  # one pod at a 2% standard error cannot be held under the 3% margin itself
    first_step = slice(4, 30)  # expand looks once the step's analysis time (5 looks) has passed
    est, se = _paths(ceiling, 4)
    b = np.vectorize(lambda r: sequential.boundary(sequential.EXPAND_ALPHA, r))(_ratio(se[first_step]))
    assert ((est[:, first_step] + b * se[first_step]) < ceiling).any(axis=1).mean() <= sequential.EXPAND_ALPHA
    # One look, at the standard error the ceiling was set from: a canary at twice the margin passes as often as
    # `expand_rate` says (what status states), a harmless one almost always (the ceiling's purpose).
    rng = np.random.default_rng(6)
    b1 = sequential.boundary(sequential.EXPAND_ALPHA, 1 / math.sqrt(4))
    for effect in (2 * MARGIN, 0.0):
        d = rng.normal(effect, one_se, PATHS)
        rate = ((d + b1 * one_se) < ceiling).mean()
        assert rate == pytest.approx(sequential.expand_rate(ceiling, effect, one_se, 4), abs=0.01)
    assert sequential.expand_rate(ceiling, 0.0, one_se, 4) == pytest.approx(sequential.EXPAND_POWER)


@pytest.mark.parametrize("alpha", [0.01, 0.05, 0.2])
def test_the_boundary_is_flat_near_its_target_and_its_t_form_is_wider(alpha):
    at = sequential.boundary(alpha, 1.0)
    assert at == pytest.approx(2 * math.sqrt(math.log(1 / alpha) / 2))
    assert sequential.boundary(alpha, 0.5) == pytest.approx(sequential.boundary(alpha, 2.0))
    assert at < sequential.boundary(alpha, 0.5) < 1.07 * at  # Pocock-like: within 7% from half to twice I*
    assert sequential.t_boundary(alpha, 1.0, 5) > at and sequential.t_boundary(alpha, 1.0, math.inf) == at
    with pytest.raises(ValueError):
        sequential.boundary(0.0, 1.0)


def test_the_ceiling_shown_before_the_start_follows_the_fleets_spread_and_a_fixed_one_is_kept():
    from vlm_operator.analysis.gate import Before, Calibration, GatePolicy, ceiling_before_start

    policy = GatePolicy(max_regression={"loop_latency": 0.03}, min_samples=5, max_duration_s=1800, interval_s=60,
                        stale_after_s=120, step_pods=(1, 2, 4))

    def pre(spread: float) -> dict:
        return {f"s{i}": Before(f"s{i}", f"n{i}", off, 20)
                for i, off in enumerate(np.random.default_rng(7).normal(0, spread, 8))}

    tight, loose = (ceiling_before_start(policy, Calibration(), pre(s)) for s in (0.002, 0.08))
    assert tight >= 0.03 and loose > 2 * tight  # never below the margin; a wider fleet, a higher ceiling
    fixed = dataclasses.replace(policy, expand_ceiling={"loop_latency": 0.05})
    assert ceiling_before_start(fixed, Calibration(), pre(0.08)) == 0.05
