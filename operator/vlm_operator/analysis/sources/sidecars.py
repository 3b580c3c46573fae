"""The sidecar source: every ready pod's `/windows.json`, read directly on the pod network.

GET http://<pod IP>:9400/windows.json for every ready pod, through a `SidecarReader`: a short timeout
(`VLM_SIDECAR_TIMEOUT_SECONDS`), all pods of a call at once on a small shared thread pool
(`VLM_SIDECAR_WORKERS`), and a per-pod cache that is read again only when the pod's next window is due, so a
live sidecar is read about once per telemetry window and a dead one costs one timeout per window (then less:
it backs off), never one per reconcile. A pod that did not answer is unavailable until its next read, never
"no regression". `VLM_SIDECAR_ENDPOINTS` (a JSON file: pod name -> host:port) overrides pod IPs; only a
testbed run without its network namespace (VLM_TESTBED_NETNS=0) uses it, so kwok's pod IPs are never dialled
on the host's network. The e2e tier and the demo read sidecars by pod IP.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from http.client import HTTPException
from typing import Any

from vlm_operator.analysis.sources.base import SignalsUnavailable, get_json
from vlm_operator.analysis.window import Window
from vlm_operator.api.names import SIDECAR_PORT

log = logging.getLogger("vlm_operator.analysis.sources.sidecars")
SIDECAR_TIMEOUT_S = 1.0  # VLM_SIDECAR_TIMEOUT_SECONDS' default: a sidecar on the pod network answers in ms
SIDECAR_WORKERS = 8  # VLM_SIDECAR_WORKERS' default
KEEP_WINDOWS = 4  # a cached pod keeps at least its windows of the last 4 intervals (the profiler summary's span)
# A `since` some caller asked for (an analysis' start) keeps the windows after it in the cache while it is asked for
# again within this long; then the cache shrinks back to what the remaining callers need (memory stays bounded by
# what the running analyses read).
HORIZON_IDLE_S = 300.0
MAX_BACKOFF_WINDOWS = 8  # a pod that keeps failing is tried at most every 8 telemetry intervals
PRUNE_AFTER_S = 600.0  # cache entries of pods nobody asked about for this long are dropped
_READ_ERRORS = (OSError, ValueError, HTTPException)  # a sidecar that cannot be read (refused, timed out, garbled)


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
    horizons: dict[float, float] = field(default_factory=dict)  # `since` asked for -> when it was last asked


class SidecarReader:
    """Reads `/windows.json` of many pods: bounded time, concurrent, cached per pod until its next window.

    A read that answers is kept until the pod's next window is due (its newest window's end plus one
    telemetry interval, between a quarter and one interval from now), then read again. A read that
    fails or times out marks the pod unavailable until its next expected window, backing off (1, 2, 4
    ... up to MAX_BACKOFF_WINDOWS intervals) while it keeps failing; the pod is reported unavailable
    meanwhile (the windows it had stay cached for its next good read). Retries of a failed pod run in the background (the caller is
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
        self._groups: dict[str, str] = {}  # pod -> the group (its service) it was last read for
        self._background: set[Future] = set()
        self._pruned_at = 0.0
        self.reads = 0  # GETs sent (answered or not), for tests and benches
        self.failures = 0

    def _get(self, url: str) -> Any:
        fetch = self._fetch or get_json
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
                self._groups.pop(p, None)

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
        self, pods: Iterable[tuple[str, str, str | None]], since: float, *, interval: float, now: float | None = None,
        group: str = "", revisions: Iterable[str] | None = None,
    ) -> list[Window]:
        """pods: (name, revision, ip). Windows that ended after `since`; SignalsUnavailable when no pod
        answered, or no pod of some revision did (its pods are named).

        With `group` (the service, "namespace/name"), the windows a pod of the group gave before it left (an
        autoscaler's scale-down, a deleted pod) still count: every cached window of the group's other pods (of
        `revisions`, when given) that ended after `since`. They stay cached while they are asked for."""
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
                if e is not None:
                    e.horizons[since] = now
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
                if group:
                    self._groups[name] = group
                if e.ok:
                    answered[revision] = answered.get(revision, 0) + 1
                    out.extend(w for w in e.windows if w.end >= since)
                else:
                    down.setdefault(revision, []).append(f"{name} ({e.error})")
            if group:
                out.extend(self._departed(group, {n for n, _, _ in wanted}, since, revisions, now))
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
        """Caller holds the lock. One read's outcome (the answer, or the exception) into the cache.

        Reads are merged, not replaced: a sidecar keeps a bounded history (64 windows across its TP ranks by
        default: 16 minutes at TP1, 2 minutes at TP8), and the reader reads each pod about once per window, so
        the cache holds every window since the oldest `since` still asked for (an analysis' start; see
        HORIZON_IDLE_S), whatever the TP degree. A failed read keeps what was cached (not returned while the
        pod is unavailable) for the pod's next good read."""
        self.reads += 1
        old = self._entries.get(name)
        same = old is not None and old.addr == addr and old.revision == revision
        horizons = {s: t for s, t in (old.horizons.items() if same else ()) if now - t < HORIZON_IDLE_S}  # type: ignore[union-attr]
        horizons[since] = now
        keep = min(min(horizons), now - KEEP_WINDOWS * interval)
        carried = tuple(w for w in old.windows if w.end >= keep) if same else ()  # type: ignore[union-attr]
        if isinstance(res, BaseException):
            failures = (old.failures if old is not None and old.addr == addr else 0) + 1
            self.failures += 1
            log.info("sidecar of pod %s not readable (%d in a row): %s", name, failures, res)
            backoff = interval * min(2 ** (failures - 1), MAX_BACKOFF_WINDOWS)
            self._entries[name] = _PodEntry(addr, revision, ok=False, windows=carried, error=_short(res),
                                            failures=failures, next_read=now + backoff, used=now, horizons=horizons)
            return
        merged = {(w.tp_rank, w.id, w.end): w for w in carried}  # ids restart with the sidecar; ends do not repeat
        for d in res if isinstance(res, list) else []:
            w = Window.from_sidecar(revision, name, d)
            if w.end >= keep:
                merged[(w.tp_rank, w.id, w.end)] = w
        windows = tuple(sorted(merged.values(), key=lambda w: (w.end, w.tp_rank)))
        newest = max((w.end for w in windows), default=now - interval)
        # The next window ends about one interval after the newest; a little slack for the sidecar to
        # publish it. Clamped so a skewed or stopped sidecar clock neither floods nor freezes us.
        wait = min(max(newest + interval + min(1.0, interval / 10) - now, interval / 4), interval)
        self._entries[name] = _PodEntry(addr, revision, ok=True, windows=windows, kept_since=keep,
                                        next_read=now + wait, used=now, horizons=horizons)

    def _departed(self, group: str, present: set[str], since: float, revisions: Iterable[str] | None,
                  now: float) -> list[Window]:
        """Caller holds the lock. The cached windows after `since` of the group's pods that are not among the
        pods asked about now (they left), of `revisions` when given."""
        revs = None if revisions is None else set(revisions)
        out: list[Window] = []
        for name, g in self._groups.items():
            e = self._entries.get(name)
            if g != group or name in present or e is None or (revs is not None and e.revision not in revs):
                continue
            ws = [w for w in e.windows if w.end >= since]
            if ws:
                e.used = now  # kept while it still counts
                out.extend(ws)
        return out

    def _prune(self, now: float) -> None:
        """Caller holds the lock. Drops pods nobody asked about for PRUNE_AFTER_S (gone pods), once a minute."""
        if now - self._pruned_at < 60.0:
            return
        self._pruned_at = now
        for name in [n for n, e in self._entries.items() if now - e.used > PRUNE_AFTER_S]:
            del self._entries[name]
            self._groups.pop(name, None)


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
