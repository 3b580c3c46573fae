"""The real Prometheus Operator (built by hack/build-binaries.sh) next to the testbed, and the objects a
kube-prometheus-stack install would have: a `Prometheus` selecting ServiceMonitors, PodMonitors and
PrometheusRules by `release: <release>` and sending alerts to the Alertmanager its `spec.alerting` names
(a Service, port `web`, found through that Service's Endpoints), the Alertmanager's Service and a pod for it
(kwok runs nothing in it: the caller's Alertmanager listens on that pod's IP), and the chart's own
ServiceMonitor, metrics Service and PrometheusRule (helm template). Test and demo tooling, never shipped.

The operator runs outside the cluster with the admin kubeconfig (it reads KUBECONFIG); what it generates
for a Prometheus (the secret `prometheus-<name>` and the ConfigMaps `prometheus-<name>-rulefiles-N`) is
what testing/vlm_testing/standin/kube_sd.py turns into a running Prometheus.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("VLM_CACHE", Path.home() / ".cache" / "vlm-operator"))
CRDS = CACHE / "prometheus-operator-crds"
RELEASE = "kube-prometheus-stack"  # the release label kube-prometheus-stack's default selectors ask for
CHART_RELEASE = "vlm"
CHART_TEMPLATES = ("templates/servicemonitor.yaml", "templates/service.yaml", "templates/prometheusrule.yaml")
# One testbed serves several pytest processes at once (xdist workers, two sessions): each process's Prometheus
# Operator reconciles only the `Prometheus` objects that this process labelled, so two operators never write
# the same generated secret or StatefulSet.
INSTANCE_LABEL = "vlm-testbed/prometheus-operator"
INSTANCE = f"p{os.getpid()}"


def instance_selector_args() -> list[str]:
    """The Prometheus Operator's flag that keeps it to this process's `Prometheus` objects."""
    return [f"--prometheus-instance-selector={INSTANCE_LABEL}={INSTANCE}"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install_crds(kubectl, crds: Path = CRDS) -> None:
    if not crds.exists():
        raise RuntimeError(f"the Prometheus Operator CRDs are missing at {crds}: run hack/build-binaries.sh")
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds.resolve()), timeout=120)
    # Not `kubectl wait --for=condition=Established` at once: right after the apply a CRD may have no
    # status.conditions yet, and kubectl wait fails on that instead of waiting.
    for plural in ("prometheuses", "servicemonitors", "podmonitors", "prometheusrules"):
        deadline = time.time() + 60
        while kubectl("get", f"crd/{plural}.monitoring.coreos.com", "-o",
                      'jsonpath={.status.conditions[?(@.type=="Established")].status}', check=False).strip() != "True":
            if time.time() > deadline:
                raise RuntimeError(f"CRD {plural}.monitoring.coreos.com not Established in 60s")
            time.sleep(0.5)


class PrometheusOperator:
    def __init__(self, binary: Path, kubeconfig: Path, log: Path) -> None:
        self.binary, self.kubeconfig, self.log = binary, kubeconfig, log
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> PrometheusOperator:
        if not self.binary.exists():
            raise RuntimeError(f"the Prometheus Operator binary is missing at {self.binary}: run hack/build-binaries.sh")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [str(self.binary), f"--web.listen-address=127.0.0.1:{_free_port()}", "--log-level=info",
                 *instance_selector_args()],
                env={**os.environ, "KUBECONFIG": str(self.kubeconfig)}, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus-operator exited: {self.log.read_text()[-3000:]}")
            if "successfully synced all caches" in self.log.read_text(errors="replace"):
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"prometheus-operator not synced in {timeout}s: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def chart_objects(helm: Path, namespace: str, *sets: str, release: str = CHART_RELEASE) -> list[dict[str, Any]]:
    """The chart's monitoring objects as `helm template` renders them (`sets`: --set values)."""
    out = subprocess.run(
        [str(helm), "template", release, str(REPO / "charts" / "vlm-operator"), "--namespace", namespace,
         "--kube-version", "1.34.4", *[a for t in CHART_TEMPLATES for a in ("-s", t)],
         *[a for s in sets for a in ("--set", s)]],
        capture_output=True, text=True, check=True, timeout=60,
        env={**os.environ, "HELM_CACHE_HOME": "/tmp/vlm-helm-cache", "HELM_CONFIG_HOME": "/tmp/vlm-helm-config",
             "HELM_DATA_HOME": "/tmp/vlm-helm-data"})
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def prometheus_version() -> str:
    out = subprocess.run(["prometheus", "--version"], capture_output=True, text=True, check=True).stdout
    return "v" + re.search(r"version (\d+\.\d+\.\d+)", out).group(1)


def prometheus_object(name: str, namespace: str, release: str = RELEASE, only_namespace: bool = True,
                      **spec: Any) -> dict[str, Any]:
    """A Prometheus selecting by `release` as kube-prometheus-stack's defaults do. kube-prometheus-stack
    looks in every namespace; `only_namespace` keeps to `namespace` (other tests' objects may linger)."""
    selector = {"matchLabels": {"release": release}}
    where = {"matchLabels": {"kubernetes.io/metadata.name": namespace}} if only_namespace else {}
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
        "metadata": {"name": name, "namespace": namespace, "labels": {INSTANCE_LABEL: INSTANCE}},
        "spec": {"replicas": 1, "version": prometheus_version(),
                 "serviceMonitorSelector": selector, "podMonitorSelector": selector, "ruleSelector": selector,
                 "serviceMonitorNamespaceSelector": where, "podMonitorNamespaceSelector": where,
                 "ruleNamespaceSelector": where, **spec},
    }


ALERTMANAGER_PORT = "web"  # the port name kube-prometheus-stack's Prometheus names in spec.alerting


def alerting(namespace: str, service: str) -> dict[str, Any]:
    """spec.alerting of kube-prometheus-stack's Prometheus: its Alertmanager Service, by name and port name."""
    return {"alertmanagers": [{"namespace": namespace, "name": service, "port": ALERTMANAGER_PORT,
                               "pathPrefix": "/", "apiVersion": "v2"}]}


def alertmanager_objects(name: str, namespace: str, port: int) -> list[dict[str, Any]]:
    """The Alertmanager's Service `name` (port `web`) and a pod `<name>-0` with the Service's selector labels
    and a `web` container port `port`, as the Alertmanager Operator's StatefulSet pod has them. kwok runs
    nothing in the pod; the controller-manager fills the Service's Endpoints with its IP, where the caller's
    Alertmanager listens."""
    selector = {"app.kubernetes.io/name": "alertmanager", "alertmanager": name}
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": namespace, "labels": {"release": RELEASE}},
               "spec": {"selector": selector,
                        "ports": [{"name": ALERTMANAGER_PORT, "port": 9093, "targetPort": ALERTMANAGER_PORT}]}}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"{name}-0", "namespace": namespace, "labels": selector},
           "spec": {"containers": [{"name": "alertmanager", "image": "quay.io/prometheus/alertmanager:e2e",
                                    "ports": [{"name": ALERTMANAGER_PORT, "containerPort": port}]}]}}
    return [service, pod]
