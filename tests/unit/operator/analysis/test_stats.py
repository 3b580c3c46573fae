"""vlm_operator.analysis.stats: effect sizes, one-sided bounds and error rates on seeded data."""

import math

import numpy as np
import pytest

from vlm_operator.analysis import stats


def _paired(d, scale="log", a_low=0.05, a_high=0.05, **kw):
    return stats.paired_many([d], scale=scale, alpha_low=a_low, alpha_high=a_high, **kw)[0]


def test_log_scale_reports_a_ratio():
    rng = np.random.default_rng(1)
    d = rng.normal(math.log(1.10), 0.03, 40)  # log(canary) - log(baseline) per time slice: 10% slower
    res = _paired(list(d))
    assert res is not None and res.n == 40
    assert res.delta == pytest.approx(math.expm1(np.sort(d)[8:32].mean()), abs=1e-12)  # 20% trimmed per tail
    assert res.low < 0.10 < res.high


def test_linear_scale_is_an_absolute_difference():
    rng = np.random.default_rng(2)
    d = rng.normal(0.04, 0.005, 30)
    res = _paired(list(d), scale="linear")
    assert res.delta == pytest.approx(np.sort(d)[6:24].mean(), abs=1e-12)  # 20% trimmed from each tail
    assert res.low < res.delta < res.high


def test_unusable_values_are_dropped_and_too_few_gives_none():
    res = _paired([0.02, None, float("nan"), 0.021, -0.019, float("inf")])
    assert res is not None and res.n == 3  # differences may be negative: only None and non-finite go
    assert _paired([0.02, 0.021]) is None
    assert _paired([None, None, 0.02]) is None


def test_constant_differences_are_known_exactly():
    res = _paired([0.0] * 5)
    assert (res.delta, res.low, res.high) == (0.0, 0.0, 0.0)
    assert res.p_greater == res.p_less == 1.0  # no difference: no evidence either way
    res = _paired([0.01] * 5, scale="linear")
    assert (res.delta, res.low, res.high) == (0.01, 0.01, 0.01)
    assert (res.p_greater, res.p_less) == (0.0, 1.0)


def test_bounds_widen_as_alpha_shrinks():
    rng = np.random.default_rng(3)
    d = list(rng.normal(0.02, 0.07, 20))
    loose = _paired(d, a_low=0.05, a_high=0.05)
    strict = _paired(d, a_low=0.001, a_high=0.001)
    assert strict.low < loose.low < loose.delta < loose.high < strict.high
    assert strict.delta == loose.delta


def test_one_sided_lower_bound_covers_the_truth_at_its_level():
    # 400 seeded experiments, normal differences, true ratio 1.05: the 95% lower bound should sit below
    # the truth ~95% of the time (binomial sd ~1.1%; 91-98.5% leaves room for Yuen's approximation).
    truth = 0.05
    covered = 0
    for seed in range(400):
        rng = np.random.default_rng([7, seed])
        d = rng.normal(math.log1p(truth), 0.04, 12)
        covered += _paired(list(d), a_low=0.05).low < truth
    assert 0.91 <= covered / 400 <= 0.985


def test_false_positive_rate_holds_under_heavy_tails():
    # Student-t(3) noise plus rare large spikes, no true difference: one-sided p < 0.05 about 5% of the
    # time, not more; a plain t-test on such data overreacts to single spikes, trimming does not.
    hits = 0
    for seed in range(400):
        rng = np.random.default_rng([11, seed])
        d = 0.03 * rng.standard_t(3, 24)
        d += np.where(rng.random(24) < 0.03, np.log(1.5), 0.0)
        hits += _paired(list(d)).p_greater < 0.05
    assert hits / 400 <= 0.08


def test_a_single_wild_window_does_not_decide():
    rng = np.random.default_rng(5)
    d = list(rng.normal(0.0, 0.02, 12))
    d[3] = math.log(10)  # one slice 10x slower (a GC pause, a stuck batch)
    res = _paired(d, a_low=0.01)
    assert res.low < 0 < res.high
    assert abs(res.delta) < 0.03


