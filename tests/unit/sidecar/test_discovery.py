"""Discovery over a fake /proc tree (exact title layouts) and over the real stand-in."""

from __future__ import annotations

import time

import pytest

from vlm_sidecar.discovery import discover, tp_rank
from vlm_testing.sidecar import fake_proc


def test_titles_padding_suffixes_and_others(tmp_path):
    fake_proc(tmp_path, 10, 1, b"python3\x00-m\x00sglang.launch_server\x00", "python3")
    fake_proc(tmp_path, 11, 10, b"sglang::scheduler_TP0" + b" " * 40, "sglang::schedul")
    fake_proc(tmp_path, 12, 10, b"sglang::scheduler_TP1\x00\x00\x00", "sglang::schedul")
    fake_proc(tmp_path, 13, 10, b"sglang::detokenizer ", "sglang::detoken")
    fake_proc(tmp_path, 14, 10, b"sglang::schedulerX", "sglang::schedul")
    fake_proc(tmp_path, 15, 1, b"vim sglang::scheduler", "vim")
    (tmp_path / "self").mkdir()
    found = discover(str(tmp_path), "sglang::scheduler")
    assert [(t.pid, t.tp_rank, t.title) for t in found] == [(11, 0, "sglang::scheduler_TP0"),
                                                             (12, 1, "sglang::scheduler_TP1")]


def test_comm_fallback_root_filter_and_restart(tmp_path):
    fake_proc(tmp_path, 20, 1, b"launcher", "launcher")
    fake_proc(tmp_path, 21, 20, b"", "sglang::schedul", start=100)  # unreadable cmdline: comm only
    fake_proc(tmp_path, 30, 1, b"other-launcher", "x")
    fake_proc(tmp_path, 31, 30, b"sglang::scheduler ", "sglang::schedul", start=50)
    assert [t.pid for t in discover(str(tmp_path), "sglang::scheduler", root_pid=20)] == [21]
    assert [t.pid for t in discover(str(tmp_path), "sglang::scheduler", root_pid=30)] == [31]
    # Both rank 0 without a root filter: the newer process wins (a restart leaves the old one dying).
    assert [t.pid for t in discover(str(tmp_path), "sglang::scheduler")] == [21]
    assert discover(str(tmp_path / "nope"), "sglang::scheduler") == []


def test_tp_rank_parsing():
    assert tp_rank("sglang::scheduler") == 0
    assert tp_rank("sglang::scheduler_DP1_TP3") == 3


@pytest.mark.slow
def test_real_standin_tp2(standin):
    s = standin("--tp", "2", warmup_s=0.5)
    found = discover("/proc", "sglang::scheduler", root_pid=s.proc.pid)
    assert [(t.pid, t.tp_rank) for t in found] == [(s.pids[0], 0), (s.pids[1], 1)]
    assert all(t.title == f"sglang::scheduler_TP{t.tp_rank}" for t in found)
    # Another stand-in on the same host is not mixed in.
    other = standin("--tp", "1", warmup_s=0.5)
    found_other = discover("/proc", "sglang::scheduler", root_pid=other.proc.pid)
    assert [t.pid for t in found_other] == other.pids
    assert found_other[0].title == "sglang::scheduler"


@pytest.mark.slow
def test_real_restart_is_rediscovered(standin):
    import os
    import signal

    s = standin("--standin-restart", warmup_s=0.5)
    before = discover("/proc", "sglang::scheduler", root_pid=s.proc.pid)
    os.kill(before[0].pid, signal.SIGKILL)
    deadline = time.time() + 15
    after = before
    while time.time() < deadline:
        after = discover("/proc", "sglang::scheduler", root_pid=s.proc.pid)
        if after and after[0].pid != before[0].pid:
            break
        time.sleep(0.2)
    assert after and after[0].pid != before[0].pid
