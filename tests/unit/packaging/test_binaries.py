"""tests/binaries.py and the stages of hack/build-binaries.sh that it runs behind the tests."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import binaries

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
    session's own namespace: tests/cluster.py hands its home_network to ensure()."""
    from tests import cluster

    assert binaries.outside is cluster.home_network
    entered: list[bool] = []

    @contextlib.contextmanager
    def outside() -> Iterator[None]:
        entered.append(True)
        yield

    monkeypatch.setattr(binaries, "outside", outside)
    done = binaries.ensure("no-such-stage", timeout_s=60)  # refused at once (exit 2): nothing is built
    assert done.returncode == 2 and entered == [True], done.stderr
