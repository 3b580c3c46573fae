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
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from vlm_testing.cluster import wait_for
from vlm_testing.integration import IMAGE, LABEL, _delete_later, render_webhook, webhook_configuration
from vlm_testing.operator_proc import free_port, run_operator


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
def make_ns(kube):
    """Namespaces of this test (labelled as the testbed's), deleted after it."""
    core, made = client.CoreV1Api(kube), []

    def make(prefix: str, labels: dict | None = None) -> str:
        ns = core.create_namespace({"metadata": {"generateName": f"t-inject-{prefix}-",
                                                 "labels": {"vlm-testbed/test": "true", **(labels or {})}}})
        made.append(ns.metadata.name)
        wait_for(lambda: core.read_namespaced_service_account("default", ns.metadata.name), 30,
                 "default ServiceAccount", ignore=(ApiException,))
        return ns.metadata.name

    yield make
    for ns in made:
        core.delete_namespace(ns, propagation_policy="Background")


def _pods(core: client.CoreV1Api, ns: str, app: str) -> list:
    return core.list_namespaced_pod(ns, label_selector=f"app={app}").items


def _bare_pod(name: str, labels: dict) -> dict:
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "server", "image": "lmsysorg/sglang:v0.5.2"}]}}


def _names(pod) -> list[str]:
    return [c.name for c in pod.spec.containers]


def test_webhook_injects_over_tls_and_never_blocks(cluster, kube, crd, namespace, make_ns, tmp_path, request):
    core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)
    adm = client.AdmissionregistrationV1Api(kube)
    port = free_port()
    mwc_name = f"vlm-inject-test-{uuid.uuid4().hex[:8]}"
    workload_ns = make_ns("work")
    profiled_ns = make_ns("nsopt", {LABEL: "true"})  # every pod, unless it says false
    baseline_ns = make_ns("baseline", {LABEL: "true", "pod-security.kubernetes.io/enforce": "baseline"})
    adm.create_mutating_webhook_configuration(webhook_configuration(
        cluster, mwc_name, port, namespace, [workload_ns, profiled_ns, baseline_ns, namespace]))
    _delete_later(request, adm, mwc_name)
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
        wait_for(lambda: op.metric_sum('vlm_operator_webhook_review_seconds_count{outcome="injected"}') >= 1, 10,
                 "the review counted")  # (recorded just after the answer is sent)

        # Without the label: the API server does not even call the webhook; the pod is as written.
        apps.create_namespaced_deployment(workload_ns, deployment("plain", {}))
        plain = wait_for(lambda: _pods(core, workload_ns, "plain"), 60, "the plain Deployment's pod")[0]
        assert [c.name for c in plain.spec.containers] == ["server"] and not plain.spec.share_process_namespace
        assert LABEL not in (plain.metadata.labels or {})

        # A namespace labelled for it: an unlabelled pod is injected (the second webhook), one saying false not.
        opted = core.create_namespaced_pod(profiled_ns, _bare_pod("any", {}))
        assert _names(opted) == ["server", "profiler"] and opted.metadata.labels[LABEL] == "true"
        assert _names(core.create_namespaced_pod(profiled_ns, _bare_pod("no", {LABEL: "false"}))) == ["server"]
        # Pod Security baseline would refuse SYS_PTRACE: the namespace is not selected, the pod is created as is.
        assert _names(core.create_namespaced_pod(baseline_ns, _bare_pod("psa", {LABEL: "true"}))) == ["server"]
        as_injected = kube.sanitize_for_serialization(side)
        as_injected["volumeMounts"] = [m for m in as_injected["volumeMounts"] if m["name"] == "profiler-tmp"]
        with pytest.raises(ApiException) as refused:  # what injecting there would have done
            core.create_namespaced_pod(baseline_ns, {"metadata": {"name": "as-injected"}, "spec": {
                "shareProcessNamespace": True, "volumes": [{"name": "profiler-tmp", "emptyDir": {}}],
                "containers": [{"name": "server", "image": "lmsysorg/sglang:v0.5.2"},
                               as_injected]}})
        assert refused.value.status == 403 and "SYS_PTRACE" in refused.value.body, refused.value.body
        # The operator's own namespace: the chart's selector leaves it out.
        own = core.create_namespaced_pod(namespace, _bare_pod("own", {LABEL: "true"}))
        assert _names(own) == ["server"]
        # The API server called the webhook for the two pods it injected, and for none of the others.
        wait_for(lambda: op.metric_sum("vlm_operator_webhook_review_seconds_count") >= 2, 10, "two reviews")
        assert op.metric_sum("vlm_operator_webhook_review_seconds_count") == 2
    finally:
        op.stop()
        next(gen, None)
    # The operator gone: failurePolicy Ignore lets the pod through, unchanged, without waiting long.
    start = time.monotonic()
    bare = core.create_namespaced_pod(workload_ns, _bare_pod("after", {LABEL: "true"}))
    took = time.monotonic() - start
    assert [c.name for c in bare.spec.containers] == ["server"]
    assert took < 5, f"pod creation took {took:.1f} s with the webhook down"


