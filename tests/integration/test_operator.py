"""The real operator against the real control plane (kube-apiserver, etcd, controller-manager,
scheduler, kwok fake H100 nodes): issue 4's acceptance."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import wait_for
from tests.operator_proc import (
    GROUP,
    PLURAL,
    VERSION,
    condition,
    dump,
    get_vlms,
    install_crd,
    run_operator,
    vlms,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((REPO / "examples").glob("*.yaml"))}


@pytest.fixture(scope="module")
def crd(cluster):
    install_crd(cluster.kubectl)


@pytest.fixture
def operator(cluster, crd, namespace, tmp_path):
    yield from run_operator(cluster.kubeconfig, namespace, tmp_path)


def create(kube, namespace: str, doc: dict) -> dict:
    body = copy.deepcopy(doc)
    body["metadata"] = {"name": doc["metadata"]["name"]}
    return vlms(kube).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def patch_spec(kube, namespace: str, name: str, spec_patch: dict) -> None:
    vlms(kube).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": spec_patch})


def wait_condition(kube, namespace, name, type_, status, reason=None, timeout=60.0, op=None):
    def check():
        obj = get_vlms(kube, namespace, name)
        c = condition(obj, type_)
        if c and c["status"] == status and (reason is None or c["reason"] == reason):
            return obj
        return None

    try:
        return wait_for(check, timeout, f"{name} {type_}={status} {reason or ''}")
    except AssertionError:
        obj = get_vlms(kube, namespace, name)
        raise AssertionError(f"{type_}={status}/{reason} not reached; status:\n{dump(obj.get('status'))}\n"
                             f"operator log:\n{op.log_tail() if op else ''}") from None


def deployments(kube, namespace, name):
    apps = client.AppsV1Api(kube)
    return {d.metadata.name: d for d in apps.list_namespaced_deployment(
        namespace, label_selector=f"serving.vlmops.dev/vlmservice={name}").items}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_example_becomes_ready_on_fake_h100_nodes(kube, namespace, operator, kubectl, example):
    doc = EXAMPLES[example]
    name = doc["metadata"]["name"]
    create(kube, namespace, doc)
    obj = wait_condition(kube, namespace, name, "Ready", "True", timeout=90, op=operator)
    st = obj["status"]
    assert st["readyReplicas"] == doc["spec"].get("replicas", 1)
    assert st["observedGeneration"] == obj["metadata"]["generation"]
    assert condition(obj, "IPCCacheActive")["status"] == "True"
    pods = client.CoreV1Api(kube).list_namespaced_pod(namespace, label_selector=f"serving.vlmops.dev/vlmservice={name}").items
    assert pods and all(p.status.phase == "Running" for p in pods)
    nodes = {n.metadata.name: n for n in client.CoreV1Api(kube).list_node().items}
    for p in pods:
        assert nodes[p.spec.node_name].metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert p.spec.share_process_namespace is True
    svc = client.CoreV1Api(kube).read_namespaced_service(name, namespace)
    assert svc.spec.selector == {"serving.vlmops.dev/vlmservice": name}
    # Printer columns show real values.
    table = kubectl("get", "vlms", "-n", namespace, name)
    header, row = table.splitlines()[:2]
    for col in ("MODEL", "READY", "PHASE", "CANARY", "LOOPP95", "TOPFN", "AGE"):
        assert col in header
    assert doc["spec"]["model"]["path"] in row and "True" in row and "Ready" in row


def test_scale_and_in_place_image_change(kube, namespace, operator):
    doc = copy.deepcopy(EXAMPLES["qwen2.5-vl-3b"])
    name = doc["metadata"]["name"]
    create(kube, namespace, doc)
    wait_condition(kube, namespace, name, "Ready", "True", op=operator)
    patch_spec(kube, namespace, name, {"replicas": 2})
    wait_for(lambda: (get_vlms(kube, namespace, name)["status"].get("readyReplicas") == 2), 60, "2 ready replicas")
    assert deployments(kube, namespace, name)[name].spec.replicas == 2
    before = get_vlms(kube, namespace, name)["status"]["stableRevision"]
    patch_spec(kube, namespace, name, {"sglang": {"image": "lmsysorg/sglang:v0.5.22"}})

    def rolled():
        d = deployments(kube, namespace, name)[name]
        c = d.spec.template.spec.containers[0]
        return c.image == "lmsysorg/sglang:v0.5.22" and d
    d = wait_for(rolled, 30, "Deployment rolled to the new image")
    assert d.spec.strategy.rolling_update.max_surge == 0
    assert set(deployments(kube, namespace, name)) == {name}  # no canary without a rollout block
    obj = wait_condition(kube, namespace, name, "Ready", "True", timeout=90, op=operator)
    wait_for(lambda: get_vlms(kube, namespace, name)["status"]["stableRevision"] != before, 30, "new stable revision")
    assert obj["status"]["readyReplicas"] == 2


def test_delete_garbage_collects_everything(kube, namespace, operator):
    doc = EXAMPLES["qwen2.5-vl-3b"]
    name = doc["metadata"]["name"]
    create(kube, namespace, doc)
    wait_condition(kube, namespace, name, "Ready", "True", op=operator)
    vlms(kube).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)
    sel = f"serving.vlmops.dev/vlmservice={name}"

    def gone():
        return (not apps.list_namespaced_deployment(namespace, label_selector=sel).items
                and not core.list_namespaced_service(namespace, label_selector=sel).items
                and not core.list_namespaced_pod(namespace, label_selector=sel).items)
    wait_for(gone, 60, "owned objects garbage-collected")


def test_more_gpus_than_any_node_is_unschedulable(kube, namespace, operator):
    doc = copy.deepcopy(EXAMPLES["qwen2.5-vl-3b"])
    doc["metadata"]["name"] = "too-big"
    doc["spec"]["sglang"]["tensorParallel"] = 16
    obj = wait_condition(kube, namespace, create(kube, namespace, doc)["metadata"]["name"], "Ready", "False",
                         "Unschedulable", timeout=60, op=operator)
    c = condition(obj, "Ready")
    assert "nvidia.com/gpu" in c["message"] or "Insufficient" in c["message"], c
    assert condition(obj, "Degraded")["status"] == "True"


def _warnings(kube, namespace, name, reason):
    evs = client.CoreV1Api(kube).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return [e for e in evs if e.type == "Warning" and e.reason == reason]


def test_ipc_cache_on_with_old_sglang_is_invalid_without_retry_storm_and_recovers(kube, namespace, operator):
    doc = copy.deepcopy(EXAMPLES["qwen2.5-vl-3b"])
    doc["metadata"]["name"] = "old-sglang"
    doc["spec"]["sglang"] = {"image": "lmsysorg/sglang:v0.5.9", "ipcCache": {"mode": "On"}}
    create(kube, namespace, doc)
    obj = wait_condition(kube, namespace, "old-sglang", "Ready", "False", "InvalidSpec", op=operator)
    assert "ipcCache" in condition(obj, "Ready")["message"]
    assert not deployments(kube, namespace, "old-sglang")
    rv = obj["metadata"]["resourceVersion"]
    writes = operator.metric_sum("vlm_operator_api_writes_total")
    time.sleep(8)  # four resyncs
    assert get_vlms(kube, namespace, "old-sglang")["metadata"]["resourceVersion"] == rv, "status rewritten"
    assert operator.metric_sum("vlm_operator_api_writes_total") == writes, "operator kept writing"
    wait_for(lambda: len(_warnings(kube, namespace, "old-sglang", "InvalidSpec")) >= 1, 10, "Warning Event")
    ev = _warnings(kube, namespace, "old-sglang", "InvalidSpec")
    assert len(ev) == 1 and (ev[0].count or 1) == 1, [(e.reason, e.count, e.message) for e in ev]
    patch_spec(kube, namespace, "old-sglang", {"sglang": {"image": "lmsysorg/sglang:v0.5.10"}})
    obj = wait_condition(kube, namespace, "old-sglang", "Ready", "True", timeout=60, op=operator)
    assert condition(obj, "IPCCacheActive")["status"] == "True"


def test_auto_on_old_sglang_reports_ipc_cache_inactive(kube, namespace, operator):
    doc = copy.deepcopy(EXAMPLES["qwen2.5-vl-3b"])
    doc["metadata"]["name"] = "auto-old"
    doc["spec"]["sglang"] = {"image": "lmsysorg/sglang:v0.5.9"}
    create(kube, namespace, doc)
    obj = wait_condition(kube, namespace, "auto-old", "Ready", "True", op=operator)
    c = condition(obj, "IPCCacheActive")
    assert c["status"] == "False" and c["reason"] == "SGLangTooOld"


def test_restart_writes_nothing(cluster, kube, namespace, crd, tmp_path):
    names = []
    gen = run_operator(cluster.kubeconfig, namespace, tmp_path)
    op = next(gen)
    for ex in ("qwen2.5-vl-3b", "qwen2.5-vl-32b-tp2"):
        doc = EXAMPLES[ex]
        create(kube, namespace, doc)
        names.append(doc["metadata"]["name"])
    for n in names:
        wait_condition(kube, namespace, n, "Ready", "True", timeout=90, op=op)
    time.sleep(3)
    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)

    def versions():
        out = {}
        for n in names:
            out[f"vlms/{n}"] = get_vlms(kube, namespace, n)["metadata"]["resourceVersion"]
            for d in apps.list_namespaced_deployment(namespace).items:
                out[f"deploy/{d.metadata.name}"] = d.metadata.resource_version
            for s in core.list_namespaced_service(namespace).items:
                out[f"svc/{s.metadata.name}"] = s.metadata.resource_version
        return out

    def event_count():
        return sum((e.count or 1) for e in core.list_namespaced_event(namespace).items
                   if e.involved_object.kind == "VLMService")

    before, events_before = versions(), event_count()
    next(gen, None)  # stop the first operator
    gen2 = run_operator(cluster.kubeconfig, namespace, tmp_path)
    op2 = next(gen2)
    try:
        time.sleep(10)  # start-up, index fill, five resync rounds
        assert op2.metric_sum("vlm_operator_reconcile_duration_seconds_count") >= len(names), op2.log_tail()
        assert op2.metric_sum("vlm_operator_api_writes_total") == 0, op2.log_tail()
        assert versions() == before
        assert event_count() == events_before
    finally:
        next(gen2, None)


def test_operator_survives_a_deleted_owned_deployment(kube, namespace, operator):
    """Drift repair: a deleted Deployment comes back on the next resync."""
    doc = EXAMPLES["qwen2.5-vl-3b"]
    name = doc["metadata"]["name"]
    create(kube, namespace, doc)
    wait_condition(kube, namespace, name, "Ready", "True", op=operator)
    client.AppsV1Api(kube).delete_namespaced_deployment(name, namespace)
    wait_for(lambda: name in deployments(kube, namespace, name), 30, "Deployment re-created")
    with pytest.raises(ApiException):
        client.AppsV1Api(kube).read_namespaced_deployment(name + "-canary", namespace)
