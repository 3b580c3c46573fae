"""Reading canary and baseline signals: from Prometheus (PromQL over HTTP) or straight from the sidecars.

Both sources return `gate.Window`s; a source that cannot be reached raises
`SignalsUnavailable`, which the reconcile turns into an Inconclusive analysis
(never a promotion).

Sidecar source: GET http://<pod IP>:9400/windows.json for every ready pod, through a
`SidecarReader`: a short timeout (`VLM_SIDECAR_TIMEOUT_SECONDS`), all pods of a call at once on a
small shared thread pool (`VLM_SIDECAR_WORKERS`), and a per-pod cache that is read again only when
the pod's next window is due, so a live sidecar is read about once per telemetry window and a dead
one costs one timeout per window (then less: it backs off), never one per reconcile. A pod that did
not answer is unavailable until its next read, never "no regression".
`VLM_SIDECAR_ENDPOINTS` (a JSON file: pod name -> host:port) overrides pod IPs; only a testbed run
without its network namespace (VLM_TESTBED_NETNS=0) uses it, so kwok's pod IPs are never dialled on
the host's network. The e2e tier and the demo read sidecars by pod IP.

Prometheus source: one window per sidecar window, from the sidecar's per-window
gauges, identified by the window's end time (`from_prometheus` says how).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from http.client import HTTPException
from typing import Any

from .gate import FRONTEND_ROLES, Window

log = logging.getLogger("vlm_operator.signals")
SIDECAR_PORT = 9400
TIMEOUT_S = 5.0  # default of _get_json (the Prometheus reads); sidecar reads use SidecarReader.timeout_s
SIDECAR_TIMEOUT_S = 1.0  # VLM_SIDECAR_TIMEOUT_SECONDS' default: a sidecar on the pod network answers in ms
SIDECAR_WORKERS = 8  # VLM_SIDECAR_WORKERS' default
KEEP_WINDOWS = 4  # a cached pod keeps at least its windows of the last 4 intervals (the profiler summary's span)
MAX_BACKOFF_WINDOWS = 8  # a pod that keeps failing is tried at most every 8 telemetry intervals
PRUNE_AFTER_S = 600.0  # cache entries of pods nobody asked about for this long are dropped
_READ_ERRORS = (OSError, ValueError, HTTPException)  # a sidecar that cannot be read (refused, timed out, garbled)


class SignalsUnavailable(Exception):
    """No data could be read (Prometheus down, no sidecar answering)."""


def _get_json(url: str, timeout: float = TIMEOUT_S) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


_overrides_cache: dict[str, Any] = {}


def _endpoint_overrides() -> Mapping[str, str] | None:
    """pod -> host:port from VLM_SIDECAR_ENDPOINTS; None when unset (then pod IPs are used).

    When the variable is set, only the pods it names are scraped, never a pod IP: in a testbed without
    its network namespace, kwok's pod IPs are not bindable addresses and must not be dialled. The file is parsed again only when it changes.
    """
    path = os.environ.get("VLM_SIDECAR_ENDPOINTS")
    if path is None:
        return None
    try:
        st = os.stat(path)
        stamp = (path, st.st_mtime_ns, st.st_size)
        if _overrides_cache.get("stamp") == stamp:
            return _overrides_cache["data"]
        with open(path) as f:
            data = json.load(f)
        out = {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
        _overrides_cache.update(stamp=stamp, data=out)
        return out
    except (OSError, ValueError):
        return {}


@dataclass(slots=True)
class _PodEntry:
    """What the reader knows about one pod's sidecar (all times unix seconds)."""

    addr: str
    revision: str
    ok: bool = False
    windows: tuple[Window, ...] = ()
    kept_since: float = math.inf  # every window that ended at or after this is in `windows`
    error: str = ""
    failures: int = 0  # consecutive failed reads
    next_read: float = 0.0  # not read again before this (the next window is not due / backing off)
    used: float = 0.0
    inflight: bool = False  # a background retry is under way


