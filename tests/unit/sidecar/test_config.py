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


@pytest.mark.parametrize(("argv", "env", "line"), [
    (["--port", "x"], {}, "--port (VLM_SIDECAR_PORT): not a valid integer (got 'x')"),
    ([], {"VLM_SIDECAR_PORT": "abc"}, "--port (VLM_SIDECAR_PORT): not a valid integer (got 'abc')"),
    ([], {"VLM_TOP_N": "-2"}, "--top-n (VLM_TOP_N): must be >= 0 (got -2)"),
    ([], {"VLM_WINDOW_HISTORY": "0"}, "--history (VLM_WINDOW_HISTORY): must be >= 1 (got 0)"),
    (["--interval", "soon"], {}, "--interval (VLM_PROFILE_INTERVAL): not a duration: 'soon'"),
    (["--duration", "40s"], {}, "--duration (VLM_PROFILE_DURATION): window duration 40s is longer than --interval 15s"),
    (["--rate", "0"], {}, "--rate (VLM_PROFILE_RATE): 0 Hz outside 1..10000"),
    ([], {"VLM_DISCOVERY_ROOT_PID": "me"}, "--discovery-root-pid (VLM_DISCOVERY_ROOT_PID): not a valid integer"),
    (["--bogus"], {}, "unrecognized arguments: --bogus"),
])
def test_errors_are_one_line_naming_the_flag_and_its_variable(argv, env, line):
    with pytest.raises(ConfigError) as e:
        load_config(argv, env)
    assert str(e.value).startswith(line) and "\n" not in str(e.value), str(e.value)


def test_every_flag_has_help_naming_its_variable():
    from vlm_sidecar.config import ENV_OF, build_parser

    actions = [a for a in build_parser({})._actions if a.option_strings and a.dest != "help"]
    assert len(actions) == 21
    for a in actions:
        flag = max(a.option_strings, key=len)
        assert a.help and f"[{ENV_OF[flag]}" in a.help, (flag, a.help)


def test_console_script_bad_env_exits_2_with_one_line():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("VLM_")}
    proc = subprocess.run([sys.executable, "-m", "vlm_sidecar"], env={**env, "VLM_PROFILE_RATE": "fast"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == "vlm-sidecar: --rate (VLM_PROFILE_RATE): not a valid integer (got 'fast')\n", proc.stderr


def test_log_lines_are_json_with_time_and_level():
    import io
    import json
    import logging
    import re

    from vlm_sidecar import log

    buf = io.StringIO()
    log.configure(buf)
    try:
        log.event("Found scheduler", pid=42, tp_rank=0)
        log.event("Lost scheduler", pid=42)
    finally:
        logging.getLogger().handlers.clear()
    first, second = (json.loads(x) for x in buf.getvalue().splitlines())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["time"])
    assert (first["level"], first["logger"], first["msg"], first["pid"]) == ("info", "vlm_sidecar", "Found scheduler", 42)
    assert second["level"] == "warning"
    assert '"msg": "Found scheduler"' in buf.getvalue()  # what the acceptance test greps for
