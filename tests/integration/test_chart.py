"""The Helm chart installed into the testbed with the real helm: the CRD rendered from the template and
upgraded by `helm upgrade`, the operator's ServiceAccount checked with a `kubectl auth can-i --as` matrix,
the real operator run with that ServiceAccount's token (so "everything it needs" is what it actually
calls, not a list), the aggregated ClusterRoles seen by a namespace admin, the `helm test` hook, and what
`helm uninstall` leaves behind (the CRDs, kept by crds.keep, and the VLMServices).

Each test installs its own release (unique name, own namespaces); nothing cluster-wide is deleted, so
other tests sharing the testbed keep their CRD. The VLMService CRD is one per cluster and other tests
apply it with kubectl, so every install adopts it (`--take-ownership`, as an upgrade from chart 0.1.0
would) and the `vlm_crd` fixture puts it back as it was afterwards (spec, labels, annotations).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from vlm_operator.api import crdgen
from vlm_testing.cluster import _namespace_prefix, wait_for
from vlm_testing.helm import CHART, CRD_NAME, Release, can_i, helm, read_crd
from vlm_testing.judge import configmap
from vlm_testing.operator_proc import (
    GROUP,
    PLURAL,
    VERSION,
    condition,
    free_port,
    get_vlms,
    run_operator,
    vlms,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((REPO / "examples" / "qwen2.5-vl-3b.yaml").read_text())


def sar(kube, user: str, verb: str, group: str, resource: str, namespace: str) -> bool:
    review = client.AuthorizationV1Api(kube).create_subject_access_review({
        "spec": {"user": user, "groups": ["system:serviceaccounts", "system:authenticated"],
                 "resourceAttributes": {"verb": verb, "group": group, "resource": resource, "namespace": namespace}}})
    return bool(review.status.allowed)


def spec_properties(crd: dict) -> dict:
    # to_dict() of the kubernetes client names the schema field open_apiv3_schema.
    schema = crd["spec"]["versions"][0]["schema"]
    root = schema.get("open_apiv3_schema") or schema.get("openAPIV3Schema")
    return root["properties"]["spec"]["properties"]


def crd_rv(kube) -> str | None:
    try:
        return client.ApiextensionsV1Api(kube).read_custom_resource_definition(CRD_NAME).metadata.resource_version
    except ApiException as e:
        if e.status == 404:
            return None
        raise


@pytest.fixture
def other_namespace(kube, request) -> Iterator[str]:
    core = client.CoreV1Api(kube)
    ns = core.create_namespace({"metadata": {"generateName": _namespace_prefix(request.node.name) + "b-",
                                             "labels": {"vlm-testbed/test": "true"}}}).metadata.name
    yield ns
    core.delete_namespace(ns, propagation_policy="Background")


def test_helm_lint_and_dry_run_against_the_api_server(cluster, namespace):
    out = helm(cluster, "lint", str(CHART), "--strict", "--kube-version", "1.34.4").stdout
    assert "0 chart(s) failed" in out
    # Server-side dry run: the API server validates every object the chart renders.
    helm(cluster, "install", "dry", str(CHART), "-n", namespace, "--dry-run=server", "--take-ownership",
         "--set", "peering.enabled=true,replicaCount=2")
    # The operator's Prometheus credentials, CA and headers (Secret and ConfigMap volumes), the sidecar's pull
    # secrets and extra scrapers: the API server takes the Deployment the chart renders for them.
    helm(cluster, "install", "dry-auth", str(CHART), "-n", namespace, "--dry-run=server", "--take-ownership",
         "-f", str(REPO / "tests" / "golden" / "chart" / "prometheus-auth.values.yaml"),
         "--set", "operator.prometheusAuth.ca.configMapName=,operator.prometheusAuth.ca.secretName=mimir-tls")


def test_cluster_wide_install_crd_and_permission_matrix(cluster, kube, namespace, other_namespace, release):
    release.install()
    crd = client.ApiextensionsV1Api(kube).read_custom_resource_definition(CRD_NAME)
    assert crd.metadata.annotations["meta.helm.sh/release-name"] == release.name, "the release does not own the CRD"
    assert crd.metadata.annotations["helm.sh/resource-policy"] == "keep"
    assert crd.metadata.labels["app.kubernetes.io/component"] == "crds"
    assert set(spec_properties(crd.to_dict())) == set(crdgen.build_crd()["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"]["properties"]["spec"]["properties"])
    # helm install returns once the CRD is created; the API server marks it Established a moment later.
    wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in client.ApiextensionsV1Api(kube)
                         .read_custom_resource_definition(CRD_NAME).status.conditions or []), 30, "CRD Established")

    sa, ns, other = release.sa, namespace, other_namespace
    allowed = [
        ("get", "vlmservices.serving.vlmops.dev", other), ("list", "vlmservices.serving.vlmops.dev", None),
        ("watch", "vlmservices.serving.vlmops.dev", None), ("patch", "vlmservices.serving.vlmops.dev", other),
        ("patch", "vlmservices.serving.vlmops.dev/status", other),
        ("create", "deployments.apps", other), ("patch", "deployments.apps", other),
        ("delete", "deployments.apps", other), ("watch", "deployments.apps", None),
        ("create", "services", other), ("patch", "services", other), ("list", "services", None),
        ("list", "pods", None), ("watch", "pods", None), ("list", "nodes", None),
        ("create", "events", other), ("get", "customresourcedefinitions.apiextensions.k8s.io", None),
    ]
    denied = [
        ("get", "secrets", ns), ("list", "secrets", None), ("get", "secrets", other),
        ("create", "pods/exec", other), ("create", "pods/exec", ns), ("create", "pods/portforward", other),
        ("create", "pods", other), ("delete", "pods", other), ("delete", "services", other),
        ("create", "vlmservices.serving.vlmops.dev", other), ("delete", "vlmservices.serving.vlmops.dev", other),
        ("update", "deployments.apps", other), ("get", "configmaps", other),
        ("create", "customresourcedefinitions.apiextensions.k8s.io", None),
        ("delete", "customresourcedefinitions.apiextensions.k8s.io", None),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", None), ("escalate", "clusterroles", None),
        ("impersonate", "serviceaccounts", None), ("delete", "namespaces", None), ("patch", "nodes", None),
        ("*", "*", None), ("create", "serviceaccounts/token", ns),
    ]
    got_allowed = {case: can_i(cluster, sa, *case) for case in allowed}
    got_denied = {case: can_i(cluster, sa, *case) for case in denied}
    # The Prometheus Operator CRDs are not installed here, so kubectl cannot resolve their group for can-i;
    # ask the same authorizer with a SubjectAccessReview, which needs no discovery.
    for verb, resource in ((v, r) for r in ("podmonitors", "prometheusrules")
                           for v in ("create", "patch", "list", "watch")):
        got_allowed[(verb, f"{resource}.monitoring.coreos.com", other)] = sar(kube, sa, verb, "monitoring.coreos.com",
                                                                              resource, other)
    got_denied[("delete", "podmonitors.monitoring.coreos.com", other)] = sar(
        kube, sa, "delete", "monitoring.coreos.com", "podmonitors", other)
    assert all(got_allowed.values()), [c for c, ok in got_allowed.items() if not ok]
    assert not any(got_denied.values()), [c for c, ok in got_denied.items() if ok]

    dep = client.AppsV1Api(kube).read_namespaced_deployment(f"{release.name}-vlm-operator", namespace)
    c = dep.spec.template.spec.containers[0]
    assert c.security_context.read_only_root_filesystem and dep.spec.template.spec.security_context.run_as_non_root


def _sa_kubeconfig(cluster, release: Release, path: Path) -> Path:
    """A kubeconfig that authenticates as the chart's ServiceAccount (a TokenRequest token)."""
    sa_name = release.sa.rsplit(":", 1)[1]
    token = cluster.kubectl("create", "token", sa_name, "-n", release.namespace, "--duration", "1h").strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    cfg = {"apiVersion": "v1", "kind": "Config", "clusters": admin["clusters"],
           "users": [{"name": "operator", "user": {"token": token}}],
           "contexts": [{"name": "operator", "context": {"cluster": admin["clusters"][0]["name"], "user": "operator"}}],
           "current-context": "operator"}
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_namespaced_install_runs_the_real_operator_with_its_service_account(
        cluster, kube, namespace, other_namespace, release, tmp_path):
    """watchNamespaces=[other]: the operator, authenticated as the chart's ServiceAccount, reconciles a
    VLMService there to Ready without a single 403; it can do nothing in namespaces it does not watch."""
    watched = other_namespace
    release.install("--set", f"watchNamespaces[0]={watched}", "--set", "peering.enabled=true")
    sa = release.sa
    assert can_i(cluster, sa, "patch", "deployments.apps", watched)
    assert not can_i(cluster, sa, "patch", "deployments.apps", namespace)
    assert not can_i(cluster, sa, "list", "vlmservices.serving.vlmops.dev", None)
    assert can_i(cluster, sa, "patch", "kopfpeerings.kopf.dev", watched)
    assert not can_i(cluster, sa, "get", "secrets", watched)
    assert can_i(cluster, sa, "list", "pods", None)  # counting free GPUs needs pods on every GPU node
    # The post-install hook made the peering object kopf needs before a second replica may start.
    peering = client.CustomObjectsApi(kube).get_namespaced_custom_object("kopf.dev", "v1", watched, "kopfpeerings",
                                                                          "vlm-operator")
    assert peering["metadata"]["name"] == "vlm-operator"

    kubeconfig = _sa_kubeconfig(cluster, release, tmp_path / "sa.kubeconfig")
    for op in run_operator(kubeconfig, watched, tmp_path):
        body = {**EXAMPLE, "metadata": {"name": "rbac-check"}}
        vlms(kube).create_namespaced_custom_object(GROUP, VERSION, watched, PLURAL, body)
        wait_for(lambda: (condition(get_vlms(kube, watched, "rbac-check"), "Ready") or {}).get("status") == "True",
                 120, f"Ready=True as the ServiceAccount; operator log:\n{op.log_tail()}")
        log = op.log_path.read_text()
        # A refusal reads "(403)" / "Reason: Forbidden" (the kubernetes client) or "... is forbidden: User ..."
        # (the API server's message); a bare "403" also matches a log line's milliseconds (",403]").
        denied = re.findall(r"\(403\)|\b403 Forbidden|[Ff]orbidden", log)
        assert not denied, op.log_tail(80)
        deps = client.AppsV1Api(kube).list_namespaced_deployment(watched, label_selector=f"{GROUP}/vlmservice=rbac-check")
        rev = get_vlms(kube, watched, "rbac-check")["status"]["stableRevision"]
        assert [d.metadata.name for d in deps.items] == [f"rbac-check-{rev}"]


