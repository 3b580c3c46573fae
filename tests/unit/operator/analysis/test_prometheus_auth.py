"""The gate's Prometheus source behind authentication (sources/base.PrometheusAuth): what each request carries,
to which host, read when; against local HTTP servers that record the headers of every request. (TLS and basic
auth against a real Prometheus: tests/integration/test_prometheus_source.py.)"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vlm_operator.analysis.sources import base
from vlm_operator.analysis.sources import prometheus as prom_source
from vlm_operator.analysis.sources.base import PrometheusAuth, SignalsUnavailable
from vlm_operator.api.settings import Settings, SettingsError

EMPTY = {"status": "success", "data": {"resultType": "matrix", "result": []}}


class _Server:
    """Answers every GET with EMPTY (or a redirect to `redirect_to`), recording each request's headers."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        self.redirect_to: str | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def do_GET(self) -> None:
                outer.seen.append({k.lower(): v for k, v in self.headers.items()})
                if outer.redirect_to:
                    self.send_response(302)
                    self.send_header("Location", outer.redirect_to + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps(EMPTY).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers() -> Iterator[tuple[_Server, _Server]]:
    a, b = _Server(), _Server()
    yield a, b
    a.close()
    b.close()


def _read(url: str, auth: PrometheusAuth | None = None) -> None:
    assert prom_source.from_prometheus(url, "ml", "qwen", ["r1"], since=0.0, now=600.0, step=5.0, auth=auth) == []


def test_bearer_token_and_headers_reach_every_query_and_a_rotated_token_is_used(servers, tmp_path):
    prom, _ = servers
    token = tmp_path / "token"
    token.write_text("first-token\n")
    auth = PrometheusAuth(url=prom.url + "/prometheus", bearer_token_file=str(token),
                          headers=(("X-Scope-OrgID", "team-a"),))
    _read(prom.url, auth)
    assert prom.seen and all(h["authorization"] == "Bearer first-token" and h["x-scope-orgid"] == "team-a"
                             for h in prom.seen)
    token.write_text("rotated-token")  # the kubelet updated the Secret's file
    prom.seen.clear()
    _read(prom.url, auth)
    assert {h["authorization"] for h in prom.seen} == {"Bearer rotated-token"}


def test_basic_auth_reads_the_password_file_and_keeps_the_password_as_written(servers, tmp_path):
    prom, _ = servers
    pw = tmp_path / "password"
    pw.write_text(" p:ss word \n")  # only the line end is dropped
    _read(prom.url, PrometheusAuth(url=prom.url, basic_auth_username="gate", basic_auth_password_file=str(pw)))
    expected = "Basic " + base64.b64encode(b"gate: p:ss word ").decode()
    assert {h["authorization"] for h in prom.seen} == {expected}


def test_nothing_is_sent_to_another_origin_or_across_a_redirect(servers, tmp_path):
    """A VLMService's own prometheusURL (another host or port) gets no credentials and no headers, and neither
    does a host the operator's Prometheus redirects to."""
    prom, other = servers
    token = tmp_path / "token"
    token.write_text("t")
    auth = PrometheusAuth(url=prom.url, bearer_token_file=str(token), headers=(("X-Scope-OrgID", "team-a"),))
    _read(other.url, auth)
    assert other.seen and not any("authorization" in h or "x-scope-orgid" in h for h in other.seen)
    other.seen.clear()
    prom.redirect_to = other.url
    _read(prom.url, auth)
    assert prom.seen and all(h["authorization"] == "Bearer t" for h in prom.seen)
    assert other.seen and not any("authorization" in h or "x-scope-orgid" in h for h in other.seen)


def test_unreadable_or_empty_credentials_are_signals_unavailable_naming_the_variable(servers, tmp_path):
    prom, _ = servers
    with pytest.raises(SignalsUnavailable, match=r"VLM_PROMETHEUS_BEARER_TOKEN_FILE .*missing"):
        _read(prom.url, PrometheusAuth(url=prom.url, bearer_token_file=str(tmp_path / "missing")))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SignalsUnavailable, match=r"VLM_PROMETHEUS_BEARER_TOKEN_FILE .* is empty"):
        _read(prom.url, PrometheusAuth(url=prom.url, bearer_token_file=str(tmp_path / "empty")))
    with pytest.raises(SignalsUnavailable, match="VLM_PROMETHEUS_CA_FILE"):
        PrometheusAuth(url="https://prom:9090", ca_file=str(tmp_path / "missing")).ssl_context("https://prom:9090/x")
    (tmp_path / "bad.pem").write_text("not a certificate")
    with pytest.raises(SignalsUnavailable, match="VLM_PROMETHEUS_CA_FILE"):
        PrometheusAuth(url="https://prom:9090", ca_file=str(tmp_path / "bad.pem")).ssl_context("https://prom:9090/x")
    assert not prom.seen  # nothing went out without its credentials


