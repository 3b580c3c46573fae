"""Integration tier: every test collected under this directory is marked `integration`."""

from pathlib import Path

import pytest

from tests.operator_proc import install_crd

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
