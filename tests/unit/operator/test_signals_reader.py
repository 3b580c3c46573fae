"""signals.SidecarReader on loopback: a short timeout, concurrent reads, one read per pod per window, dead
sidecars remembered until their next window (backing off), and unreachable pods reported, never ignored."""

from __future__ import annotations

import contextlib
import json
import socket
import time

import pytest
from vlm_operator import signals

from tests.jsonhttp import serve_json

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
    reader = signals.SidecarReader(timeout_s=0.3, workers=8)
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
    reader = signals.SidecarReader(timeout_s=1.0)
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
    reader = signals.SidecarReader()
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

    reader = signals.SidecarReader(fetch=fetch)
    tried = []
    for t in range(0, 1200, 5):
        before = len(calls)
        with pytest.raises(signals.SignalsUnavailable, match="no profiler sidecar answered: p"):
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

    reader = signals.SidecarReader(fetch=fetch)
    with pytest.raises(signals.SignalsUnavailable) as e:
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
    reader = signals.SidecarReader(fetch=lambda url, timeout: seen.append(url) or entries(NOW - 1))
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

    reader = signals.SidecarReader(fetch=fetch)
    for i in range(2):
        with pytest.raises(signals.SignalsUnavailable):
            reader.read([(f"p{i}", "r1", "10.0.0.1")], 0, interval=INTERVAL, now=NOW)
    assert reader.read([("p2", "r1", "10.0.0.1")], 0, interval=INTERVAL, now=NOW) == []


def test_pods_nobody_asks_about_are_pruned():
    reader = signals.SidecarReader(fetch=lambda url, timeout: entries(NOW - 1))
    reader.read([("gone", "r1", "10.0.0.1")], 0, interval=INTERVAL, now=NOW)
    reader.read([("other", "r1", "10.0.0.2")], 0, interval=INTERVAL, now=NOW + signals.PRUNE_AFTER_S + 61)
    assert set(reader._entries) == {"other"}


def test_a_failed_pod_is_retried_in_the_background_without_blocking_the_caller(tmp_path, monkeypatch, live,
                                                                                  black_holes):
    hole = black_holes()
    endpoints(tmp_path, monkeypatch, {"live": live["addr"], "dead": hole})
    reader = signals.SidecarReader(timeout_s=0.5, workers=2)
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

    reader = signals.SidecarReader(fetch=fetch)
    pods = [("p", "r1", "10.0.0.1")]
    with pytest.raises(signals.SignalsUnavailable):
        reader.read(pods, 0, interval=INTERVAL, now=NOW)
    state["up"] = True
    with contextlib.suppress(signals.SignalsUnavailable):  # retried in the background: maybe not yet known
        reader.read(pods, 0, interval=INTERVAL, now=NOW + 15)
    reader.wait_idle()
    assert len(reader.read(pods, 0, interval=INTERVAL, now=NOW + 16)) == 6
