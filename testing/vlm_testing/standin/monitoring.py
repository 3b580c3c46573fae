"""Real Prometheus and Alertmanager on loopback, for the e2e tests and the demo: Debian's packages, and for
the generated configuration the Prometheus hack/build-binaries.sh builds (kubernetes_sd) where it exists.

Run inside the testbed's network namespace (docs/testbed.md), as the e2e tier and the demo's agent do:
there Prometheus scrapes the sidecars and stand-ins at their pod IPs (<pod IP>:9400 and :30000) and sends
alerts to Alertmanager. Prometheus listens on the namespace's 127.0.0.1, Alertmanager on `am_host`
(127.0.0.1 unless the caller gives it a pod IP of its own, as the e2e tier does). Two configurations:

- `generated` (a kube_sd.Reloader; what the e2e tier runs): the configuration and rule files the real
  Prometheus Operator generated from the operator's PodMonitor and PrometheusRule and the chart's
  ServiceMonitor and PrometheusRule, reloaded when the Operator rewrites it. Where hack/build-binaries.sh
  built Prometheus (3.x, kubernetes_sd compiled in), that one runs it as generated, its kubernetes_sd
  against the testbed's API server (only `api_server` and credentials added); otherwise Debian's runs it
  with each kubernetes_sd replaced by a file_sd with what it would discover (testing/vlm_testing/standin/kube_sd.py),
  kept current as pods come and go.
  Scrape intervals are the objects' own (the PodMonitor's 15 s). Alertmanager is found as the generated
  `alerting` section says (the Prometheus object's spec.alerting: its Service's Endpoints); a static one is
  added only when the Reloader was given one (`Reloader(alertmanager=...)`) and the config has none.
- hand-written (no `generated`; what the demo runs): one file_sd job over podmap's `targets.json` with
  `honor_labels`, the operator's /metrics as job vlm-operator, alerts/vlm-operator.rules.yaml.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vlm_testing.standin.kube_sd import Reloader

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "alerts" / "vlm-operator.rules.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary(*names: str) -> str:
    for n in names:
        path = shutil.which(n) or (f"/usr/bin/{n}" if Path(f"/usr/bin/{n}").exists() else None)
        if path:
            return path
    raise RuntimeError(f"none of {names} found: run hack/install-system-deps.sh (Debian prometheus packages)")


def _wait_http(url: str, what: str, proc: subprocess.Popen, log: Path, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{what} not ready at {url} in {timeout}s:\n{log.read_text(errors='replace')[-3000:]}")


@dataclass
class Monitoring:
    workdir: Path
    targets_file: Path
    operator_metrics: str = ""  # host:port of the operator's /metrics, if any
    scrape_interval: str = "2s"
    prom_port: int = 0
    am_port: int = 0
    am_host: str = "127.0.0.1"  # where Alertmanager listens (a pod IP in the testbed's namespace)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    generated: Reloader | None = None
    generated_timeout: float = 90

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prom_port}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://{self.am_host}:{self.am_port}"

    def start(self) -> Monitoring:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.start_alertmanager()
        self.start_prometheus()
        return self

    def start_alertmanager(self) -> None:
        self.am_port = self.am_port or _free_port()
        cfg = self.workdir / "alertmanager.yml"
        cfg.write_text(yaml.safe_dump({
            "route": {"receiver": "default", "group_wait": "1s", "group_interval": "5s", "repeat_interval": "1h"},
            "receivers": [{"name": "default"}],
        }))
        log = self.workdir / "alertmanager.log"
        (self.workdir / "am-data").mkdir(exist_ok=True)
        self.procs["alertmanager"] = subprocess.Popen(
            [_binary("prometheus-alertmanager", "alertmanager"), f"--config.file={cfg}",
             f"--storage.path={self.workdir / 'am-data'}", f"--web.listen-address={self.am_host}:{self.am_port}",
             "--cluster.listen-address="],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,  # noqa: SIM115
        )
        _wait_http(f"{self.alertmanager_url}/-/ready", "alertmanager", self.procs["alertmanager"], log)

    def start_prometheus(self) -> None:
        self.prom_port = self.prom_port or _free_port()
        if self.generated is not None:
            self._start_generated(self.generated)
            return
        scrape = [
            {
                "job_name": "vlm-pods",
                "honor_labels": True,
                "scrape_interval": self.scrape_interval,
                "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "2s"}],
            }
        ]
        if self.operator_metrics:
            scrape.append({"job_name": "vlm-operator", "scrape_interval": self.scrape_interval,
                           "static_configs": [{"targets": [self.operator_metrics]}]})
        cfg = self.workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump({
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
            "rule_files": [str(RULES)],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"{self.am_host}:{self.am_port}"]}]}]},
            "scrape_configs": scrape,
        }))
        if not self.targets_file.exists():
            self.targets_file.write_text("[]")
        log = self.workdir / "prometheus.log"
        self.procs["prometheus"] = subprocess.Popen(
            [_binary("prometheus"), f"--config.file={cfg}", f"--storage.tsdb.path={self.workdir / 'prom-data'}",
             f"--web.listen-address=127.0.0.1:{self.prom_port}", "--storage.tsdb.retention.time=2h"],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,  # noqa: SIM115
        )
        _wait_http(f"{self.prometheus_url}/-/ready", "prometheus", self.procs["prometheus"], log)

    def _start_generated(self, gen: Reloader) -> None:
        gen.workdir = self.workdir / "generated"
        deadline = time.time() + self.generated_timeout
        while gen.cfg is None:
            try:
                gen.sync()
            except Exception as e:  # the API server or the secret not there yet
                last = e
            else:
                last = None
            if gen.cfg is not None:
                break
            if time.time() > deadline:
                raise RuntimeError(f"the Prometheus Operator generated no configuration for {gen.namespace}/"
                                   f"{gen.prometheus} in {self.generated_timeout}s (last error: {last})")
            time.sleep(1)
        log = self.workdir / "prometheus.log"
        self.procs["prometheus"] = subprocess.Popen(
            [str(gen.binary) if gen.binary else _binary("prometheus"), f"--config.file={gen.config_file}",
             f"--storage.tsdb.path={self.workdir / 'prom-data'}", f"--web.listen-address=127.0.0.1:{self.prom_port}",
             "--storage.tsdb.retention.time=2h", "--web.enable-lifecycle"],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,  # noqa: SIM115
        )
        _wait_http(f"{self.prometheus_url}/-/ready", "prometheus", self.procs["prometheus"], log)
        gen.reload = self.reload_prometheus
        gen.start()

    def reload_prometheus(self) -> None:
        """What the config-reloader sidecar does after rewriting the configuration or the rule files."""
        req = urllib.request.Request(f"{self.prometheus_url}/-/reload", method="POST")
        with urllib.request.urlopen(req, timeout=30):
            pass

    def stop_prometheus(self) -> None:
        if self.generated is not None:
            self.generated.stop()
            self.generated = Reloader(self.generated.api, self.generated.namespace, self.generated.prometheus,
                                      self.generated.workdir, self.generated.alertmanager, self.generated.period,
                                      native=self.generated.native)
        self._stop("prometheus")

    def _stop(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p and p.poll() is None:
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

    def stop(self) -> None:
        if self.generated is not None:
            self.generated.stop()
        for name in list(self.procs):
            self._stop(name)

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        url = f"{self.prometheus_url}/api/v1/query?query={urllib.request.quote(expr)}"
        if at is not None:
            url += f"&time={at:.3f}"
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())["data"]["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        url = (f"{self.prometheus_url}/api/v1/query_range?query={urllib.request.quote(expr)}"
               f"&start={start:.3f}&end={end:.3f}&step={step:g}")
        with urllib.request.urlopen(url, timeout=30) as r:
            return json.loads(r.read())["data"]["result"]

    def api(self, path: str) -> dict:
        with urllib.request.urlopen(f"{self.prometheus_url}/api/v1/{path}", timeout=10) as r:
            return json.loads(r.read())["data"]

    def alerts(self) -> list[dict]:
        with urllib.request.urlopen(f"{self.alertmanager_url}/api/v2/alerts", timeout=5) as r:
            return json.loads(r.read())
