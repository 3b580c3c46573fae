"""Operator settings (pydantic-settings): every VLM_* variable and default docs/settings.md documents, one line
naming the variable for a bad value, exit 2 from the real console script, and logs with time and level."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vlm_operator.__main__ import JsonFormatter, QuietSuccess
from vlm_operator.api.settings import DEFAULT_PROFILER_PEERS, Settings, SettingsError, env_name
from vlm_operator.desired import alerts

REPO = Path(__file__).resolve().parents[4]
# Read by other modules, not Settings (signals.py, __main__.py).
ELSEWHERE = {"VLM_SIDECAR_ENDPOINTS", "VLM_METRICS_ADDR"}


def _documented_settings() -> dict[str, str]:
    """env -> default from docs/settings.md's hand-written "Details" table (the reference table above it is
    generated from Settings by hack/gen-docs.py, checked by test_docs_generated)."""
    text = (REPO / "docs" / "settings.md").read_text()
    section = text.split("\n## Details", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for m in re.finditer(r"^\| (`VLM_\w+`[^|]*)\| ([^|]*)\|", section, re.M):
        for env in re.findall(r"`(VLM_\w+)`", m.group(1)):  # a row may name two (`A`, `B`): one default
            rows[env] = m.group(2).strip().strip("`")
    return rows


def test_every_documented_variable_is_a_setting_with_the_documented_default():
    rows = _documented_settings()
    assert {"VLM_NAMESPACES", "VLM_METRICS_PORT", "VLM_LOG_FORMAT"} <= set(rows)
    fields = {env_name(f): f for f in Settings.model_fields}
    defaults = Settings()
    for env, documented in rows.items():
        if env in ELSEWHERE:
            continue
        assert env in fields, f"docs/settings.md documents {env}, Settings has no field for it"
        value = getattr(defaults, fields[env])
        if isinstance(value, tuple) and value:  # a structured default, described in words
            continue
        if documented in ("", "all"):
            assert value in ("", ()), (env, value)
        elif isinstance(value, float):
            assert value == float(documented), (env, value, documented)
        elif isinstance(value, bool):
            assert str(value).lower() == documented.lower(), (env, value, documented)
        else:
            assert str(value) == documented, (env, value, documented)


def test_every_setting_is_documented():
    rows = _documented_settings()
    missing = [env_name(f) for f in Settings.model_fields if env_name(f) not in rows]
    assert not missing, f"no row in docs/settings.md's Details table: {missing}"


def test_module_docstring_lists_every_field():
    import vlm_operator.api.settings as mod

    for f in Settings.model_fields:
        assert env_name(f) in mod.__doc__, f


def test_from_env_reads_every_variable():
    s = Settings.from_env({"VLM_NAMESPACES": "team-a, team-b,", "VLM_SGLANG_IMAGE": "r/sglang:v0.5.10",
                           "VLM_SIDECAR_IMAGE": "r/sidecar:1", "VLM_PROMETHEUS_URL": "http://prom:9090/",
                           "VLM_LOG_FORMAT": "json", "VLM_METRICS_PORT": "9090", "VLM_RESYNC_SECONDS": "2.5",
                           "VLM_FIELD_MANAGER": "fm", "VLM_NETWORK_POLICY": "false",
                           "VLM_PROFILER_PEERS": '[{"podSelector": {}}]', "UNRELATED": "x"})
    assert s.namespaces == ("team-a", "team-b") and s.prometheus_url == "http://prom:9090"
    assert (s.sglang_image, s.sidecar_image, s.log_format, s.metrics_port, s.resync_seconds, s.field_manager) == (
        "r/sglang:v0.5.10", "r/sidecar:1", "json", 9090, 2.5, "fm")
    assert s.network_policy is False and s.profiler_peers == ({"podSelector": {}},)


def test_empty_values_are_unset_and_keywords_read_no_environment(monkeypatch):
    monkeypatch.setenv("VLM_METRICS_PORT", "1234")
    assert Settings().metrics_port == 8080  # builders and tests stay pure
    assert Settings.from_env().metrics_port == 1234
    s = Settings.from_env({"VLM_METRICS_PORT": "", "VLM_PROFILER_PEERS": "", "VLM_NETWORK_POLICY": ""})
    assert (s.metrics_port, s.profiler_peers, s.network_policy) == (8080, DEFAULT_PROFILER_PEERS, True)


@pytest.mark.parametrize(("env", "line"), [
    ({"VLM_METRICS_PORT": "abc"}, "VLM_METRICS_PORT: not a valid integer (got 'abc')"),
    ({"VLM_METRICS_PORT": "70000"}, "VLM_METRICS_PORT: must be less than or equal to 65535 (got '70000')"),
    ({"VLM_RESYNC_SECONDS": "soon"}, "VLM_RESYNC_SECONDS: not a valid number (got 'soon')"),
    ({"VLM_RESYNC_SECONDS": "0"}, "VLM_RESYNC_SECONDS: must be greater than 0 (got '0')"),
    ({"VLM_LOG_FORMAT": "xml"}, "VLM_LOG_FORMAT: must be 'text' or 'json' (got 'xml')"),
    ({"VLM_NETWORK_POLICY": "maybe"}, "VLM_NETWORK_POLICY: not a valid boolean (true or false) (got 'maybe')"),
    ({"VLM_PROFILER_PEERS": "[{"}, "VLM_PROFILER_PEERS: not JSON"),
    ({"VLM_PROFILER_PEERS": "[1]"}, "VLM_PROFILER_PEERS: must be a JSON list of NetworkPolicyPeer objects"),
    ({"VLM_NAMESPACES": "ok,Not_A_Namespace"}, "VLM_NAMESPACES: not a namespace name: 'Not_A_Namespace'"),
    ({"VLM_PROMETHEUS_URL": "prometheus:9090"}, "VLM_PROMETHEUS_URL: not an http(s) URL: 'prometheus:9090'"),
    ({"VLM_PEERING_LIFETIME_SECONDS": "5"},
     "VLM_PEERING_LIFETIME_SECONDS: must be greater than or equal to 15 (got '5')"),
])
def test_a_bad_value_is_one_line_naming_the_variable(env, line):
    with pytest.raises(SettingsError) as e:
        Settings.from_env(env)
    assert str(e.value).startswith(line) and "\n" not in str(e.value), str(e.value)


def test_every_bad_variable_is_named_at_once():
    with pytest.raises(SettingsError) as e:
        Settings.from_env({"VLM_METRICS_PORT": "x", "VLM_LOG_FORMAT": "xml"})
    assert [line.split(":")[0] for line in str(e.value).splitlines()] == ["VLM_LOG_FORMAT", "VLM_METRICS_PORT"]


def _run(*args, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VLM_")}
    return subprocess.run([sys.executable, "-m", "vlm_operator", *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


def test_console_script_exits_2_with_one_line_and_no_traceback():
    proc = _run(VLM_METRICS_PORT="abc")
    assert proc.returncode == 2 and proc.stderr == "vlm-operator: VLM_METRICS_PORT: not a valid integer (got 'abc')\n"
    flag = _run("--namespace", "Bad_NS")
    assert flag.returncode == 2 and flag.stderr.startswith("vlm-operator: VLM_NAMESPACES (--namespace): "), flag.stderr


def test_every_operator_flag_has_help():
    proc = _run("--help")
    assert proc.returncode == 0
    for flag in ("--namespace", "--peering", "--priority", "--liveness", "--version"):
        line = next(x for x in proc.stdout.splitlines() if x.strip().startswith(flag) or f", {flag}" in x)
        assert len(line.split()) > 2 or "--liveness" in line, f"{flag} has no help: {line!r}"


def test_json_log_lines_carry_time_level_logger_and_object():
    record = logging.LogRecord("vlm_operator", logging.WARNING, __file__, 1, "Created Deployment %s", ("qwen",), None)
    record.k8s_ref = {"namespace": "ml", "name": "qwen"}
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "warning" and line["logger"] == "vlm_operator" and line["msg"] == "Created Deployment qwen"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"]) and line["object"]["name"] == "qwen"


def test_kopfs_success_lines_are_dropped_and_its_failures_kept():
    def record(level: int, msg: str) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", level, __file__, 1, msg, (), None)

    quiet = QuietSuccess()
    for msg in ("Timer 'reconcile_vlmservice' succeeded.", "Handler 'count_vlmservices' succeeded.",
                "Creation is processed: 1 succeeded; 0 failed.", "Updating is processed: 1 succeeded; 0 failed."):
        assert not quiet.filter(record(logging.INFO, msg)), msg
    for level, msg in ((logging.ERROR, "Handler 'reconcile_vlmservice' failed with an exception. Will retry."),
                       (logging.WARNING, "Timer 'reconcile_vlmservice' failed temporarily: 503"),
                       (logging.INFO, "Creation is processed: 0 succeeded; 1 failed.")):
        assert quiet.filter(record(level, msg)), msg


def test_the_operator_re_executes_itself_under_jemalloc_where_it_is_installed(tmp_path, monkeypatch):
    from vlm_operator import __main__ as M

    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    got = M.allocator_exec("auto", ["--namespace", "ml"], {"LD_PRELOAD": "/x.so", "PATH": "/bin"}, (str(lib),))
    assert got is not None
    command, env = got
    assert command == [sys.executable, "-m", "vlm_operator", "--namespace", "ml"]
    assert env["LD_PRELOAD"] == f"{lib}:/x.so" and env["PYTHONMALLOC"] == "malloc" and env["PATH"] == "/bin"
    assert "MALLOC_CONF" not in env and env["VLM_ALLOCATOR_ACTIVE"] == str(lib)
    # A user's MALLOC_CONF is kept; the re-executed process does not exec again; pymalloc or no library: as is.
    assert M.allocator_exec("auto", [], {"MALLOC_CONF": "narenas:4"}, (str(lib),))[1]["MALLOC_CONF"] == "narenas:4"
    assert M.allocator_exec("auto", [], env, (str(lib),)) is None
    assert M.allocator_exec("pymalloc", [], {}, (str(lib),)) is None
    assert M.allocator_exec("auto", [], {}, (str(tmp_path / "none.so"),)) is None
    # main() execs with that command (caught here), and refuses `jemalloc` without the library.
    calls = []
    monkeypatch.setattr(M, "JEMALLOC_PATHS", (str(lib),))
    monkeypatch.setattr(M.os, "execve", lambda *a: calls.append(a) or (_ for _ in ()).throw(SystemExit(0)))
    monkeypatch.delenv("VLM_ALLOCATOR_ACTIVE", raising=False)
    with pytest.raises(SystemExit):
        M.main(["--namespace", "ml"])
    assert calls and calls[0][1][-2:] == ["--namespace", "ml"] and calls[0][2]["PYTHONMALLOC"] == "malloc"
    monkeypatch.setattr(M, "JEMALLOC_PATHS", (str(tmp_path / "none.so"),))
    monkeypatch.setenv("VLM_ALLOCATOR", "jemalloc")
    assert M.main([]) == 2


def test_console_script_refuses_an_alert_override_it_cannot_apply():
    proc = _run(VLM_ALERT_OVERRIDES='{"VLMOperatorDown": {"for": "soon"}, "VLMNope": {"for": "1m"}}')
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "vlm-operator: VLM_ALERT_OVERRIDES: VLMOperatorDown.for: not a Prometheus duration such as 30s, 5m or 1h30m "
        "(got 'soon')",
        f"vlm-operator: VLM_ALERT_OVERRIDES: VLMNope: not a shipped alert (one of {', '.join(alerts.names())})"], \
        proc.stderr


def test_sidecar_pull_secrets_scrapers_and_cidrs_from_the_environment():
    s = Settings.from_env({"VLM_SIDECAR_IMAGE_PULL_SECRETS": "regcred, mirror ,regcred",
                           "VLM_PROFILER_SCRAPERS": "monitoring/alloy,vmagent",
                           "VLM_PROFILER_PEER_CIDRS": "10.0.0.0/28, fd00::/64"})
    assert s.sidecar_image_pull_secrets == ("regcred", "mirror")  # once each, in order
    assert s.profiler_scrapers == ("monitoring/alloy", "vmagent") and s.profiler_peer_cidrs == ("10.0.0.0/28", "fd00::/64")
    peers = s.network_policy_peers
    assert peers[:2] == DEFAULT_PROFILER_PEERS
    assert peers[2] == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "alloy"}}}
    assert peers[3] == {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "vmagent"}}}
    assert peers[4:] == ({"ipBlock": {"cidr": "10.0.0.0/28"}}, {"ipBlock": {"cidr": "fd00::/64"}})
    plain = Settings()
    assert plain.network_policy_peers == DEFAULT_PROFILER_PEERS and plain.sidecar_image_pull_secrets == ()
    # A scraper the peers already admit is not repeated.
    assert Settings(profiler_scrapers=("prometheus",)).network_policy_peers == DEFAULT_PROFILER_PEERS


@pytest.mark.parametrize(("env", "line"), [
    ({"VLM_SIDECAR_IMAGE_PULL_SECRETS": "ok,Not_A_Secret"}, "VLM_SIDECAR_IMAGE_PULL_SECRETS: not a Secret name: "
                                                           "'Not_A_Secret'"),
    ({"VLM_PROFILER_SCRAPERS": "a/b/c"}, "VLM_PROFILER_SCRAPERS: not [namespace/]name"),
    ({"VLM_PROFILER_SCRAPERS": "Monitoring/alloy"}, "VLM_PROFILER_SCRAPERS: not [namespace/]name"),
    ({"VLM_PROFILER_SCRAPERS": "monitoring/"}, "VLM_PROFILER_SCRAPERS: not [namespace/]name"),
    ({"VLM_PROFILER_PEER_CIDRS": "10.0.0.1"}, "VLM_PROFILER_PEER_CIDRS: not a CIDR such as 10.0.0.0/24: '10.0.0.1'"),
    ({"VLM_PROFILER_PEER_CIDRS": "10.0.0.0/33"}, "VLM_PROFILER_PEER_CIDRS: not a CIDR"),
    ({"VLM_PROFILER_PEERS": '[{"podSelectr": {}}]'}, "VLM_PROFILER_PEERS: not a NetworkPolicyPeer (unknown field "
                                                     "podSelectr)"),
    ({"VLM_PROFILER_PEERS": '[{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]'},
     "VLM_PROFILER_PEERS: not a NetworkPolicyPeer (ipBlock goes alone)"),
    ({"VLM_PROFILER_PEERS": '[{"ipBlock": {"cidr": "nowhere"}}]'},
     "VLM_PROFILER_PEERS: not a NetworkPolicyPeer (ipBlock needs a cidr)"),
    ({"VLM_PROFILER_PEERS": '[{"podSelector": {"app": "x"}}]'},
     "VLM_PROFILER_PEERS: not a NetworkPolicyPeer (podSelector must be a label selector"),
])
def test_a_bad_peer_scraper_cidr_or_pull_secret_is_one_line_naming_the_variable(env, line):
    """Each of these would make every service's NetworkPolicy or Deployment one the API server refuses."""
    with pytest.raises(SettingsError) as e:
        Settings.from_env(env)
    assert str(e.value).startswith(line) and "\n" not in str(e.value), str(e.value)


