"""Shared pytest configuration: loads the control-plane fixtures (testing/vlm_testing/cluster.py) for every tier."""

import os
import sys
import time
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

# Tests that must have a testbed to themselves: `hack/run-tests.sh` runs the integration and e2e tiers on
# pytest-xdist workers sharing one testbed (`-m "not serial"`, each test in its own namespace) and, beside them,
# these one at a time on a second testbed of their own (`-m serial`, `serial-beside`). A test belongs here when it
# changes something every test of its testbed shares. Path (relative to tests/) or node id prefix -> why.
SERIAL = {
    "e2e/test_chaos.py": "SIGKILLs the API server and operator replicas; runs the chart's cluster-wide peering",
    "integration/test_testbed.py": "asserts the fake nodes' GPU capacity and the namespace's network",
    "integration/test_chart.py": "helm adopts and upgrades the one VLMService CRD every test uses",
    "integration/test_plugin_rbac.py": "helm adopts and upgrades the one VLMService CRD every test uses",
    "integration/test_burst.py": "1000 services: the API server and CPU are the measurement",
    "e2e/test_autoscaling.py": "runs KEDA: registers its external metrics API (API discovery fails for all while it is "
                               "not up) and installs its CRDs",
    "integration/test_autoscaling.py": "installs KEDA's CRDs, which operators started meanwhile would see",
}
# Serial tests that also need the machine to themselves: `hack/run-tests.sh` runs them last, alone (`-m alone`), not in
# serial-beside. Path -> why.
ALONE = {
    "e2e/test_autoscaling.py": "the HPA's replica counts follow the front end's busy share, which a busy machine moves: "
                               "beside the parallel pass it scaled 2 -> 4 at a load sized for 3, and in the next run "
                               "3 -> 2 in mid-load (CI 2026-12-07); alone it passed both times",
}
# Tests whose verdicts rest on py-spy's samples of stand-ins: beside two other workers on 2 cores the samples
# starve (CI, 2026-12-06: the node pairs read an unchanged canary 25% slower). They run in a pass of their own
# (`-m heavy`, hack/run-tests.sh), the two side by side with nothing else: with all-spinning stand-ins each kept 2
# cores busy alone and two side by side failed together in two of three CI runs (2026-12-07); the testbed's
# stand-ins now nap most of each stage (the "hybrid" cost model), and a failure is rerun alone. Each has GPU nodes
# no other test uses (the node pairs make theirs; the monitoring proof has the testbed's two). Path -> why.
HEAVY = {
    "e2e/test_node_pairs.py": "measures node speeds through py-spy: no other sampler beside it",
    "e2e/test_monitoring.py": "the shipped cadence's verdicts and a surge next to a stable pod: no other sampler beside it",
}
# The longest files of the parallel pass (seconds of setup, call and teardown on 3 workers, CI of 2026-12-07's
# per-test log; the Flagger and bench files as measured after their changes that day), handed out first:
# hack/run-tests.sh passes --no-loadscope-reorder, so pytest-xdist hands whole files (--dist loadfile) out in this
# collection order, two to a worker at the start, then one to each worker that finishes. xdist's default order
# (files with the most tests first) handed these single-test files out last and left the other workers idle behind
# them: 919 s of wall time for 2140 s of tests on 3 workers.
LONGEST_FIRST = (
    "e2e/test_canary.py",  # 348 (two tests)
    "e2e/test_frontend.py",  # 248
    "integration/test_judge_argo.py",  # 240
    "integration/test_operator_fuzz.py",  # 200
    "integration/test_judge_flagger.py",  # 193 (the real Flagger, both canaries at once)
    "integration/test_operator.py",  # 179
    "integration/test_bench_operator_scale.py",  # 156 (no wait for a small run's namespace; 260 before)
    "e2e/test_load_hook.py",  # 122
    "integration/test_placement.py",  # 80
    "e2e/test_weights.py",  # 60
)
_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark SERIAL's tests `serial`, HEAVY's `heavy` and ALONE's `alone` (and `serial`); under pytest-xdist (`-n`) refuse to run a serial test
    beside other tests."""
    stale = [k for k in (*SERIAL, *HEAVY, *ALONE) if not (_TESTS / k.split("::")[0]).exists()]
    if set(ALONE) - set(SERIAL):
        raise pytest.UsageError(f"tests/conftest.py ALONE names tests that are not SERIAL: {set(ALONE) - set(SERIAL)}")
    if stale:
        raise pytest.UsageError(f"tests/conftest.py SERIAL/HEAVY/ALONE name files that do not exist: {stale}")
    for item in items:
        rel = Path(item.path).resolve().relative_to(_TESTS).as_posix() if _TESTS in Path(item.path).resolve().parents else ""
        nodeid = rel + item.nodeid[item.nodeid.find("::"):] if "::" in item.nodeid else rel
        for marks, mark in ((SERIAL, pytest.mark.serial), (HEAVY, pytest.mark.heavy), (ALONE, pytest.mark.alone)):
            if any(nodeid == k or nodeid.startswith(k + "::") or nodeid.startswith(k + "[") for k in marks):
                item.add_marker(mark)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts alike: the collections must match
        def rank(item: pytest.Item) -> int:
            p = Path(item.path).resolve()
            rel = p.relative_to(_TESTS).as_posix() if _TESTS in p.parents else ""
            return LONGEST_FIRST.index(rel) if rel in LONGEST_FIRST else len(LONGEST_FIRST)
        items.sort(key=rank)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under pytest-xdist (`-n`) a `serial` test fails at once: other tests run beside it on the same testbed."""
    if os.environ.get("PYTEST_XDIST_WORKER") and item.get_closest_marker("serial"):
        pytest.fail("marked serial (tests/conftest.py SERIAL): it must not run on xdist workers beside other "
                    "tests; run the -n pass with -m 'not serial' and these in a pass of their own (hack/run-tests.sh)",
                    pytrace=False)
    if os.environ.get("PYTEST_XDIST_WORKER") and item.get_closest_marker("heavy") \
            and item.config.option.markexpr != "heavy":
        pytest.fail("marked heavy (tests/conftest.py HEAVY): on xdist workers it runs only beside other heavy tests "
                    "(-m heavy, hack/run-tests.sh); beside the parallel pass py-spy's samples starve", pytrace=False)


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot, from /proc/stat's first line."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """With VLM_CPU_LOG set, each test's wall time (setup to teardown) and how busy the machine's CPUs were
    meanwhile are appended to that file, one tab-separated line per test (hack/run-tests.sh prints the slowest
    with their CPU share: where a pass waits rather than computes is where tests can run side by side)."""
    path = os.environ.get("VLM_CPU_LOG")
    if not path:
        yield
        return
    t0, (b0, n0) = time.monotonic(), _cpu_ticks()
    yield
    wall, (b1, n1) = time.monotonic() - t0, _cpu_ticks()
    busy = (b1 - b0) / (n1 - n0) if n1 > n0 else 0.0
    with open(path, "a") as f:
        f.write(f"{wall:.1f}\t{busy:.2f}\t{os.environ.get('PYTEST_XDIST_WORKER', '-')}\t{item.nodeid}\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With VLM_FAILED_FILE set, each failed test's node id is appended to that file (hack/run-tests.sh reruns the
    parallel pass's failures from it; pytest's own last-failed cache is off in CI, `-p no:cacheprovider`).
    Under pytest-xdist the controller and the worker both see a report: the file is read as a set."""
    path = os.environ.get("VLM_FAILED_FILE")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(report.nodeid + "\n")
