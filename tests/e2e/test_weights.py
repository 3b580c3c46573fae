"""Weights loaded once, end to end: a VLMService with a model cache and a hub id. The operator makes the weights Job;
the real Job controller runs its pod (here a local process, testing/vlm_testing/standin/podmap.JobPods, with the claim's volume a
directory) which downloads through the real huggingface_hub client from a small hub endpoint in the testbed's
network namespace (testing/vlm_testing/standin/hub.py, HF_ENDPOINT). The pod is killed half-way; the Job controller starts
another, which resumes the file from its partial part. Meanwhile the service's pods wait behind the scheduling
gate (no GPU held) with ModelReady False; after the Job they start with HF_HOME on the claim and offline mode."""

from __future__ import annotations

import copy
import hashlib
import time

import pytest
from kubernetes import client

from vlm_testing.cluster import wait_for
from vlm_testing.e2e import SPEC, create
from vlm_testing.operator_proc import dump, get_vlms
from vlm_testing.standin.hub import Hub, Repo
from vlm_testing.standin.podmap import JobPods

NAME = "qwen-weights"
REPO_ID = "org/tiny-vl"
BIG = hashlib.sha256(b"e2e").digest() * (32_000_000 // 32)  # the client writes 10 MiB chunks: cut after 2 of them
CUT = 22_000_000


@pytest.fixture
def claim(kube, namespace, tmp_path):
    """A PersistentVolume (hostPath) bound to the claim `weights`; the Job pods' view of it is `tmp_path/pv`."""
    core = client.CoreV1Api(kube)
    local = tmp_path / "pv"
    local.mkdir()
    pv = f"{namespace}-weights"[:63]
    core.create_persistent_volume({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "hostPath": {"path": str(local)}, "persistentVolumeReclaimPolicy": "Retain"}})
    core.create_namespaced_persistent_volume_claim(namespace, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "weights"},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                 "resources": {"requests": {"storage": "1Gi"}}}})
    wait_for(lambda: core.read_namespaced_persistent_volume_claim("weights", namespace).status.phase == "Bound", 60,
             "the claim bound", interval=0.5)
    yield local
    core.delete_persistent_volume(pv)


def condition(kube, namespace, type_):
    st = get_vlms(kube, namespace, NAME).get("status") or {}
    return next((c for c in st.get("conditions", []) if c["type"] == type_), {})


def test_weights_job_fills_the_cache_once_resumes_after_a_kill_and_pods_start_after(
        kube, namespace, make_operator, podmap, claim, tmp_path):
    hub = Hub({REPO_ID: Repo({"config.json": b'{"model_type": "qwen2_5_vl"}', "model.safetensors": BIG})},
              rate=4_000_000, hold_at=CUT).start()  # the first GET stops at CUT until released; the pod is
    #                                                    killed there. In the testbed's namespace (this thread is there)
    jobs = JobPods(kube, namespace, tmp_path / "jobs", component="weights", claims={"weights": claim}).start()
    try:
        op = make_operator()
        spec = copy.deepcopy(SPEC)
        spec.pop("rollout")
        spec["replicas"] = 2
        spec["model"] = {"path": REPO_ID, "cache": {"claimName": "weights", "mountPath": "/models",
                                                    "download": {"endpoint": hub.url}}}
        create(kube, namespace, spec, name=NAME)
        first = wait_for(lambda: jobs.started[:1], 90, "the weights Job's pod running", interval=0.5)[0]
        assert condition(kube, namespace, "ModelReady").get("reason") in ("Downloading", None)
        core = client.CoreV1Api(kube)

        def serving_pods():
            return core.list_namespaced_pod(namespace, label_selector=f"serving.vlmops.dev/vlmservice={NAME}").items

        # The ReplicaSet makes the serving pods; beside other tests on a shared testbed it can take seconds
        # (CI, 2026-12-06: none yet when half the weights were sent; then, paced at 2 MB/s, the download had finished
        # by the time they were). The hub holds the first body at CUT, so the order no longer races.
        wait_for(lambda: len(serving_pods()) == 2, 60, "the serving pods made", interval=0.5)
        wait_for(lambda: any(r["sent"] >= CUT for r in hub.served("model.safetensors")), 60, "half the weights sent",
                 interval=0.2)
        serving = serving_pods()
        assert serving and all(p.spec.scheduling_gates and not p.spec.node_name for p in serving), \
            "the serving pods wait behind the gate, holding no GPU"
        cond = condition(kube, namespace, "ModelReady")
        assert (cond.get("status"), cond.get("reason")) == ("False", "Downloading"), dump(cond)
        assert condition(kube, namespace, "Ready").get("reason") == "WaitingForModel"
        assert jobs.kill(first)
        hub.release()  # the held body ends with its client; the retried pod's GET runs unheld

        wait_for(lambda: condition(kube, namespace, "ModelReady").get("status") == "True", 180,
                 "ModelReady True after the retried pod", interval=1.0)
        gets = hub.served("model.safetensors")
        assert len(gets) == 2 and len(jobs.started) == 2, (gets, jobs.started)
        start = int((gets[1]["range"] or "bytes=0-").removeprefix("bytes=").rstrip("-"))
        assert start >= 10 * 1024 * 1024 and gets[1]["sent"] == len(BIG) - start, gets  # resumed
        assert jobs.ended[first] == 137 and jobs.ended[jobs.started[1]] == 0, jobs.ended
        blobs = list((claim / "hf" / "hub" / "models--org--tiny-vl" / "blobs").iterdir())
        assert any(b.read_bytes() == BIG for b in blobs), "the weights are on the claim"
        batch = client.BatchV1Api(kube)
        job = batch.list_namespaced_job(namespace, label_selector="app.kubernetes.io/component=weights").items
        assert len(job) == 1 and job[0].status.succeeded == 1 and job[0].status.failed == 1, dump(job[0].status.to_dict())

        wait_for(lambda: condition(kube, namespace, "Ready").get("status") == "True", 120, "the service Ready",
                 interval=1.0)
        pods = core.list_namespaced_pod(namespace, label_selector=f"serving.vlmops.dev/vlmservice={NAME}").items
        for p in pods:
            env = {e.name: e.value for c in p.spec.containers if c.name == "sglang" for e in c.env or []}
            assert env.get("HF_HOME") == "/models/hf" and env.get("HF_HUB_OFFLINE") == "1", env
        time.sleep(2)
        assert len(hub.served("model.safetensors")) == 2, "downloaded once, not per pod"
    finally:
        jobs.stop()
        hub.stop()
    assert condition(kube, namespace, "ModelReady").get("reason") == "Downloaded", op.log_tail(20)
