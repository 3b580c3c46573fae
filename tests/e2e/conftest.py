"""E2E tier: the testbed plus real Prometheus and Alertmanager, real sidecars running real py-spy
against scheduler stand-ins whose speed follows the flags the operator put in each pod.

The network path is a cluster's: inside the testbed's network namespace (tests/cluster.py moves the
session there) every stand-in and sidecar listens on its pod's IP and ports, the operator reads the
sidecars at <pod IP>:9400 and Prometheus scrapes pod IPs. No endpoint override is involved.

Monitoring is a kube-prometheus-stack install's: the real Prometheus Operator (session-wide) generates
the configuration of a `Prometheus` (per test, selecting by `release: kube-prometheus-stack`) from the
operator's PodMonitor and PrometheusRule (VLM_MONITORING_LABELS carries the release label) and the chart's
ServiceMonitor, metrics Service and PrometheusRule (helm template), and Prometheus runs on that
configuration (bench/standin/kube_sd.py: kubernetes_sd emulated by file_sd, the rest as generated).
The operator runs as a local process: a kwok pod with the chart's selector labels and a `metrics` port
stands in for its pod, so the chart's Service has Endpoints naming that pod's IP, and the operator listens
on 0.0.0.0 of the namespace (every pod IP is an address of its lo), hence on that pod IP too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client
from vlm_operator.api.units import parse_duration
from vlm_operator.desired import alerts

from bench.standin import prom_operator as po
from bench.standin.kube_sd import Reloader
from bench.standin.monitoring import Monitoring
from bench.standin.podmap import PodMapper
from tests import binaries
from tests.cluster import wait_for
from tests.operator_proc import OperatorProcess, free_port, install_crd, pod_network_here

PROMETHEUS = "kps"  # the Prometheus object (kube-prometheus-stack's is <release>-prometheus)
ALERTMANAGER = "kps-alertmanager"  # its Alertmanager's Service (kube-prometheus-stack's <release>-alertmanager)

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="module")
def crd(cluster):
    install_crd(cluster.kubectl)


@pytest.fixture(scope="session")
def pod_network(cluster):
    """The e2e tier needs pod IPs that are real addresses: the testbed's network namespace."""
    if not cluster.pod_network:
        pytest.fail("the e2e tier needs the testbed's pod network; this testbed runs without its network "
                    "namespace (VLM_TESTBED_NETNS=0). Run as root with VLM_TESTBED_NETNS unset (docs/testbed.md).",
                    pytrace=False)
    if not pod_network_here():
        pytest.fail(f"pod IPs are not addresses of this process's namespace (expected {cluster.netns})",
                    pytrace=False)


@pytest.fixture
def podmap(kube, namespace, tmp_path, pod_network):
    m = PodMapper(kube, namespace, tmp_path / "pods").start()
    yield m
    m.stop()


@pytest.fixture(scope="session")
def prometheus_operator(cluster, tmp_path_factory):
    binaries.require("monitoring", "the Prometheus Operator")  # built behind the cluster stage
    try:
        po.install_crds(cluster.kubectl)
        proc = po.PrometheusOperator(cluster.bin_dir / "prometheus-operator", cluster.kubeconfig,
                                     tmp_path_factory.mktemp("prometheus-operator") / "prometheus-operator.log").start()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    yield proc
    proc.stop()


