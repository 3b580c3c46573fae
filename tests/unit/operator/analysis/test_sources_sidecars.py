"""sources.SidecarReader on loopback: a short timeout, concurrent reads, one read per pod per window, dead
sidecars remembered until their next window (backing off), and unreachable pods reported, never ignored."""

from __future__ import annotations

import contextlib
import json
import socket
import time

import pytest

from vlm_operator.analysis import sources
from vlm_operator.analysis.sources import sidecars
from vlm_testing.jsonhttp import serve_json

INTERVAL = 15.0
NOW = 10_000.0


def entries(last_end: float, n: int = 6, loop: float = 0.02) -> list[dict]:
    return [{"id": i, "end": last_end - INTERVAL * (n - 1 - i), "samples": 500, "loop_mean_seconds": loop}
            for i in range(n)]


@pytest.fixture
def live():
    """A sidecar answering /windows.json with `state['windows']`; counts its requests."""
    state = {"windows": entries(NOW - 2), "hits": 0}

    def answer(_path: str, _peer: str) -> tuple[int, list]:
        state["hits"] += 1
        return 200, state["windows"]

    with serve_json(answer) as srv:
        state["addr"] = f"127.0.0.1:{srv.server_address[1]}"
        yield state

@pytest.fixture
def black_holes():
    """Listening sockets that never answer: a connect succeeds, the read hangs until the timeout."""
    socks = []

    def make() -> str:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        socks.append(s)
        return f"127.0.0.1:{s.getsockname()[1]}"

    yield make
    for s in socks:
        s.close()


def endpoints(tmp_path, monkeypatch, mapping: dict[str, str]) -> None:
    f = tmp_path / "endpoints.json"
    f.write_text(json.dumps(mapping))
    monkeypatch.setenv("VLM_SIDECAR_ENDPOINTS", str(f))


def test_dead_sidecars_are_read_concurrently_within_the_timeout(tmp_path, monkeypatch, live, black_holes):
    dead = {f"dead-{i}": black_holes() for i in range(8)}
    endpoints(tmp_path, monkeypatch, {"live": live["addr"], **dead})
    reader = sources.SidecarReader(timeout_s=0.3, workers=8)
    pods = [("live", "r1", None)] + [(n, "r1", None) for n in dead]
    started = time.monotonic()
    ws = reader.read(pods, NOW - 60, interval=INTERVAL, now=NOW)
    elapsed = time.monotonic() - started
    assert {w.pod for w in ws} == {"live"}
    assert elapsed < 1.5, f"8 dead sidecars took {elapsed:.2f}s (sequential would be >= 2.4s)"
    assert reader.reads == 9 and reader.failures == 8
    # Within the window nothing is read again: the dead ones cost no second timeout.
    started = time.monotonic()
    reader.read(pods, NOW - 60, interval=INTERVAL, now=NOW + 5)
    assert time.monotonic() - started < 0.1 and reader.reads == 9
    reader.close()


def test_a_live_sidecar_is_read_once_per_window(tmp_path, monkeypatch, live):
    endpoints(tmp_path, monkeypatch, {"p": live["addr"]})
    reader = sources.SidecarReader(timeout_s=1.0)
    first = reader.read([("p", "r1", None)], NOW - 60, interval=INTERVAL, now=NOW)
    # Newest window ended at NOW-2: the next one ends at NOW+13; until then the cache answers.
    for dt in (1, 5, 10):
        assert reader.read([("p", "r1", None)], NOW - 60, interval=INTERVAL, now=NOW + dt) == first
    assert live["hits"] == 1
    live["windows"] = entries(NOW + 13)
    later = reader.read([("p", "r1", None)], NOW - 60, interval=INTERVAL, now=NOW + 15)
    assert live["hits"] == 2 and max(w.end for w in later) == NOW + 13


