"""Node-paired, warm rollouts on the real control plane (issue: "Node-paired progressive rollouts that never drop
a warm pod").

The real operator, kube-apiserver, ReplicaSet controller, scheduler and kwok, on four fake nodes of one GPU each
(their own GPU product, so no other test's pods share them; two zones). A 4-replica service is changed twice:

- the first change's canary gets no profiler data (this tier runs no sidecar), so its gate rolls it back at
  maxDuration: the canary pod must have taken the node of the stable pod it replaced, and the rollback must put a
  stable pod back on that node;
- the second change is promoted by annotation after its first step: every canary pod running before the
  promotion must still run after it (same UIDs: no warm pod dropped), every new pod must sit on the node of the
  pod it replaced, and the stable revision must become the canary's.

Through both, a watch on the service's pods (every event, not samples) checks that Ready replicas never fall
below replicas - maxUnavailable = 3.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from kubernetes import client, watch

from vlm_testing.cluster import wait_for
from vlm_testing.operator_proc import GROUP, PLURAL, VERSION, dump, get_vlms, run_operator, vlms

PRODUCT = "NVIDIA-PAIRED-TEST"
NODES = {"paired-node-0": "paired-a", "paired-node-1": "paired-a", "paired-node-2": "paired-b",
         "paired-node-3": "paired-b"}
NAME = "paired"
LABEL_SERVICE = "serving.vlmops.dev/vlmservice"
LABEL_REVISION = "serving.vlmops.dev/revision"

SPEC = {
    "model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"},
    "replicas": 4,
    "gpu": {"product": PRODUCT, "count": 1},
    "telemetry": {"enabled": True},
    "rollout": {
        "maxUnavailable": 1,
        "startupTimeout": "5m",
        "analysis": {"source": "Sidecar", "interval": "5s", "maxDuration": "20s", "onInconclusive": "Rollback"},
    },
}


def node_body(name: str, zone: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                     "labels": {"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                "topology.kubernetes.io/zone": zone, "nvidia.com/gpu.present": "true",
                                "nvidia.com/gpu.product": PRODUCT, "nvidia.com/gpu.count": "1"}},
        "spec": {},
        "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "1"},
                   "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "1"}},
    }


@pytest.fixture(scope="module")
def nodes(cluster, kube):
    core = client.CoreV1Api(kube)
    for name, zone in NODES.items():
        try:
            core.create_node(node_body(name, zone))
        except client.ApiException as e:
            if e.status != 409:
                raise
    wait_for(lambda: all(any(c.type == "Ready" and c.status == "True" for c in (core.read_node(n).status.conditions or []))
                         for n in NODES), 60, "the paired test nodes Ready", interval=0.5)
    yield list(NODES)
    for name in NODES:
        with contextlib.suppress(client.ApiException):
            core.delete_node(name)


@contextlib.contextmanager
def operator_running(cluster, namespace: str, tmp_path, resync_s: str):
    """The real operator for one test, its log's tail printed when the test fails."""
    gen = run_operator(cluster.kubeconfig, namespace, tmp_path, VLM_RESYNC_SECONDS=resync_s)
    op = next(gen)
    try:
        yield op
    except BaseException:
        print(op.log_tail(60))
        raise
    finally:
        with contextlib.suppress(StopIteration):
            next(gen)


class ReadyWatch:
    """Every pod event of the service, from a watch: the least Ready pods seen at any moment after `arm()`."""

    def __init__(self, kube, namespace: str):
        self.core = client.CoreV1Api(kube)
        self.namespace = namespace
        self.ready: dict[str, bool] = {}
        self.low: int | None = None
        self.armed = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(self.core.list_namespaced_pod, self.namespace,
                                   label_selector=f"{LABEL_SERVICE}={NAME}", timeout_seconds=5):
                    p = ev["object"]
                    ok = (ev["type"] != "DELETED" and not p.metadata.deletion_timestamp and any(
                        c.type == "Ready" and c.status == "True" for c in (p.status.conditions or [])))
                    self.ready[p.metadata.name] = ok
                    if self.armed:
                        n = sum(self.ready.values())
                        self.low = n if self.low is None else min(self.low, n)
                    if self.stop.is_set():
                        break
            except Exception:  # a watch that ends is restarted
                time.sleep(0.2)

    def arm(self) -> None:
        self.low = sum(self.ready.values())
        self.armed = True