def test_the_default_auth_comes_from_the_environment_once(servers, tmp_path, monkeypatch):
    """from_prometheus without `auth` (as sources.Prometheus calls it) uses the operator's VLM_PROMETHEUS_*."""
    prom, _ = servers
    token = tmp_path / "token"
    token.write_text("from-env")
    monkeypatch.setenv("VLM_PROMETHEUS_URL", prom.url)
    monkeypatch.setenv("VLM_PROMETHEUS_BEARER_TOKEN_FILE", str(token))
    monkeypatch.setenv("VLM_PROMETHEUS_HEADERS", '{"X-Scope-OrgID": "t1"}')
    base.configure_prometheus_auth(None)
    try:
        _read(prom.url)
        assert {(h["authorization"], h["x-scope-orgid"]) for h in prom.seen} == {("Bearer from-env", "t1")}
        assert base.prometheus_auth() is base.prometheus_auth()
    finally:
        base.configure_prometheus_auth(None)
        monkeypatch.delenv("VLM_PROMETHEUS_URL")
        monkeypatch.delenv("VLM_PROMETHEUS_BEARER_TOKEN_FILE")
        monkeypatch.delenv("VLM_PROMETHEUS_HEADERS")
    assert not base.prometheus_auth().configured
    base.configure_prometheus_auth(None)


@pytest.mark.parametrize(("env", "message"), [
    ({"VLM_PROMETHEUS_BEARER_TOKEN_FILE": "/t"}, "VLM_PROMETHEUS_BEARER_TOKEN_FILE: needs VLM_PROMETHEUS_URL"),
    ({"VLM_PROMETHEUS_URL": "https://p", "VLM_PROMETHEUS_BASIC_AUTH_USERNAME": "u"},
     "VLM_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE: needed with VLM_PROMETHEUS_BASIC_AUTH_USERNAME"),
    ({"VLM_PROMETHEUS_URL": "https://p", "VLM_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE": "/p"},
     "VLM_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE: needs VLM_PROMETHEUS_BASIC_AUTH_USERNAME"),
    ({"VLM_PROMETHEUS_URL": "https://p", "VLM_PROMETHEUS_BEARER_TOKEN_FILE": "/t",
      "VLM_PROMETHEUS_BASIC_AUTH_USERNAME": "u", "VLM_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE": "/p"},
     "VLM_PROMETHEUS_BASIC_AUTH_USERNAME: either basic auth or VLM_PROMETHEUS_BEARER_TOKEN_FILE"),
    ({"VLM_PROMETHEUS_HEADERS": "X-Scope-OrgID: a"}, "VLM_PROMETHEUS_HEADERS: not JSON"),
    ({"VLM_PROMETHEUS_HEADERS": '{"X-Scope-OrgID": 1}'}, "VLM_PROMETHEUS_HEADERS: must be a JSON object"),
    ({"VLM_PROMETHEUS_HEADERS": '{"Authorization": "Bearer x"}'}, "VLM_PROMETHEUS_HEADERS: set by the operator"),
    ({"VLM_PROMETHEUS_HEADERS": '{"X-A": "a\\r\\nX-B: b"}'}, "VLM_PROMETHEUS_HEADERS: not a valid header"),
    ({"VLM_PROMETHEUS_HEADERS": '{"bad name": "a"}'}, "VLM_PROMETHEUS_HEADERS: not a valid header"),
])
def test_bad_auth_settings_stop_the_operator_naming_the_variable(env, message):
    with pytest.raises(SettingsError) as e:
        Settings.from_env(env)
    assert message in str(e.value), str(e.value)


def test_settings_to_auth():
    s = Settings.from_env({"VLM_PROMETHEUS_URL": "https://mimir.monitoring:8080/prometheus/",
                           "VLM_PROMETHEUS_BASIC_AUTH_USERNAME": "u",
                           "VLM_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE": "/etc/vlm-operator/prometheus/password/password",
                           "VLM_PROMETHEUS_CA_FILE": "/etc/ca.crt", "VLM_PROMETHEUS_HEADERS": '{"X-Scope-OrgID": "a"}'})
    a = PrometheusAuth.from_settings(s)
    assert a == PrometheusAuth(url="https://mimir.monitoring:8080/prometheus", basic_auth_username="u",
                               basic_auth_password_file="/etc/vlm-operator/prometheus/password/password",
                               ca_file="/etc/ca.crt", headers=(("X-Scope-OrgID", "a"),))
    assert a.applies_to("https://MIMIR.monitoring:8080/other") and not a.applies_to("http://mimir.monitoring:8080")
    assert not a.applies_to("https://mimir.monitoring/prometheus")  # another port
    assert PrometheusAuth(url="https://p").applies_to("https://p:443/x")
    assert not Settings().prometheus_headers and not PrometheusAuth.from_settings(Settings()).configured