class SidecarReader:
    """Reads `/windows.json` of many pods: bounded time, concurrent, cached per pod until its next window.

    A read that answers is kept until the pod's next window is due (its newest window's end plus one
    telemetry interval, between a quarter and one interval from now), then read again. A read that
    fails or times out marks the pod unavailable until its next expected window, backing off (1, 2, 4
    ... up to MAX_BACKOFF_WINDOWS intervals) while it keeps failing; the pod is reported unavailable
    meanwhile, its old windows dropped. Retries of a failed pod run in the background (the caller is
    told "unavailable" at once and the answer is there for the next read), so a dead sidecar blocks a
    reconcile at most once, on its first read. Thread-safe: reconciles of different services share one
    reader.
    """

    def __init__(
        self,
        timeout_s: float = SIDECAR_TIMEOUT_S,
        workers: int = SIDECAR_WORKERS,
        fetch: Callable[[str, float], Any] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.workers = max(1, workers)
        self._fetch = fetch
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._entries: dict[str, _PodEntry] = {}
        self._background: set[Future] = set()
        self._pruned_at = 0.0
        self.reads = 0  # GETs sent (answered or not), for tests and benches
        self.failures = 0

    def _get(self, url: str) -> Any:
        fetch = self._fetch or _get_json
        return fetch(url, self.timeout_s)

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="vlm-sidecar-read")
            return self._pool

    def forget(self, pods: Iterable[str]) -> None:
        with self._lock:
            for p in pods:
                self._entries.pop(p, None)

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait for the background retries in flight (tests and benches)."""
        with self._lock:
            pending = list(self._background)
        if pending:
            wait_futures(pending, timeout=timeout)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def read(
        self, pods: Iterable[tuple[str, str, str | None]], since: float, *, interval: float, now: float | None = None
    ) -> list[Window]:
        """pods: (name, revision, ip). Windows that ended after `since`; SignalsUnavailable when no pod
        answered, or no pod of some revision did (its pods are named)."""
        now = time.time() if now is None else now
        interval = max(1.0, interval)
        overrides = _endpoint_overrides()
        wanted: list[tuple[str, str, str]] = []
        for name, revision, ip in pods:
            addr = overrides.get(name) if overrides is not None else (f"{ip}:{SIDECAR_PORT}" if ip else None)
            if addr:
                wanted.append((name, revision, addr))
        todo: list[tuple[str, str, str]] = []
        retry: list[tuple[str, str, str]] = []
        with self._lock:
            for name, revision, addr in wanted:
                e = self._entries.get(name)
                if e is None or e.addr != addr or e.revision != revision:
                    todo.append((name, revision, addr))
                elif not e.ok:
                    if now >= e.next_read and not e.inflight:  # backing off until then, however far back `since` is
                        e.inflight = True
                        retry.append((name, revision, addr))
                elif now >= e.next_read or since < e.kept_since:
                    todo.append((name, revision, addr))
        if todo:
            self._read_now(todo, since, interval, now)
        for name, revision, addr in retry:
            self._retry(name, revision, addr, since, interval, now)
        out: list[Window] = []
        answered: dict[str, int] = {}
        down: dict[str, list[str]] = {}
        with self._lock:
            for name, revision, _ in wanted:
                e = self._entries.get(name)
                if e is None:
                    continue
                e.used = now
                if e.ok:
                    answered[revision] = answered.get(revision, 0) + 1
                    out.extend(w for w in e.windows if w.end >= since)
                else:
                    down.setdefault(revision, []).append(f"{name} ({e.error})")
            self._prune(now)
        silent = {rev: names for rev, names in down.items() if not answered.get(rev)}
        if not answered or silent:
            names = [n for ns in (silent or down).values() for n in ns]
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            what = "no profiler sidecar answered" if not answered else "no profiler sidecar of revision " + ", ".join(sorted(silent)) + " answered"
            raise SignalsUnavailable(f"{what}: {shown}" if shown else what)
        return out

    def _retry(self, name: str, revision: str, addr: str, since: float, interval: float, now: float) -> None:
        """Read a failed pod again without waiting for it; the answer lands in the cache."""
        fut = self._executor().submit(self._get, f"http://{addr}/windows.json")
        with self._lock:
            self._background.add(fut)

        def done(f: Future) -> None:
            exc = f.exception() if not f.cancelled() else TimeoutError("cancelled")
            if exc is not None and not isinstance(exc, _READ_ERRORS):
                log.error("reading the sidecar of pod %s failed unexpectedly", name, exc_info=exc)
            res = exc if exc is not None else f.result()
            with self._lock:
                self._background.discard(f)
                self._store(name, revision, addr, res, since, interval, now)

        fut.add_done_callback(done)

    def _read_now(self, todo: Sequence[tuple[str, str, str]], since: float, interval: float, now: float) -> None:
        urls = {name: f"http://{addr}/windows.json" for name, _, addr in todo}
        results: dict[str, Any] = {}
        if len(todo) == 1:
            name = todo[0][0]
            try:
                results[name] = self._get(urls[name])
            except _READ_ERRORS as e:
                results[name] = e
        else:
            pool = self._executor()
            futures: dict[str, Future] = {name: pool.submit(self._get, urls[name]) for name, _, _ in todo}
            # The urlopen timeout bounds each socket operation; this bounds the whole call (queueing included).
            limit = self.timeout_s * (2 * math.ceil(len(todo) / self.workers) + 1)
            done, _ = wait_futures(list(futures.values()), timeout=limit)
            for name, f in futures.items():
                if f not in done:
                    f.cancel()
                    results[name] = TimeoutError(f"no answer within {limit:.1f}s")
                    continue
                exc = f.exception()
                if exc is not None and not isinstance(exc, _READ_ERRORS):
                    raise exc
                results[name] = exc if exc is not None else f.result()
        with self._lock:
            for name, revision, addr in todo:
                self._store(name, revision, addr, results[name], since, interval, now)

    def _store(self, name: str, revision: str, addr: str, res: Any, since: float, interval: float, now: float) -> None:
        """Caller holds the lock. One read's outcome (the answer, or the exception) into the cache."""
        self.reads += 1
        old = self._entries.get(name)
        failures = old.failures if old is not None and old.addr == addr else 0
        if isinstance(res, BaseException):
            failures += 1
            self.failures += 1
            log.info("sidecar of pod %s not readable (%d in a row): %s", name, failures, res)
            backoff = interval * min(2 ** (failures - 1), MAX_BACKOFF_WINDOWS)
            self._entries[name] = _PodEntry(addr, revision, ok=False, error=_short(res), failures=failures,
                                            next_read=now + backoff, used=now)
            return
        keep = min(since, now - KEEP_WINDOWS * interval)
        windows = tuple(
            w for w in (Window.from_sidecar(revision, name, d) for d in (res if isinstance(res, list) else []))
            if w.end >= keep
        )
        newest = max((w.end for w in windows), default=now - interval)
        # The next window ends about one interval after the newest; a little slack for the sidecar to
        # publish it. Clamped so a skewed or stopped sidecar clock neither floods nor freezes us.
        wait = min(max(newest + interval + min(1.0, interval / 10) - now, interval / 4), interval)
        self._entries[name] = _PodEntry(addr, revision, ok=True, windows=windows, kept_since=keep,
                                        next_read=now + wait, used=now)

    def _prune(self, now: float) -> None:
        """Caller holds the lock. Drops pods nobody asked about for PRUNE_AFTER_S (gone pods), once a minute."""
        if now - self._pruned_at < 60.0:
            return
        self._pruned_at = now
        for name in [n for n, e in self._entries.items() if now - e.used > PRUNE_AFTER_S]:
            del self._entries[name]


