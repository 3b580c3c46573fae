"""A tiny JSON HTTP server for tests that stand in for a sidecar or a pod: `answer(path, peer)` gives
(status, JSON-able body) per GET."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[str, str], tuple[int, Any]]


def start_json(answer: Answer, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """The server, serving in a daemon thread until its `shutdown()`."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, obj = answer(self.path, self.client_address[0])
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@contextlib.contextmanager
def serve_json(answer: Answer, host: str = "127.0.0.1", port: int = 0) -> Iterator[ThreadingHTTPServer]:
    srv = start_json(answer, host, port)
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