def test_an_earlier_since_than_cached_reads_again(tmp_path, monkeypatch, live):
    endpoints(tmp_path, monkeypatch, {"p": live["addr"]})
    reader = sources.SidecarReader()
    short = reader.read([("p", "r1", None)], NOW - 30, interval=INTERVAL, now=NOW)
    assert live["hits"] == 1 and len(short) == 2  # ending at NOW-2 and NOW-17 (4 intervals are kept)
    assert len(reader.read([("p", "r1", None)], NOW - 60, interval=INTERVAL, now=NOW + 1)) == 4
    assert live["hits"] == 1
    long = reader.read([("p", "r1", None)], NOW - 1000, interval=INTERVAL, now=NOW + 1)
    assert live["hits"] == 2 and len(long) == 6


def test_failed_pods_back_off_and_are_unavailable_meanwhile():
    calls: list[str] = []

    def fetch(url, timeout):
        calls.append(url)
        raise ConnectionRefusedError("refused")

    reader = sources.SidecarReader(fetch=fetch)
    tried = []
    for t in range(0, 1200, 5):
        before = len(calls)
        with pytest.raises(sources.SignalsUnavailable, match="no profiler sidecar answered: p"):
            reader.read([("p", "r1", "10.0.0.1")], 0, interval=INTERVAL, now=NOW + t)
        reader.wait_idle()
        if len(calls) > before:
            tried.append(t)
    assert tried == [0, 15, 45, 105, 225, 345, 465, 585, 705, 825, 945, 1065, 1185]


def test_a_revision_whose_pods_all_failed_is_unavailable_even_if_others_answer():
    def fetch(url, timeout):
        if "10.0.0.2" in url:
            raise TimeoutError("timed out")
        return entries(NOW - 1)

    reader = sources.SidecarReader(fetch=fetch)
    with pytest.raises(sources.SignalsUnavailable) as e:
        reader.read([("stable-0", "old", "10.0.0.1"), ("canary-0", "new", "10.0.0.2")], NOW - 60,
                    interval=INTERVAL, now=NOW)
    assert "revision new" in str(e.value) and "canary-0" in str(e.value) and "stable-0" not in str(e.value)
    # One of two canary pods answering is data (the gate counts the samples it gets).
    ws = reader.read([("c1", "new", "10.0.0.3"), ("canary-0", "new", "10.0.0.2")], NOW - 60,
                     interval=INTERVAL, now=NOW)
    assert {w.pod for w in ws} == {"c1"}


def test_a_new_pod_ip_is_read_at_once(monkeypatch):
    monkeypatch.delenv("VLM_SIDECAR_ENDPOINTS", raising=False)
    seen = []
    reader = sources.SidecarReader(fetch=lambda url, timeout: seen.append(url) or entries(NOW - 1))
    reader.read([("p", "r1", "10.0.0.1")], 0, interval=INTERVAL, now=NOW)
    reader.read([("p", "r1", "10.0.0.9")], 0, interval=INTERVAL, now=NOW + 1)
    assert seen == ["http://10.0.0.1:9400/windows.json", "http://10.0.0.9:9400/windows.json"]


def test_garbled_answers_are_failures_not_exceptions():
    import http.client

    answers = [ValueError("bad json"), http.client.BadStatusLine("x"), {"not": "a list"}]

    def fetch(url, timeout):
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    reader = sources.SidecarReader(fetch=fetch)
    for i in range(2):
        with pytest.raises(sources.SignalsUnavailable):
            reader.read([(f"p{i}", "r1", "10.0.0.1")], 0, interval=INTERVAL, now=NOW)
    assert reader.read([("p2", "r1", "10.0.0.1")], 0, interval=INTERVAL, now=NOW) == []


def test_pods_nobody_asks_about_are_pruned():
    reader = sources.SidecarReader(fetch=lambda url, timeout: entries(NOW - 1))
    reader.read([("gone", "r1", "10.0.0.1")], 0, interval=INTERVAL, now=NOW)
    reader.read([("other", "r1", "10.0.0.2")], 0, interval=INTERVAL, now=NOW + sidecars.PRUNE_AFTER_S + 61)
    assert set(reader._entries) == {"other"}


