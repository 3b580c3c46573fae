"""vlm_operator.analysis.stats: the numbers under the gate's comparison (its tests on seeded data are
test_paired.py's and test_compare.py's: the comparison lives in gate.compare)."""

import math

import numpy as np
import pytest

from vlm_operator.analysis import stats


def test_bonferroni_splits_alpha_over_the_product_of_its_parts():
    assert stats.bonferroni(0.05, 10, 2, 5) == pytest.approx(0.0005)
    assert stats.bonferroni(0.05, 0) == 0.05  # an empty part counts as one
    assert stats.bonferroni(0.05) == 0.05


def test_finite_drops_what_cannot_be_compared():
    xs = [0.02, None, float("nan"), -0.019, float("inf"), 0.0]
    assert stats.finite(xs).tolist() == [0.02, -0.019, 0.0]  # differences may be negative
    assert stats.finite(xs, positive=True).tolist() == [0.02]  # a log scale needs values above zero


def test_center_is_the_trimmed_mean_geometric_on_the_log_scale():
    rng = np.random.default_rng(1)
    x = rng.lognormal(0.0, 0.2, 30)
    assert stats.center(list(x), scale="linear") == pytest.approx(np.sort(x)[6:24].mean(), rel=1e-12)
    assert stats.center(list(x), scale="log") == pytest.approx(math.exp(np.log(np.sort(x)[6:24]).mean()),
                                                                rel=1e-12)
    assert stats.center([None, float("nan")], scale="linear") is None
    # one wild window does not move the centre (20% cut from each tail)
    assert stats.center([1.0] * 9 + [100.0], scale="linear") == pytest.approx(1.0)
