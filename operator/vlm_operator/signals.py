"""Reading canary and baseline signals: from Prometheus (PromQL over HTTP) or straight from the sidecars.

Both sources return `gate.Window`s; a source that cannot be reached raises
`SignalsUnavailable`, which the reconcile turns into an Inconclusive analysis
(never a promotion).

Sidecar source: GET http://<pod IP>:9400/windows.json for every ready pod.
`VLM_SIDECAR_ENDPOINTS` (a JSON file: pod name -> host:port) overrides pod IPs;
the e2e harness uses it because kwok pods have no real network.

Prometheus source: each scrape-aligned step of the analysis range becomes one
window per pod, from the sidecar metrics (loop latency from the histogram's
rate of sum over rate of count, stage and function shares from the gauges).
"""

from __future__ import annotations

import json
import logging
import os
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .gate import Window

log = logging.getLogger("vlm_operator.signals")
SIDECAR_PORT = 9400
TIMEOUT_S = 5.0


class SignalsUnavailable(Exception):
    """No data could be read (Prometheus down, no sidecar answering)."""


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r:
        return json.loads(r.read())


def _endpoint_overrides() -> Mapping[str, str] | None:
    """pod -> host:port from VLM_SIDECAR_ENDPOINTS; None when unset (then pod IPs are used).

    When the variable is set, only the pods it names are scraped, never a pod IP: in the kwok testbed
    pod IPs are fake addresses that must not be dialled.
    """
    path = os.environ.get("VLM_SIDECAR_ENDPOINTS")
    if path is None:
        return None
    try:
        with open(path) as f:
            data = json.load(f)
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def from_sidecars(pods: Iterable[tuple[str, str, str | None]], since: float) -> list[Window]:
    """pods: (name, revision, ip). Windows that ended after `since`, deduplicated by the gate."""
    overrides = _endpoint_overrides()
    out: list[Window] = []
    reached = 0
    for name, revision, ip in pods:
        addr = overrides.get(name) if overrides is not None else (f"{ip}:{SIDECAR_PORT}" if ip else None)
        if not addr:
            continue
        try:
            data = _get_json(f"http://{addr}/windows.json")
        except (OSError, ValueError) as e:
            log.info("sidecar of pod %s not readable: %s", name, e)
            continue
        reached += 1
        for entry in data if isinstance(data, list) else []:
            w = Window.from_sidecar(revision, name, entry)
            if w.end >= since:
                out.append(w)
    if reached == 0:
        raise SignalsUnavailable("no profiler sidecar answered")
    return out


def _query_range(base: str, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.0f}s"})
    try:
        data = _get_json(f"{base}/api/v1/query_range?{params}")
    except (OSError, ValueError) as e:
        raise SignalsUnavailable(f"Prometheus at {base} not readable: {e}") from e
    if data.get("status") != "success":
        raise SignalsUnavailable(f"Prometheus query failed: {data.get('error')}")
    return data["data"]["result"]


def from_prometheus(
    base: str, namespace: str, service: str, revisions: Sequence[str], *, since: float, now: float, step: float
) -> list[Window]:
    """Windows per (pod, step) for the given revisions, from the sidecar series in Prometheus."""
    sel = f'namespace="{namespace}",vlmservice="{service}",revision=~"{"|".join(revisions)}"'
    rng = f"{max(int(step), 15)}s"
    start = max(since, now - 6 * 3600)
    if now - start < step:
        return []
    by_key: dict[tuple[str, str, float], dict[str, Any]] = {}

    def slot(metric: Mapping[str, str], t: float) -> dict[str, Any]:
        key = (metric.get("pod", ""), metric.get("revision", ""), t)
        return by_key.setdefault(key, {"stage_shares": {}, "function_shares": {}})

    loop = _query_range(
        base,
        f"sum by (pod, revision) (rate(vlm_scheduler_loop_seconds_sum{{{sel}}}[{rng}]))"
        f" / sum by (pod, revision) (rate(vlm_scheduler_loop_seconds_count{{{sel}}}[{rng}]))",
        start, now, step,
    )
    for series in loop:
        for t, v in series["values"]:
            s = slot(series["metric"], float(t))
            s["loop_mean_seconds"] = float(v)
            s["samples"] = 1
    p95 = _query_range(
        base,
        f"histogram_quantile(0.95, sum by (le, pod, revision) (rate(vlm_scheduler_loop_seconds_bucket{{{sel}}}[{rng}])))",
        start, now, step,
    )
    for series in p95:
        for t, v in series["values"]:
            if v not in ("NaN", "+Inf"):
                slot(series["metric"], float(t))["loop_p95_seconds"] = float(v)
    for query, key, label in (
        (f"avg by (pod, revision, stage) (vlm_scheduler_stage_share{{{sel}}})", "stage_shares", "stage"),
        (
            f'avg by (pod, revision, function) (vlm_scheduler_function_share{{{sel},kind="inclusive"}})',
            "function_shares",
            "function",
        ),
    ):
        for series in _query_range(base, query, start, now, step):
            for t, v in series["values"]:
                slot(series["metric"], float(t))[key][series["metric"].get(label, "")] = float(v)
    samples = _query_range(base, f"sum by (pod, revision) (increase(vlm_profiler_samples_total{{{sel}}}[{rng}]))", start, now, step)
    for series in samples:
        for t, v in series["values"]:
            slot(series["metric"], float(t))["samples"] = int(float(v))
    out = []
    for (pod, revision, t), d in sorted(by_key.items()):
        if "loop_mean_seconds" not in d:
            continue
        out.append(Window.from_sidecar(revision, pod, {"id": f"{pod}@{t:.0f}", "end": t, **d}))
    return out
