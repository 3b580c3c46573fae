"""vlm_operator.cluster.connection: the operator's HTTP connection to the API server, on a real HTTP server on loopback,
and the kubeconfig check that decides whether the kubernetes library stays out of the operator's process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vlm_operator.api.errors import PermanentError
from vlm_operator.cluster import client as apply
from vlm_operator.cluster import connection as kubeconn


class Info:
    """The part of kopf's ConnectionInfo the connection reads."""

    def __init__(self, server: str, token: str):
        self.server, self.token, self.insecure = server, token, None

    def as_http_headers(self):
        return {"Authorization": f"Bearer {self.token}"}

    def as_ssl_context(self):
        raise AssertionError("plain HTTP here")


@pytest.fixture
def server():
    """An API-server-shaped HTTP server on loopback: it accepts token `good`, answers 401 to anything else,
    records every request, and answers a GET of /missing with 404."""
    seen: list[dict] = []

    class H(BaseHTTPRequestHandler):
        def _answer(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            seen.append({"method": self.command, "path": self.path, "auth": self.headers.get("Authorization"),
                         "type": self.headers.get("Content-Type"), "body": body})
            if self.headers.get("Authorization") != "Bearer good":
                code, out = 401, {"message": "Unauthorized"}
            elif self.path.startswith("/missing"):
                code, out = 404, {"message": "not found"}
            else:
                code, out = 200, {"metadata": {"resourceVersion": "9"}}
            data = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_DELETE = _answer

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()


def test_requests_carry_the_token_query_and_body_and_a_401_logs_in_again_once(server):
    url, seen = server
    tokens = iter(["rotated-away", "good"])  # the first login's token expired; the file now holds a new one
    logins = []

    def login():
        logins.append(1)
        return Info(url, next(tokens))

    kube = apply.Kube(kubeconn.Connection(login, pool_size=2), "vlm-operator")
    obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "ns"}, "spec": {}}
    assert kube.apply(obj, None) is True
    assert len(logins) == 2  # one 401, one new login, the request repeated
    first, again = seen
    assert first["auth"] == "Bearer rotated-away" and again["auth"] == "Bearer good"
    assert again["method"] == "PATCH"
    assert again["path"] == "/apis/apps/v1/namespaces/ns/deployments/d?fieldManager=vlm-operator&force=true"
    assert again["type"] == "application/apply-patch+yaml" and json.loads(again["body"]) == obj
    # A JSON body (merge patch) and the answer's resourceVersion.
    assert kube.patch_status("ns", "s", {"phase": "A"}, {"phase": "B"}) == "9"
    assert json.loads(seen[-1]["body"]) == {"status": {"phase": "B"}}
    assert seen[-1]["type"] == "application/merge-patch+json"
    assert len(logins) == 2


def test_an_error_answer_is_an_api_error_and_repeated_401_is_not_a_loop(server):
    url, seen = server
    conn = kubeconn.Connection(lambda: Info(url, "good"))
    with pytest.raises(kubeconn.ApiError) as e:
        conn.request("GET", "/missing/x")
    assert e.value.status == 404 and json.loads(e.value.body)["message"] == "not found"
    assert apply.Kube(conn, "m").get("v1", "Service", "ns", "s") is not None
    bad = kubeconn.Connection(lambda: Info(url, "revoked"))
    with pytest.raises(PermanentError, match="401 Unauthorized"):
        apply.Kube(bad, "m").apply({"apiVersion": "v1", "kind": "Service",
                                    "metadata": {"name": "s", "namespace": "ns"}}, None)
    assert [r["auth"] for r in seen[-2:]] == ["Bearer revoked", "Bearer revoked"]  # logged in again once


def _kubeconfig(tmp_path, user: dict) -> str:
    path = tmp_path / "config"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": user}],
    }))
    return str(path)


def test_only_an_exec_or_auth_provider_kubeconfig_needs_the_client_library(tmp_path):
    token = _kubeconfig(tmp_path, {"token": "t"})
    assert not kubeconn.needs_client_library({"KUBECONFIG": token})
    (tmp_path / "exec").mkdir()
    plugin = _kubeconfig(tmp_path / "exec", {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                                       "command": "aws"}})
    assert kubeconn.needs_client_library({"KUBECONFIG": plugin})
    # The first file naming the current context's user wins, as kubectl and kopf read a KUBECONFIG list.
    assert not kubeconn.needs_client_library({"KUBECONFIG": f"{token}:{plugin}"})
    assert not kubeconn.needs_client_library({"KUBECONFIG": str(tmp_path / "absent")})
    (tmp_path / "bad").write_text("{not: [yaml")
    assert not kubeconn.needs_client_library({"KUBECONFIG": str(tmp_path / "bad")})


def test_the_operator_process_imports_kopf_and_its_handlers_without_the_kubernetes_library(tmp_path):
    """What the entry point does before importing kopf: with a token kubeconfig, `import kubernetes` fails in
    the process, and kopf and every operator module load without it; with an exec plugin it stays importable."""
    code = textwrap.dedent("""
        import sys
        from vlm_operator.cluster.connection import keep_client_library_out
        kept_out = keep_client_library_out()
        import kopf
        from vlm_operator.analysis import handoff, sources  # noqa: F401
        from vlm_operator.controller import handlers, reconcile  # noqa: F401
        from vlm_operator.rollout import steps  # noqa: F401
        loaded = [m for m in sys.modules if m.split(".")[0] == "kubernetes" and sys.modules[m] is not None]
        print(kept_out, loaded)
    """)
    token = _kubeconfig(tmp_path, {"token": "t"})
    out = subprocess.run([sys.executable, "-c", code], env={"KUBECONFIG": token, "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == "True []", out
    (tmp_path / "exec").mkdir()
    plugin = _kubeconfig(tmp_path / "exec", {"exec": {"command": "aws"}})
    out = subprocess.run([sys.executable, "-c", code], env={"KUBECONFIG": plugin, "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.startswith("False ['kubernetes"), out  # kopf imported the library, as it does when installed