def test_uninstall_keeps_crds_and_vlmservices(cluster, kube, namespace, release):
    """crds.keep (the default): the CRD the release owns survives `helm uninstall`, and so do the VLMServices.
    crds.keep=false is checked by rendering only (tests/unit/packaging): deleting the shared CRD here would
    delete every other test's VLMServices."""
    release.install("--set", "peering.enabled=true")
    assert read_crd(kube)["metadata"]["annotations"]["meta.helm.sh/release-name"] == release.name
    body = {**EXAMPLE, "metadata": {"name": "survivor"}}
    vlms(kube).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    release.uninstall()

    status = helm(cluster, "status", release.name, "-n", namespace, check=False)
    assert status.returncode != 0 and "not found" in status.stderr
    assert crd_rv(kube) is not None, "helm uninstall deleted the VLMService CRD"
    assert get_vlms(kube, namespace, "survivor")["spec"]["model"]["path"] == EXAMPLE["spec"]["model"]["path"]
    ext = client.ApiextensionsV1Api(kube)
    for name in ("kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"):  # helm.sh/resource-policy: keep
        assert ext.read_custom_resource_definition(name).metadata.name == name
    rbac = client.RbacAuthorizationV1Api(kube)
    with pytest.raises(ApiException) as e:
        rbac.read_cluster_role(f"{release.name}-vlm-operator")
    assert e.value.status == 404
    with pytest.raises(ApiException) as e:
        client.CoreV1Api(kube).read_namespaced_service_account(f"{release.name}-vlm-operator", namespace)
    assert e.value.status == 404
    assert not can_i(cluster, release.sa, "list", "vlmservices.serving.vlmops.dev", None)


