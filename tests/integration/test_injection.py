"""The injection webhook on the real API server: the operator (a process, VLM_INJECTION=true) makes its CA and
serving certificate, stores them in a Secret and writes the CA into a MutatingWebhookConfiguration's caBundle;
the API server calls it over TLS at 127.0.0.1 (the testbed's network namespace, where this process and the
API server both are) for a plain Deployment's pods.

The testbed is shared: the configuration selects this test's workload namespace alone and is deleted after.
"""

from __future__ import annotations

import base64
import time
import uuid

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.cluster import wait_for
from tests.operator_proc import free_port, run_operator

LABEL = "serving.vlmops.dev/profile"
IMAGE = "vlmops/vlm-sidecar:inject-test"


def webhook_configuration(name: str, port: int, workload_ns: str) -> dict:
    """What the chart renders (templates/mutatingwebhook.yaml), with a URL instead of the Service and the
    namespace selector narrowed to one namespace."""
    def hook(hook_name: str, object_selector: dict) -> dict:
        return {
            "name": hook_name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate"},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "timeoutSeconds": 5,
            "reinvocationPolicy": "IfNeeded",
            "matchPolicy": "Equivalent",
            "namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [workload_ns]}]},
            "objectSelector": object_selector,
        }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [hook("pods.profile.serving.vlmops.dev", {"matchLabels": {LABEL: "true"}})],
    }


def deployment(name: str, labels: dict) -> dict:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, **labels}},
                "spec": {"containers": [{"name": "server", "image": "lmsysorg/sglang:v0.5.2",
                                         "command": ["python3", "-m", "sglang.launch_server"],
                                         "args": ["--port", "8000"]}]},
            },
        },
    }


@pytest.fixture
def workload_ns(kube):
    core = client.CoreV1Api(kube)
    ns = core.create_namespace({"metadata": {"generateName": "t-inject-work-",
                                             "labels": {"vlm-testbed/test": "true"}}}).metadata.name
    wait_for(lambda: core.read_namespaced_service_account("default", ns), 30, "default ServiceAccount",
             ignore=(ApiException,))
    yield ns
    core.delete_namespace(ns, propagation_policy="Background")


def _pods(core: client.CoreV1Api, ns: str, app: str) -> list:
    return core.list_namespaced_pod(ns, label_selector=f"app={app}").items


def test_webhook_injects_over_tls_and_never_blocks(cluster, kube, crd, namespace, workload_ns, tmp_path):
    core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)
    adm = client.AdmissionregistrationV1Api(kube)
    port = free_port()
    mwc_name = f"vlm-inject-test-{uuid.uuid4().hex[:8]}"
    adm.create_mutating_webhook_configuration(webhook_configuration(mwc_name, port, workload_ns))
    gen = run_operator(cluster.kubeconfig, namespace, tmp_path, VLM_INJECTION="true", VLM_WEBHOOK_NAMESPACE=namespace,
                       VLM_WEBHOOK_ADDR="127.0.0.1", VLM_WEBHOOK_PORT=str(port), VLM_WEBHOOK_CERT_HOSTS="127.0.0.1",
                       VLM_WEBHOOK_CONFIGURATION=mwc_name, VLM_SIDECAR_IMAGE=IMAGE,
                       VLM_SIDECAR_IMAGE_PULL_SECRETS="regcred")
    op = next(gen)
    try:
        # The operator's certificate: in its Secret, its CA in the caBundle.
        secret = wait_for(lambda: core.read_namespaced_secret("vlm-operator-webhook-tls", namespace), 60,
                          "the webhook's Secret", ignore=(ApiException,))
        assert secret.type == "kubernetes.io/tls" and set(secret.data) >= {"ca.crt", "ca.key", "tls.crt", "tls.key"}

        def ca_bundle():
            hooks = adm.read_mutating_webhook_configuration(mwc_name).webhooks
            return all(h.client_config.ca_bundle for h in hooks) and hooks[0].client_config.ca_bundle

        written = wait_for(ca_bundle, 60, "caBundle written by the operator")
        assert base64.b64decode(written) == base64.b64decode(secret.data["ca.crt"])
        wait_for(lambda: "Injection webhook serving" in op.log_tail(200), 30, "the webhook serving")

        # A plain Deployment asking for it: its pod gets the sidecar (through TLS: the API server checks the
        # serving certificate against the caBundle and 127.0.0.1).
        apps.create_namespaced_deployment(workload_ns, deployment("chat", {LABEL: "true"}))
        pod = wait_for(lambda: _pods(core, workload_ns, "chat"), 60, "the Deployment's pod")[0]
        names = [c.name for c in pod.spec.containers]
        assert names == ["server", "profiler"], (names, op.log_tail())
        assert pod.spec.share_process_namespace is True
        side = pod.spec.containers[1]
        assert side.image == IMAGE
        assert side.security_context.capabilities.add == ["SYS_PTRACE"]
        assert pod.spec.containers[0].security_context is None
        assert side.resources.requests == side.resources.limits
        env = {e.name: e for e in side.env}
        assert env["VLM_REVISION"].value_from.field_ref.field_path == "metadata.labels['pod-template-hash']"
        assert env["VLM_SERVICE_NAME"].value_from.field_ref.field_path == "metadata.labels['app']"
        assert env["VLM_SGLANG_METRICS_URL"].value == "http://127.0.0.1:8000/metrics"
        assert "profiler-tmp" in {v.name for v in pod.spec.volumes}
        assert {"regcred"} <= {s.name for s in pod.spec.image_pull_secrets}
        assert pod.metadata.annotations["serving.vlmops.dev/profiler-injected"] == IMAGE
        assert op.metric_sum('vlm_operator_webhook_review_seconds_count{outcome="injected"}') >= 1

        # Without the label: the API server does not even call the webhook; the pod is as written.
        apps.create_namespaced_deployment(workload_ns, deployment("plain", {}))
        plain = wait_for(lambda: _pods(core, workload_ns, "plain"), 60, "the plain Deployment's pod")[0]
        assert [c.name for c in plain.spec.containers] == ["server"] and not plain.spec.share_process_namespace
        assert LABEL not in (plain.metadata.labels or {})
    finally:
        op.stop()
        next(gen, None)
    try:
        # The operator gone: failurePolicy Ignore lets the pod through, unchanged, without waiting long.
        start = time.monotonic()
        bare = core.create_namespaced_pod(workload_ns, {
            "metadata": {"name": "after", "labels": {LABEL: "true"}},
            "spec": {"containers": [{"name": "server", "image": "lmsysorg/sglang:v0.5.2"}]}})
        took = time.monotonic() - start
        assert [c.name for c in bare.spec.containers] == ["server"]
        assert took < 5, f"pod creation took {took:.1f} s with the webhook down"
    finally:
        adm.delete_mutating_webhook_configuration(mwc_name)
