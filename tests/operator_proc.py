"""Running the real operator as a subprocess against the testbed (integration and e2e tiers)."""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml
from kubernetes import client

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "hack") not in sys.path:
    sys.path.insert(0, str(REPO / "hack"))

from testbed_lib import netns  # noqa: E402
from testbed_lib.layout import POD_CIDR  # noqa: E402

CRD = REPO / "crds" / "serving.vlmops.dev_vlmservices.yaml"
GROUP, VERSION, PLURAL = "serving.vlmops.dev", "v1alpha1", "vlmservices"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pod_network_here() -> bool:
    """Whether this thread is where pod IPs are addresses (inside the testbed's network namespace)."""
    return netns.bindable(str(ipaddress.ip_network(POD_CIDR)[-2]))


def install_crd(kubectl) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    # Polled, not `kubectl wait --for=condition`: that fails at once ("<nil> is of the type <nil>") when it
    # reads the CRD before the API server has given it any condition.
    deadline = time.time() + 60
    query = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
    while kubectl("get", "crd/vlmservices.serving.vlmops.dev", "-o", query).strip() != "True":
        if time.time() > deadline:
            raise AssertionError("CRD vlmservices.serving.vlmops.dev not Established within 60 s")
        time.sleep(0.5)


@dataclass
class OperatorProcess:
    kubeconfig: Path
    namespace: str
    log_path: Path
    env_extra: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    metrics_port: int = 0
    args: list[str] = field(default_factory=list)  # extra command-line flags, e.g. ["--peering", "NAME"]

    def start(self) -> OperatorProcess:
        self.metrics_port = int(self.env_extra.get("VLM_METRICS_PORT") or free_port())
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "VLM_METRICS_ADDR": "127.0.0.1",
            "VLM_RESYNC_SECONDS": "2",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("VLM_SIDECAR_ENDPOINTS", None)
        if not pod_network_here():
            # A testbed without its network namespace (VLM_TESTBED_NETNS=0): pod IPs are kwok's made-up
            # addresses on the host's network, never to be dialled; an empty override file scrapes none.
            endpoints = self.log_path.with_suffix(".endpoints.json")
            endpoints.write_text("{}")
            env["VLM_SIDECAR_ENDPOINTS"] = str(endpoints)
        # Inside the namespace the operator reads every sidecar at <pod IP>:9400, as in a cluster.
        env.update({**self.env_extra, "VLM_METRICS_PORT": str(self.metrics_port)})
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vlm_operator", "--namespace", self.namespace,
             "--liveness", f"http://127.0.0.1:{free_port()}/healthz", *self.args],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        )
        deadline = time.time() + 120  # the import alone took 56 s on a loaded 2-core machine
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.metrics()
                return self
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"operator did not serve /metrics in 120 s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def metric_sum(self, name: str) -> float:
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total


@dataclass(frozen=True)
class Request:
    """One request an operator process sent to the API server (through its ApiRecorder)."""

    at: float  # unix seconds, when it arrived at the recorder
    method: str
    path: str  # without the query
    query: str
    held: bool = False  # stopped by a hold rule: the API server never saw it

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
        req = Request(time.time(), self.command, url.path, url.query)
        hold = rec.matching_hold(req)
        if hold is not None:
            req = Request(req.at, req.method, req.path, req.query, held=True)
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
        except OSError:  # the API server is down (restarting): the client sees its connection closed
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
        except OSError:
            self.close_connection = True  # either side went away mid-stream: the client sees a broken stream
        finally:
            conn.close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _relay


class _RecorderServer(ThreadingHTTPServer):
    daemon_threads = True
    recorder: ApiRecorder

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a killed operator resets its connections
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


def run_operator(kubeconfig: Path, namespace: str, tmp: Path, **env: str) -> Iterator[OperatorProcess]:
    op = OperatorProcess(kubeconfig, namespace, tmp / f"operator-{namespace}.log", dict(env)).start()
    try:
        yield op
    finally:
        op.stop()


def vlms(kube: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube)


def get_vlms(kube, namespace: str, name: str) -> dict:
    return vlms(kube).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def condition(obj: dict, type_: str) -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def dump(obj) -> str:
    return json.dumps(obj, indent=1, default=str)[:3000]
