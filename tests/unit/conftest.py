"""Fixtures for the unit tier's tests that measure timing against live processes (the quiet pass,
hack/run-tests.sh)."""

from __future__ import annotations

import pytest

from vlm_testing import binaries


@pytest.fixture
def quiet_cpu():
    """The control plane's background build (a cold `make test`) and the unit tests run beside the quiet pass
    (hack/run-tests.sh's unit-beside, VLM_HOLD_PGID_FILE) held while the test measures timing against live
    processes (testing/vlm_testing/binaries.py `paused`); True when anything was held."""
    with binaries.paused() as held:
        yield held
