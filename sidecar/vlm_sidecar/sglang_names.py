"""SGLang's Prometheus metric names, per SGLang release, for reading TTFT / ITL / throughput from its /metrics.

Pure constants plus one lookup by version. The compat tier (tests/compat/test_sglang_contract.py) checks every
row against the released wheels' own source (`observability/metrics_collector.py`, `metrics/collector.py` in
0.5.9): the name exists, with the kind noted here. Add a row there and here when a new SGLang is supported.

Names are metric *family* names as `prometheus_client.parser.text_string_to_metric_families` reports them,
the convention of `sglang_metrics.py`: a Counter declared `sglang:x_total` is family `sglang:x` with sample
`sglang:x_total`; histograms and gauges are named as declared (histogram samples add _bucket/_sum/_count).

Labels to sum over (not part of the name): from 0.5.17 TTFT, e2e latency and the token counters carry
`is_streaming`; the tokenizer-side metrics carry `model_name` (+ `engine_type` from 0.5.15), the scheduler-side
gauges `model_name, engine_type, tp_rank, pp_rank, moe_ep_rank` (+ `dp_rank` with DP).
"""

from __future__ import annotations

import re

# Keys: ttft, itl, e2e (histograms, seconds); generation_tokens, prompt_tokens (counters, tokens), num_requests
# (counter, finished requests);
# gen_throughput (gauge, token/s, per scheduler); num_running_reqs, num_queue_reqs (gauges).
_V0_5 = {
    "ttft": "sglang:time_to_first_token_seconds",
    "itl": "sglang:inter_token_latency_seconds",
    "e2e": "sglang:e2e_request_latency_seconds",
    "generation_tokens": "sglang:generation_tokens",
    "prompt_tokens": "sglang:prompt_tokens",
    # Requests finished; SGLang adds a finished request's prompt tokens to prompt_tokens in the same call, so the
    # two counters' deltas give a window's prompt tokens per request (image tokens included).
    "num_requests": "sglang:num_requests",
    "gen_throughput": "sglang:gen_throughput",
    "num_running_reqs": "sglang:num_running_reqs",
    "num_queue_reqs": "sglang:num_queue_reqs",
}

# The names have not changed between 0.5.9 and 0.5.23; one row per release the compat tier reads, so a
# rename in a later release gets its own row here.
REQUEST_METRICS: dict[str, dict[str, str]] = {
    "0.5.9": dict(_V0_5),
    "0.5.10": dict(_V0_5),
    "0.5.15": dict(_V0_5),
    "0.5.17": dict(_V0_5),
    "0.5.20": dict(_V0_5),
    "0.5.23": dict(_V0_5),
}

# SGLang's own scheduler stage accounting (families), 0.5.20 on; `sglang_metrics.py` reads these.
STAGE_COUNTER = "sglang:scheduler_stage_seconds"  # labels: category (+ forward_overlap from 0.5.23)
IDLE_COUNTER = "sglang:scheduler_idle_seconds"
STAGE_COUNTERS_SINCE = "0.5.20"
# Forward passes by CUDA graph use (label mode), every supported release: the batches the scheduler ran.
FORWARD_PASSES = "sglang:cuda_graph_passes"


def _key(version: str) -> tuple[int, ...]:
    """'0.5.10.post1' -> (0, 5, 10); () when the version does not start with a release number."""
    m = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    return tuple(int(p) for p in m[1].split(".")) if m else ()


def request_metrics(version: str | None) -> dict[str, str]:
    """The names for `version`: the newest row at or below it; the newest row for None or an unparsable one,
    the oldest for a version older than every row."""
    rows = sorted(REQUEST_METRICS, key=_key)
    key = _key(version) if version else ()
    if not key:
        return dict(REQUEST_METRICS[rows[-1]])
    best = rows[0]
    for row in rows:
        if _key(row) <= key:
            best = row
    return dict(REQUEST_METRICS[best])