def pods(kube, namespace: str) -> dict[str, client.V1Pod]:
    items = client.CoreV1Api(kube).list_namespaced_pod(namespace, label_selector=f"{LABEL_SERVICE}={NAME}").items
    return {p.metadata.name: p for p in items if not p.metadata.deletion_timestamp}


def status(kube, namespace: str) -> dict:
    return get_vlms(kube, namespace, NAME).get("status") or {}


def ready_all(kube, namespace: str, revision: str | None = None) -> bool:
    ps = pods(kube, namespace)
    return len(ps) == 4 and all(
        any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
        and (revision is None or p.metadata.labels.get(LABEL_REVISION) == revision) for p in ps.values())


def test_paired_steps_rollback_on_the_same_nodes_and_warm_promotion(cluster, kube, crd, namespace, nodes, tmp_path):
    api = vlms(kube)
    with operator_running(cluster, namespace, tmp_path, "1"):
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "VLMService", "metadata": {"name": NAME}, "spec": SPEC})
        wait_for(lambda: ready_all(kube, namespace), 120, "4 Ready pods", interval=0.5)
        first = status(kube, namespace)["stableRevision"]
        before = pods(kube, namespace)
        assert sorted(p.spec.node_name for p in before.values()) == sorted(NODES), {n: p.spec.node_name for n, p in before.items()}
        assert {p.metadata.labels.get("serving.vlmops.dev/role") for p in before.values()} == {"stable"}
        watcher = ReadyWatch(kube, namespace)
        wait_for(lambda: sum(watcher.ready.values()) == 4, 30, "the watch sees 4 Ready pods", interval=0.2)
        watcher.arm()

        # ---- change 1: step 1 (one canary pod on a replaced pod's node), no data -> rolled back on that node
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME, {
            "spec": {"sglang": {"env": [{"name": "CHANGE", "value": "1"}]}}})
        r = wait_for(lambda: (r := status(kube, namespace).get("rollout") or {}).get("phase") in ("RolledBack",) and r,
                     180, "the unverifiable canary rolled back", interval=0.5)
        pairs = r["pairs"]
        assert pairs and pairs[0]["kind"] == "Replace", dump(r)
        canary_node = pairs[0]["node"]
        assert before[pairs[0]["replaced"]].spec.node_name == canary_node, dump(r)
        wait_for(lambda: ready_all(kube, namespace, first) and not (status(kube, namespace).get("rollout") or {}).get("waiting")
                 and status(kube, namespace).get("canaryRevision") is None, 120,
                 "all 4 pods back at the stable revision", interval=0.5)
        back = pods(kube, namespace)
        assert canary_node in {p.spec.node_name for p in back.values()}, {n: p.spec.node_name for n, p in back.items()}
        # the stable pods the canary never touched kept running (no restart)
        untouched = set(before) - {pairs[0]["replaced"]}
        assert untouched <= set(back), (sorted(untouched), sorted(back))
        assert watcher.low is not None and watcher.low >= 3, watcher.low

        # ---- change 2: promoted by annotation after step 1 is placed: warm, node by node
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME, {
            "spec": {"sglang": {"env": [{"name": "CHANGE", "value": "2"}]}}})
        wait_for(lambda: (status(kube, namespace).get("rollout") or {}).get("phase") == "Analysing", 120,
                 "step 1 of change 2 analysing", interval=0.5)
        second = status(kube, namespace)["rollout"]["revision"]
        canary_uids = {p.metadata.uid for p in pods(kube, namespace).values()
                       if p.metadata.labels.get(LABEL_REVISION) == second}
        assert len(canary_uids) == 1, canary_uids
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME, {
            "metadata": {"annotations": {"serving.vlmops.dev/rollout-action": "promote"}}})
        wait_for(lambda: status(kube, namespace).get("stableRevision") == second and ready_all(kube, namespace, second),
                 180, "change 2 promoted, all 4 pods at its revision", interval=0.5)
        final = status(kube, namespace)
        after = pods(kube, namespace)
        assert canary_uids <= {p.metadata.uid for p in after.values()}, "a canary pod was dropped at promotion"
        assert final["rollout"]["phase"] == "Promoted", dump(final["rollout"])
        assert {p.metadata.labels.get("serving.vlmops.dev/role") for p in after.values()} == {"stable"}
        for pair in final["rollout"]["pairs"]:
            if pair.get("pod") and not pair.get("dropped"):
                assert after[pair["pod"]].spec.node_name == pair["node"], dump(final["rollout"]["pairs"])
        assert sorted(p.spec.node_name for p in after.values()) == sorted(NODES)
        assert watcher.low >= 3, watcher.low
        # the old revisions' Deployments are gone, the new one is named by its revision
        deps = {d.metadata.name for d in client.AppsV1Api(kube).list_namespaced_deployment(
            namespace, label_selector=f"{LABEL_SERVICE}={NAME}").items}
        wait_for(lambda: {d.metadata.name for d in client.AppsV1Api(kube).list_namespaced_deployment(
            namespace, label_selector=f"{LABEL_SERVICE}={NAME}").items} == {f"{NAME}-{second}"}, 60,
            f"only {NAME}-{second} left (had {sorted(deps)})", interval=0.5)
        watcher.stop.set()


