"""Comparisons for the canary gate: effect size, one-sided confidence bounds, p-values.

Pure and small on purpose: numbers in, numbers out, no windows, pods or policies (that is `gate`).
The test is Yuen's one-sample trimmed-mean t-test on paired differences (canary minus the baseline of
the same time slice; `paired_many`), in numpy with `tdist`'s t distribution, so the operator does not
load scipy:
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
from dataclasses import dataclass
from typing import Literal

import numpy as np

from vlm_operator.analysis.tdist import t_cdf, t_ppf, t_sf, trim_mean

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


def planned_looks(max_duration_s: float, interval_s: float) -> int:
    """How many analyses fit into max_duration: the Bonferroni divisor for repeated looks."""
    if interval_s <= 0:
        raise ValueError("interval_s must be positive")
    return max(1, math.ceil(max_duration_s / interval_s - 1e-9))


def bonferroni(alpha: float, *parts: int) -> float:
    """alpha split evenly over the product of `parts` (looks x signals ...): valid whatever their correlation."""
    k = 1
    for p in parts:
        k *= max(1, int(p))
    return alpha / k


def mixture_multiplier(n: int, alpha: float, r: float) -> float:
    """Half-width of a one-sided normal-mixture confidence sequence for a mean, in standard errors.

    For n observations with standard error s, `mean - mixture_multiplier(...) * s` is a lower bound
    that holds at every n at once with probability 1 - alpha (Robbins' normal mixture, with Ville's
    inequality; Howard et al. 2021), so an analysis may look as often as it likes. `r` is the number of
    observations where the boundary is tightest. Two-sided mixture at level alpha: conservative for
    one side.
    """
    if n < 1 or not 0 < alpha < 1 or r <= 0:
        raise ValueError(f"need n >= 1, alpha in (0, 1), r > 0; got {n}, {alpha}, {r}")
    return math.sqrt((1 + r / n) * 2 * math.log(math.sqrt(1 + n / r) / alpha))


@dataclass(frozen=True)
class Paired:
    """A one-sample comparison of paired differences (canary minus its concurrent baseline), on the test's
    scale (log differences for `log`). `delta`, `low` and `high` are on the signal's natural scale:
    relative change (canary / baseline - 1) for `log`, absolute difference for `linear`. `low` is a
    one-sided lower bound at level 1 - alpha_low and includes `extra_var_low`, `high` an upper bound at
    1 - alpha_high with `extra_var_high`. `p_greater` is the one-sided p-value of H0 "canary <= baseline",
    `p_less` of H0 "canary >= baseline"."""

    delta: float
    low: float
    high: float
    p_greater: float
    p_less: float
    n: int


def paired_many(
    rows: Sequence[Sequence[float]],
    *,
    scale: Scale,
    alpha_low: float,
    alpha_high: float,
    trim: float = DEFAULT_TRIM,
    extra_var_low: Sequence[float] | None = None,
    extra_var_high: Sequence[float] | None = None,
    anytime_r: float | None = None,
    var_factor: Sequence[float] | None = None,
    extra_df: Sequence[float] | None = None,
) -> list[Paired | None]:
    """Yuen's one-sample trimmed-mean t-test per row of differences (Tukey-McLaughlin standard error:
    winsorized variance, h - 1 degrees of freedom), in plain numpy.

    Each row holds one difference per time slice, canary minus the baseline windows of the same slice:
    load that moves both revisions (a traffic ramp) cancels in every difference instead of widening the
    spread of both samples. `extra_var_*` (per row, on the test scale) is added to the squared standard
    error of the bound on that side (the gate passes the between-pod variance for the rollback bound).
    p-values use the larger of the two variances. None for rows with fewer than MIN_PER_SIDE values.

    `anytime_r`: bounds from a normal-mixture confidence sequence (`mixture_multiplier`) instead of
    the t quantile: valid at every look, however many, at the cost of width at any one look.
    `var_factor` (per row, >= 1) widens the windows' squared standard error for their dependence in time
    (`autocorrelation_factor`); `extra_df` (per row): the degrees of freedom behind the extra variance, itself
    an estimate; the t quantile then takes the Welch-Satterthwaite degrees of freedom of the sum.
    """
    if not (0 < alpha_low < 0.5 and 0 < alpha_high < 0.5):
        raise ValueError(f"alphas must be in (0, 0.5), got {alpha_low}, {alpha_high}")
    out: list[Paired | None] = []
    for i, raw in enumerate(rows):
        d = np.sort(np.asarray([x for x in raw if x is not None and math.isfinite(x)], dtype=float))
        n = int(d.size)
        if n < MIN_PER_SIDE:
            out.append(None)
            continue
        g = math.floor(trim * n)
        h = n - 2 * g
        tm = float(d[g : n - g].mean())
        w = np.clip(d, d[g], d[n - 1 - g])
        var_w = float(w.var(ddof=1)) if n > 1 else 0.0
        se2 = (n - 1) * var_w / (h * (h - 1)) if h > 1 else math.inf
        if var_factor is not None:
            se2 *= max(1.0, float(var_factor[i]))
        df = max(1, h - 1)
        ex_l = max(0.0, float(extra_var_low[i])) if extra_var_low is not None else 0.0
        ex_h = max(0.0, float(extra_var_high[i])) if extra_var_high is not None else 0.0
        df_l = df_h = float(df)
        if extra_df is not None and math.isfinite(extra_df[i]) and extra_df[i] > 0 and math.isfinite(se2):
            df_l, df_h = (_satterthwaite(se2, df, ex, float(extra_df[i])) for ex in (ex_l, ex_h))
        se_l, se_h = math.sqrt(se2 + ex_l), math.sqrt(se2 + ex_h)
        if anytime_r is None:
            z_l, z_h = float(t_ppf(1 - alpha_low, df_l)), float(t_ppf(1 - alpha_high, df_h))
        else:
            z_l, z_h = mixture_multiplier(h, alpha_low, anytime_r), mixture_multiplier(h, alpha_high, anytime_r)
        low = tm - z_l * se_l
        high = tm + z_h * se_h
        se_p = max(se_l, se_h)
        if se_p > 0:
            t = tm / se_p
            p_greater, p_less = float(t_sf(t, df)), float(t_cdf(t, df))
        else:  # every difference identical: known exactly
            p_greater = 0.0 if tm > 0 else 1.0
            p_less = 0.0 if tm < 0 else 1.0
        if scale == "log":
            out.append(Paired(math.expm1(tm), math.expm1(low), math.expm1(high), p_greater, p_less, n))
        else:
            out.append(Paired(tm, low, high, p_greater, p_less, n))
    return out


def _satterthwaite(a: float, df_a: float, b: float, df_b: float) -> float:
    """Degrees of freedom of the sum of two independent variance estimates (Welch-Satterthwaite)."""
    if b <= 0:
        return df_a
    den = a * a / df_a + b * b / df_b
    return (a + b) ** 2 / den if den > 0 else df_a


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
