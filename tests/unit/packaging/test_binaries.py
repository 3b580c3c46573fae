"""testing/vlm_testing/binaries.py and the stages of hack/build-binaries.sh that it runs behind the tests."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vlm_testing import binaries

REPO = Path(__file__).resolve().parents[3]


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _states(pids: list[int], stopped: bool) -> bool:
    """Whether every pid is (or is no longer) stopped within 5 s (signals arrive asynchronously)."""
    deadline = time.time() + 5
    while time.time() < deadline:
        if all((_state(p) == "T") is stopped for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_paused_stops_the_background_build_and_lets_it_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.Popen(["bash", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        monkeypatch.setattr(binaries, "_background", proc)
        time.sleep(0.3)
        children = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert children
        with binaries.paused() as held:
            assert held is True
            assert _states([proc.pid, *children], stopped=True)  # the whole process group
        assert _states([proc.pid, *children], stopped=False)
    finally:
        subprocess.run(["pkill", "-g", str(proc.pid)], check=False)
        proc.wait(10)
    with binaries.paused() as held:  # finished: nothing to hold
        assert held is False


@pytest.mark.parametrize("stage", ["foo", "cluster,foo", ""])
def test_an_unknown_stage_is_refused(stage: str) -> None:
    r = subprocess.run(["bash", str(REPO / "hack" / "build-binaries.sh"), "--stage", stage], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "unknown stage" in r.stderr and "prometheus" in r.stderr


def test_a_foreground_build_runs_outside_the_testbeds_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build a test starts (inside the testbed's network namespace, where no registry answers) runs in the
    session's own namespace: vlm_testing.cluster hands its home_network to ensure()."""
    from vlm_testing import cluster

    assert binaries.outside is cluster.home_network
    entered: list[bool] = []

    @contextlib.contextmanager
    def outside() -> Iterator[None]:
        entered.append(True)
        yield

    monkeypatch.setattr(binaries, "outside", outside)
    done = binaries.ensure("no-such-stage", timeout_s=60)  # refused at once (exit 2): nothing is built
    assert done.returncode == 2 and entered == [True], done.stderr


@pytest.mark.parametrize(("worker", "behind", "collected", "want"), [
    (None, None, True, True),  # a plain session with integration tests
    (None, None, False, False),  # unit tests only
    (None, "1", False, True),  # hack/run-tests.sh's unit pass builds for the passes after it
    ("gw0", None, True, True),  # the first xdist worker builds
    ("gw1", None, True, False),  # the others wait on its locks
    ("gw2", "1", False, False),
])
def test_one_process_starts_the_background_build(monkeypatch: pytest.MonkeyPatch, worker: str | None,
                                                 behind: str | None, collected: bool, want: bool) -> None:
    for name, value in (("PYTEST_XDIST_WORKER", worker), ("VLM_BUILD_BEHIND", behind)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert binaries.wanted(collected) is want


def test_a_build_left_behind_outlives_the_session(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """VLM_BUILD_BEHIND=1: the build's process group id is written down and the session's end leaves it running."""
    monkeypatch.setenv("VLM_BUILD_BEHIND", "1")
    monkeypatch.setattr(binaries, "PGID", tmp_path / "build-behind.pgid")
    monkeypatch.setattr(binaries, "LOG", tmp_path / "build.log")
    monkeypatch.setattr(binaries, "SCRIPT", tmp_path / "build.sh")
    (tmp_path / "build.sh").write_text("sleep 60\n")
    monkeypatch.setattr(binaries, "_background", None)
    monkeypatch.setattr(binaries, "_adopted", None)
    binaries.start_background()
    proc = binaries._background
    try:
        assert proc is not None
        assert (tmp_path / "build-behind.pgid").read_text().strip() == str(proc.pid)
        binaries.stop_background()
        assert proc.poll() is None  # still building for the next pass
    finally:
        subprocess.run(["pkill", "-g", str(proc.pid)], check=False)
        proc.wait(10)


def test_a_session_adopts_the_build_make_test_started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """hack/build-behind.sh (the first thing `make test` runs) leaves its process group id behind: the unit session
    starts no second build, and `paused` holds the adopted one while a test measures."""
    group = subprocess.Popen(["bash", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        monkeypatch.setattr(binaries, "PGID", tmp_path / "build-behind.pgid")
        monkeypatch.setattr(binaries, "SCRIPT", tmp_path / "must-not-run.sh")
        monkeypatch.setattr(binaries, "_background", None)
        monkeypatch.setattr(binaries, "_adopted", None)
        (tmp_path / "build-behind.pgid").write_text(f"{group.pid}\n")
        binaries.start_background()
        assert binaries._background is None and binaries._adopted == group.pid
        with binaries.paused() as held:
            assert held is True and _states([group.pid], stopped=True)
        assert _states([group.pid], stopped=False)
        # The script itself: a build already running is left alone, none is started beside it.
        r = subprocess.run(["bash", str(REPO / "hack" / "build-behind.sh")], capture_output=True, text=True,
                           timeout=30, env={"PATH": "/usr/bin:/bin", "VLM_CACHE": str(tmp_path)})
        assert r.returncode == 0 and "already running" in r.stderr, r.stderr
        assert (tmp_path / "build-behind.pgid").read_text().strip() == str(group.pid)
    finally:
        subprocess.run(["pkill", "-g", str(group.pid)], check=False)
        group.wait(10)
    deadline = time.time() + 5  # its orphaned `sleep` is reaped by init a moment later
    while binaries._running_behind() is not None and time.time() < deadline:
        time.sleep(0.05)
    with binaries.paused() as held:  # the adopted build ended: nothing to hold
        assert held is False