def _events(kube, namespace: str, name: str) -> dict[str, str]:
    evs = client.CoreV1Api(kube).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return {e.reason: e.message for e in evs}


def test_one_replica_surges_on_a_free_gpu_and_is_told_before_an_outage(cluster, kube, crd, namespace, nodes, tmp_path):
    """A 1-replica service without a rollout block: changed while a GPU is free elsewhere, it never has 0 Ready
    pods (the new pod is added on the free GPU first); changed when every other GPU is taken, the status and an
    Event say it will cost an outage while the old pod still serves, and only then is the pod replaced."""
    api = vlms(kube)
    one = {k: v for k, v in SPEC.items() if k != "rollout"} | {"replicas": 1}
    # A 4 s resync: the round that announces the outage and the one that replaces the pod are 4 s apart, time for
    # the test to see the old pod still serving while the warning is up.
    with operator_running(cluster, namespace, tmp_path, "4"):
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "VLMService", "metadata": {"name": NAME}, "spec": one})

        def one_ready(revision: str | None = None) -> bool:
            ps = pods(kube, namespace)
            return len(ps) == 1 and all(any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
                                        and (revision is None or p.metadata.labels.get(LABEL_REVISION) == revision)
                                        for p in ps.values())

        wait_for(one_ready, 120, "1 Ready pod", interval=0.5)
        watcher = ReadyWatch(kube, namespace)
        wait_for(lambda: sum(watcher.ready.values()) == 1, 30, "the watch sees the Ready pod", interval=0.2)
        watcher.arm()
        first = status(kube, namespace)["stableRevision"]
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME, {
            "spec": {"sglang": {"env": [{"name": "CHANGE", "value": "1"}]}}})
        wait_for(lambda: status(kube, namespace).get("rollout") is None and one_ready()
                 and status(kube, namespace).get("stableRevision") != first, 120, "updated", interval=0.5)
        assert watcher.low == 1, f"Ready fell to {watcher.low} with a free GPU"
        assert "UpdateCausesOutage" not in _events(kube, namespace, NAME)
        watcher.stop.set()

        # every other GPU taken: the next change costs an outage, said first
        [(old_name, old)] = pods(kube, namespace).items()
        filler = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "filler"},
                  "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "filler"}},
                           "template": {"metadata": {"labels": {"app": "filler"}},
                                        "spec": {"nodeSelector": {"nvidia.com/gpu.product": PRODUCT},
                                                 "containers": [{"name": "c", "image": "filler", "resources": {
                                                     "limits": {"nvidia.com/gpu": "1"}}}]}}}}
        client.AppsV1Api(kube).create_namespaced_deployment(namespace, filler)
        wait_for(lambda: sum(1 for p in client.CoreV1Api(kube).list_namespaced_pod(namespace, label_selector="app=filler").items
                             if p.spec.node_name) == 3, 60, "3 filler pods placed", interval=0.5)
        second_before = status(kube, namespace)["stableRevision"]
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME, {
            "spec": {"sglang": {"env": [{"name": "CHANGE", "value": "2"}]}}})
        warned = wait_for(lambda: (status(kube, namespace).get("rollout") or {}).get("warning"), 60,
                          "the outage announced in status.rollout.warning", interval=0.05)
        # told while the old pod still serves, unmarked
        still = pods(kube, namespace).get(old_name)
        assert still is not None and not (still.metadata.annotations or {}).get("controller.kubernetes.io/pod-deletion-cost"), warned
        assert "outage" in warned
        wait_for(lambda: "UpdateCausesOutage" in _events(kube, namespace, NAME), 30, "the UpdateCausesOutage Event",
                 interval=0.5)
        wait_for(lambda: status(kube, namespace).get("stableRevision") != second_before and one_ready(), 120,
                 "replaced after the warning", interval=0.5)
        [(_, new)] = pods(kube, namespace).items()
        assert new.spec.node_name == old.spec.node_name  # on the node the old pod left