PROBE = "upgradeProbe"  # a spec field only the second chart version's CRD has


def _chart_with_a_new_crd_field(tmp_path: Path) -> Path:
    """Chart 0.2.0 as a later release would ship it: the generated CRD file with one more spec field."""
    chart = tmp_path / "vlm-operator"
    shutil.copytree(CHART, chart)
    crd_file = chart / "files" / "crds" / crdgen.CRD_FILE
    crd = yaml.safe_load(crd_file.read_text())
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][PROBE] = {
        "type": "string", "description": "Added by the next chart version (test only)."}
    crd_file.write_text(yaml.safe_dump(crd, sort_keys=False))
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["version"] = meta["version"] + "-next"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return chart


def test_helm_upgrade_applies_a_crd_change(cluster, kube, namespace, release, tmp_path):
    """The failure crds/ had: a field the cluster's CRD lacks is pruned. After `helm upgrade` to a chart whose
    CRD has the field, the served schema has it and a VLMService keeps it."""
    release.install()
    api = vlms(kube)
    body = copy.deepcopy(EXAMPLE)
    body["metadata"] = {"name": "probe"}
    body["spec"][PROBE] = "kept"
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    assert PROBE not in get_vlms(kube, namespace, "probe")["spec"], "the installed CRD should prune the unknown field"

    release.upgrade(chart=_chart_with_a_new_crd_field(tmp_path))
    crd = read_crd(kube)
    assert PROBE in spec_properties(crd), "helm upgrade did not apply the CRD change"
    assert crd["metadata"]["labels"]["helm.sh/chart"].endswith("-next")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    history = yaml.safe_load(helm(release.cluster, "history", release.name, "-n", namespace, "-o", "yaml").stdout)
    assert [h["status"] for h in history] == ["superseded", "deployed"], history

    def kept() -> bool:  # the API server swaps in the new schema asynchronously after the CRD update
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "probe", {"spec": {PROBE: "kept"}})
        return get_vlms(kube, namespace, "probe")["spec"].get(PROBE) == "kept"

    wait_for(kept, 30, f"spec.{PROBE} kept after the upgrade")
    body["metadata"] = {"name": "probe-new"}
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    assert get_vlms(kube, namespace, "probe-new")["spec"][PROBE] == "kept"