def test_peers_the_api_server_takes_are_taken():
    for peers in ('[{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}]',
                  '[{"namespaceSelector": {"matchLabels": {"team": "obs"}}}]',
                  '[{"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}, '
                  '"namespaceSelector": {}}]'):
        assert Settings.from_env({"VLM_PROFILER_PEERS": peers}).profiler_peers == tuple(json.loads(peers))


def test_webhook_settings():
    s = Settings.from_env({"VLM_INJECTION": "true", "VLM_WEBHOOK_NAMESPACE": "vlm-system",
                           "VLM_WEBHOOK_CERT_HOSTS": "127.0.0.1, localhost,127.0.0.1", "VLM_WEBHOOK_TLS": "cert-manager"})
    assert (s.injection, s.webhook_port, s.webhook_cert_hosts, s.webhook_tls) == (
        True, 9443, ("127.0.0.1", "localhost"), "cert-manager")
    for env, named in (({"VLM_INJECTION": "true"}, "VLM_WEBHOOK_NAMESPACE"),
                       ({"VLM_WEBHOOK_CERT_HOSTS": "not a host"}, "VLM_WEBHOOK_CERT_HOSTS"),
                       ({"VLM_WEBHOOK_TLS": "openssl"}, "VLM_WEBHOOK_TLS"),
                       ({"VLM_WEBHOOK_NAMESPACE": "Bad_NS"}, "VLM_WEBHOOK_NAMESPACE"),
                       ({"VLM_WEBHOOK_PORT": "0"}, "VLM_WEBHOOK_PORT")):
        with pytest.raises(SettingsError, match=named):
            Settings.from_env(env)
