"""Student's t distribution and trimmed means in plain numpy. Pure.

The gate needs the t distribution's tail probabilities and quantiles at a few dozen (value, degrees of
freedom) pairs per decision, and trimmed means. scipy has them, but importing scipy.stats loads its whole
compiled stack into the operator, a large share of the operator's memory budget (docs/benchmarks.md, "No
scipy in the operator"); these are a hundred lines. tests/unit/operator/analysis/test_tdist.py checks them
against scipy (a test dependency only) across the degrees of freedom and tail probabilities the gate uses.

- `t_sf(t, df)`: P(T > t), from the regularised incomplete beta function (Lentz's continued fraction),
  `t_cdf(t, df)` = `t_sf(-t, df)`; accurate to ~1e-12 relative where the value is above 1e-300.
- `t_ppf(p, df)`: the quantile, by Newton's method on the log tail from a normal start (bisection-safe).
- `trim_mean`: the trimmed mean, as `scipy.stats.trim_mean` computes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from statistics import NormalDist

import numpy as np

_TINY = 1e-300
_EPS = 3e-16
_MAX_ITER = 2000


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) >= _TINY else _TINY)
    h = d
    for m in range(1, _MAX_ITER):
        m2 = 2.0 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) >= _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) >= _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) >= _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) >= _TINY else _TINY
        step = d * c
        h *= step
        if abs(step - 1.0) < _EPS:
            break
    return h


def _betainc(a: float, b: float, x: float, omx: float) -> float:
    """The regularised incomplete beta function I_x(a, b), with 1 - x passed in exactly (no cancellation)."""
    if x <= 0.0:
        return 0.0
    if omx <= 0.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(omx))
    if x < (a + 1.0) / (a + b + 2.0):
        return min(1.0, front * _betacf(a, b, x) / a)
    return max(0.0, 1.0 - front * _betacf(b, a, omx) / b)


def _sf(t: float, df: float) -> float:
    if math.isnan(t) or math.isnan(df) or df <= 0:
        return math.nan
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    t2 = t * t
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t2), t2 / (df + t2))  # P(|T| > |t|) / 2
    return tail if t > 0 else 1.0 - tail


def _pdf(t: float, df: float) -> float:
    return math.exp(math.lgamma((df + 1.0) / 2.0) - math.lgamma(df / 2.0) - 0.5 * math.log(df * math.pi)
                    - (df + 1.0) / 2.0 * math.log1p(t * t / df))


_NORMAL = NormalDist()


@lru_cache(maxsize=4096)
def _ppf(p: float, df: float) -> float:
    if math.isnan(p) or math.isnan(df) or df <= 0 or not 0.0 < p < 1.0:
        return math.nan
    if p == 0.5:
        return 0.0
    q = 1.0 - p if p > 0.5 else p  # the smaller tail, solved for t > 0
    z = _NORMAL.inv_cdf(1.0 - q)
    # Cornish-Fisher start, then Newton on log P(T > t) = log q inside a bracket that only narrows.
    t = max(0.0, z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2))
    lo, hi, logq = 0.0, math.inf, math.log(q)
    for _ in range(200):
        s = _sf(t, df)
        f = math.log(max(s, 1e-300)) - logq
        if f > 0:
            lo = t  # the tail is still heavier than q: t must grow
        elif f < 0:
            hi = t
        else:
            break
        new = t + f * s / max(_pdf(t, df), 1e-300)  # Newton: d log s / dt = -pdf / s
        if not lo < new < hi:
            new = max(2.0 * t, lo + 1.0) if math.isinf(hi) else (lo + hi) / 2.0
        if abs(new - t) <= 1e-14 * max(1.0, abs(t)):
            t = new
            break
        t = new
    return t if p > 0.5 else -t


def _map(fn: Callable[[float, float], float], x: np.ndarray | float, df: np.ndarray | float) -> np.ndarray:
    xs, ds = np.broadcast_arrays(np.asarray(x, dtype=float), np.asarray(df, dtype=float))
    out = np.fromiter((fn(float(a), float(b)) for a, b in zip(xs.ravel(), ds.ravel(), strict=True)), dtype=float,
                      count=xs.size)
    return out.reshape(xs.shape)


def t_sf(t: np.ndarray | float, df: np.ndarray | float) -> np.ndarray:
    """P(T > t) for Student's t with `df` degrees of freedom (NaN in, NaN out), element-wise."""
    return _map(_sf, t, df)


def t_cdf(t: np.ndarray | float, df: np.ndarray | float) -> np.ndarray:
    return _map(lambda a, b: _sf(-a, b), t, df)


def t_ppf(p: np.ndarray | float, df: np.ndarray | float) -> np.ndarray:
    """The quantile: the t with P(T <= t) = p (NaN for p outside (0, 1), df <= 0 or NaN), element-wise."""
    return _map(_ppf, p, df)


def trim_mean(a: np.ndarray, trim: float, axis: int = -1) -> np.ndarray:
    """Mean after cutting int(trim * n) values from each end along `axis` (scipy.stats.trim_mean)."""
    a = np.sort(np.asarray(a, dtype=float), axis=axis)
    n = a.shape[axis]
    g = int(trim * n)
    return np.take(a, np.arange(g, n - g), axis=axis).mean(axis=axis)
