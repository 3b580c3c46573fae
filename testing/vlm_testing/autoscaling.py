"""What autoscaling's e2e test and bench run beside a real KEDA (vlm_testing.keda).

- `ServiceLoad`: a Service's traffic to a VLMService's stand-in front ends (tests/e2e/test_autoscaling.py: the real
  sidecars' samples of the pools it keeps busy are the signal).
- `BusySidecars`, `prometheus`: for the bench (bench/autoscaling.py), which needs a signal it can make noisy at will
  and many replicas on a 2-core machine: a stand-in for the sidecars' busy-share series, the gauge
  `vlm_scheduler_stage_share_ratio{stage="idle"}`, one series per Running pod of the service (listed from the API
  at each window), and a Prometheus that scrapes it and the operator. What Prometheus, KEDA, the HPA loop and the
  operator do with it is real; the share itself is set by the caller (a fixed idle share, or a load model), where
  a real sidecar's window comes from py-spy's samples of a real scheduler."""

from __future__ import annotations

import http.server
import json
import random
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

# The sidecar's cadence at the API's defaults (telemetry.intervalSeconds): a busy share changes once a window.
SIDECAR_CADENCE_S = 15.0


class BusySidecars:
    """The idle share each Running pod of the service would export.

    `idle` fixes it for every pod. `load` (in schedulers' worth of work, e.g. 1.5 = one and a half schedulers busy)
    spreads it over the Running pods, as a load balancer would: each pod's busy share is load / pods, capped at 1,
    plus Gaussian noise of `noise` (a window's sampling error and the traffic's burstiness). With `cadence_s` the
    series change only once a window, as the sidecar's do (a new pod's series appear after its first window)."""

    def __init__(self, kube, namespace: str, name: str, *, cadence_s: float = 0.0, seed: int = 0,
                 pods: Callable[[], list[str]] | None = None):
        self.kube, self.namespace, self.name = kube, namespace, name
        self.pods = pods or self._running_pods
        self.idle: float | None = 0.9
        self.load: float | None = None
        self.noise = 0.0
        self.cadence_s = cadence_s
        self._rng = random.Random(seed)
        self._text, self._at = "", -1
        self._lock = threading.Lock()

    def _running_pods(self) -> list[str]:
        from kubernetes import client

        pods = client.CoreV1Api(self.kube).list_namespaced_pod(self.namespace,
                                             label_selector=f"serving.vlmops.dev/vlmservice={self.name}")
        return sorted(p.metadata.name for p in pods.items
                      if p.status.phase == "Running" and not p.metadata.deletion_timestamp)

    def window(self) -> dict[str, float]:
        """A new window: each Running pod's idle share."""
        pods = self.pods()
        out = {}
        for p in pods:
            if self.load is not None:
                busy = min(1.0, self.load / max(1, len(pods)))
            else:
                busy = 1.0 - (self.idle if self.idle is not None else 1.0)
            if self.noise:
                busy += self._rng.gauss(0.0, self.noise)
            out[p] = round(min(1.0, max(0.0, 1.0 - busy)), 4)
        return out

    def text(self) -> str:
        """The scrape's body: the current window's series (a new window when the cadence's next one has begun)."""
        with self._lock:
            slot = int(time.monotonic() // self.cadence_s) if self.cadence_s else None
            if slot is None or slot != self._at:
                lines = ["# TYPE vlm_scheduler_stage_share_ratio gauge"]
                for pod, idle in self.window().items():
                    lines.append(f'vlm_scheduler_stage_share_ratio{{namespace="{self.namespace}",'
                                 f'vlmservice="{self.name}",pod="{pod}",tp_rank="0",stage="idle"}} {idle}')
                self._text, self._at = "\n".join(lines) + "\n", slot
            return self._text

    def serve(self) -> tuple[int, http.server.ThreadingHTTPServer]:
        me = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = me.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv.server_address[1], srv


class Prom:
    """The two queries vlm_testing.dashboard.has_data asks of a Prometheus."""

    def __init__(self, url: str):
        self.url = url

    def _get(self, path: str, **params) -> list:
        with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=10) as r:
            return json.loads(r.read())["data"]["result"]

    def query(self, q: str, at: float | None = None) -> list:
        return self._get("/api/v1/query", query=q, **({"time": at} if at else {}))

    def query_range(self, q: str, start: float, end: float, step: float) -> list:
        return self._get("/api/v1/query_range", query=q, start=start, end=end, step=step)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prometheus(tmp: Path, sidecars_port: int | list[int], operator_port: int,
               scrape_interval: str = "2s") -> tuple[str, subprocess.Popen]:
    """Debian's Prometheus scraping the stand-in sidecars (one port or several) and the operator's /metrics: its
    URL and process."""
    ports = sidecars_port if isinstance(sidecars_port, list) else [sidecars_port]
    exe = shutil.which("prometheus")
    assert exe, "prometheus not found: hack/install-system-deps.sh installs Debian's"
    port = free_port()
    cfg = tmp / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({"global": {"scrape_interval": scrape_interval}, "scrape_configs": [
        {"job_name": "sidecars", "honor_labels": True, "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}]},
        {"job_name": "vlm-operator", "honor_labels": True,
         "static_configs": [{"targets": [f"127.0.0.1:{operator_port}"]}]}]}))
    proc = subprocess.Popen([exe, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                            stderr=open(tmp / "prometheus.log", "ab"))  # noqa: SIM115
    return f"http://127.0.0.1:{port}", proc


class ServiceLoad:
    """A Service's traffic to a VLMService's stand-in front ends: `POST /generate` of `images` images at `rate`
    requests a second in all (fixed gaps), spread round robin over the service's Ready pods, as kube-proxy spreads a
    Service's connections over its Ready endpoints; each pod's front end listens on `port` of its pod IP
    (`--standin-frontend-port`). So one pod's share of the load falls as replicas are added, which is what an
    autoscaler acts on. The pods are listed from the API every second. kwok reports a pod Ready before its stand-in
    listens: a pod that refuses a connection is skipped for 2 s and its request goes to the next one. Open loop, up
    to `workers` requests in flight; one that finds them all taken waits (counted in `late`)."""

    def __init__(self, kube, namespace: str, name: str, port: int, *, images: int = 2, workers: int = 48):
        from concurrent.futures import ThreadPoolExecutor

        self.kube, self.namespace, self.name, self.port, self.images = kube, namespace, name, port, images
        self.rate = 0.0
        self.sent: dict[str, int] = {}  # pod -> requests answered
        self.refused = self.late = 0
        self._targets: list[tuple[str, str]] = []  # (pod, ip), Ready
        self._skip: dict[str, float] = {}
        self._rr = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._slots = threading.Semaphore(workers)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="service-load")
        self._threads: list[threading.Thread] = []

    def start(self) -> ServiceLoad:
        for target in (self._list, self._send):
            t = threading.Thread(target=target, daemon=True, name=f"service-load{target.__name__}")
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _list(self) -> None:
        from kubernetes import client

        from vlm_testing.standin.podmap import LABEL_SERVICE

        core = client.CoreV1Api(self.kube)
        while not self._stop.is_set():
            try:
                pods = core.list_namespaced_pod(self.namespace, label_selector=f"{LABEL_SERVICE}={self.name}").items
                ready = [(p.metadata.name, p.status.pod_ip) for p in pods
                         if p.status.pod_ip and not p.metadata.deletion_timestamp
                         and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))]
                with self._lock:
                    self._targets = sorted(ready)
            except Exception:  # a flaky list keeps the last targets; the next second retries
                pass
            self._stop.wait(1.0)

    def _pick(self) -> tuple[str, str] | None:
        now = time.monotonic()
        with self._lock:
            live = [t for t in self._targets if self._skip.get(t[0], 0) <= now]
            if not live:
                return None
            self._rr += 1
            return live[self._rr % len(live)]

    def _post(self, rid: int) -> None:
        import http.client

        try:
            for _ in range(3):
                target = self._pick()
                if target is None:
                    return
                pod, ip = target
                body = json.dumps({"rid": rid, "text": "describe the image", "images": self.images})
                try:
                    conn = http.client.HTTPConnection(ip, self.port, timeout=30)
                    conn.request("POST", "/generate", body, {"Content-Type": "application/json"})
                    conn.getresponse().read()
                    conn.close()
                except OSError:
                    with self._lock:
                        self.refused += 1
                        self._skip[pod] = time.monotonic() + 2.0
                    continue
                with self._lock:
                    self.sent[pod] = self.sent.get(pod, 0) + 1
                return
        finally:
            self._slots.release()

    def _send(self) -> None:
        rid, nxt = 0, time.monotonic()
        while not self._stop.is_set():
            rate = self.rate
            if rate <= 0:
                nxt = time.monotonic()
                self._stop.wait(0.2)
                continue
            nxt = max(nxt + 1.0 / rate, time.monotonic() - 1.0)  # a stall is not made up by a burst
            delay = nxt - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            if not self._slots.acquire(timeout=0):
                self.late += 1
                self._slots.acquire()
            self._pool.submit(self._post, rid)
            rid += 1
