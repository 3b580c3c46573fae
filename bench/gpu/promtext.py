"""Pure helpers over Prometheus text: parse samples, subtract two scrapes, histogram quantiles.

Used by the GPU loop benchmark to turn the stand-in's SGLang-named metrics, scraped at the start and
end of a window, into that window's latency numbers.
"""

from __future__ import annotations

import math
import re

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(name, sorted label pairs): value} for every sample line."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = tuple(sorted(_LABEL.findall(m[2] or "")))
        out[(m[1], labels)] = float(m[3])
    return out


def scalar(samples: dict, name: str) -> float:
    """Sum of every series of `name` (the stand-in has one per metric)."""
    return sum(v for (n, _), v in samples.items() if n == name)


def histogram(samples: dict, name: str) -> tuple[list[tuple[float, float]], float, float]:
    """(sorted [(le, cumulative count)], sum, count) of histogram `name`."""
    buckets: dict[float, float] = {}
    for (n, labels), v in samples.items():
        if n == f"{name}_bucket":
            le = dict(labels)["le"]
            buckets[math.inf if le == "+Inf" else float(le)] = buckets.get(math.inf if le == "+Inf" else float(le), 0) + v
    return sorted(buckets.items()), scalar(samples, f"{name}_sum"), scalar(samples, f"{name}_count")


def histogram_delta(before: tuple, after: tuple) -> tuple[list[tuple[float, float]], float, float]:
    """after - before, bucket by bucket (counters only grow while the process lives)."""
    b_buckets = dict(before[0])
    return ([(le, c - b_buckets.get(le, 0.0)) for le, c in after[0]], after[1] - before[1], after[2] - before[2])


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket holding rank q*count."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le