def test_aggregated_cluster_roles_give_namespace_users_vlmservices(cluster, kube, namespace, other_namespace, release):
    """A RoleBinding of the built-in admin/edit/view ClusterRole in one namespace covers VLMServices there,
    through the chart's aggregated ClusterRoles (the controller-manager's aggregation controller folds them in)."""
    release.install()
    rbac = client.RbacAuthorizationV1Api(kube)
    users = {role: f"{role}-user@{namespace}" for role in ("admin", "edit", "view")}
    for role, user in users.items():
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": f"test-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    vlm = "vlmservices.serving.vlmops.dev"
    wait_for(lambda: all(can_i(cluster, u, "get", vlm, namespace) for u in users.values()), 30,
             "the aggregated rules in admin, edit and view")

    write = ["create", "update", "patch", "delete"]
    expected: dict[tuple[str, str, str, str | None], bool] = {}
    for role, user in users.items():
        writer = role != "view"
        for verb in ["get", "list", "watch"]:
            expected[(user, verb, vlm, namespace)] = True
            expected[(user, verb, f"{vlm}/status", namespace)] = True
        for verb in write:
            expected[(user, verb, vlm, namespace)] = writer
        expected[(user, "patch", f"{vlm}/scale", namespace)] = writer
        # Status is the operator's: edit/admin may patch it (`kubectl vlm retry`), nobody may replace it whole.
        expected[(user, "patch", f"{vlm}/status", namespace)] = writer
        expected[(user, "update", f"{vlm}/status", namespace)] = False
        expected[(user, "get", vlm, other_namespace)] = False  # the RoleBinding is namespaced
        expected[(user, "list", vlm, None)] = False
    got = {case: can_i(cluster, case[0], *case[1:]) for case in expected}
    assert got == expected, {c: v for c, v in got.items() if v != expected[c]}


