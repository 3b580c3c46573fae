"""The injection webhook's effects (vlm_operator.admission.webhook): the HTTPS server on loopback (answers, refusals, the
one-write response, a renewed certificate), and the certificate keeper against a fake of our own Connection."""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import ssl
import statistics
import threading
import time
from collections.abc import Iterator

import pytest

from vlm_operator.admission import webhook
from vlm_operator.api.settings import Settings
from vlm_operator.cluster import certs
from vlm_operator.cluster.connection import ApiError

SETTINGS = Settings(webhook_namespace="vlm-system", webhook_cert_hosts=("127.0.0.1",), sidecar_image="img:1")
POD = {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "s", "image": "x"}]}}


def _review(obj: object = POD) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE",
                                   "namespace": "team", "object": obj}}).encode()


def _bundle() -> certs.Bundle:
    bundle, _ = certs.plan(None, ("127.0.0.1",), dt.datetime.now(dt.UTC))
    assert bundle is not None
    return bundle


@pytest.fixture
def server() -> Iterator[tuple[webhook.Server, certs.Bundle, list]]:
    bundle = _bundle()
    seen: list = []
    srv = webhook.Server(("127.0.0.1", 0), webhook.injection_config(SETTINGS), webhook.server_context(bundle),
                         lambda elapsed, decision: seen.append((elapsed, decision.outcome)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, bundle, seen
    srv.shutdown()
    srv.server_close()


def _seen(seen: list, n: int) -> list:
    """The first n observations (the server records one after its response is sent: wait for it)."""
    deadline = time.monotonic() + 5
    while len(seen) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return seen[:n]


def _conn(srv: webhook.Server, ca: bytes) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection("127.0.0.1", srv.server_address[1],
                                       context=ssl.create_default_context(cadata=ca.decode()), timeout=10)


def _post(c: http.client.HTTPSConnection, body: bytes, path: str = "/mutate") -> tuple[int, bytes]:
    c.request("POST", path, body, {"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, r.read()


def test_answers_reviews_over_one_kept_alive_connection_without_delay(server):
    srv, bundle, seen = server
    c = _conn(srv, bundle.ca_crt)
    times = []
    for _ in range(25):
        start = time.perf_counter()
        status, body = _post(c, _review())
        times.append(time.perf_counter() - start)
        assert status == 200
    resp = json.loads(body)["response"]
    assert resp["allowed"] is True and resp["patchType"] == "JSONPatch" and resp["uid"] == "u"
    assert [o for _, o in _seen(seen, 25)] == ["injected"] * 25
    # Headers and body in one write: written apart they waited for a delayed ACK (about 40 ms each on Linux).
    assert statistics.median(times[5:]) < 0.015, times


def test_refuses_nothing_it_can_read_and_bounds_what_it_reads(server):
    srv, bundle, seen = server
    c = _conn(srv, bundle.ca_crt)
    status, body = _post(c, b"{not json")
    resp = json.loads(body)["response"]
    assert status == 200 and resp["allowed"] is True and resp["warnings"]
    assert _seen(seen, 1)[0][1] == "error"
    assert _post(c, _review(), path="/other")[0] == 404
    c = _conn(srv, bundle.ca_crt)
    c.putrequest("POST", "/mutate")
    c.putheader("Content-Length", str(webhook.MAX_BODY + 1))
    c.endheaders()
    assert c.getresponse().status == 413


def test_a_renewed_certificate_serves_the_next_connection(server):
    srv, bundle, _ = server
    renewed = _bundle()
    srv.context = webhook.server_context(renewed)
    assert _post(_conn(srv, renewed.ca_crt), _review())[0] == 200
    with pytest.raises(ssl.SSLCertVerificationError):
        _post(_conn(srv, bundle.ca_crt), _review())


class FakeConn:
    """Our own Connection's one method, over an in-memory Secret and MutatingWebhookConfiguration."""

    def __init__(self, secret: dict | None = None, hooks: int = 2, conflicts: int = 0):
        self.secret = secret
        self.mwc = {"webhooks": [{"name": f"h{i}", "clientConfig": {}} for i in range(hooks)]} if hooks else None
        self.conflicts = conflicts
        self.calls: list[tuple[str, str]] = []

    def request(self, method: str, path: str, *, body: bytes | None = None, headers=None, query=None) -> bytes:
        self.calls.append((method, path.rsplit("/", 2)[-2] if "secrets" in path else path.rsplit("/", 1)[-1]))
        doc = json.loads(body) if body else None
        if "mutatingwebhookconfigurations" in path:
            if self.mwc is None:
                raise ApiError(404)
            if method == "PATCH":
                for op in doc:
                    if op["op"] == "add":
                        i = int(op["path"].split("/")[2])
                        self.mwc["webhooks"][i]["clientConfig"]["caBundle"] = op["value"]
            return json.dumps(self.mwc).encode()
        if method == "GET":
            if self.secret is None:
                raise ApiError(404)
            return json.dumps(self.secret).encode()
        if self.conflicts:
            self.conflicts -= 1
            raise ApiError(409)
        if method == "POST":
            self.secret = {**doc, "metadata": {**doc["metadata"], "resourceVersion": "1"}}
        else:  # merge patch
            assert doc["metadata"]["resourceVersion"] == self.secret["metadata"]["resourceVersion"]
            data = {**self.secret["data"], **doc["data"]}
            self.secret["data"] = {k: v for k, v in data.items() if v is not None}
        return json.dumps(self.secret).encode()


def test_keeper_creates_the_secret_and_writes_the_ca_bundle_once():
    conn = FakeConn()
    keeper = webhook.CertKeeper(conn, SETTINGS)
    bundle = keeper.ensure()
    assert bundle is not None and conn.secret["type"] == "kubernetes.io/tls"
    assert certs.Bundle.from_secret_data(conn.secret["data"]) == bundle
    want = base64.b64encode(bundle.ca_bundle).decode()
    assert [h["clientConfig"]["caBundle"] for h in conn.mwc["webhooks"]] == [want, want]
    conn.calls.clear()
    assert keeper.ensure() == bundle  # nothing due: reads only
    assert [m for m, _ in conn.calls] == ["GET", "GET"]
    conn.mwc["webhooks"][1]["clientConfig"].pop("caBundle")  # a helm upgrade rendered it empty
    keeper.ensure()
    assert conn.mwc["webhooks"][1]["clientConfig"]["caBundle"] == want


def test_keeper_renews_with_a_conflict_retried_and_drops_stale_keys():
    now = dt.datetime.now(dt.UTC)
    conn = FakeConn()
    webhook.CertKeeper(conn, SETTINGS, now=lambda: now).ensure()
    old = certs.Bundle.from_secret_data(conn.secret["data"])
    conn.secret["data"]["ca-previous.crt"] = base64.b64encode(b"junk").decode()
    conn.conflicts = 1
    later = now + dt.timedelta(days=300)
    renewed = webhook.CertKeeper(conn, SETTINGS, now=lambda: later).ensure()
    assert renewed.ca_crt == old.ca_crt and renewed.tls_crt != old.tls_crt
    assert "ca-previous.crt" not in conn.secret["data"]
    assert [m for m, _ in conn.calls].count("PATCH") >= 2  # the conflicted try, then the write (+ caBundle none)


def test_keeper_in_cert_manager_mode_only_reads():
    bundle = _bundle()
    data = {k: v for k, v in bundle.secret_data().items() if k != "ca.key"}
    conn = FakeConn(secret={"metadata": {"resourceVersion": "9"}, "data": data})
    s = Settings(webhook_namespace="vlm-system", webhook_tls="cert-manager")
    got = webhook.CertKeeper(conn, s).ensure()
    assert got is not None and got.tls_crt == bundle.tls_crt
    assert {m for m, _ in conn.calls} == {"GET"}
    # No Secret yet (cert-manager has not issued): nothing to serve, nothing written.
    empty = FakeConn(hooks=0)
    assert webhook.CertKeeper(empty, s).ensure() is None and {m for m, _ in empty.calls} == {"GET"}
