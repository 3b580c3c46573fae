"""The Helm chart installed into the testbed with the real helm: the CRD present, the operator's
ServiceAccount checked with a `kubectl auth can-i --as` matrix, the real operator run with that
ServiceAccount's token (so "everything it needs" is what it actually calls, not a list), and what
`helm uninstall` leaves behind (the CRDs and the VLMServices; Helm never deletes crds/).

Each test installs its own release (unique name, own namespaces); nothing cluster-wide is deleted,
so other tests sharing the testbed keep their CRD.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import _namespace_prefix, wait_for
from tests.operator_proc import GROUP, PLURAL, VERSION, condition, get_vlms, run_operator, vlms

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "vlm-operator"
CRD_NAME = f"{PLURAL}.{GROUP}"
EXAMPLE = yaml.safe_load((REPO / "examples" / "qwen2.5-vl-3b.yaml").read_text())


def helm(cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "HELM_CACHE_HOME": "/tmp/vlm-helm-cache",
           "HELM_CONFIG_HOME": "/tmp/vlm-helm-config", "HELM_DATA_HOME": "/tmp/vlm-helm-data"}
    proc = subprocess.run([str(cluster.bin_dir / "helm"), *args], capture_output=True, text=True, env=env, timeout=300)
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def can_i(cluster, sa: str, verb: str, resource: str, namespace: str | None) -> bool:
    where = ["--all-namespaces"] if namespace is None else ["-n", namespace]
    proc = subprocess.run([str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "auth", "can-i",
                           verb, resource, *where, "--as", sa], capture_output=True, text=True, timeout=30)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), f"can-i {verb} {resource}: {proc.stdout} {proc.stderr}"
    return answer == "yes"


def sar(kube, user: str, verb: str, group: str, resource: str, namespace: str) -> bool:
    review = client.AuthorizationV1Api(kube).create_subject_access_review({
        "spec": {"user": user, "groups": ["system:serviceaccounts", "system:authenticated"],
                 "resourceAttributes": {"verb": verb, "group": group, "resource": resource, "namespace": namespace}}})
    return bool(review.status.allowed)


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


class Release:
    def __init__(self, cluster, name: str, namespace: str):
        self.cluster, self.name, self.namespace = cluster, name, namespace
        self.sa = f"system:serviceaccount:{namespace}:{name}-vlm-operator"

    def install(self, *values: str) -> None:
        helm(self.cluster, "install", self.name, str(CHART), "-n", self.namespace, *values)

    def uninstall(self) -> None:
        helm(self.cluster, "uninstall", self.name, "-n", self.namespace, "--wait", "--timeout", "60s", check=False)


@pytest.fixture
def release(cluster, namespace) -> Iterator[Release]:
    r = Release(cluster, namespace.removeprefix("t-")[-20:].strip("-"), namespace)
    yield r
    r.uninstall()


def test_helm_lint_and_dry_run_against_the_api_server(cluster, namespace):
    out = helm(cluster, "lint", str(CHART), "--strict", "--kube-version", "1.34.4").stdout
    assert "0 chart(s) failed" in out
    # Server-side dry run: the API server validates every object the chart renders.
    helm(cluster, "install", "dry", str(CHART), "-n", namespace, "--dry-run=server",
         "--set", "peering.enabled=true,replicaCount=2")


def test_cluster_wide_install_crd_and_permission_matrix(cluster, kube, namespace, other_namespace, release):
    rv_before = crd_rv(kube)
    release.install()
    rv_after = crd_rv(kube)
    assert rv_after is not None, "helm install did not create the VLMService CRD"
    if rv_before is not None:  # Helm skips crds/ that exist: it must not have touched the CRD
        assert rv_after == rv_before
    established = client.ApiextensionsV1Api(kube).read_custom_resource_definition(CRD_NAME).status.conditions
    assert any(c.type == "Established" and c.status == "True" for c in established)

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
    for verb, resource in (("create", "podmonitors"), ("patch", "podmonitors"), ("create", "prometheusrules"),
                           ("patch", "prometheusrules")):
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
        assert "403" not in log and "Forbidden" not in log and "forbidden" not in log, op.log_tail(80)
        deps = client.AppsV1Api(kube).list_namespaced_deployment(watched, label_selector=f"{GROUP}/vlmservice=rbac-check")
        assert [d.metadata.name for d in deps.items] == ["rbac-check"]


def test_uninstall_keeps_crds_and_vlmservices(cluster, kube, namespace, release):
    release.install("--set", "peering.enabled=true")
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
