"""Pure summaries of timing samples for the GPU benchmarks (no I/O, no clock)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not samples:
        return math.nan
    data = sorted(samples)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Median, p99, mean, min and count of a list of samples (same unit out as in)."""
    if not samples:
        return {"n": 0, "median": math.nan, "p99": math.nan, "mean": math.nan, "min": math.nan}
    return {
        "n": len(samples),
        "median": percentile(samples, 50),
        "p99": percentile(samples, 99),
        "mean": sum(samples) / len(samples),
        "min": min(samples),
    }


def ratio(off: float, on: float) -> float:
    """How many times cheaper `on` is than `off`; nan when undefined."""
    if not on or math.isnan(on) or math.isnan(off):
        return math.nan
    return off / on
