"""The judge endpoint served by the real operator process (VLM_JUDGE_PORT) against the real API server: callers
authenticate with ServiceAccount tokens from the TokenRequest API, checked by TokenReview, and need `create
judgements.serving.vlmops.dev` in the namespace (SubjectAccessReview); pods are listed by label selector and their
sidecars (local stand-ins, VLM_SIDECAR_ENDPOINTS) read. The verdicts themselves are unit-tested
(tests/unit/operator/judge/test_judge.py); here: the wiring, the auth and the errors on the wire."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from vlm_testing.cluster import wait_for
from vlm_testing.integration import _token
from vlm_testing.jsonhttp import start_json
from vlm_testing.operator_proc import OperatorProcess, free_port
from vlm_testing.signals import sidecar_windows


def _sidecar(windows: list[dict]) -> ThreadingHTTPServer:
    return start_json(lambda path, _peer: (200, windows) if path == "/windows.json" else (404, {"error": "not found"}))


def _post(url: str, payload: Any, token: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def sidecars(namespace: str, kube: client.ApiClient, tmp_path: Path):
    """Two stable and two canary pods on the kwok nodes (Ready), each with a stand-in sidecar serving 10 minutes
    of windows (the canary's 10% slower), and the endpoints file that points the operator at them."""
    core = client.CoreV1Api(kube)
    now = time.time()
    servers, endpoints = [], {}
    for rev, effect in (("stable", 0.0), ("canary", 0.10)):
        for i in range(2):
            name = f"svc-{rev}-{i}"
            core.create_namespaced_pod(namespace, {
                "metadata": {"name": name, "labels": {"app": "svc", "rev": rev}},
                "spec": {"nodeName": f"gpu-node-{i}", "containers": [{"name": "sglang", "image": "sglang"}]}})
            s = _sidecar(sidecar_windows(0.02, effect, 40, seed=i, start=now - 40 * 15))
            servers.append(s)
            endpoints[name] = f"127.0.0.1:{s.server_address[1]}"

    def ready() -> bool:
        pods = core.list_namespaced_pod(namespace, label_selector="app=svc").items
        return len(pods) == 4 and all(any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
                                      for p in pods)

    wait_for(ready, 60, "the four pods Ready (kwok)")
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps(endpoints))
    yield path, now
    for s in servers:
        s.shutdown()


@pytest.fixture
def callers(namespace: str, kube: client.ApiClient) -> dict[str, str]:
    """`caller`: granted `create judgements.serving.vlmops.dev` in the namespace (a Role); `nobody`: no grant."""
    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    for sa in ("caller", "nobody"):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": sa}})
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": "judge-caller"},
        "rules": [{"apiGroups": ["serving.vlmops.dev"], "resources": ["judgements"], "verbs": ["create"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "judge-caller"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "judge-caller"},
        "subjects": [{"kind": "ServiceAccount", "name": "caller", "namespace": namespace}]})
    return {sa: _token(kube, namespace, sa) for sa in ("caller", "nobody")}


def test_the_operator_serves_the_judge_to_service_account_tokens(cluster, crd, namespace, kube, sidecars, callers,
                                                                 tmp_path):
    endpoints, now = sidecars
    port = free_port()
    op = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "operator.log",
                         {"VLM_JUDGE_PORT": str(port), "VLM_SIDECAR_ENDPOINTS": str(endpoints)}).start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: urllib.request.urlopen(f"{url}/healthz", timeout=2).status == 200, 60,
                 "the judge's /healthz", ignore=(OSError,))
        body = {"namespace": namespace, "baseline": "app=svc,rev=stable", "canary": "app=svc,rev=canary",
                "startedAt": now - 40 * 15, "analysis": {"maxDuration": "30m"}}

        assert _post(f"{url}/v1/judge", body, None)[0] == 401
        status, a = _post(f"{url}/v1/judge", body, "not-a-token")
        assert (status, a["field"]) == (401, "Authorization"), a
        status, a = _post(f"{url}/v1/judge", body, callers["nobody"])
        assert (status, a["field"]) == (403, "namespace"), a
        assert "judgements.serving.vlmops.dev" in a["error"]
        status, a = _post(f"{url}/v1/judge", {**body, "analysis": {"confidence": 3}}, callers["caller"])
        assert (status, a["field"]) == (400, "analysis.confidence"), a
        status, a = _post(f"{url}/v1/judge", {**body, "namespace": "kube-system"}, callers["caller"])
        assert status == 403, a

        status, a = _post(f"{url}/v1/judge", body, callers["caller"])
        assert status == 200, a
        assert a["verdict"] in ("Rollback", "Continue", "Inconclusive") and a["pass"] in (-1, 0), a
        assert a["analysis"]["baselinePods"] == ["svc-stable-0", "svc-stable-1"]
        assert a["analysis"]["canaryPods"] == ["svc-canary-0", "svc-canary-1"]
        # Every window since startedAt was read from the stand-ins; the canary pods just became Ready, so their
        # windows fall in the warm-up the gate leaves out (as it does for a VLMService's canary pods).
        assert a["analysis"]["windows"] == {"baseline": 80, "canary": 80}, a
        assert a["analysis"]["warmupShift"] is None or a["analysis"]["warmupShift"] > 0.05

        # Flagger's webhook with the same token: a non-2xx answer unless the verdict lets the canary go on.
        hook = {"name": "svc", "namespace": namespace, "phase": "Progressing", "checksum": "abc",
                "metadata": {"baseline": "app=svc,rev=stable", "canary": "app=svc,rev=canary",
                             "startedAt": str(now - 40 * 15)}}
        status, a = _post(f"{url}/v1/flagger", hook, callers["caller"])
        assert status == {"Rollback": 412, "Inconclusive": 425, "Continue": 200}[a["verdict"]], a
        assert "Traceback" not in op.log_tail()
    finally:
        op.stop()
