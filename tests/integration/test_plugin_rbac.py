"""Every `kubectl vlm` subcommand works for a user bound only to the built-in `edit` ClusterRole, through the
chart's aggregated ClusterRoles, on the real API server; `view` stays read-only.

The user is a ServiceAccount with a RoleBinding of `edit` in the test namespace and nothing else; the plugin
runs as it (a kubeconfig with its token) through an ApiRecorder, so the test sees every request each
subcommand really makes and the API server's answer to it. The permissions each subcommand needs are derived
from those requests (verb, resource, subresource), checked against the table below (a new kind of request
fails here until the table, the chart and docs/packaging.md say who may make it), each asked of the API
server's authorizer with `kubectl auth can-i --as`, and none answered 403. With the operator running: status,
status --watch, pause/resume/abort/promote --wait on a real canary, retry --wait of the aborted revision (the
status patch edit and admin now grant), profile (its pod-proxy hop reaches the API server's proxy, which kwok
pods cannot answer: a 5xx, not a 403).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

import yaml
from kubernetes import client

from vlm_testing.api_recorder import ApiRecorder, Request
from vlm_testing.cluster import wait_for
from vlm_testing.helm import can_i
from vlm_testing.operator_proc import GROUP, PLURAL, VERSION, get_vlms, run_operator, vlms

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "kubectl-plugin"
EXAMPLE = yaml.safe_load((REPO / "examples" / "qwen2.5-vl-3b.yaml").read_text())
VLM = f"{PLURAL}.{GROUP}"


# What each subcommand may ask of the API server, from kubectl_vlm.py: (verb, resource, subresource).
NEEDS: dict[str, set[tuple[str, str, str]]] = {
    "status": {("list", VLM, ""), ("get", VLM, "")},
    "promote": {("get", VLM, ""), ("patch", VLM, "")},  # the rollout-action annotation
    "abort": {("get", VLM, ""), ("patch", VLM, "")},
    "pause": {("get", VLM, ""), ("patch", VLM, "")},
    "resume": {("get", VLM, ""), ("patch", VLM, "")},
    "retry": {("get", VLM, ""), ("patch", VLM, "status")},  # merge patch clearing status.rollout
    # GET through the pod proxy; --view diff also lists the service's pods and POSTs (create) the baseline's
    # stacks to the pod's /profile/diff.svg.
    "profile": {("get", "pods", ""), ("list", "pods", ""), ("get", "pods", "proxy"), ("create", "pods", "proxy")},
}
_VERBS = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def permission(req: Request) -> tuple[str, str, str]:
    """(verb, resource, subresource) of one recorded request, as the API server's authorizer sees it."""
    parts = req.path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if rest and rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource, name, sub = [*rest, "", "", ""][:3]
    verb = _VERBS[req.method]
    if verb == "get" and not name:
        verb = "watch" if "watch=true" in urllib.parse.unquote(req.query) else "list"
    return verb, f"{resource}.{group}" if group else resource, sub


def _user(cluster, kube, namespace: str, name: str, role: str, path: Path) -> tuple[str, Path]:
    """A ServiceAccount bound to the built-in ClusterRole `role` in `namespace` only, and a kubeconfig with its
    token."""
    client.CoreV1Api(kube).create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    client.RbacAuthorizationV1Api(kube).create_namespaced_role_binding(namespace, {
        "metadata": {"name": f"test-{name}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    token = cluster.kubectl("create", "token", name, "-n", namespace, "--duration", "1h").strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": admin["clusters"],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": admin["clusters"][0]["name"], "user": name,
                                                "namespace": namespace}}],
        "current-context": name}))
    return f"system:serviceaccount:{namespace}:{name}", path


