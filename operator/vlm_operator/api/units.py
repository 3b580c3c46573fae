"""Parsing of the small string types in the API: Go-style durations, Kubernetes quantities and times.

The same patterns are used in the pydantic models and the generated CRD so the
API server and the operator agree on what is valid. Times in status are RFC 3339 in UTC to the second
(`2027-01-15T08:00:00Z`, as Kubernetes writes them); the operator computes with unix seconds.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"

_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_DURATION_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_QUANTITY_FACTOR = {
    None: Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
}


def parse_duration(text: str) -> float:
    """'1m30s' -> 90.0 seconds. Raises ValueError on anything else."""
    if not isinstance(text, str) or not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"invalid duration {text!r}: use a number and a unit, e.g. 30s, 5m, 1h30m")
    return sum(float(n) * _DURATION_SECONDS[u] for n, u in _DURATION_PART.findall(text))


def format_duration(seconds: float) -> str:
    """Shortest Go-style spelling of whole seconds (used in messages)."""
    s = round(seconds)
    if s % 3600 == 0 and s:
        return f"{s // 3600}h"
    if s % 60 == 0 and s:
        return f"{s // 60}m"
    return f"{s}s"


def parse_quantity(text: str) -> Decimal:
    """'16Gi' -> bytes (or cores for cpu). Raises ValueError on anything else."""
    m = _QUANTITY.fullmatch(str(text))
    if not m:
        raise ValueError(f"invalid quantity {text!r}: e.g. 8, 500m, 64Gi")
    return Decimal(m.group(1)) * _QUANTITY_FACTOR[m.group(2)]


TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(t: float) -> str:
    """Unix seconds -> RFC 3339 in UTC, whole seconds: 1800000000.7 -> '2027-01-15T08:00:00Z'."""
    return datetime.fromtimestamp(t, UTC).strftime(TIME_FORMAT)


def parse_time(text: str | None) -> float:
    """RFC 3339 (as status and metadata hold it) -> unix seconds; 0.0 when unset or empty. Raises
    ValueError on anything else."""
    if not text:
        return 0.0
    if not isinstance(text, str):
        raise ValueError(f"not a time: {text!r}")
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def parse_time_or_none(text: str | None) -> float | None:
    """`parse_time`, leniently: None when unset, empty or not a time."""
    if not text:
        return None
    try:
        return parse_time(text)
    except ValueError:
        return None
