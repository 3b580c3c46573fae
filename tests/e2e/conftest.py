"""E2E tier: the testbed plus real Prometheus and Alertmanager, real sidecars running real py-spy
against scheduler stand-ins whose speed follows the flags the operator put in each pod.

The network path is a cluster's: inside the testbed's network namespace (testing/vlm_testing/cluster.py moves the
session there) every stand-in and sidecar listens on its pod's IP and ports, the operator reads the
sidecars at <pod IP>:9400 and Prometheus scrapes pod IPs. No endpoint override is involved.

Monitoring is a kube-prometheus-stack install's: the real Prometheus Operator (session-wide) generates
the configuration of a `Prometheus` (per test, selecting by `release: kube-prometheus-stack`) from the
operator's PodMonitor and PrometheusRule (VLM_MONITORING_LABELS carries the release label) and the chart's
ServiceMonitor, metrics Service and PrometheusRule (helm template), and Prometheus runs on that
configuration (testing/vlm_testing/standin/kube_sd.py: kubernetes_sd emulated by file_sd, the rest as generated).
The operator runs as a local process: a kwok pod with the chart's selector labels and a `metrics` port
stands in for its pod, so the chart's Service has Endpoints naming that pod's IP, and the operator listens
on 0.0.0.0 of the namespace (every pod IP is an address of its lo), hence on that pod IP too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client

from vlm_testing import binaries
from vlm_testing.cluster import wait_for
from vlm_testing.e2e import ALERTMANAGER, PROMETHEUS, _operator_pod, alert_overrides, operator_env
from vlm_testing.operator_proc import OperatorProcess, free_port, install_crd, pod_network_here
from vlm_testing.standin import prom_operator as po
from vlm_testing.standin.kube_sd import Reloader
from vlm_testing.standin.monitoring import Monitoring
from vlm_testing.standin.podmap import PodMapper

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
    (testing/vlm_testing/standin/kube_sd.py `native`). The others run Debian's Prometheus with each kubernetes_sd replaced by
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


@pytest.fixture
def stack(make_operator, monitoring, podmap):
    """The operator on the e2e monitoring (conftest: Prometheus on the Prometheus Operator's generated
    configuration, so the PodMonitor's 15 s scrape), with the short windows of SPEC."""
    op = make_operator(**operator_env(monitoring))
    return op, monitoring, podmap