def _operator_pod(name: str, namespace: str, port: int) -> dict:
    """The operator's pod as the chart's metrics Service selects it (kwok runs nothing in it)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": "vlm-operator",
                                    "app.kubernetes.io/instance": po.CHART_RELEASE,
                                    "app.kubernetes.io/component": "operator"}},
            "spec": {"containers": [{"name": "operator", "image": "vlmops/vlm-operator:e2e",
                                     "ports": [{"name": "metrics", "containerPort": port}]}]}}


@pytest.fixture
def monitoring(request, cluster, kube, namespace, podmap, prometheus_operator, tmp_path):
    """Alertmanager and Prometheus on the configuration the Prometheus Operator generated (see above).
    `operator_env(monitoring)` is the environment the operator must run with for it.

    Alertmanager is found as on a kube-prometheus-stack install: the Prometheus object's spec.alerting names
    its Service (port `web`), the Operator generates a `kubernetes_sd_configs` (role endpoints) with keep
    relabelings on that name and port, and the Service's Endpoints name a kwok pod's IP, where Alertmanager
    listens. No static Alertmanager is configured: alerts reach it only through that discovery.

    Tests marked `native_sd` (tests/e2e/test_monitoring.py: the monitoring proof and pod discovery) run the
    Prometheus hack/build-binaries.sh builds with kubernetes_sd (stage `prometheus`, built behind the
    integration tier): the generated configuration as it is, discovering the pods, the Services' Endpoints and
    Alertmanager from the testbed's API server, with only the API server's address and credentials added
    (bench/standin/kube_sd.py `native`). The others run Debian's Prometheus with each kubernetes_sd replaced by
    a file_sd of what it would discover (`runnable`), so a cold CI's e2e tier need not wait for that build."""
    native = request.node.get_closest_marker("native_sd") is not None
    overrides = alert_overrides(request)
    if native:
        binaries.require("prometheus", "Prometheus with kubernetes_sd")
    core = client.CoreV1Api(kube)
    port, am_port = free_port(), free_port()
    core.create_namespaced_pod(namespace, _operator_pod("vlm-operator-0", namespace, port))
    am_objs = po.alertmanager_objects(ALERTMANAGER, namespace, am_port)
    objs = po.chart_objects(cluster.bin_dir / "helm", namespace, "metrics.serviceMonitor.enabled=true",
                            f"monitoring.extraLabels.release={po.RELEASE}",
                            *[f"monitoring.customRules.{n}.for={o['for']}" for n, o in overrides.items()])
    # Rules are evaluated every 15 s (the Operator's default is 30 s): alerts reach Alertmanager sooner.
    objs.append(po.prometheus_object(PROMETHEUS, namespace, evaluationInterval="15s",
                                     alerting=po.alerting(namespace, ALERTMANAGER)))
    cluster.kubectl("apply", "-n", namespace, "-f", "-",
                    stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [*am_objs, *objs]}))
    am_pod = am_objs[1]["metadata"]["name"]
    am_ip = wait_for(lambda: core.read_namespaced_pod(am_pod, namespace).status.pod_ip, 60,
                     f"a pod IP for {am_pod}", interval=0.5)
    mon = Monitoring(tmp_path / "monitoring", podmap.targets_file, operator_metrics=f"127.0.0.1:{port}",
                     am_host=am_ip, am_port=am_port,
                     generated=Reloader(kube, namespace, PROMETHEUS, tmp_path / "monitoring" / "generated", native=native))
    try:
        mon.start()
        # Prometheus sends to what it discovered: the Endpoints' pod IP and the pod's `web` port.
        want = f"http://{am_ip}:{am_port}/api/v2/alerts"
        wait_for(lambda: [a["url"] for a in mon.api("alertmanagers")["activeAlertmanagers"]] == [want], 60,
                 f"Prometheus sending to the discovered Alertmanager {want}", interval=1.0, ignore=(OSError,))
    except (RuntimeError, AssertionError) as e:
        mon.stop()
        pytest.fail(f"could not start Prometheus/Alertmanager: {e}")
    mon.alert_overrides = overrides  # for operator_env: the operator's rules take the same overrides
    yield mon
    mon.stop()


def alert_overrides(request) -> dict[str, dict[str, str]]:
    """The `alert_for(duration)` marker's overrides: that `for` for every shipped alert whose own is longer, as a
    user tunes them (chart value monitoring.customRules, VLM_ALERT_OVERRIDES); none without the marker."""
    marker = request.node.get_closest_marker("alert_for")
    if marker is None:
        return {}
    limit = parse_duration(marker.args[0])
    return {r["alert"]: {"for": marker.args[0]} for r in (*alerts.rules(), *alerts.self_rules())
            if parse_duration(r["for"]) > limit}


def operator_env(mon: Monitoring) -> dict[str, str]:
    """The operator's settings for the e2e monitoring: its Prometheus, its metrics on the port of its stand-in
    pod (on every address: that pod's IP included), the release label on its PodMonitor and PrometheusRule, and
    the alert overrides the chart's PrometheusRule got (`alert_for`)."""
    env = {"VLM_PROMETHEUS_URL": mon.prometheus_url, "VLM_METRICS_PORT": mon.operator_metrics.rsplit(":", 1)[1],
           "VLM_METRICS_ADDR": "0.0.0.0", "VLM_MONITORING_LABELS": json.dumps({"release": po.RELEASE})}
    if getattr(mon, "alert_overrides", None):
        env["VLM_ALERT_OVERRIDES"] = json.dumps(mon.alert_overrides)
    return env


@pytest.fixture
def make_operator(cluster, crd, namespace, tmp_path, podmap, prometheus_operator):
    """Start (and restart) the real operator for the test namespace; stopped at teardown."""
    started: list[OperatorProcess] = []

    def start(**env: str) -> OperatorProcess:
        op = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "operator.log", dict(env))
        started.append(op)  # before start(): one that fails to come up is stopped at teardown too
        op.start()
        return op

    yield start
    for op in started:
        op.stop()
