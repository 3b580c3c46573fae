"""A pod injected by the webhook is profiled end to end: a plain Deployment (no VLMService) labelled
serving.vlmops.dev/profile=true gets the sidecar from the operator's webhook; the pod mapper runs an SGLang
stand-in and the real sidecar (real py-spy) with the env the webhook wrote, and the sidecar's series on the pod's
IP carry the identity derived from the Deployment's labels."""

from __future__ import annotations

import re
import urllib.request
import uuid

from kubernetes import client

from vlm_testing.cluster import wait_for
from vlm_testing.integration import LABEL, _delete_later, webhook_configuration
from vlm_testing.operator_proc import free_port, run_operator
from vlm_testing.standin.podmap import PodMapper


def test_injected_pod_is_profiled(cluster, kube, crd, namespace, pod_network, tmp_path, request):
    core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)
    adm = client.AdmissionregistrationV1Api(kube)
    work = core.create_namespace({"metadata": {"generateName": "t-inject-e2e-",
                                               "labels": {"vlm-testbed/test": "true"}}}).metadata.name
    port = free_port()
    mwc_name = f"vlm-inject-e2e-{uuid.uuid4().hex[:8]}"
    adm.create_mutating_webhook_configuration(webhook_configuration(cluster, mwc_name, port, namespace, [work]))
    _delete_later(request, adm, mwc_name)
    gen = run_operator(cluster.kubeconfig, namespace, tmp_path, VLM_INJECTION="true", VLM_WEBHOOK_NAMESPACE=namespace,
                       VLM_WEBHOOK_ADDR="127.0.0.1", VLM_WEBHOOK_PORT=str(port), VLM_WEBHOOK_CERT_HOSTS="127.0.0.1",
                       VLM_WEBHOOK_CONFIGURATION=mwc_name)
    op = next(gen)
    mapper = PodMapper(kube, work, tmp_path / "pods", injected=True).start()
    try:
        wait_for(lambda: "Injection webhook serving" in op.log_tail(200), 60, "the webhook serving")
        wait_for(lambda: all(h.client_config.ca_bundle for h in adm.read_mutating_webhook_configuration(mwc_name).webhooks),
                 60, "the caBundle")
        wait_for(lambda: core.read_namespaced_service_account("default", work), 30, "ServiceAccount",
                 ignore=(client.ApiException,))
        apps.create_namespaced_deployment(work, {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "chat"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "chat"}},
                     "template": {"metadata": {"labels": {"app": "chat", LABEL: "true"}},
                                  "spec": {"tolerations": [{"operator": "Exists"}],
                                           "containers": [{"name": "server", "image": "lmsysorg/sglang:v0.5.2",
                                                           "command": ["python3", "-m", "sglang.launch_server"],
                                                           "args": ["--port", "30000", "--enable-metrics"]}]}}}})
        pod = wait_for(lambda: next(iter(core.list_namespaced_pod(work, label_selector="app=chat").items), None),
                       60, "the pod")
        assert [c.name for c in pod.spec.containers] == ["server", "profiler"]
        mapper.wait_mapped(1, timeout=120)
        (mapped,) = mapper.mapped.values()
        url = f"http://{mapped.ip}:{mapped.sidecar_port}/metrics"

        def loop_series() -> list[str]:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            return [line for line in text.splitlines()
                    if line.startswith("vlm_scheduler_loop_seconds_count{") and not line.endswith(" 0.0")]

        series = wait_for(loop_series, 150, "the sidecar's loop histogram from a sampled window", interval=2,
                          ignore=(OSError,))
        revision = pod.metadata.labels["pod-template-hash"]
        labels = dict(re.findall(r'(\w+)="([^"]*)"', series[0]))
        assert (labels["vlmservice"], labels["revision"], labels["namespace"], labels["pod"]) == (
            "chat", revision, work, pod.metadata.name), series
    finally:
        mapper.stop()
        op.stop()
        next(gen, None)
        core.delete_namespace(work, propagation_policy="Background")
