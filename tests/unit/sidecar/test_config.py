"""Config: durations, env vars vs flags, validation."""

from __future__ import annotations

import pytest
from vlm_sidecar.config import DEFAULT_RATE_HZ, ConfigError, load_config, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("2m", 120), ("500ms", 0.5), ("1.5", 1.5), ("1h", 3600),
                                               (7, 7.0)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "abc", "-3s", "0", "10 parsecs"])
def test_parse_duration_rejects(bad):
    with pytest.raises(ConfigError):
        parse_duration(bad)


def test_defaults_and_env():
    cfg = load_config([], {})
    assert (cfg.port, cfg.rate_hz, cfg.top_n, cfg.process_pattern) == (9400, DEFAULT_RATE_HZ, 10, "sglang::scheduler")
    assert cfg.sglang_metrics_url == "http://127.0.0.1:30000/metrics"
    env = {"VLM_SIDECAR_PORT": "9500", "VLM_PROFILE_INTERVAL": "1m", "VLM_PROFILE_DURATION": "10s",
           "VLM_PROFILE_RATE": "250", "VLM_WATCH_FUNCTIONS": "a, b,,c", "VLM_TOP_N": "3",
           "VLM_PROCESS_PATTERN": "sglang::scheduler_TP1", "VLM_SGLANG_METRICS_URL": "", "VLM_PYSPY": "/x/py-spy",
           "VLM_DISCOVERY_ROOT_PID": "42", "POD_NAME": "p", "POD_NAMESPACE": "ns", "VLM_SERVICE_NAME": "svc",
           "VLM_REVISION": "r1"}
    cfg = load_config([], env)
    assert (cfg.port, cfg.interval_s, cfg.duration_s, cfg.rate_hz) == (9500, 60, 10, 250)
    assert cfg.watch_functions == ("a", "b", "c") and cfg.top_n == 3
    assert cfg.sglang_metrics_url is None and cfg.pyspy == "/x/py-spy" and cfg.discovery_root_pid == 42
    assert cfg.labels == {"namespace": "ns", "vlmservice": "svc", "pod": "p", "revision": "r1"}


def test_flags_win_over_env():
    cfg = load_config(["--rate", "100", "--interval", "20s"], {"VLM_PROFILE_RATE": "250"})
    assert cfg.rate_hz == 100 and cfg.interval_s == 20


@pytest.mark.parametrize("argv", [["--duration", "40s"], ["--rate", "0"], ["--top-n", "-1"], ["--bogus"],
                                  ["--interval", "soon"]])
def test_rejects(argv):
    with pytest.raises(ConfigError):
        load_config(argv, {})