def test_a_service_made_by_the_previous_release_is_adopted_without_a_restart(cluster, kube, crd, namespace, nodes,
                                                                               tmp_path):
    """The previous release's objects, as it made them: the VLMService with status.stableRevision, and its stable
    Deployment `NAME` (the role in its selector and pod template), its pods Ready. The new operator adopts that
    Deployment as the stable revision's: its spec is not written (same generation), no other Deployment is made,
    and every pod keeps running (same UIDs)."""
    from vlm_operator.api import v1alpha1 as vapi
    from vlm_operator.api.settings import Settings
    from vlm_operator.desired import builders

    spec = {k: v for k, v in SPEC.items() if k != "rollout"} | {"replicas": 2}
    obj = vlms(kube).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "VLMService", "metadata": {"name": NAME}, "spec": spec})
    owner = builders.Owner(NAME, namespace, obj["metadata"]["uid"])
    desired = builders.build_desired(owner, vapi.parse_spec(spec), Settings.from_env())
    template = builders.with_role(desired.template, desired.revision, "stable")
    legacy = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": NAME, "labels": {**builders.common_labels(owner), LABEL_REVISION: desired.revision,
                                              "serving.vlmops.dev/role": "stable"},
                     "ownerReferences": [owner.reference()]},
        "spec": {"replicas": 2, "revisionHistoryLimit": 3,
                 "selector": {"matchLabels": {LABEL_SERVICE: NAME, "serving.vlmops.dev/role": "stable"}},
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                 "template": template},
    }
    apps = client.AppsV1Api(kube)
    apps.create_namespaced_deployment(namespace, legacy)
    vlms(kube).patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, NAME, {
        "status": {"stableRevision": desired.revision, "replicas": 2}})
    wait_for(lambda: len(pods(kube, namespace)) == 2 and all(
        any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
        for p in pods(kube, namespace).values()), 60, "the previous release's 2 pods Ready", interval=0.5)
    uids = {p.metadata.uid for p in pods(kube, namespace).values()}
    generation = apps.read_namespaced_deployment(NAME, namespace).metadata.generation

    with operator_running(cluster, namespace, tmp_path, "1"):
        wait_for(lambda: status(kube, namespace).get("observedGeneration") == 1 and any(
            c["type"] == "Ready" and c["status"] == "True" for c in status(kube, namespace).get("conditions", [])),
            60, "reconciled and Ready", interval=0.5)
        time.sleep(5)  # several resyncs
        st = status(kube, namespace)
        assert st["stableRevision"] == desired.revision and st.get("rollout") is None, dump(st)
        assert {p.metadata.uid for p in pods(kube, namespace).values()} == uids, "a pod was restarted"
        assert apps.read_namespaced_deployment(NAME, namespace).metadata.generation == generation
        names = {d.metadata.name for d in apps.list_namespaced_deployment(namespace).items}
        assert names == {NAME}, names