def _short(e: BaseException) -> str:
    text = str(getattr(e, "reason", None) or e) or type(e).__name__
    return text if len(text) <= 80 else text[:77] + "..."


_default_reader: SidecarReader | None = None


def from_sidecars(
    pods: Iterable[tuple[str, str, str | None]],
    since: float,
    *,
    interval: float = 15.0,
    now: float | None = None,
    reader: SidecarReader | None = None,
) -> list[Window]:
    """pods: (name, revision, ip). Windows that ended after `since`, deduplicated by the gate.

    `interval`: the telemetry interval (when the next window of a pod is due). `reader`: the operator's
    (its settings' timeout and pool); a module-wide default one otherwise.
    """
    global _default_reader
    if reader is None:
        if _default_reader is None:
            _default_reader = SidecarReader()
        reader = _default_reader
    return reader.read(pods, since, interval=interval, now=now)


def _query_range(base: str, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.0f}s"})
    try:
        data = _get_json(f"{base}/api/v1/query_range?{params}")
    except (OSError, ValueError) as e:
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
    """One range-query series with string labels and [finite time, numeric string] points; None if unusable
    (a proxy or a broken Prometheus may answer anything: a bad point is dropped, never raised)."""
    if not isinstance(r, dict) or not isinstance(r.get("metric"), dict) or not isinstance(r.get("values"), list):
        return None
    metric = {k: v for k, v in r["metric"].items() if isinstance(k, str) and isinstance(v, str)}
    values = []
    for point in r["values"]:
        if not isinstance(point, (list, tuple)) or len(point) != 2:
            continue
        t, v = _number(point[0]), point[1]
        if t is None or not math.isfinite(t) or not isinstance(v, str) or _number(v) is None:
            continue
        values.append([t, v])
    return {"metric": metric, "values": values}


