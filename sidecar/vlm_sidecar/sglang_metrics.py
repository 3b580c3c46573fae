"""Cross-check against SGLang's own stage counters (`sglang:scheduler_stage_seconds_total{category}`, 0.5.20+).

The runner scrapes SGLang's /metrics at the start and end of a window; the counter deltas give SGLang's
own stage shares for the same wall-clock span, and `agreement` compares them with the sidecar's.
Older SGLang versions lack the counter: `stage_seconds` then returns None and nothing is exported.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

STAGE_COUNTER = "sglang:scheduler_stage_seconds"  # prometheus_client strips the _total suffix
IDLE_COUNTER = "sglang:scheduler_idle_seconds"


class ScrapeError(Exception):
    """SGLang /metrics could not be fetched or parsed."""


def fetch(url: str, timeout_s: float = 2.0) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise ScrapeError(f"GET {url}: {e}") from e


def stage_seconds(text: str) -> dict[str, float] | None:
    """{category: seconds} summed over other labels, plus 'idle'; None without the stage counter."""
    out: dict[str, float] = {}
    found = False
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError) as e:
        raise ScrapeError(f"bad metrics text: {e}") from e
    for fam in families:
        if fam.name == STAGE_COUNTER:
            for s in fam.samples:
                if s.name.endswith("_total") and "category" in s.labels:
                    found = True
                    out[s.labels["category"]] = out.get(s.labels["category"], 0.0) + s.value
        elif fam.name == IDLE_COUNTER:
            for s in fam.samples:
                if s.name.endswith("_total"):
                    out["idle"] = out.get("idle", 0.0) + s.value
    return out if found else None


def window_shares(before: dict[str, float], after: dict[str, float]) -> dict[str, float] | None:
    """SGLang's stage shares between two scrapes; None if the counters did not move (or reset)."""
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    if any(v < 0 for v in delta.values()):
        return None  # counter reset: SGLang restarted mid-window
    total = sum(delta.values())
    if total <= 0:
        return None
    return {k: v / total for k, v in delta.items()}


def agreement(sidecar: dict[str, float], sglang: dict[str, float]) -> dict[str, float]:
    """|sidecar - SGLang| per stage both know, after renormalising both over those stages.

    SGLang's categories need not cover the sidecar's "other" (loop overhead), so shares are compared
    over the common stages only.
    """
    common = [k for k in sglang if k in sidecar]
    a_tot = sum(sidecar[k] for k in common)
    b_tot = sum(sglang[k] for k in common)
    if a_tot <= 0 or b_tot <= 0:
        return {}
    return {k: abs(sidecar[k] / a_tot - sglang[k] / b_tot) for k in common}
