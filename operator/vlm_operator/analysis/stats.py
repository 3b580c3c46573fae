"""The numbers under the canary gate's comparison: usable values, the split of an error rate over looks and
signals, trimmed centres, and how much neighbouring windows' dependence widens a variance.

Pure and small on purpose: numbers in, numbers out, no windows, pods or policies (that is `gate`). The
comparison itself, a trimmed-mean t-test on paired differences per canary pod with the pods pooled as pods
(`gate.compare.pool_pods`), is in numpy with `tdist`'s t distribution, so the operator does not load scipy:
- per-window scheduler values have heavy right tails (GC pauses, a long prefill batch in one
  window); trimming 20% per tail keeps one such window from deciding a rollout, while keeping
  far more power than a median test on the 10-60 windows a canary step yields;
- unlike a rank test it gives a confidence interval for the effect size itself, which is what a
  margin ("at most +3% slower") is compared against;
- pairing by time slice cancels load that moves both revisions (a traffic ramp).
Latencies are compared on the log scale, so the effect is a ratio (canary / baseline - 1) and
multiplicative pod or load factors do not skew it; shares are compared as plain differences.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from vlm_operator.analysis.tdist import trim_mean

Scale = Literal["log", "linear"]

# Fraction cut from each tail before the means and variances are taken (Yuen). 0.2 is the usual
# choice (Wilcox): robust to a few wild windows, about 95% as efficient as the mean on normal data.
DEFAULT_TRIM = 0.2
# Yuen's test needs at least two values left after trimming on each side.
MIN_PER_SIDE = 3


def finite(values: Sequence[float | None], *, positive: bool = False) -> np.ndarray:
    """The usable values of a sequence: drops None, NaN, infinities and (for log scale) values <= 0."""
    out = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    arr = np.asarray(out, dtype=float)
    return arr[arr > 0] if positive else arr


def bonferroni(alpha: float, *parts: int) -> float:
    """alpha split evenly over the product of `parts` (looks x signals ...): valid whatever their correlation."""
    k = 1
    for p in parts:
        k *= max(1, int(p))
    return alpha / k


def center(values: Sequence[float | None], *, scale: Scale, trim: float = DEFAULT_TRIM) -> float | None:
    """The trimmed mean of the usable values (geometric for `log`): what a side's level is reported as."""
    x = finite(values, positive=scale == "log")
    if x.size == 0:
        return None
    if scale == "log":
        return math.exp(float(trim_mean(np.log(x), trim)))
    return float(trim_mean(x, trim))


def autocorrelation_factor(series: Sequence[Sequence[float]], max_lag: int | None = None) -> float:
    """How much dependence between neighbouring windows widens the variance of a mean (>= 1).

    Host noise is not independent from window to window (neighbouring windows correlate, and still a minute
    apart: docs/benchmarks.md, "Windows are not independent"), so a standard error that assumes independent
    windows is too small. This is the Newey-West (Bartlett kernel) long-run variance over the plain variance,
    1 + 2 sum_l (1 - l/(L+1)) rho_l, with the autocorrelations pooled over `series` (one time-ordered series per
    pod, each centred on its own mean so pod offsets are not read as dependence). Lag window L = ceil(n^(1/3)) of
    the longest series unless given. Floored at 1 (negative correlation never narrows a bound) and capped at 1 + 2L.
    """
    xs = [np.asarray([v for v in s if v is not None and math.isfinite(v)], dtype=float) for s in series]
    xs = [x - x.mean() for x in xs if x.size >= 3]
    if not xs:
        return 1.0
    n_max = max(x.size for x in xs)
    lag = max_lag if max_lag is not None else max(1, math.ceil(n_max ** (1 / 3)))
    var = sum(float(x @ x) for x in xs)
    if var <= 0:
        return 1.0
    factor = 1.0
    for k in range(1, lag + 1):
        cov = sum(float(x[k:] @ x[:-k]) for x in xs if x.size > k)
        factor += 2 * (1 - k / (lag + 1)) * cov / var
    return min(max(1.0, factor), 1.0 + 2 * lag)
