"""The stand-in's version rules follow REFERENCE.md, and its metrics and accounting are served."""

from __future__ import annotations

import pytest
from vlm_sidecar import sglang_metrics

from bench.standin.sglang_standin import (
    StandinConfigError,
    build_config,
    env_bool,
    parse_version,
    resolve_feature_path,
)

ON = {"SGLANG_USE_CUDA_IPC_TRANSPORT": "1", "SGLANG_USE_IPC_POOL_HANDLE_CACHE": "1"}


@pytest.mark.parametrize(("version", "env", "flag", "transport", "cache"), [
    ("0.5.9", ON, None, "cuda_ipc", False),            # predates the cache
    ("0.5.10", {}, None, "cpu", False),                # both env vars default off
    ("0.5.10.post1", ON, None, "cuda_ipc", True),
    ("0.5.15", {"SGLANG_USE_CUDA_IPC_TRANSPORT": "yes"}, None, "cuda_ipc", False),
    ("0.5.16", {"SGLANG_USE_IPC_POOL_HANDLE_CACHE": "1"}, None, "cpu", False),   # unset flag means cpu
    ("0.5.16", {"SGLANG_USE_IPC_POOL_HANDLE_CACHE": "1"}, "cuda_ipc", "cuda_ipc", True),
    ("0.5.17", {}, None, "cuda_ipc", True),            # cache on and cuda_ipc auto-picked
    ("0.5.17", {"SGLANG_USE_IPC_POOL_HANDLE_CACHE": "0"}, None, "cuda_ipc", False),
    ("0.5.20", {}, None, "cpu", False),                # unset means cpu again
    ("v0.5.20", {}, "cuda_ipc", "cuda_ipc", True),
    ("0.5.23", {}, "cuda_vmm", "cuda_vmm", False),
])
def test_feature_path_by_version(version, env, flag, transport, cache):
    p = resolve_feature_path(version, env, flag)
    assert (p.transport, p.cache) == (transport, cache)


@pytest.mark.parametrize(("version", "env", "flag"), [
    ("0.5.12", {}, "cuda_ipc"),                        # flag did not exist yet
    ("0.5.17", {}, "cuda_vmm"),                        # choice added in 0.5.18
    ("0.5.20", {"SGLANG_USE_IPC_POOL_HANDLE_CACHE": "maybe"}, None),
    ("latest", {}, None),
])
def test_what_sglang_would_refuse(version, env, flag):
    with pytest.raises(StandinConfigError):
        resolve_feature_path(version, env, flag)


def test_env_bool_and_version_parse():
    assert env_bool({"X": "Y"}, "X", False) is True and env_bool({}, "X", True) is True
    assert parse_version("0.5.10.post1") == (0, 5, 10, 1)


def test_operator_args_accepted_unknown_ignored():
    cfg = build_config(["--model-path", "Qwen/Qwen2.5-VL-3B-Instruct", "--tp", "2", "--host", "0.0.0.0",
                        "--port", "31000", "--enable-metrics", "--mm-feature-transport", "cuda_ipc",
                        "--mem-fraction-static", "0.8", "--standin-version", "0.5.20"], {})
    assert (cfg.tp, cfg.host, cfg.port, cfg.enable_metrics, cfg.path.transport, cfg.path.cache) == (
        2, "0.0.0.0", 31000, True, "cuda_ipc", True)
    assert cfg.stage_metrics


@pytest.mark.slow
def test_served_metrics_and_accounting(standin):
    import time
    import urllib.request

    s = standin("--standin-version", "0.5.20", "--standin-request-rate", "30")
    time.sleep(1.0)
    text = urllib.request.urlopen(f"http://127.0.0.1:{s.port}/metrics").read().decode()
    for name in ("sglang:time_to_first_token_seconds_bucket", "sglang:inter_token_latency_seconds_sum",
                 "sglang:gen_throughput", "sglang:num_running_reqs", "sglang:scheduler_stage_seconds_total"):
        assert name in text, name
    stages = sglang_metrics.stage_seconds(text)
    assert stages["run_batch"] > 0 and "idle" in stages
    acc = s.get("/standin/accounting")["ranks"][0]
    assert acc["iterations"] > 10 and sum(acc["stage_shares"].values()) == pytest.approx(1.0, abs=1e-6)
    assert urllib.request.urlopen(f"http://127.0.0.1:{s.port}/health").status == 200


def test_sglang_metrics_helpers():
    before = {"run_batch": 1.0, "recv_requests": 0.5, "idle": 0.5}
    after = {"run_batch": 4.0, "recv_requests": 1.5, "idle": 1.5}
    shares = sglang_metrics.window_shares(before, after)
    assert shares == pytest.approx({"run_batch": 0.6, "recv_requests": 0.2, "idle": 0.2})
    assert sglang_metrics.window_shares(after, before) is None  # counter reset
    agree = sglang_metrics.agreement({"run_batch": 0.5, "recv_requests": 0.2, "idle": 0.2, "other": 0.1}, shares)
    assert max(agree.values()) < 0.05
    assert sglang_metrics.stage_seconds("# nothing\nfoo 1\n") is None
    with pytest.raises(sglang_metrics.ScrapeError):
        sglang_metrics.fetch("http://127.0.0.1:1/metrics", timeout_s=0.5)