def test_self_signed_certificate_renewed_and_ca_bundle_repaired_on_the_api_server(
        cluster, kube, namespace, monkeypatch, tmp_path):
    """The certificate keeper's writes as the API server takes them: the Secret created, then renewed by a merge
    patch carrying its resourceVersion (a key no longer wanted removed), and a caBundle that a `helm upgrade`
    emptied written again."""
    import datetime as dt

    from vlm_operator.admission import webhook
    from vlm_operator.api.settings import Settings
    from vlm_operator.cluster import certs
    from vlm_operator.cluster import connection as kubeconn

    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    core, adm = client.CoreV1Api(kube), client.AdmissionregistrationV1Api(kube)
    mwc_name = f"vlm-inject-keeper-{uuid.uuid4().hex[:8]}"
    # Selects no namespace (a name that cannot exist): only its caBundle matters here.
    adm.create_mutating_webhook_configuration(
        webhook_configuration(cluster, mwc_name, free_port(), namespace, ["no-such-namespace-" + uuid.uuid4().hex[:6]]))
    try:
        settings = Settings(injection=True, webhook_namespace=namespace, webhook_configuration=mwc_name)
        now = dt.datetime.now(dt.UTC)
        conn = kubeconn.Connection()
        first = webhook.CertKeeper(conn, settings, now=lambda: now).ensure()
        secret = core.read_namespaced_secret(settings.webhook_secret, namespace)
        assert certs.Bundle.from_secret_data(secret.data) == first

        def bundles() -> list[bytes]:
            return [base64.b64decode(h.client_config.ca_bundle or "")
                    for h in adm.read_mutating_webhook_configuration(mwc_name).webhooks]

        assert bundles() == [first.ca_bundle, first.ca_bundle]
        core.patch_namespaced_secret(settings.webhook_secret, namespace,
                                     {"data": {certs.PREVIOUS_CA: base64.b64encode(b"stale").decode()}})
        later = now + dt.timedelta(days=300)
        renewed = webhook.CertKeeper(conn, settings, now=lambda: later).ensure()
        secret = core.read_namespaced_secret(settings.webhook_secret, namespace)
        assert renewed.ca_crt == first.ca_crt and renewed.tls_crt != first.tls_crt
        assert certs.Bundle.from_secret_data(secret.data) == renewed and certs.PREVIOUS_CA not in secret.data
        assert int(secret.metadata.resource_version) > 0
        # A `helm upgrade` rendered the configuration without a caBundle: the next check writes it again.
        adm.patch_mutating_webhook_configuration(mwc_name, [
            {"op": "remove", "path": f"/webhooks/{i}/clientConfig/caBundle"} for i in range(2)])
        assert bundles() == [b"", b""]
        webhook.CertKeeper(conn, settings, now=lambda: later).ensure()
        assert bundles() == [renewed.ca_bundle, renewed.ca_bundle]
    finally:
        adm.delete_mutating_webhook_configuration(mwc_name)


class _As:
    """kopf's login for this process, as a ServiceAccount (impersonated by the testbed's admin)."""

    def __init__(self, info, user: str):
        self._info, self._user = info, user

    def __getattr__(self, name):
        return getattr(self._info, name)

    def as_http_headers(self) -> dict:
        return {**self._info.as_http_headers(), "Impersonate-User": self._user,
                "Impersonate-Group": "system:serviceaccounts"}


def test_the_charts_rbac_is_what_the_certificate_keeper_needs(cluster, kube, namespace, monkeypatch):
    """The keeper runs as the chart's ServiceAccount with the chart's webhook Role and ClusterRole only: it
    creates and renews its Secret and writes its configuration's caBundle, and reads no other Secret."""
    import datetime as dt

    from vlm_operator.admission import webhook
    from vlm_operator.api.settings import Settings
    from vlm_operator.cluster import connection as kubeconn

    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    release = f"rb{uuid.uuid4().hex[:6]}"
    objs = render_webhook(cluster, release, namespace, ["no-such-namespace-" + uuid.uuid4().hex[:6]])
    (mwc,) = [d for d in objs if d["kind"] == "MutatingWebhookConfiguration"]
    for hook in mwc["webhooks"]:
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{free_port()}/mutate"}
    rbac = [d for d in objs if d["kind"] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")]
    assert sorted(d["kind"] for d in rbac) == ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
    sa = rbac[0]["metadata"]["name"].removesuffix("-webhook")  # the chart's ServiceAccount: <fullname>
    core = client.CoreV1Api(kube)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": sa}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "other"}, "data": {"k": "dg=="}})
    docs = [*rbac, mwc]
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
    try:
        settings = Settings(injection=True, webhook_namespace=namespace, webhook_configuration=mwc["metadata"]["name"],
                            webhook_secret=f"{release}-vlm-operator-webhook-tls",
                            webhook_service=f"{release}-vlm-operator-webhook")
        user = f"system:serviceaccount:{namespace}:{sa}"
        conn = kubeconn.Connection(lambda: _As(kubeconn.login(), user))
        now = dt.datetime.now(dt.UTC)
        # RBAC objects can take a moment to reach the authorizer's cache.
        first = wait_for(lambda: webhook.CertKeeper(conn, settings, now=lambda: now).ensure(), 30,
                         "the keeper's first write as the ServiceAccount", ignore=(kubeconn.ApiError,))
        renewed = webhook.CertKeeper(conn, settings, now=lambda: now + dt.timedelta(days=300)).ensure()
        assert renewed.tls_crt != first.tls_crt
        hooks = client.AdmissionregistrationV1Api(kube).read_mutating_webhook_configuration(mwc["metadata"]["name"])
        assert {h.client_config.ca_bundle for h in hooks.webhooks} == {base64.b64encode(first.ca_bundle).decode()}
        with pytest.raises(kubeconn.ApiError) as denied:
            conn.request("GET", f"/api/v1/namespaces/{namespace}/secrets/other")
        assert denied.value.status == 403
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "-f", "-", stdin=yaml.safe_dump_all(docs))
