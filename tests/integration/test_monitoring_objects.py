"""With the Prometheus Operator's CRDs present, the operator creates a PodMonitor and a PrometheusRule
per VLMService (owned, so they go with it). The CRDs here are minimal stand-ins of the real ones
(same group, kinds and scope; schema left open): enough for the API server to store the objects."""

from __future__ import annotations

import copy

import pytest
from kubernetes import client

from vlm_testing.cluster import wait_for
from vlm_testing.integration import EXAMPLES, create, ensure_monitoring_crds, wait_condition
from vlm_testing.operator_proc import install_crd, run_operator


@pytest.fixture(scope="module")
def monitoring_crds(cluster, kube):
    install_crd(cluster.kubectl)
    ensure_monitoring_crds(kube)


def test_podmonitor_and_prometheusrule_follow_the_service(cluster, kube, namespace, monitoring_crds, tmp_path):
    gen = run_operator(cluster.kubeconfig, namespace, tmp_path)
    op = next(gen)
    try:
        doc = copy.deepcopy(EXAMPLES["qwen2.5-vl-3b"])
        name = doc["metadata"]["name"]
        create(kube, namespace, doc)
        wait_condition(kube, namespace, name, "Ready", "True", op=op)
        co = client.CustomObjectsApi(kube)

        def get(plural):
            return co.get_namespaced_custom_object("monitoring.coreos.com", "v1", namespace, plural, name)

        pm = wait_for(lambda: get("podmonitors"), 30, "PodMonitor", ignore=(client.ApiException,))
        assert pm["spec"]["selector"]["matchLabels"] == {"serving.vlmops.dev/vlmservice": name}
        assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} == {"http", "profiler"}
        # The sidecar's own namespace/vlmservice/pod/revision labels win over the target's (issue 13).
        assert all(e["honorLabels"] is True for e in pm["spec"]["podMetricsEndpoints"])
        pr = get("prometheusrules")
        rules = pr["spec"]["groups"][0]["rules"]
        assert {r["alert"] for r in rules} >= {"VLMCanaryRolledBack", "VLMIPCCacheInactive"}
        assert all(f'vlmservice="{name}"' in r["expr"] for r in rules)
        assert pr["metadata"]["ownerReferences"][0]["kind"] == "VLMService"
        # Watched: one deleted by hand comes back at the service's next resync, with no spec change.
        uid = pm["metadata"]["uid"]
        co.delete_namespaced_custom_object("monitoring.coreos.com", "v1", namespace, "podmonitors", name)
        back = wait_for(lambda: (o := get("podmonitors")) and o["metadata"]["uid"] != uid and o, 60,
                        "the deleted PodMonitor re-created", ignore=(client.ApiException,))
        assert back["spec"]["selector"] == pm["spec"]["selector"]
    finally:
        next(gen, None)
