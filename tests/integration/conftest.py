"""Integration tier: every test collected under this directory is marked `integration`."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from vlm_operator.api import crdgen
from vlm_testing.helm import CRD_NAME, Release, read_crd
from vlm_testing.operator_proc import install_crd

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The hook sees the whole session's items, so mark only the ones that live here.
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def crd(cluster):
    """The VLMService CRD, installed (idempotently) once per test module."""
    install_crd(cluster.kubectl)


@pytest.fixture
def vlm_crd(kube) -> Iterator[None]:
    """Put the shared VLMService CRD back as it was (or as crdgen writes it) after a test that let a
    release adopt and upgrade it, so no Helm ownership or test-only field outlives the test."""
    ext = client.ApiextensionsV1Api(kube)
    before = ext.read_custom_resource_definition(CRD_NAME) if read_crd(kube) else None
    yield
    if read_crd(kube) is None:
        return
    current = ext.read_custom_resource_definition(CRD_NAME)
    if before is not None:
        body = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": CRD_NAME, "labels": before.metadata.labels,
                             "annotations": before.metadata.annotations}, "spec": before.spec}
    else:
        body = crdgen.build_crd()
    body["metadata"]["resourceVersion"] = current.metadata.resource_version
    ext.replace_custom_resource_definition(CRD_NAME, body)


@pytest.fixture
def release(cluster, namespace, vlm_crd) -> Iterator[Release]:
    r = Release(cluster, namespace.removeprefix("t-")[-20:].strip("-"), namespace)
    yield r
    r.uninstall()
