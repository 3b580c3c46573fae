"""The sidecar's HTTP port: metrics, probes, flamegraphs, window summaries.

GET  /metrics                       Prometheus text, computed at scrape time
GET  /healthz                       200 while the process serves and the profiling loop thread lives
GET  /readyz                        same; never depends on finding a scheduler (the pod must stay Ready)
GET  /profile/latest.svg            flamegraph of the newest window (?tp_rank=N, default 0; ?role=R for a
                                    front-end role: its processes' role threads merged)
GET  /profile/latest.json           speedscope JSON (?format=collapsed for collapsed-stack text; ?role=R too)
GET  /profile/diff.svg?baseline=ID  newest window vs stored window ID
POST /profile/diff.svg              newest window vs the collapsed stacks in the request body
GET  /windows.json                  last N window summaries (?limit=N), oldest first
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from vlm_sidecar.collector import ProfileStore, SidecarCollector
from vlm_sidecar.flamegraph import render_diff_svg, render_svg, to_speedscope
from vlm_sidecar.model import FRONTEND_ROLES
from vlm_sidecar.parser import format_collapsed, parse_collapsed

MAX_BODY = 16 << 20


class SidecarHTTP:
    def __init__(self, store: ProfileStore, labels: dict[str, str], stale_after_s: float, clock: Callable[[], float],
                 alive: Callable[[], bool] = lambda: True) -> None:
        self.store = store
        self.alive = alive
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SidecarCollector(store, labels, stale_after_s, clock))
        self.httpd: ThreadingHTTPServer | None = None

    # Each handler returns (status, content type, body).
    def get(self, path: str, query: dict[str, list[str]]) -> tuple[int, str, bytes]:
        rank = _int(query, "tp_rank", 0)
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path in ("/healthz", "/readyz"):
            ok = self.alive()
            return (200 if ok else 503), "text/plain", (b"ok\n" if ok else b"profiling loop stopped\n")
        if path == "/windows.json":
            limit = _int(query, "limit", 0)
            ws = [w.to_json() for w in self.store.windows()]
            return 200, "application/json", json.dumps(ws[-limit:] if limit > 0 else ws).encode()
        role = query.get("role", ["scheduler"])[0] or "scheduler"
        if path in ("/profile/latest.svg", "/profile/latest.json") and role != "scheduler":
            return self._role_profile(path, role, query)
        latest = self.store.latest_with_stacks(rank)
        if path == "/profile/latest.svg":
            if latest is None:
                return 404, "text/plain", b"no profile yet\n"
            w, stacks = latest
            title = f"window {w.id} tp_rank {w.tp_rank} ({w.result})"
            return 200, "image/svg+xml", render_svg(stacks, title).encode()
        if path == "/profile/latest.json":
            if latest is None:
                return 404, "application/json", b'{"error": "no profile yet"}'
            w, stacks = latest
            if query.get("format", ["speedscope"])[0] == "collapsed":
                return 200, "text/plain", format_collapsed(stacks).encode()
            return 200, "application/json", json.dumps(to_speedscope(stacks, f"window {w.id}")).encode()
        if path == "/profile/diff.svg":
            if "baseline" not in query:
                return 400, "text/plain", b"baseline=<window id> required (or POST collapsed stacks)\n"
            base_id = _int(query, "baseline", -1)
            base = self.store.stacks(base_id)
            if base is None:
                return 404, "text/plain", f"no stored window {base_id}\n".encode()
            return self._diff(latest, base, f"window {base_id}")
        return 404, "text/plain", b"not found\n"

    def _role_profile(self, path: str, role: str, query: dict[str, list[str]]) -> tuple[int, str, bytes]:
        if role not in FRONTEND_ROLES:
            return 400, "text/plain", f"unknown role {role[:40]!r} (scheduler, {', '.join(FRONTEND_ROLES)})\n".encode()
        latest = self.store.latest_role_stacks(role)
        if latest is None:
            return 404, "text/plain", f"no {role} profile yet\n".encode()
        fw, stacks = latest
        summary = fw.roles.get(role)
        title = f"window {fw.id} {role} ({summary.sampled if summary else 0} processes)"
        if path == "/profile/latest.svg":
            return 200, "image/svg+xml", render_svg(stacks, title).encode()
        if query.get("format", ["speedscope"])[0] == "collapsed":
            return 200, "text/plain", format_collapsed(stacks).encode()
        return 200, "application/json", json.dumps(to_speedscope(stacks, title)).encode()

    def post(self, path: str, query: dict[str, list[str]], body: bytes) -> tuple[int, str, bytes]:
        if path != "/profile/diff.svg":
            return 404, "text/plain", b"not found\n"
        base, bad = parse_collapsed(body)
        if not base:
            return 400, "text/plain", f"no collapsed stacks in body ({bad} bad lines)\n".encode()
        return self._diff(self.store.latest_with_stacks(_int(query, "tp_rank", 0)), base, "posted profile")

    def _diff(self, latest, base, base_name: str) -> tuple[int, str, bytes]:
        if latest is None:
            return 404, "text/plain", b"no profile yet\n"
        w, stacks = latest
        title = f"window {w.id} vs {base_name} (red: grew, blue: shrank)"
        return 200, "image/svg+xml", render_diff_svg(base, stacks, title).encode()

    def serve(self, host: str, port: int) -> ThreadingHTTPServer:
        app = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args) -> None:  # probes and scrapes would flood the log
                return None

            def _reply(self, status: int, ctype: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                self._reply(*app.get(url.path, parse_qs(url.query)))

            def do_POST(self) -> None:
                url = urlparse(self.path)
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if length < 0:
                    self._reply(400, "text/plain", b"bad Content-Length\n")
                    return
                if length > MAX_BODY:
                    self._reply(413, "text/plain", b"body too large\n")
                    return
                self._reply(*app.post(url.path, parse_qs(url.query), self.rfile.read(length)))

        httpd = ThreadingHTTPServer((host, port), Handler)
        httpd.daemon_threads = True
        self.httpd = httpd
        threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
        return httpd

    def shutdown(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()


def _int(query: dict[str, list[str]], name: str, default: int) -> int:
    try:
        return int(query[name][0])
    except (KeyError, IndexError, ValueError):
        return default
