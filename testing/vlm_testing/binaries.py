"""The control-plane binaries for the integration and e2e tiers, built while the unit tier runs.

`make test` builds only the tools stage in front (py-spy and helm, which the unit tier uses). When the
collected tests include integration or e2e ones, the session starts `hack/build-binaries.sh --stage
cluster,monitoring,argo,flagger,prometheus,keda` in the background, at nice 19 in a session of its own: with the
kernel's scheduling autogroups that is an equal share of the CPU beside the tests, on purpose (the builds are on
the integration tests' critical path: hack/build-behind.sh says what a real yield cost), and the timing tests
hold it while they measure (`paused`). The first test that needs the control
plane waits for the cluster stage; the Prometheus Operator (monitoring), the Argo Rollouts and Flagger controllers
(argo, flagger: the parallel pass's judge tests), Prometheus with kubernetes_sd (prometheus: the heavy pass) and KEDA
(keda: the autoscaling e2e, last) go on building behind the integration tests in that order, and only the tests that
run them wait for them (`require`). On a machine where everything is cached the background run finishes in a second. On a cold
one it overlaps the 15-20 minute Go build with the tests instead of running them one after the other.

`make test` starts that build before anything else (`hack/build-behind.sh`: before the virtualenv, the tools and
the fetches, so a cold machine's Go build overlaps them too); a session that finds it running adopts it instead of
starting a second. `hack/run-tests.sh` runs the unit tier in a session of its own, before the testbed starts: it sets
VLM_BUILD_BEHIND=1, and that session starts the same background build whatever it collected and leaves it
running at its end (its process group id in CACHE/build-behind.pgid) for the integration and e2e passes,
whose `ensure` calls wait on its locks; the script stops it when the run ends. Under pytest-xdist only the
first worker (gw0) starts one.

`ensure(stage)` runs that stage once more in the foreground: it waits on the stage's lock while the
background run builds it, then is a no-op after a good build (the script skips what is built); it is the
real build where none ran (a plain `pytest tests/integration`), and the build's own error when the
background run failed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "build-binaries.sh"
CACHE = Path(os.environ.get("VLM_CACHE") or Path.home() / ".cache" / "vlm-operator")
LOG = CACHE / "build-cluster.log"
PGID = CACHE / "build-behind.pgid"
STAGES = "cluster,monitoring,argo,flagger,prometheus,keda"


def behind() -> bool:
    """Whether this session starts the background build for later sessions and leaves it running (VLM_BUILD_BEHIND=1)."""
    return os.environ.get("VLM_BUILD_BEHIND") == "1"


def wanted(collected_cluster_tests: bool) -> bool:
    """Whether this process should start the background build: it collected tests that need the control plane
    (or runs the unit tier for later passes, `behind`), and it is no xdist worker but the first."""
    return (collected_cluster_tests or behind()) and os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0"

# Where a foreground build runs: tests/cluster.py sets this to its `home_network`, so that a build started from a
# test inside the testbed's network namespace (no registry there) runs in the session's own namespace.
outside: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
_lock = threading.Lock()
_background: subprocess.Popen[bytes] | None = None
_adopted: int | None = None  # the process group of a background build this session found running
_ensured: dict[str, subprocess.CompletedProcess[str]] = {}


def _running_behind() -> int | None:
    """The process group of a background build `hack/build-behind.sh` (run first by `make test`) or an earlier
    session left running, when it still runs."""
    try:
        pgid = int(PGID.read_text().strip())
        os.killpg(pgid, 0)
    except (OSError, ValueError):
        return None
    return pgid


def start_background() -> None:
    """Start the cluster, monitoring, prometheus and argo stages behind the tests (once per session), or adopt
    the one `hack/build-behind.sh` started (`paused` then holds that one)."""
    global _background, _adopted
    with _lock:
        if _background is not None or _adopted is not None:
            return
        _adopted = _running_behind()
        if _adopted is not None:
            return
        CACHE.mkdir(parents=True, exist_ok=True)
        with LOG.open("wb") as out:
            _background = subprocess.Popen(["nice", "-n", "19", "bash", str(SCRIPT), "--stage", STAGES],
                                           stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True)
        if behind():
            PGID.write_text(f"{_background.pid}\n")


def ensure(stage: str = "cluster", timeout_s: float = 3600) -> subprocess.CompletedProcess[str]:
    """Make sure `stage` (cluster, monitoring or prometheus) is built, waiting for the background build of it (the
    script's lock for that stage) or building it. Returns the foreground run; its returncode is non-zero,
    with the script's stderr, when a binary is missing and cannot be built."""
    with _lock:
        done = _ensured.get(stage)
        if done is not None and done.returncode == 0:
            return done
    try:
        with outside():
            done = subprocess.run(["bash", str(SCRIPT), "--stage", stage], capture_output=True, text=True,
                                  timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        done = subprocess.CompletedProcess(e.cmd, 124, "", f"hack/build-binaries.sh --stage {stage} did not "
                                           f"finish in {timeout_s:.0f} s")
    if done.returncode != 0 and LOG.exists():
        done.stderr += f"\n(background build log, {LOG}):\n" + LOG.read_text(errors="replace")[-4000:]
    with _lock:
        _ensured[stage] = done
    return done


def require(stage: str, what: str) -> None:
    """`ensure(stage)`, failing the calling test (not skipping it) with the build's error when it cannot be built."""
    built = ensure(stage)
    if built.returncode != 0:
        pytest.fail(f"{what} could not be built (hack/build-binaries.sh --stage {stage}):\n{built.stderr[-6000:]}",
                    pytrace=False)


def _held_beside() -> int | None:
    """The process group of work run beside this session at nice 19 (hack/run-tests.sh's unit-beside, whose
    group id is in the file VLM_HOLD_PGID_FILE names), while it runs."""
    path = os.environ.get("VLM_HOLD_PGID_FILE")
    try:
        pgid = int(Path(path).read_text().strip()) if path else 0
    except (OSError, ValueError):
        return None
    if pgid <= 1:
        return None
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return None
    return pgid


@contextlib.contextmanager
def paused() -> Iterator[bool]:
    """Hold the background build (SIGSTOP to its process group, SIGCONT after), and the unit tests run beside this
    session (VLM_HOLD_PGID_FILE), while a test measures timing against live processes: at nice 19 they still take
    the CPU the test leaves idle for a moment, and a cold build's compilers, linker and page cache then read
    py-spy's loop estimates several percent long. Yields whether anything was held; a no-op when nothing runs."""
    groups: list[int] = []
    with _lock:
        pgid = _background.pid if _background is not None and _background.poll() is None else None
        if pgid is None and _adopted is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(_adopted, 0)
                pgid = _adopted
        for g in (pgid, _held_beside()):
            if g is not None and g not in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(g, signal.SIGSTOP)
                    groups.append(g)
    try:
        yield bool(groups)
    finally:
        for g in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(g, signal.SIGCONT)


def stop_background() -> None:
    """At the session's end: a build still running (the session stopped early) is stopped; the Go build cache
    keeps what it compiled, and the script rebuilds only what has no finished binary. Left running when this
    session builds for later ones (`behind`)."""
    with _lock:
        if _background is not None and not behind() and _background.poll() is None:
            try:
                os.killpg(_background.pid, signal.SIGTERM)
                _background.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
