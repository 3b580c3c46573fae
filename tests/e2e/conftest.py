"""E2E tier: the testbed plus real Prometheus and Alertmanager, real sidecars running real py-spy
against scheduler stand-ins whose speed follows the flags the operator put in each pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.standin.monitoring import Monitoring
from bench.standin.podmap import PodMapper
from tests.operator_proc import OperatorProcess, install_crd

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="module")
def crd(cluster):
    install_crd(cluster.kubectl)


@pytest.fixture
def podmap(kube, namespace, tmp_path):
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
        op = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "operator.log",
                             {"VLM_SIDECAR_ENDPOINTS": str(podmap.endpoints_file), **env})
        op.start()
        started.append(op)
        return op

    yield start
    for op in started:
        op.stop()