def test_a_failed_pod_is_retried_in_the_background_without_blocking_the_caller(tmp_path, monkeypatch, live,
                                                                                  black_holes):
    hole = black_holes()
    endpoints(tmp_path, monkeypatch, {"live": live["addr"], "dead": hole})
    reader = sources.SidecarReader(timeout_s=0.5, workers=2)
    pods = [("live", "r1", None), ("dead", "r1", None)]
    started = time.monotonic()
    reader.read(pods, NOW - 60, interval=INTERVAL, now=NOW)  # the first read of a new pod waits for it
    assert 0.4 < time.monotonic() - started < 1.5
    live["windows"] = entries(NOW + 13)
    started = time.monotonic()
    ws = reader.read(pods, NOW - 60, interval=INTERVAL, now=NOW + 15)  # the retry of "dead" is due
    assert time.monotonic() - started < 0.3 and {w.pod for w in ws} == {"live"}
    reader.wait_idle()
    assert reader.reads == 4 and reader.failures == 2  # the retry ran, failed, and backs off
    with reader._lock:
        assert reader._entries["dead"].failures == 2 and reader._entries["dead"].next_read == NOW + 15 + 2 * INTERVAL
    reader.close()


def test_a_recovered_pod_answers_on_the_read_after_its_background_retry():
    state = {"up": False}

    def fetch(url, timeout):
        if not state["up"]:
            raise ConnectionRefusedError("refused")
        return entries(NOW + 14)

    reader = sources.SidecarReader(fetch=fetch)
    pods = [("p", "r1", "10.0.0.1")]
    with pytest.raises(sources.SignalsUnavailable):
        reader.read(pods, 0, interval=INTERVAL, now=NOW)
    state["up"] = True
    with contextlib.suppress(sources.SignalsUnavailable):  # retried in the background: maybe not yet known
        reader.read(pods, 0, interval=INTERVAL, now=NOW + 15)
    reader.wait_idle()
    assert len(reader.read(pods, 0, interval=INTERVAL, now=NOW + 16)) == 6


class RingSidecar:
    """A sidecar's /windows.json as the real one keeps it: the newest `history` windows across all TP ranks
    (64 by default: 8 per rank at TP8, 2 minutes of 15 s windows), ids counted per process."""

    def __init__(self, ranks: int, history: int = 64):
        self.ranks, self.history, self.windows, self.next_id = ranks, history, [], 0

    def tick(self, end: float) -> None:
        for rank in range(self.ranks):
            self.windows.append({"id": self.next_id, "tp_rank": rank, "end": end, "samples": 500,
                                 "loop_mean_seconds": 0.02})
            self.next_id += 1
        self.windows = self.windows[-self.history:]

    def fetch(self, _url: str, _timeout: float) -> list[dict]:
        return list(self.windows)


def test_at_tp8_an_analysis_sees_every_window_since_it_started_not_the_sidecars_last_two_minutes():
    """The sidecar keeps 64 windows across its ranks: at TP8 that is 2 minutes. The reader merges its reads, so
    a 30-minute analysis (a look a minute, the profiler summary between) gets all 120 windows of each of the 8
    ranks; a reader that replaced its cache at each read would give the last 8 per rank."""
    side = RingSidecar(ranks=8)
    reader = sources.SidecarReader(fetch=side.fetch)
    start = NOW
    got: list = []
    for k in range(1, 121):
        t = start + k * INTERVAL
        side.tick(t - 1)
        reader.read([("p", "r1", "10.0.0.1")], t - 4 * INTERVAL, interval=INTERVAL, now=t)  # the profiler summary
        if k % 4 == 0:  # the gate's look, once a minute, since the step started
            got = reader.read([("p", "r1", "10.0.0.1")], start, interval=INTERVAL, now=t + 0.5)
    per_rank = {r: sorted(w.end for w in got if w.tp_rank == r) for r in range(8)}
    assert all(len(ends) == 120 for ends in per_rank.values()), {r: len(e) for r, e in per_rank.items()}
    assert per_rank[7][0] == start + INTERVAL - 1 and per_rank[7][-1] == start + 120 * INTERVAL - 1


