"""A recording relay between one operator process and the API server (the e2e chaos test's tool).

Every request the process sends goes through it, so a test counts what each replica wrote (kopf's own
writes included: progress annotations, Events, peering keep-alives), and `hold(match)` keeps matching
requests from reaching the API server, which stops an operator exactly between two writes of one reconcile.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Request:
    """One request an operator process sent to the API server (through its ApiRecorder)."""

    at: float  # unix seconds, when it arrived at the recorder
    method: str
    path: str  # without the query
    query: str
    held: bool = False  # stopped by a hold rule: the API server never saw it
    # For a peering keep-alive: the `lastseen` kopf stamped in its body (unix seconds). kopf stamps it when it
    # builds the patch, which can be seconds before the request leaves a busy process; the peers' deadlines
    # are computed from the stamp, not from when the request arrived.
    stamp: float | None = None
    # The API server's answer (HTTP status), appended once it came back; empty while pending or if none came.
    answer: list[int] = field(default_factory=list, compare=False)
    # The request's body, for hold rules that look into it (e.g. which rollout phase a status write sets).
    body: bytes | None = field(default=None, compare=False, repr=False)

    def rollout_phase(self) -> str | None:
        """The status.rollout.phase a (merge-patch) status write sets; None when it sets none."""
        try:
            doc = json.loads(self.body or b"{}")
        except ValueError:
            return None
        rollout = (doc.get("status") or {}).get("rollout") if isinstance(doc, dict) else None
        return rollout.get("phase") if isinstance(rollout, dict) else None

    @property
    def write(self) -> bool:
        return self.method not in ("GET", "HEAD", "OPTIONS")

    @property
    def peering(self) -> bool:
        """kopf's own peering traffic (keep-alives and clean-ups of the KopfPeering object)."""
        return "/kopfpeerings" in self.path or "/clusterkopfpeerings" in self.path


@dataclass
class Hold:
    """A request matching `match` is held: not sent to the API server until `release` (then it is dropped:
    its connection closed, as when the process that sent it is killed meanwhile). `hit` is set when one
    arrives; `requests` are the ones held."""

    match: Callable[[Request], bool]
    once: bool = True
    hit: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    requests: list[Request] = field(default_factory=list)


_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
        "content-length", "host"}


def _peering_stamp(path: str, body: bytes | None) -> float | None:
    """The newest `lastseen` in a KopfPeering patch's status entries, as unix seconds (None for other requests
    and for a body that is not such a patch)."""
    if not body or "kopfpeerings" not in path:
        return None
    try:
        status = json.loads(body).get("status") or {}
        stamps = [datetime.fromisoformat(v["lastseen"]).timestamp() for v in status.values()
                  if isinstance(v, dict) and v.get("lastseen")]
    except (ValueError, TypeError, AttributeError, KeyError):
        return None
    return max(stamps, default=None)


class _Relay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _RecorderServer

    def log_message(self, *_: object) -> None:  # one line per request on stderr is noise here
        pass

    def _relay(self) -> None:
        rec = self.server.recorder
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        url = urllib.parse.urlsplit(self.path)
        req = Request(time.time(), self.command, url.path, url.query, stamp=_peering_stamp(url.path, body), body=body)
        hold = rec.matching_hold(req)
        if hold is not None:
            req = Request(req.at, req.method, req.path, req.query, held=True, stamp=req.stamp)
            rec.add(req)
            hold.requests.append(req)
            hold.hit.set()
            hold.release.wait()
            self.close_connection = True
            return
        rec.add(req)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        conn = http.client.HTTPSConnection(rec.upstream_host, rec.upstream_port, context=rec.tls)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            req.answer.append(resp.status)
        except (OSError, http.client.HTTPException):  # the API server is down (restarting): connection closed
            conn.close()
            self.close_connection = True
            return
        try:
            self.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP:
                    self.send_header(k, v)
            if resp.status in (204, 304) or self.command == "HEAD":
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            # Chunked, relayed as it arrives: watches stream for minutes.
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while chunk := resp.read1(65536):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (OSError, http.client.HTTPException):
            # Either side went away mid-stream (the API server restarting, the operator killed): the client
            # sees a broken stream, as it would without the relay.
            self.close_connection = True
        finally:
            conn.close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _relay


class _RecorderServer(ThreadingHTTPServer):
    daemon_threads = True
    recorder: ApiRecorder

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, http.client.HTTPException)):  # a killed operator, a restart
            super().handle_error(request, client_address)


class ApiRecorder:
    """A plain-HTTP relay between one operator process and the API server (TLS to the API server), so a test
    can see every request that process made: `kubeconfig` is that process's kubeconfig (same admin token,
    server this relay). Requests are recorded (`requests`, `writes()`), and `hold(match)` keeps matching
    ones from reaching the API server, to stop the operator between two writes of one reconcile.

    Two replicas each behind their own recorder: what each one wrote, kopf's writes included (annotations,
    Events, peering keep-alives), not only the ones the operator counts in its metrics."""

    def __init__(self, kubeconfig: Path):
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        cluster = cfg["clusters"][0]["cluster"]
        server = urllib.parse.urlsplit(cluster["server"])
        self.upstream_host, self.upstream_port = server.hostname, server.port or 443
        self.tls = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        self._cfg = cfg
        self.requests: list[Request] = []
        self.holds: list[Hold] = []
        self._lock = threading.Lock()
        self._server: _RecorderServer | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="vlm-apirec-")
        self.kubeconfig = Path(self._dir.name) / "kubeconfig"

    def start(self) -> ApiRecorder:
        self._server = _RecorderServer(("127.0.0.1", 0), _Relay)
        self._server.recorder = self
        threading.Thread(target=self._server.serve_forever, daemon=True, name="api-recorder").start()
        cfg = json.loads(json.dumps(self._cfg))
        cfg["clusters"][0]["cluster"] = {"server": f"http://127.0.0.1:{self._server.server_address[1]}"}
        self.kubeconfig.write_text(yaml.safe_dump(cfg))
        return self

    def stop(self) -> None:
        for h in self.holds:
            h.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self._dir.cleanup()

    def add(self, req: Request) -> None:
        with self._lock:
            self.requests.append(req)

    def hold(self, match: Callable[[Request], bool], once: bool = True) -> Hold:
        h = Hold(match, once)
        with self._lock:
            self.holds.append(h)
        return h

    def matching_hold(self, req: Request) -> Hold | None:
        with self._lock:
            for h in self.holds:
                if not h.release.is_set() and not (h.once and h.requests) and h.match(req):
                    return h
        return None

    def writes(self, since: float = 0.0, until: float = float("inf"), peering: bool = False) -> list[Request]:
        """Writes that reached the API server in [since, until); kopf's peering keep-alives only if asked."""
        with self._lock:
            return [r for r in self.requests
                    if r.write and not r.held and since <= r.at < until and (peering or not r.peering)]