def test_extra_variance_widens_its_own_side():
    d = list(np.random.default_rng(6).normal(0.03, 0.02, 16))
    plain = _paired(d, scale="linear")
    low = _paired(d, scale="linear", extra_var_low=[0.01**2])
    high = _paired(d, scale="linear", extra_var_high=[0.01**2])
    assert low.low < plain.low and low.high == plain.high and low.delta == plain.delta
    assert high.high > plain.high and high.low == plain.low
    # p-values take the larger variance: extra variance on either side is less evidence.
    assert low.p_greater > plain.p_greater and high.p_greater > plain.p_greater


def test_rows_are_compared_independently():
    rng = np.random.default_rng(9)
    rows = [list(rng.normal(0.01 * i, 0.01, 8 + i)) for i in range(4)]
    rows[2] = rows[2][:2]  # too few: None, the others unaffected
    many = stats.paired_many(rows, scale="linear", alpha_low=0.01, alpha_high=0.05)
    assert many[2] is None
    for row, m in zip(rows, many, strict=True):
        assert m == stats.paired_many([row], scale="linear", alpha_low=0.01, alpha_high=0.05)[0]


def test_alpha_outside_range_is_rejected():
    with pytest.raises(ValueError):
        _paired([1, 2, 3], a_low=0.0)
    with pytest.raises(ValueError):
        _paired([1, 2, 3], a_high=0.5)


def test_planned_looks_and_bonferroni():
    assert stats.planned_looks(1800, 60) == 30
    assert stats.planned_looks(90, 60) == 2
    assert stats.planned_looks(10, 60) == 1
    assert stats.bonferroni(0.05, 10, 2, 5) == pytest.approx(0.0005)
    assert stats.bonferroni(0.05, 0) == 0.05
    with pytest.raises(ValueError):
        stats.planned_looks(60, 0)


def test_confidence_sequence_holds_at_every_look():
    # 2000 streams of 300 standard-normal differences, bound checked after every one: the share of
    # streams whose lower bound ever rises above the true mean (0) stays within alpha; the fixed-n
    # bound at the same level, checked as often, crosses far more often (why looks need a correction).
    rng = np.random.default_rng(7)
    alpha, r = 0.05, 60.0
    x = rng.standard_normal((2000, 300))
    n = np.arange(1, 301)
    mean = np.cumsum(x, axis=1) / n
    se = 1 / np.sqrt(n)
    z_cs = np.array([stats.mixture_multiplier(int(k), alpha, r) for k in n])
    crossed_cs = ((mean - z_cs * se) > 0)[:, 2:].any(axis=1).mean()
    crossed_fixed = ((mean - 1.645 * se) > 0)[:, 2:].any(axis=1).mean()
    assert crossed_cs <= alpha
    assert crossed_fixed > 3 * alpha


def test_confidence_sequence_is_tightest_near_r_and_wider_than_one_look():
    m = [stats.mixture_multiplier(n, 0.05, 100.0) for n in (10, 100, 1000)]
    assert all(v > 1.645 for v in m)
    assert stats.mixture_multiplier(100, 0.01, 100.0) > m[1]
    with pytest.raises(ValueError):
        stats.mixture_multiplier(0, 0.05, 100.0)


def test_paired_many_anytime_bounds_are_wider_than_the_t_bounds():
    rows = [list(np.random.default_rng(3).normal(0.02, 0.05, 80))]
    t = stats.paired_many(rows, scale="linear", alpha_low=0.01, alpha_high=0.01)[0]
    cs = stats.paired_many(rows, scale="linear", alpha_low=0.01, alpha_high=0.01, anytime_r=40.0)[0]
    assert cs.delta == pytest.approx(t.delta)
    assert cs.low < t.low and cs.high > t.high
