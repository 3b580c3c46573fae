"""The operator's own t distribution and trimmed mean (vlm_operator.analysis.tdist) against scipy, the reference
they replace (a test dependency only), over the degrees of freedom and tail probabilities the gate uses."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as ref

from vlm_operator.analysis import tdist

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


@pytest.mark.parametrize("n", [3, 5, 8, 12, 30, 90])
def test_trim_mean_matches_scipy(n):
    a = RNG.lognormal(0.05, 0.2, (6, n))
    assert np.allclose(tdist.trim_mean(a, 0.2, axis=1), ref.trim_mean(a, 0.2, axis=1), rtol=1e-12)
    assert np.allclose(tdist.trim_mean(a.T, 0.2, axis=0), ref.trim_mean(a, 0.2, axis=1), rtol=1e-12)