def kubectl_vlm(cluster, kubeconfig: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig),
           "PATH": os.pathsep.join([str(PLUGIN_DIR), str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    return subprocess.run([str(cluster.bin_dir / "kubectl"), "vlm", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _rollout(kube, namespace: str, name: str) -> dict:
    return (get_vlms(kube, namespace, name).get("status") or {}).get("rollout") or {}


def test_every_subcommand_works_for_a_user_bound_to_edit(cluster, kube, namespace, release, tmp_path):
    release.install()
    editor, editor_cfg = _user(cluster, kube, namespace, "editor", "edit", tmp_path / "editor.kubeconfig")
    viewer, viewer_cfg = _user(cluster, kube, namespace, "viewer", "view", tmp_path / "viewer.kubeconfig")
    wait_for(lambda: can_i(cluster, editor, "patch", f"{VLM}/status", namespace)
             and can_i(cluster, viewer, "get", VLM, namespace), 30, "the aggregated rules in edit and view")

    # Every permission the plugin's code asks for, granted to edit; view may read but write nothing.
    for perms in NEEDS.values():
        for verb, resource, sub in perms:
            assert can_i(cluster, editor, verb, f"{resource}/{sub}" if sub else resource, namespace), (verb, resource, sub)
    assert not can_i(cluster, editor, "update", f"{VLM}/status", namespace)
    assert not can_i(cluster, viewer, "patch", f"{VLM}/status", namespace)
    assert not can_i(cluster, viewer, "patch", VLM, namespace)

    rec = ApiRecorder(editor_cfg).start()
    seen: dict[str, set[tuple[str, str, str]]] = {}
    answers: list[tuple[str, Request]] = []

    def run(*args: str, code: int = 0, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        before = len(rec.requests)
        proc = kubectl_vlm(cluster, rec.kubeconfig, *args, timeout=timeout)
        assert proc.returncode == code, f"kubectl vlm {' '.join(args)}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        for req in rec.requests[before:]:
            seen.setdefault(args[0], set()).add(permission(req))
            answers.append((args[0], req))
        return proc

    try:
        for op in run_operator(cluster.kubeconfig, namespace, tmp_path):
            body = copy.deepcopy(EXAMPLE)
            body["metadata"] = {"name": "live"}
            body["spec"].update(replicas=2, rollout={"capacity": "Surge", "steps": [{"replicas": 1, "analysis": "10m"}]})
            vlms(kube).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
            wait_for(lambda: (get_vlms(kube, namespace, "live").get("status") or {}).get("readyReplicas") == 2, 120,
                     f"live ready; operator log:\n{op.log_tail()}")
            vlms(kube).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "live",
                                                      {"spec": {"sglang": {"args": ["--chunked-prefill-size", "4096"]}}})
            wait_for(lambda: _rollout(kube, namespace, "live").get("phase") in ("Progressing", "Analysing"), 90,
                     f"a canary; operator log:\n{op.log_tail()}")

            assert "live" in run("status").stdout  # the kubeconfig's namespace
            run("status", "live", "-n", namespace, "--watch", "--timeout", "2", "--interval", "1", code=2)
            run("pause", "live", "-n", namespace, "--wait", "--wait-timeout", "60")
            wait_for(lambda: _rollout(kube, namespace, "live").get("phase") == "Paused", 30, "paused")
            run("resume", "live", "-n", namespace, "--wait", "--wait-timeout", "60")
            run("abort", "live", "-n", namespace, "--wait", "--wait-timeout", "60")
            held = wait_for(lambda: _rollout(kube, namespace, "live").get("phase") == "Aborted"
                            and _rollout(kube, namespace, "live"), 60, "aborted")
            # retry: the status patch, as the edit user; the operator analyses the same revision again.
            out = run("retry", "live", "-n", namespace, "--wait", "--wait-timeout", "60").stdout
            assert "operator restarted the canary" in out, out
            again = _rollout(kube, namespace, "live")
            assert again["revision"] == held["revision"] and again["phase"] in ("Progressing", "Analysing"), again
            run("promote", "live", "-n", namespace, "--wait", "--wait-timeout", "60")
            out = run("status", "live", "-n", namespace, "--watch", "--timeout", "90", timeout=150).stdout
            assert "promoted" in out, f"{out}\noperator log:\n{op.log_tail()}"

            # profile: the plugin finds a stable pod and asks its sidecar through the pod proxy; kwok pods do not
            # answer there, so the API server's proxy fails (5xx), after authorizing the edit user.
            def stable_pods() -> list[str]:
                pods = client.CoreV1Api(kube).list_namespaced_pod(
                    namespace, label_selector=f"{GROUP}/vlmservice=live,{GROUP}/role=stable").items
                return sorted(p.metadata.name for p in pods if p.status.phase == "Running"
                              and not p.metadata.deletion_timestamp)

            pod = wait_for(lambda: len(stable_pods()) >= 2 and stable_pods()[0], 90, "two running stable pods")
            failed = run("profile", pod, "-n", namespace, "--view", "diff", "--against", "stable",
                         "--request-timeout", "20", code=1)
            assert "from the API server's pod proxy" in failed.stderr or "no answer" in failed.stderr, failed.stderr
            run("profile", pod, "-n", namespace, "-o", str(tmp_path / "flame.svg"), "--request-timeout", "20", code=1)
    finally:
        rec.stop()

    # What the code asked for, as the API server saw it: within the table, every kind of request made, and
    # no refusal (pod-proxy answers come from the proxy hop, after authorization).
    extra = {cmd: perms - NEEDS[cmd] for cmd, perms in seen.items() if perms - NEEDS[cmd]}
    assert not extra, f"requests the table does not list (add them, to the chart and docs/packaging.md): {extra}"
    assert set(seen) == set(NEEDS) and all(seen[c] for c in NEEDS), seen
    assert seen["retry"] >= {("patch", VLM, "status")} and ("get", "pods", "proxy") in seen["profile"], seen
    refused = [(cmd, r.method, r.path, r.answer) for cmd, r in answers if 401 in r.answer or 403 in r.answer]
    assert not refused, refused
    assert all(r.answer for _, r in answers), [(c, r.method, r.path) for c, r in answers if not r.answer]

    # view: status works, retry is refused with the plugin's own explanation.
    assert kubectl_vlm(cluster, viewer_cfg, "status", "-n", namespace).returncode == 0
    write_status = {"rollout": {**_rollout(kube, namespace, "live"), "phase": "Aborted"}}
    vlms(kube).patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "live", {"status": write_status})
    denied = kubectl_vlm(cluster, viewer_cfg, "retry", "live", "-n", namespace)
    assert denied.returncode == 1 and "retry needs `patch` on vlmservices/status" in denied.stderr, denied