def _hook_script(cluster, release: Release) -> tuple[dict, str]:
    hooks = [d for d in yaml.safe_load_all(helm(cluster, "get", "hooks", release.name, "-n", release.namespace).stdout) if d]
    (pod,) = [h for h in hooks if h["kind"] == "Pod" and h["metadata"]["annotations"]["helm.sh/hook"] == "test"]
    return pod, pod["spec"]["containers"][0]["command"][2]


def test_helm_test_hook(cluster, kube, namespace, release, tmp_path):
    """kwok runs no containers: it marks the test pod Running and, since no Job owns it, never completes it.
    So: `helm test` creates the hook's pod (checked as created); playing the kubelet, the pod's status is set
    to Succeeded and `helm test` reports it; the pod's own script is run here against the real operator's
    /metrics (it passes) and against a port where nothing answers (it fails)."""
    release.install()
    pod_manifest, script = _hook_script(cluster, release)
    name = pod_manifest["metadata"]["name"]
    result: dict[str, subprocess.CompletedProcess[str]] = {}
    runner = threading.Thread(target=lambda: result.update(
        proc=helm(cluster, "test", release.name, "-n", namespace, "--timeout", "90s", check=False)))
    runner.start()
    core = client.CoreV1Api(kube)
    pod = wait_for(lambda: core.read_namespaced_pod(name, namespace), 60, f"pod {name}", ignore=(ApiException,))
    assert pod.metadata.annotations["helm.sh/hook"] == "test"
    assert pod.metadata.labels["app.kubernetes.io/component"] == "test"
    assert pod.spec.containers[0].command[2] == script
    wait_for(lambda: core.read_namespaced_pod(name, namespace).status.phase == "Running", 60, f"kwok runs {name}")
    core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Succeeded"}})
    runner.join(120)
    proc = result["proc"]
    assert proc.returncode == 0 and "Succeeded" in proc.stdout, f"{proc.stdout}\n{proc.stderr}"

    with_port = {**os.environ}
    for op in run_operator(cluster.kubeconfig, namespace, tmp_path):
        with_port["METRICS_URL"] = f"http://127.0.0.1:{op.metrics_port}/metrics"
        ok = subprocess.run([sys.executable, "-c", script], env=with_port, capture_output=True, text=True, timeout=90)
        assert ok.returncode == 0 and "the operator answers" in ok.stdout, ok.stderr
    # The operator stopped: nothing answers on that port any more; the script gives up after its 60 s.
    down = subprocess.run([sys.executable, "-c", script.replace("+ 60", "+ 3")], env=with_port,
                          capture_output=True, text=True, timeout=60)
    assert down.returncode != 0 and "refused" in down.stderr.lower(), down.stderr


