"""The operator's own t distribution and Yuen statistics (vlm_operator.tdist) against scipy, the reference
they replace (a test dependency only), over the degrees of freedom and tail probabilities the gate uses."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as ref
from vlm_operator import stats, tdist

RNG = np.random.default_rng(7)
DFS = np.concatenate([[1.0, 1.5, 2.0, 3.0, 4.7, 10.0, 30.0, 99.5, 1000.0], RNG.uniform(1.0, 300.0, 40)])


def test_tail_probabilities_match_scipy():
    ts = np.concatenate([[0.0, 1e-9, 0.3, 1.0, 1.96, 4.0, 12.0, 80.0, -0.7, -3.0, -25.0], RNG.normal(0, 6, 60)])
    t, df = np.meshgrid(ts, DFS)
    want, got = ref.t.sf(t, df), tdist.t_sf(t, df)
    ok = want > 1e-300
    assert np.max(np.abs(got[ok] - want[ok]) / want[ok]) < 1e-9
    assert np.allclose(tdist.t_cdf(t, df), ref.t.cdf(t, df), rtol=1e-9, atol=1e-300)
    assert tdist.t_sf(0.0, 5.0) == pytest.approx(0.5, abs=1e-15)


def test_quantiles_match_scipy_deep_in_the_tails():
    """Bonferroni over looks and signals takes the gate to tail probabilities of 1e-6 and below."""
    ps = np.array([1e-10, 1e-7, 1e-5, 1e-3, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.999, 1 - 1e-8])
    p, df = np.meshgrid(ps, DFS)
    want, got = ref.t.ppf(p, df), tdist.t_ppf(p, df)
    assert np.allclose(got, want, rtol=1e-9, atol=1e-12), np.max(np.abs(got - want))


def test_bad_input_gives_nan_not_an_exception():
    for bad in (tdist.t_ppf(0.0, 3), tdist.t_ppf(1.0, 3), tdist.t_ppf(0.9, 0.0), tdist.t_ppf(math.nan, 3),
                tdist.t_sf(math.nan, 3), tdist.t_sf(1.0, -1.0)):
        assert math.isnan(float(bad))
    assert float(tdist.t_sf(math.inf, 3)) == 0.0 and float(tdist.t_sf(-math.inf, 3)) == 1.0


@pytest.mark.parametrize(("n_c", "n_b"), [(3, 3), (5, 8), (12, 30), (40, 90), (4, 60)])
def test_yuen_matches_scipys_trimmed_welch_test(n_c, n_b):
    c = RNG.lognormal(0.0, 0.3, (6, n_c))
    b = RNG.lognormal(0.05, 0.2, (6, n_b))
    want = ref.ttest_ind(c, b, axis=1, equal_var=False, trim=0.2)
    stat, df, se, diff = tdist.yuen(c, b, 0.2)
    ci = want.confidence_interval(0.5)
    assert np.allclose(stat, want.statistic, rtol=1e-12) and np.allclose(df, want.df, rtol=1e-12)
    assert np.allclose(se, (ci.high - ci.low) / (2 * ref.t.ppf(0.75, want.df)), rtol=1e-9)
    assert np.allclose(diff, ref.trim_mean(c, 0.2, axis=1) - ref.trim_mean(b, 0.2, axis=1), rtol=1e-12)
    assert np.allclose(tdist.trim_mean(b, 0.2, axis=1), ref.trim_mean(b, 0.2, axis=1), rtol=1e-12)


def test_gate_comparisons_are_what_scipy_would_give():
    """compare_many and paired_many on random rows: every bound and p-value as the scipy-based versions
    computed them (reimplemented here from scipy's documented functions)."""
    for _trial in range(40):
        nb, nc = int(RNG.integers(5, 60)), int(RNG.integers(5, 30))
        b = RNG.lognormal(0.0, 0.1, nb)
        c = RNG.lognormal(float(RNG.normal(0, 0.05)), 0.1, nc)
        al, ah = float(RNG.uniform(1e-6, 0.2)), float(RNG.uniform(1e-6, 0.2))
        got = stats.compare(b, c, scale="log", alpha_low=al, alpha_high=ah)
        lb, lc = np.log(b), np.log(c)
        r = ref.ttest_ind(lc, lb, equal_var=False, trim=0.2)
        ci = r.confidence_interval(0.5)
        se = (ci.high - ci.low) / (2 * ref.t.ppf(0.75, r.df))
        d = ref.trim_mean(lc, 0.2) - ref.trim_mean(lb, 0.2)
        assert got.delta == pytest.approx(math.expm1(d), rel=1e-9, abs=1e-12)
        assert got.low == pytest.approx(math.expm1(d - ref.t.ppf(1 - al, r.df) * se), rel=1e-8, abs=1e-12)
        assert got.high == pytest.approx(math.expm1(d + ref.t.ppf(1 - ah, r.df) * se), rel=1e-8, abs=1e-12)
        assert got.p_greater == pytest.approx(float(ref.t.sf(d / se, r.df)), rel=1e-8, abs=1e-300)
        x = RNG.normal(0.01, 0.05, nc)
        (p,) = stats.paired_many([x], scale="linear", alpha_low=al, alpha_high=ah)
        g = int(0.2 * nc)
        h = nc - 2 * g
        w = np.clip(np.sort(x), np.sort(x)[g], np.sort(x)[nc - 1 - g])
        se_p = math.sqrt((nc - 1) * w.var(ddof=1) / (h * (h - 1)))
        assert p.low == pytest.approx(ref.trim_mean(x, 0.2) - ref.t.ppf(1 - al, h - 1) * se_p, rel=1e-8, abs=1e-12)
