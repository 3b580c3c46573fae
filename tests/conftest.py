"""Shared pytest configuration: loads the control-plane fixtures (testing/vlm_testing/cluster.py) for every tier."""

import os
import sys
from pathlib import Path

import pytest

# Test this checkout's packages even when the editable install points at another clone of the repo
# (a CI run in a fresh clone re-points it): pyproject.toml's pytest `pythonpath` puts this checkout's
# operator/, sidecar/ and testing/ first on sys.path; what a plugin imported before that is dropped here, so
# it is imported again from this checkout. Only this process: subprocesses use the install.
for _m in [m for m in sys.modules if m.split(".")[0] in ("vlm_operator", "vlm_sidecar", "vlm_testing")]:
    del sys.modules[_m]

# Sample with the py-spy the sidecar image ships (hack/build-binaries.sh builds it; `make test` runs that
# first): first on PATH, for this process and every sidecar, stand-in and benchmark it starts.
# tests/unit/sidecar/test_sampler.py fails, with the command to run, when it was not built.
_PYSPY_DIR = Path.home() / ".cache" / "vlm-operator" / "pyspy"
if "VLM_CACHE" in os.environ:
    _PYSPY_DIR = Path(os.environ["VLM_CACHE"]) / "pyspy"
if (_PYSPY_DIR / "py-spy").exists() and str(_PYSPY_DIR) not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = f"{_PYSPY_DIR}{os.pathsep}{os.environ.get('PATH', '')}"

pytest_plugins = ["vlm_testing.cluster"]

# Tests that must have the testbed to themselves: `hack/run-tests.sh` runs the integration and e2e tiers on
# pytest-xdist workers sharing one testbed (`-m "not serial"`, each test in its own namespace), then these
# alone (`-m serial`). A test belongs here when it changes something every test shares, or when its
# assertion depends on no other test running. Path (relative to tests/) or node id prefix -> why.
SERIAL = {
    "e2e/test_chaos.py": "SIGKILLs the API server and operator replicas; runs the chart's cluster-wide peering",
    "integration/test_testbed.py": "asserts the fake nodes' GPU capacity and the namespace's network",
    "integration/test_chart.py": "helm adopts and upgrades the one VLMService CRD every test uses",
    "integration/test_plugin_rbac.py": "helm adopts and upgrades the one VLMService CRD every test uses",
    "integration/test_burst.py": "1000 services: the API server and CPU are the measurement",
}
_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark SERIAL's tests `serial`; under pytest-xdist (`-n`) refuse to run them beside other tests."""
    stale = [k for k in SERIAL if not (_TESTS / k.split("::")[0]).exists()]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py SERIAL names files that do not exist: {stale}")
    for item in items:
        rel = Path(item.path).resolve().relative_to(_TESTS).as_posix() if _TESTS in Path(item.path).resolve().parents else ""
        nodeid = rel + item.nodeid[item.nodeid.find("::"):] if "::" in item.nodeid else rel
        if any(nodeid == k or nodeid.startswith(k + "::") or nodeid.startswith(k + "[") for k in SERIAL):
            item.add_marker(pytest.mark.serial)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under pytest-xdist (`-n`) a `serial` test fails at once: other tests run beside it on the same testbed."""
    if os.environ.get("PYTEST_XDIST_WORKER") and item.get_closest_marker("serial"):
        pytest.fail("marked serial (tests/conftest.py SERIAL): it must not run on xdist workers beside other "
                    "tests; run the -n pass with -m 'not serial' and these in a pass of their own (hack/run-tests.sh)",
                    pytrace=False)
