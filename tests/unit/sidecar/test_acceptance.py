"""Issue 7 acceptance with real py-spy on the real stand-in, at the sidecar's default rate and window.

- stage shares within 3 percentage points of the stand-in's own accounting (every window);
- loop-iteration mean within 15% of the true mean for iterations >= 20 ms (median over windows: one
  window on a CPU-starved CI host can lose py-spy samples for tens of ms, see docs/sidecar.md);
- cache off shows a clearly larger process_input_requests share than cache on.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

import pytest
from vlm_sidecar.collector import ProfileStore
from vlm_sidecar.config import SidecarConfig
from vlm_sidecar.discovery import discover
from vlm_sidecar.runner import Runner
from vlm_sidecar.sampler import PySpySampler

from tests.unit.sidecar.helpers import free_port

pytestmark = pytest.mark.slow


def run_windows(s, n: int, metrics_url: str | None = None):
    cfg = SidecarConfig(sglang_metrics_url=metrics_url)  # defaults: rate, window length
    store = ProfileStore()
    sampler = PySpySampler(cfg.pyspy, cfg.rate_hz, cfg.duration_s)
    runner = Runner(cfg, store, sampler, lambda: discover("/proc", cfg.process_pattern, s.proc.pid))
    out = []
    for _ in range(n):
        [w] = runner.run_window()
        assert w.result == "ok", w.error
        out.append((w, s.accounting(w.start, w.end)))
    return out, store


def test_stage_shares_and_loop_time_match_truth(standin):
    # ~25 ms iterations, run_batch-dominated, with multimodal input on the cached CUDA IPC path.
    s = standin("--standin-version", "0.5.20", "--mm-feature-transport", "cuda_ipc", "--standin-batch-ms", "18",
                "--standin-request-rate", "15")
    windows, _ = run_windows(s, 3, f"http://127.0.0.1:{s.port}/metrics")
    errs = []
    for w, truth in windows:
        assert truth["loop_mean_seconds"] >= 0.020
        diffs = {k: abs(w.stage_shares[k] - truth["stage_shares"][k]) for k in truth["stage_shares"]}
        assert max(diffs.values()) <= 0.03, (diffs, w.stage_shares, truth["stage_shares"])
        errs.append(w.loop_mean_seconds / truth["loop_mean_seconds"] - 1)
        # The SGLang cross-check saw the same window (stand-in serves scheduler_stage_seconds_total).
        assert w.sglang_stage_shares is not None
    assert abs(statistics.median(errs)) <= 0.15, errs
    print("loop mean relative errors", [f"{e:+.3f}" for e in errs])


def test_cache_off_shows_larger_input_share(standin):
    shares = {}
    for name, cache in (("off", "0"), ("on", "1")):
        env = {"SGLANG_USE_CUDA_IPC_TRANSPORT": "1", "SGLANG_USE_IPC_POOL_HANDLE_CACHE": cache}
        s = standin("--standin-version", "0.5.10", env=env)
        assert s.info["cache"] is (cache == "1")
        windows, _ = run_windows(s, 2)
        shares[name] = statistics.mean(w.stage_shares["process_input_requests"] for w, _ in windows)
        truth = statistics.mean(t["stage_shares"]["process_input_requests"] for _, t in windows)
        assert abs(shares[name] - truth) <= 0.03
        s.stop()
    assert shares["off"] > shares["on"] + 0.08, shares
    print("process_input_requests share", shares)


def test_console_script_end_to_end(standin):
    """The real `vlm-sidecar` process: finds the stand-in, serves metrics and windows, stops on SIGTERM."""
    s = standin("--tp", "2")
    port = free_port()
    env = dict(os.environ, VLM_SIDECAR_PORT=str(port), VLM_PROFILE_INTERVAL="4s", VLM_PROFILE_DURATION="2s",
               VLM_DISCOVERY_ROOT_PID=str(s.proc.pid), VLM_SGLANG_METRICS_URL=f"http://127.0.0.1:{s.port}/metrics",
               POD_NAME="qwen-abc", POD_NAMESPACE="ml", VLM_SERVICE_NAME="qwen", VLM_REVISION="r1")
    proc = subprocess.Popen([sys.executable, "-m", "vlm_sidecar"], env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 40
        windows = []
        while time.time() < deadline and len({w["tp_rank"] for w in windows if w["error"] is None}) < 2:
            time.sleep(0.5)
            try:
                windows = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/windows.json").read())
            except OSError:
                continue
        assert {w["tp_rank"] for w in windows if w["error"] is None} == {0, 1}
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        assert 'vlm_profiler_stale{namespace="ml",pod="qwen-abc",revision="r1",tp_rank="1",vlmservice="qwen"} 0.0' \
            in text
        assert "vlm_scheduler_stage_share{" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
    assert rc == 0
    log = proc.stderr.read().decode()
    assert '"msg": "Found scheduler"' in log