# Per-window gauges the sidecar exports (all from its last usable window), and the Window field each fills.
_WINDOW_GAUGES = {
    "vlm_scheduler_window_loop_mean_seconds": "loop_mean_seconds",
    "vlm_scheduler_window_loop_p95_seconds": "loop_p95_seconds",
    "vlm_scheduler_window_iterations": "iterations",
    "vlm_sglang_window_ttft_seconds": "ttft_seconds",
    "vlm_sglang_window_itl_seconds": "itl_seconds",
    "vlm_sglang_window_generation_tokens_per_second": "throughput",
    "vlm_sglang_window_requests_per_second": "request_rate",
    "vlm_profiler_stale": "stale",
    "vlm_scheduler_feature_transport_share_ratio": "feature_transport_share",
    "vlm_scheduler_ipc_handle_reopen_share_ratio": "ipc_handle_reopen_share",
}
_KEY = "pod, revision, tp_rank"


# A front-end window ends just after the scheduler windows it ran beside (the sidecar summarizes it last).
_FRONTEND_ATTACH_S = 10.0


def _attach_frontend(series: Callable[..., list[dict[str, Any]]], windows: dict[tuple[str, str, str, float],
                                                                                dict[str, Any]]) -> None:
    """Give each scheduler window the front-end window sampled beside it (`frontend.roles`, as the sidecar's
    /windows.json has it: busy shares and inclusive function shares per role), when the sidecar samples the
    front end. The front-end gauges describe the newest front-end window, identified by
    `vlm_frontend_last_window_timestamp_seconds`; each is read at the first step that shows it."""
    ends = series("vlm_frontend_last_window_timestamp_seconds", by="pod, revision")
    if not ends:
        return  # front-end sampling is off: no further queries
    at: dict[tuple[str, str], dict[float, float]] = {}  # (pod, revision) -> {t: front-end window end}
    for sr in ends:
        k = (sr["metric"].get("pod", ""), sr["metric"].get("revision", ""))
        first: dict[float, float] = {}
        for t, v in sr["values"]:
            first.setdefault(float(v), float(t))
        at[k] = {t: end for end, t in first.items()}
    roles: dict[tuple[str, str, float], dict[str, dict[str, Any]]] = {}

    def put(sr: Mapping[str, Any], apply: Callable[[dict[str, Any], float], None]) -> None:
        m = sr["metric"]
        role = m.get("role", "")
        by_t = at.get((m.get("pod", ""), m.get("revision", "")))
        if role not in FRONTEND_ROLES or not by_t:
            return
        for t, v in sr["values"]:
            end = by_t.get(float(t))
            if end is not None and v not in ("NaN", "+Inf", "-Inf"):
                apply(roles.setdefault((m["pod"], m["revision"], end), {}).setdefault(role, {}), float(v))

    for sr in series("vlm_process_busy_share_ratio", by="pod, revision, role"):
        put(sr, lambda r, v: r.__setitem__("busy_share", v))
    for sr in series("vlm_process_function_share_ratio", ',kind="inclusive"', by="pod, revision, role, function"):
        fn = sr["metric"].get("function", "")
        put(sr, lambda r, v, fn=fn: r.setdefault("function_shares", {}).__setitem__(fn, v))
    by_pod: dict[tuple[str, str], list[float]] = {}
    for pod, revision, end in roles:
        by_pod.setdefault((pod, revision), []).append(end)
    for (pod, revision, _rank, end), d in windows.items():
        near = [e for e in by_pod.get((pod, revision), ()) if end - 1.0 <= e <= end + _FRONTEND_ATTACH_S]
        if near:
            d["frontend"] = {"roles": roles[(pod, revision, min(near))]}


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
    for sr in series("vlm_scheduler_stage_share_ratio", by=f"{_KEY}, stage"):
        st = sr["metric"].get("stage", "")
        assign(sr, lambda d, v, st=st: d["stage_shares"].__setitem__(st, v))
    for sr in series("vlm_scheduler_function_share_ratio", ',kind="inclusive"', by=f"{_KEY}, function"):
        fn = sr["metric"].get("function", "")
        assign(sr, lambda d, v, fn=fn: d["function_shares"].__setitem__(fn, v))
    _attach_frontend(series, windows)
    out = []
    for (pod, revision, rank, end), d in sorted(windows.items()):
        if "loop_mean_seconds" not in d:
            continue
        rank_n = int(rank) if rank.isdigit() else 0
        out.append(Window.from_sidecar(revision, pod, {"id": f"{pod}/{rank}@{end:.3f}", "tp_rank": rank_n, **d}))
    return out
