"""What the sidecar reads from SGLang's own /metrics, scraped at the start and end of every window.

- Stage counters (`sglang:scheduler_stage_seconds_total{category}`, 0.5.20+): their deltas give SGLang's
  own stage shares for the window's span, and `agreement` compares them with the sidecar's. Older SGLang
  versions lack the counter: nothing is exported then.
- Request signals for the canary gate (every supported version): mean time to first token and mean
  inter-token latency from the histograms' _sum/_count deltas, generation throughput from the token
  counter's delta over the window. Metric names come from `sglang_names`, which the compat tier checks
  against the released wheels.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from vlm_sidecar import sglang_names

STAGE_COUNTER = sglang_names.STAGE_COUNTER  # prometheus_client strips the _total suffix
IDLE_COUNTER = sglang_names.IDLE_COUNTER


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
    return stages_of(parse(text))


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


# --- request signals: TTFT, ITL and generation throughput per window ----------------------------------------

# Histograms whose _sum/_count deltas give a window's mean, and the generation-token counter (families).
_REQUEST_NAMES = sglang_names.request_metrics(None)


def parse(text: str, names: dict[str, str] | None = None) -> dict[str, float]:
    """One scrape of SGLang's /metrics, reduced to what the sidecar uses: stage counters (as
    `stage_seconds`, keys "stage:<category>" and "stage:idle") and request counters ("ttft_sum",
    "ttft_count", "itl_sum", "itl_count", "generation_tokens", and the finished requests' "prompt_tokens" and
    "finished_requests"), each summed over its other labels, and the waiting queue ("queued": SGLang's
    num_queue_reqs gauge, the largest over its schedulers, which share one queue). Names default to the newest row of sglang_names (they have not changed between releases).
    """
    n = names or _REQUEST_NAMES
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError) as e:
        raise ScrapeError(f"bad metrics text: {e}") from e
    out: dict[str, float] = {}

    def add(key: str, v: float) -> None:
        out[key] = out.get(key, 0.0) + v

    for fam in families:
        if fam.name == STAGE_COUNTER:
            for s in fam.samples:
                if s.name.endswith("_total") and "category" in s.labels:
                    add(f"stage:{s.labels['category']}", s.value)
        elif fam.name == IDLE_COUNTER:
            for s in fam.samples:
                if s.name.endswith("_total"):
                    add("stage:idle", s.value)
        elif fam.name in (sglang_names.FORWARD_PASSES, sglang_names.FORWARD_PASSES + "_total"):
            for s in fam.samples:
                if s.name.endswith("_total"):
                    add("forward_passes", s.value)
        elif fam.name in (n["ttft"], n["itl"]):
            key = "ttft" if fam.name == n["ttft"] else "itl"
            for s in fam.samples:
                if s.name.endswith("_sum"):
                    add(f"{key}_sum", s.value)
                elif s.name.endswith("_count"):
                    add(f"{key}_count", s.value)
        elif fam.name == n["num_queue_reqs"]:
            # One gauge per scheduler (TP rank) of the same queue: the largest, not the sum.
            for s in fam.samples:
                out["queued"] = max(out.get("queued", 0.0), s.value)
        elif fam.name in (n["prompt_tokens"], n["prompt_tokens"] + "_total", n["num_requests"],
                          n["num_requests"] + "_total"):
            key = "prompt_tokens" if fam.name.startswith(n["prompt_tokens"]) else "finished_requests"
            for s in fam.samples:
                if s.name.endswith("_total"):
                    add(key, s.value)
        elif fam.name in (n["generation_tokens"], n["generation_tokens"] + "_total"):
            # prometheus_client names the family without _total when the TYPE line has it, and keeps it
            # (an untyped family) when the TYPE line names the counter without it, as SGLang's does.
            for s in fam.samples:
                if s.name.endswith("_total"):
                    add("generation_tokens", s.value)
    return out


def stages_of(parsed: dict[str, float]) -> dict[str, float] | None:
    """The stage part of `parse` in `stage_seconds`' shape; None when SGLang has no stage counter."""
    st = {k.removeprefix("stage:"): v for k, v in parsed.items() if k.startswith("stage:")}
    return st if any(k != "idle" for k in st) else None


def request_signals(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """The window's mean TTFT and ITL (seconds), generation throughput (tokens/s) and request rate
    (requests/s: requests that reached their first token, the TTFT histogram's count) from two scrapes, and
    `queued_requests`: the smaller of the waiting queue's lengths at the two scrapes. Where that is a backlog (a
    second of the pod's arrivals or more), the pod was saturated, so its throughput was what it can do, not what
    the router sent it (the gate compares throughput only in such windows). `prompt_tokens_per_request`: the
    prompt tokens of the requests that finished in the window, per request (the request mix: the gate's
    covariate), where any finished.

    Only what moved is reported: no request finished its first token in the window -> no ttft (the request
    rate is then 0.0, a real observation: the gate's front-end comparison needs it). A counter that went
    backwards (SGLang restarted) yields nothing.
    """
    out: dict[str, float] = {}
    for key in ("ttft", "itl"):
        dc = after.get(f"{key}_count", 0.0) - before.get(f"{key}_count", 0.0)
        ds = after.get(f"{key}_sum", 0.0) - before.get(f"{key}_sum", 0.0)
        if f"{key}_count" in after and dc > 0 and ds >= 0:
            out[f"{key}_seconds"] = ds / dc
        if key == "ttft" and "ttft_count" in after and "ttft_count" in before and dc >= 0 and seconds > 0:
            out["request_rate"] = dc / seconds
    if "forward_passes" in after and "forward_passes" in before and seconds > 0:
        d = after["forward_passes"] - before["forward_passes"]
        if d >= 0:
            out["forward_pass_rate"] = d / seconds
    if "finished_requests" in after and "finished_requests" in before and "prompt_tokens" in after \
            and "prompt_tokens" in before:
        dn = after["finished_requests"] - before["finished_requests"]
        dp = after["prompt_tokens"] - before["prompt_tokens"]
        if dn > 0 and dp >= 0:
            out["prompt_tokens_per_request"] = dp / dn
    if "queued" in after and "queued" in before:
        out["queued_requests"] = max(0.0, min(after["queued"], before["queued"]))
    if "generation_tokens" in after and "generation_tokens" in before and seconds > 0:
        d = after["generation_tokens"] - before["generation_tokens"]
        if d >= 0:
            out["throughput"] = d / seconds
    return out
