"""E2E tier: the testbed plus real Prometheus and Alertmanager, real sidecars running real py-spy
against scheduler stand-ins whose speed follows the flags the operator put in each pod.

The network path is a cluster's: inside the testbed's network namespace (tests/cluster.py moves the
session there) every stand-in and sidecar listens on its pod's IP and ports, the operator reads the
sidecars at <pod IP>:9400 and Prometheus scrapes pod IPs. No endpoint override is involved."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.standin.monitoring import Monitoring
from bench.standin.podmap import PodMapper
from tests.operator_proc import OperatorProcess, install_crd, pod_network_here

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


@pytest.fixture
def monitoring(podmap, tmp_path):
    mon = Monitoring(tmp_path / "monitoring", podmap.targets_file)
    try:
        mon.start()
    except RuntimeError as e:
        pytest.fail(f"could not start Prometheus/Alertmanager: {e}")
    yield mon
    mon.stop()


@pytest.fixture
def make_operator(cluster, crd, namespace, tmp_path, podmap):
    """Start (and restart) the real operator for the test namespace; stopped at teardown."""
    started: list[OperatorProcess] = []

    def start(**env: str) -> OperatorProcess:
        op = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "operator.log", dict(env))
        op.start()
        started.append(op)
        return op

    yield start
    for op in started:
        op.stop()
