"""Reading canary and baseline signals: from Prometheus (PromQL over HTTP) or straight from the sidecars.

Both sources return `gate.Window`s; a source that cannot be reached raises
`SignalsUnavailable`, which the reconcile turns into an Inconclusive analysis
(never a promotion).

Sidecar source: GET http://<pod IP>:9400/windows.json for every ready pod.
`VLM_SIDECAR_ENDPOINTS` (a JSON file: pod name -> host:port) overrides pod IPs;
the e2e harness uses it because kwok pods have no real network.

Prometheus source: one window per sidecar window, from the sidecar's per-window
gauges, identified by the window's end time (`from_prometheus` says how).
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


# Per-window gauges the sidecar exports (all from its last usable window), and the Window field each fills.
_WINDOW_GAUGES = {
    "vlm_scheduler_window_loop_mean_seconds": "loop_mean_seconds",
    "vlm_scheduler_window_loop_p95_seconds": "loop_p95_seconds",
    "vlm_scheduler_window_iterations": "iterations",
    "vlm_sglang_window_ttft_seconds": "ttft_seconds",
    "vlm_sglang_window_itl_seconds": "itl_seconds",
    "vlm_sglang_window_generation_tokens_per_second": "throughput",
    "vlm_profiler_stale": "stale",
}
_KEY = "pod, revision, tp_rank"


def from_prometheus(
    base: str, namespace: str, service: str, revisions: Sequence[str], *, since: float, now: float, step: float
) -> list[Window]:
    """One Window per sidecar window, for the given revisions, from the sidecar's per-window gauges.

    Every gauge describes the sidecar's last usable window, whose end time
    `vlm_profiler_last_window_timestamp_seconds` carries: that value is the window's identity. The range
    is read at `step` (at most the telemetry interval, so no window is skipped while the scrape keeps up),
    and each window is taken once, at the first step that shows it, so a window scraped many times is
    still one observation (no pseudo-replication), whatever the scrape and telemetry intervals are. A
    window whose sidecar reported itself stale at that point is marked stale.
    """
    sel = f'namespace="{namespace}",vlmservice="{service}",revision=~"{"|".join(revisions)}"'
    start = max(since, now - 6 * 3600)
    if now <= start:
        return []

    def series(metric: str, extra: str = "", by: str = _KEY) -> list[dict[str, Any]]:
        return _query_range(base, f"max by ({by}) ({metric}{{{sel}{extra}}})", start, now, step)

    def key(m: Mapping[str, str]) -> tuple[str, str, str]:
        return m.get("pod", ""), m.get("revision", ""), m.get("tp_rank", "")

    # (pod, revision, rank) -> [(t, window end)], then the first t at which each window end appears.
    first_seen: dict[tuple[str, str, str], dict[float, float]] = {}
    for sr in series("vlm_profiler_last_window_timestamp_seconds"):
        seen = first_seen.setdefault(key(sr["metric"]), {})
        for t, v in sr["values"]:
            end = float(v)
            if end >= since and end not in seen:
                seen[end] = float(t)
    if not first_seen:
        return []
    at: dict[tuple[str, str, str], dict[float, float]] = {  # (series) -> {t: window end}
        k: {t: end for end, t in ends.items()} for k, ends in first_seen.items()
    }
    windows: dict[tuple[str, str, str, float], dict[str, Any]] = {}
    for k, by_t in at.items():
        for end in by_t.values():
            windows[(*k, end)] = {"end": end, "samples": 1, "stage_shares": {}, "function_shares": {}}

    def assign(sr: Mapping[str, Any], put) -> None:
        k = key(sr["metric"])
        by_t = at.get(k)
        if not by_t:
            return
        for t, v in sr["values"]:
            end = by_t.get(float(t))
            if end is not None and v not in ("NaN", "+Inf", "-Inf"):
                put(windows[(*k, end)], float(v))

    for metric, field in _WINDOW_GAUGES.items():
        for sr in series(metric):
            assign(sr, lambda d, v, f=field: d.__setitem__(f, v))
    for sr in series("vlm_scheduler_stage_share", by=f"{_KEY}, stage"):
        st = sr["metric"].get("stage", "")
        assign(sr, lambda d, v, st=st: d["stage_shares"].__setitem__(st, v))
    for sr in series("vlm_scheduler_function_share", ',kind="inclusive"', by=f"{_KEY}, function"):
        fn = sr["metric"].get("function", "")
        assign(sr, lambda d, v, fn=fn: d["function_shares"].__setitem__(fn, v))
    out = []
    for (pod, revision, rank, end), d in sorted(windows.items()):
        if "loop_mean_seconds" not in d:
            continue
        rank_n = int(rank) if rank.isdigit() else 0
        out.append(Window.from_sidecar(revision, pod, {"id": f"{pod}/{rank}@{end:.3f}", "tp_rank": rank_n, **d}))
    return out
