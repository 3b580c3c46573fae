"""The request mix as a regression covariate (CUPED-style): what a window's value owes to the requests it served.

A pod's loop latency, TTFT, ITL and throughput in a window move with the requests the router happened to send it:
longer prompts (image tokens included) mean longer prefills. Time pairing cancels what every pod saw at that moment,
not what one pod got more of. The covariate is each window's prompt tokens per finished request (SGLang's own
counters, `Window.prompt_tokens_per_request`): the router sets it, the revision does not.

Per signal (log scale), the slope of the value on log prompt tokens per request is fitted **on the baseline's
windows only**, within each pod (pod offsets removed), so the canary's effect can never leak into it. Every window
of both revisions is then moved to the baseline's mean mix: value x exp(-slope (x - center)). The canary's
windows get the same correction as the baseline's, so a canary that served the same mix keeps its effect exactly
and one that served a heavier mix is not read as slower.

Left out (the signal is compared as measured) when:
- fewer than MIN_UNITS baseline units or MIN_UNITS / 2 canary units carry the covariate;
- the slope is not clearly there (|t| < MIN_SLOPE_T): an irrelevant covariate would only add noise;
- the revisions' mean mix differs by more than MAX_MIX_SHIFT_T standard errors (widened for the windows'
  dependence in time): the revision itself moved the covariate (a new tokenizer or chat template changes the
  token count of the same request), and adjusting for it would hide or invent an effect.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from vlm_operator.analysis import stats
from vlm_operator.analysis.gate.samples import Unit

# The signals a request mix moves (all on the log scale).
FAMILIES = ("loop_latency", "loop_p95", "ttft", "itl", "throughput")
MIN_UNITS = 20
MIN_SLOPE_T = 2.0
MAX_MIX_SHIFT_T = 4.0


@dataclass(frozen=True)
class Adjustment:
    """One signal's covariate fit: value x exp(-slope (log mix - center)). `variance_cut`: the share of the
    baseline's within-pod variance the mix explains (what the adjustment takes off each window's noise)."""

    family: str
    slope: float
    center: float
    variance_cut: float
    units: int

    def apply(self, value: float | None, unit: Unit) -> float | None:
        """`value` of `unit` at the baseline's mean mix (unchanged where the unit's mix is unknown)."""
        x = mix(unit)
        if value is None or x is None or not math.isfinite(value) or value <= 0:
            return value
        return value * math.exp(-self.slope * (x - self.center))


def mix(u: Unit) -> float | None:
    """The unit's log prompt tokens per finished request (its TP ranks' windows averaged); None: unknown."""
    xs = [w.prompt_tokens_per_request for w in u.windows if w.prompt_tokens_per_request]
    return math.log(sum(xs) / len(xs)) if xs else None


def _pairs(units: Sequence[Unit], family: str) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for u in units:
        x, v = mix(u), u.values.get(family)
        if x is not None and v is not None and math.isfinite(v) and v > 0:
            out[u.pod].append((x, math.log(v)))
    return out


def fit(family: str, baseline: Sequence[Unit], canary: Sequence[Unit]) -> Adjustment | None:
    """The adjustment for `family`, or None where it is left out (module docstring)."""
    b, c = _pairs(baseline, family), _pairs(canary, family)
    nb, nc = sum(map(len, b.values())), sum(map(len, c.values()))
    if nb < MIN_UNITS or nc < MIN_UNITS // 2:
        return None
    sxx = sxy = syy = 0.0
    df = 0
    for pts in b.values():
        if len(pts) < 2:
            continue
        mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
        sxx += sum((p[0] - mx) ** 2 for p in pts)
        sxy += sum((p[0] - mx) * (p[1] - my) for p in pts)
        syy += sum((p[1] - my) ** 2 for p in pts)
        df += len(pts) - 1
    if sxx <= 0 or syy <= 0 or df < 3:
        return None
    slope = sxy / sxx
    resid = max(syy - slope * sxy, 0.0)
    se = math.sqrt(resid / max(df - 1, 1) / sxx)
    if se > 0 and abs(slope) / se < MIN_SLOPE_T:
        return None
    # Did the revision move the mix? The two sides' mean log mix, their windows' dependence in time counted.
    xb = [[p[0] for p in pts] for pts in b.values()]
    xc = [[p[0] for p in pts] for pts in c.values()]
    shift_se = math.sqrt(sum(_mean_var(x) for x in (xb, xc)))
    mb, mc = _mean(xb), _mean(xc)
    if shift_se > 0 and abs(mc - mb) / shift_se > MAX_MIX_SHIFT_T:
        return None
    return Adjustment(family, slope, mb, min(1.0, max(0.0, slope * sxy / syy)), nb)


def _mean(series: Sequence[Sequence[float]]) -> float:
    flat = [v for s in series for v in s]
    return sum(flat) / len(flat)


def _mean_var(series: Sequence[Sequence[float]]) -> float:
    """The variance of the mean of every value in `series` (one series per pod), widened by their dependence."""
    flat = [v for s in series for v in s]
    n = len(flat)
    if n < 2:
        return 0.0
    m = sum(flat) / n
    var = sum((v - m) ** 2 for v in flat) / (n - 1)
    return var / n * stats.autocorrelation_factor(series)