def test_the_cache_shrinks_back_once_nobody_asks_for_the_old_windows():
    side = RingSidecar(ranks=1)
    reader = sources.SidecarReader(fetch=side.fetch)
    t = NOW
    for k in range(1, 41):  # 10 minutes of an analysis that asks since NOW
        t = NOW + k * INTERVAL
        side.tick(t - 1)
        reader.read([("p", "r1", "10.0.0.1")], NOW, interval=INTERVAL, now=t)
    assert len(reader._entries["p"].windows) == 40
    for k in range(41, 41 + int(sidecars.HORIZON_IDLE_S / INTERVAL) + 2):  # then only the profiler asks
        t = NOW + k * INTERVAL
        side.tick(t - 1)
        reader.read([("p", "r1", "10.0.0.1")], t - 4 * INTERVAL, interval=INTERVAL, now=t)
    kept = reader._entries["p"].windows
    # What the last HORIZON_IDLE_S of the profiler's asks (each since its own 4 intervals back) still cover.
    assert len(kept) <= (sidecars.HORIZON_IDLE_S + 4 * INTERVAL) / INTERVAL + 1, len(kept)
    assert min(w.end for w in kept) > NOW + 30 * INTERVAL  # the analysis' first windows are gone


def test_a_restarted_sidecar_counts_its_ids_again_and_no_cached_window_is_lost():
    side = RingSidecar(ranks=1)
    reader = sources.SidecarReader(fetch=side.fetch)
    for k in range(1, 5):
        side.tick(NOW + k * INTERVAL - 1)
        reader.read([("p", "r1", "10.0.0.1")], NOW, interval=INTERVAL, now=NOW + k * INTERVAL)
    side.windows, side.next_id = [], 0  # the sidecar container restarted: ids from 0 again
    for k in range(5, 8):
        side.tick(NOW + k * INTERVAL - 1)
        got = reader.read([("p", "r1", "10.0.0.1")], NOW, interval=INTERVAL, now=NOW + k * INTERVAL)
    assert sorted(w.end for w in got) == [NOW + k * INTERVAL - 1 for k in range(1, 8)]


def test_windows_of_a_pod_that_left_still_count_for_its_service_while_asked_for():
    """An autoscaler's scale-down mid-step: the stable pod that left gave windows before it went, and the gate still
    compares them (a pod of another service, or of a revision not asked for, is not mixed in)."""
    answers = {"a": entries(NOW - 2, loop=0.02), "b": entries(NOW - 2, loop=0.03),
               "z": entries(NOW - 2, loop=0.05)}
    reader = sidecars.SidecarReader(fetch=lambda url, _t: answers[url.split("//")[1].split(":")[0]])
    since = NOW - 4 * INTERVAL
    read = {"a": ("a", "stable", "a"), "b": ("b", "stable", "b"), "z": ("z", "stable", "z")}
    both = reader.read([read["a"], read["b"]], since, interval=INTERVAL, now=NOW, group="ns/svc")
    reader.read([read["z"]], since, interval=INTERVAL, now=NOW, group="ns/other")
    assert {w.pod for w in both} == {"a", "b"}
    # b is gone (scaled down): its windows after `since` still come with a's, z's (another service) never do.
    later = reader.read([read["a"]], since, interval=INTERVAL, now=NOW + 20, group="ns/svc")
    assert {w.pod for w in later} == {"a", "b"}
    assert len([w for w in later if w.pod == "b"]) == len([w for w in both if w.pod == "b"])
    assert {w.pod for w in reader.read([read["a"]], since, interval=INTERVAL, now=NOW + 21, group="ns/svc",
                                       revisions=["canary"])} == {"a"}  # b's revision was not asked for
    # Without a group (the judge's reads), only the pods asked about.
    assert {w.pod for w in reader.read([read["a"]], since, interval=INTERVAL, now=NOW + 22)} == {"a"}
    # A later step (since after b left) has none of b's windows.
    assert {w.pod for w in reader.read([read["a"]], NOW + 30, interval=INTERVAL, now=NOW + 40,
                                       group="ns/svc")} <= {"a"}


def test_the_sidecar_source_reads_departed_pods_of_its_own_service():
    src = sources.choose("Sidecars", None, namespace="ns", service="svc", interval_s=INTERVAL, pods=[],
                         reader=sidecars.SidecarReader())
    assert src.group == "ns/svc"
