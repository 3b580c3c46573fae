"""The py-spy the sidecar image ships (hack/build-pyspy.sh: py-spy 0.4.3 from crates.io with
hack/patches/py-spy-0.4.3-vlm.patch) is the one the tests sample with, and its `record --main-thread` reads
only the scheduler's main thread on a target with many threads (4 idle Python threads and 56 native ones,
as a real scheduler's CUDA, NCCL and OpenMP threads), with the loop estimate still within 5% of the
stand-in's truth. What it saves is measured by bench/sidecar_overhead.py (docs/sidecar.md, "CPU cost"), not
timed here."""

from __future__ import annotations

import os
import statistics
import subprocess

import pytest

from vlm_sidecar.collector import ProfileStore
from vlm_sidecar.config import SidecarConfig
from vlm_sidecar.discovery import discover
from vlm_sidecar.parser import parse_chrometrace
from vlm_sidecar.runner import Runner
from vlm_sidecar.sampler import PySpySampler, supports_main_thread

pytestmark = pytest.mark.slow


def test_the_tests_sample_with_the_sidecar_images_py_spy(pyspy):
    version = subprocess.run([pyspy, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    assert "+vlm." in version, (
        f"{pyspy} is {version!r}, not the sidecar image's py-spy build: run `bash hack/build-binaries.sh` "
        "(it builds it into ~/.cache/vlm-operator/pyspy, which tests/conftest.py puts first on PATH)")
    assert supports_main_thread(pyspy)


def test_the_flag_is_passed_only_to_a_py_spy_that_has_it(tmp_path):
    stock = tmp_path / "py-spy"
    stock.write_text("#!/bin/sh\necho 'Usage: py-spy record [OPTIONS] --pid <pid>'\n")
    stock.chmod(0o755)
    assert "--main-thread" not in PySpySampler(str(stock), 100, 1).command(1, "out.json")
    assert "--main-thread" in PySpySampler(str(stock), 100, 1, main_thread=True).command(1, "out.json")


def test_main_thread_samples_the_scheduler_alone_among_many_threads(quiet_cpu, standin, pyspy):
    s = standin("--standin-threads", "4", "--standin-native-threads", "56", warmup_s=2.0)
    pid = s.pids[0]
    assert len(os.listdir(f"/proc/{pid}/task")) >= 61
    cfg = SidecarConfig(sglang_metrics_url=None, duration_s=2)
    errs = []
    for main in (False, True, True):
        sampler = PySpySampler(pyspy, cfg.rate_hz, cfg.duration_s, main_thread=main)
        o = sampler.record(pid)
        assert o.error is None, o.error
        assert len(parse_chrometrace(o.output).threads) == (1 if main else 5)  # main + 4 Python threads
        if main:
            runner = Runner(cfg, ProfileStore(), sampler, lambda: discover("/proc", cfg.process_pattern, s.proc.pid))
            [w] = runner.run_window()
            assert w.result == "ok", w.error
            truth = s.accounting(w.start, w.end)
            errs.append(w.loop_mean_seconds / truth["loop_mean_seconds"] - 1)
    assert abs(statistics.median(errs)) <= 0.05, errs