def _judge_call(port: int, host: str, ca_pem: str, token: str, namespace: str) -> tuple[int, dict]:
    """POST /v1/judge over TLS to 127.0.0.1:`port`, verifying the certificate for `host` against `ca_pem` alone."""
    body = json.dumps({"namespace": namespace, "baseline": "app=qwen,track=stable",
                       "canary": "app=qwen,track=canary"}).encode()
    ctx = ssl.create_default_context(cadata=ca_pem)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw, \
            ctx.wrap_socket(raw, server_hostname=host) as s:
        s.sendall(b"POST /v1/judge HTTP/1.1\r\nHost: " + host.encode() + b"\r\nAuthorization: Bearer "
                  + token.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        raw_answer = b""
        while chunk := s.recv(65536):
            raw_answer += chunk
    head, _, payload = raw_answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload or b"{}")


def test_judge_install_serves_https_its_callers_can_verify_and_only_bound_callers_may_ask(
        cluster, kube, namespace, other_namespace, release, tmp_path):
    """judge.enabled: the real operator, authenticated as the chart's ServiceAccount, makes the judge's CA and serving
    certificate in its Secret, publishes the CA in the ConfigMap callers mount, and serves HTTPS that verifies for
    the judge Service's DNS name against that CA alone; a caller bound by judge.callers gets an answer, an unbound
    one 403. Every API call the judge makes is the chart's RBAC at work (no 403 in the operator's log)."""
    serving = other_namespace
    core = client.CoreV1Api(kube)
    for sa in ("rollouts", "stranger"):
        core.create_namespaced_service_account(serving, {"metadata": {"name": sa}})
    release.install("--set", f"watchNamespaces[0]={serving}",  # run_operator watches one namespace
                    "--set", "judge.enabled=true", "--set", f"judge.callers[0].namespace={serving}",
                    "--set", "judge.callers[0].serviceAccount=rollouts")
    rendered = yaml.safe_load_all(helm(cluster, "get", "manifest", release.name, "-n", release.namespace).stdout)
    (dep,) = [o for o in rendered if o and o["kind"] == "Deployment"]
    env = {e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]
           if e["name"].startswith("VLM_JUDGE_")}
    port = free_port()
    env["VLM_JUDGE_PORT"] = str(port)  # the chart's 8090, on this host: a free port
    host = f"{env['VLM_JUDGE_SERVICE']}.{release.namespace}.svc"
    kubeconfig = _sa_kubeconfig(cluster, release, tmp_path / "sa.kubeconfig")
    for op in run_operator(kubeconfig, serving, tmp_path, **env):
        cm = wait_for(lambda: configmap(core, release.namespace, env["VLM_JUDGE_CA_CONFIGMAP"]), 60,
                      f"the judge's CA ConfigMap; operator log:\n{op.log_tail()}")
        secret = core.read_namespaced_secret(env["VLM_JUDGE_SECRET"], release.namespace)
        assert secret.type == "kubernetes.io/tls" and "ca.key" in secret.data
        ca = cm.data["ca.crt"]
        token = cluster.kubectl("create", "token", "rollouts", "-n", serving, "--duration", "1h").strip()
        status, answer = wait_for(lambda ca=ca, token=token: _judge_call_or_none(port, host, ca, token, serving), 60,
                                  f"the judge's HTTPS answer; operator log:\n{op.log_tail()}")
        assert status == 200 and answer["verdict"] in ("Continue", "Inconclusive", "Rollback", "Promote"), answer
        stranger = cluster.kubectl("create", "token", "stranger", "-n", serving, "--duration", "1h").strip()
        assert _judge_call(port, host, ca, stranger, serving)[0] == 403
        with pytest.raises(ssl.SSLCertVerificationError):  # the same server, by a name not in its certificate
            _judge_call(port, "judge.example.com", ca, token, serving)
        log = op.log_path.read_text()
        assert not re.findall(r"\(403\)|\b403 Forbidden|[Ff]orbidden", log), op.log_tail(80)


def _judge_call_or_none(port: int, host: str, ca: str, token: str, namespace: str) -> tuple[int, dict] | None:
    try:
        return _judge_call(port, host, ca, token, namespace)
    except (ConnectionRefusedError, ConnectionResetError):
        return None
