"""The judge's certificate kept in a Secret and its CA published in a ConfigMap (VLM_JUDGE_TLS, the chart's
judge.enabled): made, served over HTTPS that verifies against the published CA, renewed without a restart, and
only read in cert-manager mode. The API server here is an in-memory store of Secrets and ConfigMaps; the
integration tier runs the same against the real one as the chart's ServiceAccount (tests/integration/test_chart.py)."""

from __future__ import annotations

import datetime as dt
import json
import socket
import ssl
from http.server import BaseHTTPRequestHandler

import pytest

from vlm_operator.api.settings import Settings
from vlm_operator.cluster import certs
from vlm_operator.cluster.connection import ApiError
from vlm_operator.judge import server as judge_server

NOW = dt.datetime.now(dt.UTC)  # the handshake checks validity against the real clock
MADE = NOW - dt.timedelta(days=300)  # a serving certificate in its last third: due for renewal NOW
S = Settings(judge_port=8090, judge_tls="self-signed", judge_namespace="vlm-system")


class Store:
    """Our Connection's one method over an in-memory map of object paths (GET, POST, merge PATCH)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict] = {}
        self.calls: list[tuple[str, str]] = []

    def request(self, method: str, path: str, *, body: bytes | None = None, headers=None, query=None) -> bytes:
        self.calls.append((method, path))
        doc = json.loads(body) if body else None
        if method == "POST":
            path = f"{path}/{doc['metadata']['name']}"
            if path in self.objects:
                raise ApiError(409)
            self.objects[path] = {**doc, "metadata": {**doc["metadata"], "resourceVersion": "1"}}
        elif path not in self.objects:
            raise ApiError(404)
        elif method == "PATCH":
            obj = self.objects[path]
            data = {**obj.get("data", {}), **doc["data"]}
            obj["data"] = {k: v for k, v in data.items() if v is not None}
            obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        return json.dumps(self.objects[path]).encode()

    def get(self, kind: str, name: str) -> dict | None:
        return self.objects.get(f"/api/v1/namespaces/vlm-system/{kind}/{name}")


class Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args) -> None:
        pass


def _get(port: int, ca_pem: str) -> int:
    """GET over TLS to 127.0.0.1, verifying the Service's DNS name against `ca_pem` (as a caller that mounted the
    published ConfigMap does)."""
    ctx = ssl.create_default_context(cadata=ca_pem)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="vlm-operator-judge.vlm-system.svc") as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: judge\r\nConnection: close\r\n\r\n")
        return int(s.recv(64).split()[1])


def test_self_signed_makes_the_certificate_publishes_its_ca_and_serves_https_that_verifies():
    store = Store()
    keeper = judge_server.KeptCert(store, S, now=lambda: MADE)
    server = judge_server.KeptServer(Hello, 0, keeper, host="127.0.0.1")
    server.refresh()
    try:
        secret = store.get("secrets", "vlm-operator-judge-tls")
        cm = store.get("configmaps", "vlm-operator-judge-ca")
        assert secret is not None and secret["type"] == "kubernetes.io/tls"
        bundle = certs.Bundle.from_secret_data(secret["data"])
        assert bundle is not None and cm is not None and cm["data"]["ca.crt"] == bundle.ca_bundle.decode()
        port = server.server.server_address[1]
        assert _get(port, cm["data"]["ca.crt"]) == 200
        # A caller that trusts another CA is refused the handshake.
        other = certs.new_ca(NOW)[0].decode()
        with pytest.raises(ssl.SSLCertVerificationError):
            _get(port, other)
        # Nothing due: the next check reads and writes nothing.
        store.calls.clear()
        server.refresh()
        assert [m for m, _ in store.calls] == ["GET", "GET"]
        # Renewal (the serving certificate's last third): the new pair serves the next connection, same port,
        # and callers that mounted the CA keep connecting.
        keeper.secret.now = lambda: NOW
        server.refresh()
        renewed = certs.Bundle.from_secret_data(store.get("secrets", "vlm-operator-judge-tls")["data"])
        assert renewed is not None and renewed.tls_crt != bundle.tls_crt and renewed.ca_crt == bundle.ca_crt
        assert server.server.server_address[1] == port
        assert _get(port, store.get("configmaps", "vlm-operator-judge-ca")["data"]["ca.crt"]) == 200
    finally:
        server.shutdown()


def test_cert_manager_mode_only_reads_and_waits_for_its_secret():
    store = Store()
    s = S.model_copy(update={"judge_tls": "cert-manager"})
    keeper = judge_server.KeptCert(store, s, now=lambda: NOW)
    server = judge_server.KeptServer(Hello, 0, keeper, host="127.0.0.1")
    server.refresh()  # no Secret yet: nothing served, nothing written
    assert server.server is None and {m for m, _ in store.calls} == {"GET"}
    ca_crt, ca_key = certs.new_ca(NOW)
    tls_crt, tls_key = certs.new_serving(ca_crt, ca_key, certs.service_hosts("vlm-operator-judge", "vlm-system"), NOW)
    issued = certs.Bundle(ca_crt, b"", tls_crt, tls_key)  # cert-manager keeps the CA's key to itself
    store.objects["/api/v1/namespaces/vlm-system/secrets/vlm-operator-judge-tls"] = {
        "metadata": {"name": "vlm-operator-judge-tls", "resourceVersion": "1"},
        "data": {k: v for k, v in issued.secret_data().items() if k != "ca.key"}}
    server.refresh()
    try:
        assert server.server is not None
        assert store.get("configmaps", "vlm-operator-judge-ca")["data"]["ca.crt"] == ca_crt.decode()
        assert _get(server.server.server_address[1], ca_crt.decode()) == 200
        assert not [m for m, p in store.calls if m != "GET" and "secrets" in p]  # the Secret is cert-manager's
    finally:
        server.shutdown()


@pytest.mark.parametrize(("env", "message"), [
    ({"VLM_JUDGE_TLS": "self-signed"}, "needed with VLM_JUDGE_TLS"),
    ({"VLM_JUDGE_TLS": "self-signed", "VLM_JUDGE_NAMESPACE": "x", "VLM_JUDGE_TLS_CERT_FILE": "/c",
      "VLM_JUDGE_TLS_KEY_FILE": "/k"}, "not with VLM_JUDGE_TLS_CERT_FILE"),
    ({"VLM_JUDGE_TLS": "vault"}, "self-signed"),
])
def test_bad_judge_tls_settings_are_refused_naming_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        Settings.from_env(env)
