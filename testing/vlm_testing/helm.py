"""Shared by tests (moved out of tests/integration/test_chart.py, so no test imports another test module)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from vlm_testing.cluster import REPO
from vlm_testing.operator_proc import (
    GROUP,
    PLURAL,
)

CHART = REPO / "charts" / "vlm-operator"


CRD_NAME = f"{PLURAL}.{GROUP}"


def helm(cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "HELM_CACHE_HOME": "/tmp/vlm-helm-cache",
           "HELM_CONFIG_HOME": "/tmp/vlm-helm-config", "HELM_DATA_HOME": "/tmp/vlm-helm-data"}
    proc = subprocess.run([str(cluster.bin_dir / "helm"), *args], capture_output=True, text=True, env=env, timeout=300)
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def can_i(cluster, sa: str, verb: str, resource: str, namespace: str | None) -> bool:
    """`kubectl auth can-i`; "RESOURCE/SUB" here means the subresource (`--subresource`): kubectl itself
    reads TYPE/NAME, an object named SUB, which would ask about the resource's own verbs instead."""
    where = ["--all-namespaces"] if namespace is None else ["-n", namespace]
    resource, _, sub = resource.partition("/")
    subresource = [f"--subresource={sub}"] if sub else []
    proc = subprocess.run([str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "auth", "can-i",
                           verb, resource, *subresource, *where, "--as", sa], capture_output=True, text=True, timeout=30)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), f"can-i {verb} {resource}: {proc.stdout} {proc.stderr}"
    return answer == "yes"


def read_crd(kube) -> dict | None:
    try:
        return client.ApiextensionsV1Api(kube).read_custom_resource_definition(CRD_NAME).to_dict()
    except ApiException as e:
        if e.status == 404:
            return None
        raise


class Release:
    def __init__(self, cluster, name: str, namespace: str):
        self.cluster, self.name, self.namespace = cluster, name, namespace
        self.sa = f"system:serviceaccount:{namespace}:{name}-vlm-operator"

    def install(self, *values: str, chart: Path = CHART) -> None:
        helm(self.cluster, "install", self.name, str(chart), "-n", self.namespace, "--take-ownership", *values)

    def upgrade(self, *values: str, chart: Path = CHART) -> None:
        helm(self.cluster, "upgrade", self.name, str(chart), "-n", self.namespace, *values)

    def uninstall(self) -> None:
        helm(self.cluster, "uninstall", self.name, "-n", self.namespace, "--wait", "--timeout", "60s", check=False)
