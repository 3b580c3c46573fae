"""The Prometheus source: one Window per sidecar window, from the sidecar's per-window gauges.

Every gauge describes the sidecar's last usable window, whose end time
`vlm_profiler_last_window_timestamp_seconds` carries: that value is the window's identity (`from_prometheus`
says how it is read). The windows are built here directly, field by field, with the rules
`Window.from_sidecar` applies to a `/windows.json` entry (a value it would drop is dropped here too), and
they carry every field the sidecar source fills: the per-window scalars, the stage shares, the inclusive and
self function shares with the bound for the functions left out of the export
(`vlm_scheduler_unexported_self_share_max_ratio`), the call-edge shares (`vlm_scheduler_edge_share_ratio`), the
IPC transport fields, and per front-end role the busy share, the function shares and its bound. So the gate
decides and attributes the same through both sources
(tests/unit/operator/analysis/test_sources_parity.py). A bad point (not a number, not finite, a malformed series) is
dropped, never raised.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vlm_operator.analysis.sources.base import PrometheusAuth, SignalsUnavailable, get_json, prometheus_auth
from vlm_operator.analysis.window import (
    EDGE_SEP,
    RoleSample,
    Window,
    _count,
    _edges,
    _flag,
    _nonnegative,
    _nonnegative_int,
    _positive,
    _share,
    _shares,
)
from vlm_operator.api.names import FRONTEND_ROLES


def _query_range(base: str, query: str, start: float, end: float, step: float,
                 auth: PrometheusAuth | None = None) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.0f}s"})
    url = f"{base}/api/v1/query_range?{params}"
    try:
        auth = auth or prometheus_auth()
        headers, context = auth.request_headers(url), auth.ssl_context(url)
        data = get_json(url, headers=headers, context=context) if headers or context else get_json(url)
    except (OSError, ValueError) as e:  # (a SettingsError is a ValueError: the operator refused it at start)
        raise SignalsUnavailable(f"Prometheus at {base} not readable: {e}") from e
    if not isinstance(data, dict) or data.get("status") != "success":
        error = data.get("error") if isinstance(data, dict) else f"not a Prometheus answer: {str(data)[:80]}"
        raise SignalsUnavailable(f"Prometheus query failed: {error}")
    result = data.get("data", {}).get("result") if isinstance(data.get("data"), dict) else None
    if not isinstance(result, list):
        raise SignalsUnavailable(f"Prometheus answered without a result list for {query[:80]}")
    return [s for s in (_clean_series(r) for r in result) if s is not None]


def _number(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if isinstance(x, (str, int, float)) and not isinstance(x, bool) else None


def _clean_series(r: Any) -> dict[str, Any] | None:
    """One range-query series: string labels and (finite time, finite value) points; None if unusable (a proxy
    or a broken Prometheus may answer anything: a bad point, NaN and infinities included, is dropped)."""
    if not isinstance(r, dict) or not isinstance(r.get("metric"), dict) or not isinstance(r.get("values"), list):
        return None
    metric = {k: v for k, v in r["metric"].items() if isinstance(k, str) and isinstance(v, str)}
    values: list[tuple[float, float]] = []
    for point in r["values"]:
        if not isinstance(point, (list, tuple)) or len(point) != 2:
            continue
        t, v = _number(point[0]), point[1]
        x = _number(v) if isinstance(v, str) else None
        if t is None or x is None or not math.isfinite(t) or not math.isfinite(x):
            continue
        values.append((t, x))
    return {"metric": metric, "values": values}


# Per-window gauges the sidecar exports (all from its last usable window), and the Window field each fills.
_WINDOW_GAUGES = {
    "vlm_scheduler_window_loop_mean_seconds": "loop_mean_seconds",
    "vlm_scheduler_window_loop_p95_seconds": "loop_p95_seconds",
    "vlm_scheduler_window_iterations": "iterations",
    "vlm_scheduler_window_samples": "samples",
    "vlm_sglang_window_ttft_seconds": "ttft_seconds",
    "vlm_sglang_window_itl_seconds": "itl_seconds",
    "vlm_sglang_window_generation_tokens_per_second": "throughput",
    "vlm_sglang_window_requests_per_second": "request_rate",
    "vlm_sglang_window_forward_passes_per_second": "forward_pass_rate",
    "vlm_sglang_window_queued_requests": "queued_requests",
    "vlm_sglang_window_prompt_tokens_per_request": "prompt_tokens_per_request",
    "vlm_profiler_stale": "stale",
    "vlm_scheduler_feature_transport_share_ratio": "feature_transport_share",
    "vlm_scheduler_ipc_handle_reopen_share_ratio": "ipc_handle_reopen_share",
    "vlm_scheduler_window_feature_transport_samples": "feature_transport_samples",
    "vlm_scheduler_unexported_self_share_max_ratio": "unexported_self_share_max",
}
# How each field reads a value: the rule Window.from_sidecar applies to the same /windows.json key.
_FIELD_VALUE: dict[str, Callable[[float], Any]] = {
    "loop_mean_seconds": _positive,
    "loop_p95_seconds": _positive,
    "iterations": _count,
    "samples": _count,
    "ttft_seconds": _positive,
    "itl_seconds": _positive,
    "throughput": _positive,
    "request_rate": _nonnegative,
    "forward_pass_rate": _nonnegative,
    "queued_requests": _nonnegative,
    "prompt_tokens_per_request": _positive,
    "stale": _flag,
    "feature_transport_share": _share,
    "ipc_handle_reopen_share": _share,
    "feature_transport_samples": _nonnegative_int,
    "unexported_self_share_max": _share,
}
_KEY = "pod, revision, tp_rank"
_POD_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_KINDS = {"inclusive": "function_shares", "self": "self_shares"}

# A front-end window ends just after the scheduler windows it ran beside (the sidecar summarizes it last).
_FRONTEND_ATTACH_S = 10.0

Series = Callable[..., list[dict[str, Any]]]


@dataclass
class _Seen:
    """What the gauges said about one window (or one front-end role in one window), before it is built."""

    scalars: dict[str, Any] = field(default_factory=dict)
    shares: dict[str, dict[str, float]] = field(default_factory=dict)  # stage/function/self -> name -> value

    def share(self, kind: str, name: str, v: float) -> None:
        self.shares.setdefault(kind, {})[name] = v

    def shares_of(self, kind: str) -> dict[str, float]:
        return _shares(self.shares.get(kind, {}))


def _first_steps(sr: Mapping[str, Any], since: float = -math.inf) -> dict[float, float]:
    """{t: value} of a window-end series, keeping each end once, at the first step that shows it."""
    first: dict[float, float] = {}
    for t, end in sr["values"]:
        if end >= since and end not in first:
            first[end] = t
    return {t: end for end, t in first.items()}


def _frontend(series: Series) -> dict[tuple[str, str], dict[float, dict[str, RoleSample]]]:
    """(pod, revision) -> {front-end window end: {role: RoleSample}}, when the sidecars sample the front end
    (roles without a busy share are left out, as in /windows.json's `frontend.roles`). The front-end gauges
    describe the newest front-end window, identified by `vlm_frontend_last_window_timestamp_seconds`; each is
    read at the first step that shows it."""
    ends = series("vlm_frontend_last_window_timestamp_seconds", by="pod, revision")
    if not ends:
        return {}  # front-end sampling is off: no further queries
    at: dict[tuple[str, str], dict[float, float]] = {}  # (pod, revision) -> {t: front-end window end}
    for sr in ends:
        at.setdefault((sr["metric"].get("pod", ""), sr["metric"].get("revision", "")), {}).update(_first_steps(sr))
    seen: dict[tuple[str, str, float], dict[str, _Seen]] = {}

    def put(sr: Mapping[str, Any], apply: Callable[[_Seen, float], None]) -> None:
        m = sr["metric"]
        role, pod, revision = m.get("role", ""), m.get("pod", ""), m.get("revision", "")
        by_t = at.get((pod, revision))
        if role not in FRONTEND_ROLES or not by_t:
            return
        for t, v in sr["values"]:
            end = by_t.get(t)
            if end is not None:
                apply(seen.setdefault((pod, revision, end), {}).setdefault(role, _Seen()), v)

    for sr in series("vlm_process_busy_share_ratio", by="pod, revision, role"):
        put(sr, lambda r, v: r.scalars.__setitem__("busy_share", v))
    for sr in series("vlm_process_unexported_self_share_max_ratio", by="pod, revision, role"):
        put(sr, lambda r, v: r.scalars.__setitem__("unexported_self_share_max", v))
    for sr in series("vlm_process_function_share_ratio", by="pod, revision, role, function, kind"):
        kind, fn = _KINDS.get(sr["metric"].get("kind", "")), sr["metric"].get("function", "")
        if kind is not None:
            put(sr, lambda r, v, kind=kind, fn=fn: r.share(kind, fn, v))
    out: dict[tuple[str, str], dict[float, dict[str, RoleSample]]] = {}
    for (pod, revision, end), roles in seen.items():
        built = {}
        for role, r in roles.items():
            busy = _share(r.scalars.get("busy_share"))
            if busy is not None:
                built[role] = RoleSample(busy, r.shares_of("function_shares"), r.shares_of("self_shares"),
                                         _share(r.scalars.get("unexported_self_share_max")))
        if built:
            out.setdefault((pod, revision), {})[end] = built
    return out


def from_prometheus(
    base: str, namespace: str, service: str, revisions: Sequence[str], *, since: float, now: float, step: float,
    auth: PrometheusAuth | None = None, pods: Mapping[str, str] | None = None,
) -> list[Window]:
    """One Window per sidecar window, for the given revisions, from the sidecar's per-window gauges.

    Every gauge describes the sidecar's last usable window, whose end time
    `vlm_profiler_last_window_timestamp_seconds` carries: that value is the window's identity. The range
    is read at `step` (at most the telemetry interval, so no window is skipped while the scrape keeps up),
    and each window is taken once, at the first step that shows it, so a window scraped many times is
    still one observation (no pseudo-replication), whatever the scrape and telemetry intervals are. A
    window whose sidecar reported itself stale at that point is marked stale. Each scheduler window gets
    the front-end window sampled beside it (the one that ended from 1 s before to `_FRONTEND_ATTACH_S`
    after it), when the sidecar samples the front end. A sidecar older than the samples gauge gives
    windows of 1 sample (enough for the gate, which only asks for some); older than the self-share and
    bound series, windows without them (attribution then compares only what both sides exported).

    `pods` (pod name -> side): read these pods of `namespace` by name instead of the service's revisions, and
    give each window its pod's side as its revision (the judge endpoint, whose pods a label selector picked).

    Every query carries `auth` (default: the operator's, `base.prometheus_auth()`, from VLM_PROMETHEUS_*): its
    credentials, headers and CA where `base` is on VLM_PROMETHEUS_URL's scheme, host and port, nothing elsewhere.
    """
    if pods is not None:
        if not pods:
            return []
        # Pod names are DNS subdomains: only "." means something in a regex (escaped for PromQL's string too).
        names = "|".join(p.replace(".", "\\\\.") for p in sorted(pods) if _POD_NAME.match(p))
        sel = f'namespace="{namespace}",pod=~"{names}"'
    else:
        sel = f'namespace="{namespace}",vlmservice="{service}",revision=~"{"|".join(revisions)}"'
    start = max(since, now - 6 * 3600)
    if now <= start:
        return []

    def series(metric: str, extra: str = "", by: str = _KEY) -> list[dict[str, Any]]:
        return _query_range(base, f"max by ({by}) ({metric}{{{sel}{extra}}})", start, now, step, auth)

    def key(m: Mapping[str, str]) -> tuple[str, str, str]:
        return m.get("pod", ""), m.get("revision", ""), m.get("tp_rank", "")

    at: dict[tuple[str, str, str], dict[float, float]] = {}  # (pod, revision, rank) -> {t: window end}
    for sr in series("vlm_profiler_last_window_timestamp_seconds"):
        by_t = at.setdefault(key(sr["metric"]), {})
        known = set(by_t.values())
        by_t.update({t: end for t, end in _first_steps(sr, since).items() if end not in known})
    if not any(at.values()):
        return []
    windows = {(*k, end): _Seen() for k, by_t in at.items() for end in by_t.values()}

    def assign(sr: Mapping[str, Any], apply: Callable[[_Seen, float], None]) -> None:
        k = key(sr["metric"])
        by_t = at.get(k)
        if not by_t:
            return
        for t, v in sr["values"]:
            end = by_t.get(t)
            if end is not None:
                apply(windows[(*k, end)], v)

    for metric, name in _WINDOW_GAUGES.items():
        for sr in series(metric):
            assign(sr, lambda w, v, name=name: w.scalars.__setitem__(name, _FIELD_VALUE[name](v)))
    for sr in series("vlm_scheduler_stage_share_ratio", by=f"{_KEY}, stage"):
        st = sr["metric"].get("stage", "")
        assign(sr, lambda w, v, st=st: w.share("stage_shares", st, v))
    for sr in series("vlm_sglang_stage_share_ratio", by=f"{_KEY}, stage"):
        st = sr["metric"].get("stage", "")
        assign(sr, lambda w, v, st=st: w.share("sglang_stage_shares", st, v))
    for sr in series("vlm_scheduler_function_share_ratio", by=f"{_KEY}, function, kind"):
        kind, fn = _KINDS.get(sr["metric"].get("kind", "")), sr["metric"].get("function", "")
        if kind is not None:
            assign(sr, lambda w, v, kind=kind, fn=fn: w.share(kind, fn, v))
    for sr in series("vlm_scheduler_edge_share_ratio", by=f"{_KEY}, caller, callee"):
        edge = f'{sr["metric"].get("caller", "")}{EDGE_SEP}{sr["metric"].get("callee", "")}'
        assign(sr, lambda w, v, edge=edge: w.share("edge_shares", edge, v))
    frontend = _frontend(series)
    out = []
    for (pod, revision, rank, end), w in sorted(windows.items()):
        fe = frontend.get((pod, revision), {})
        near = [e for e in fe if end - 1.0 <= e <= end + _FRONTEND_ATTACH_S]
        out.append(Window(
            revision=revision if pods is None else pods.get(pod, revision),
            pod=pod,
            id=f"{pod}/{rank}@{end:.3f}",
            end=end,
            tp_rank=_count(rank),
            samples=w.scalars.get("samples", 1),
            loop_mean_seconds=w.scalars.get("loop_mean_seconds"),
            loop_p95_seconds=w.scalars.get("loop_p95_seconds"),
            stage_shares=w.shares_of("stage_shares"),
            function_shares=w.shares_of("function_shares"),
            self_shares=w.shares_of("self_shares"),
            stale=w.scalars.get("stale", False),
            ttft_seconds=w.scalars.get("ttft_seconds"),
            itl_seconds=w.scalars.get("itl_seconds"),
            throughput=w.scalars.get("throughput"),
            request_rate=w.scalars.get("request_rate"),
            forward_pass_rate=w.scalars.get("forward_pass_rate"),
            queued_requests=w.scalars.get("queued_requests"),
            prompt_tokens_per_request=w.scalars.get("prompt_tokens_per_request"),
            iterations=w.scalars.get("iterations"),
            feature_transport_share=w.scalars.get("feature_transport_share"),
            ipc_handle_reopen_share=w.scalars.get("ipc_handle_reopen_share"),
            feature_transport_samples=w.scalars.get("feature_transport_samples"),
            unexported_self_share_max=w.scalars.get("unexported_self_share_max"),
            frontend=fe[min(near)] if near else {},
            edge_shares=_edges(w.shares.get("edge_shares", {})),
            sglang_stage_shares=w.shares_of("sglang_stage_shares"),
        ))
    return out
