"""Fuzzing the sidecar's HTTP endpoints: any path, query and body gets a status and a body, never an
exception, and garbage on the socket (bad Content-Length, a non-HTTP line) leaves the server serving."""

from __future__ import annotations

import socket
import urllib.request

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vlm_sidecar.collector import ProfileStore
from vlm_sidecar.server import SidecarHTTP
from vlm_testing.sidecar import LABELS, fill

PATHS = ["/metrics", "/healthz", "/readyz", "/windows.json", "/profile/latest.svg", "/profile/latest.json",
         "/profile/diff.svg", "/", "/windows.json/", "//metrics"]
texts = st.text(max_size=12) | st.sampled_from(["-1", "0", "99999999999999999999", "1e3", "", "collapsed", "x"])
queries = st.dictionaries(st.sampled_from(["tp_rank", "limit", "baseline", "format", "role", "zz"]),
                          st.lists(texts, min_size=1, max_size=2), max_size=4)  # parse_qs never gives []


def _app(filled: bool) -> SidecarHTTP:
    store = ProfileStore(4)
    if filled:
        fill(store)
    return SidecarHTTP(store, LABELS, stale_after_s=60, clock=lambda: 1015.0)


APPS = {True: _app(True), False: _app(False)}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.booleans(), st.sampled_from(PATHS) | st.text(max_size=16), queries, st.binary(max_size=256))
def test_any_request_gets_an_answer(filled, path, query, body):
    app = APPS[filled]
    for status, ctype, out in (app.get(path, query), app.post(path, query, body)):
        assert status in (200, 400, 404, 413), (path, query, status)
        assert isinstance(ctype, str) and isinstance(out, bytes)


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                c = s.recv(4096)
            except OSError:
                break
            if not c:
                break
            chunks.append(c)
        return b"".join(chunks)


def test_garbage_on_the_socket_leaves_the_server_serving():
    app = _app(True)
    httpd = app.serve("127.0.0.1", 0)
    port = httpd.server_address[1]
    try:
        answers = [
            _raw(port, b"POST /profile/diff.svg HTTP/1.1\r\nContent-Length: -5\r\n\r\nabc"),
            _raw(port, b"POST /profile/diff.svg HTTP/1.1\r\nContent-Length: abc\r\n\r\nabc"),
            _raw(port, b"\x00\xff garbage\r\n\r\n"),
            _raw(port, b"GET /windows.json?limit=%ff%fe HTTP/1.1\r\n\r\n"),
        ]
        assert answers[0].startswith(b"HTTP/1.0 400") and answers[1].startswith(b"HTTP/1.0 400"), answers[:2]
        assert answers[3].startswith(b"HTTP/1.0 200"), answers[3][:80]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.status == 200
    finally:
        app.shutdown()
