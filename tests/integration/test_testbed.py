"""Acceptance tests of the local control plane: the behaviours the operator relies on, for real.

Each test exercises a component that a fake API server would not have: the controller-manager
(Deployments, garbage collection, namespace deletion), the scheduler (GPU capacity), kwok (pods
Running and Ready on fake H100 nodes), RBAC with service-account tokens, and CEL validation; and the
pod network of the testbed's network namespace (pod IPs that are real addresses, reached directly
and through the API server's pod proxy, with nothing but lo in the namespace).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import time
import urllib.request

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from vlm_testing.cluster import TESTBED, Cluster, gpu_nodes, home_network, netns, wait_for
from vlm_testing.jsonhttp import serve_json

H100 = "NVIDIA-H100-80GB-HBM3"
FAKE_NODES = {"gpu-node-0", "gpu-node-1"}


def _gpu_pod_spec(gpus: int) -> dict:
    return {
        "nodeSelector": {"nvidia.com/gpu.product": H100},
        "containers": [
            {
                "name": "server",
                "image": "lmsysorg/sglang:v0.5.10",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }
        ],
    }


def _is_ready(pod: client.V1Pod) -> bool:
    conds = pod.status.conditions or []
    return pod.status.phase == "Running" and any(c.type == "Ready" and c.status == "True" for c in conds)


def _gone(read) -> bool:
    try:
        read()
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def test_deployment_gets_replicaset_and_ready_pods_on_fake_h100(kube, namespace):
    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    labels = {"app": "vlm"}
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "vlm"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": _gpu_pod_spec(1)},
            },
        },
    )

    def owned_replicasets():
        return [
            rs
            for rs in apps.list_namespaced_replica_set(namespace).items
            if any(o.kind == "Deployment" and o.name == "vlm" for o in rs.metadata.owner_references or [])
        ]

    (rs,) = wait_for(owned_replicasets, 30, "a ReplicaSet owned by Deployment vlm")

    def ready_pods():
        pods = core.list_namespaced_pod(namespace, label_selector="app=vlm").items
        ready = [p for p in pods if _is_ready(p)]
        return ready if len(ready) == 2 else None

    pods = wait_for(ready_pods, 60, "2 Running and Ready pods of Deployment vlm")
    for pod in pods:
        assert pod.spec.node_name in FAKE_NODES
        assert [o.uid for o in pod.metadata.owner_references] == [rs.metadata.uid]
        node = core.read_node(pod.spec.node_name)
        assert node.metadata.labels["nvidia.com/gpu.product"] == H100
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
    wait_for(
        lambda: apps.read_namespaced_deployment("vlm", namespace).status.available_replicas == 2,
        30,
        "Deployment vlm to report 2 available replicas",
    )


def test_pod_asking_for_nine_gpus_stays_pending_unschedulable(kube, namespace):
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(namespace, {"metadata": {"name": "too-big"}, "spec": _gpu_pod_spec(9)})

    def unschedulable():
        pod = core.read_namespaced_pod("too-big", namespace)
        return next(
            (c for c in pod.status.conditions or [] if c.type == "PodScheduled" and c.status == "False"), None
        )

    cond = wait_for(unschedulable, 30, "PodScheduled=False on pod too-big")
    assert cond.reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in cond.message
    time.sleep(2)  # a later retry by the scheduler must not place it either
    pod = core.read_namespaced_pod("too-big", namespace)
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None


def test_a_tests_own_gpu_node_takes_only_pods_that_tolerate_the_gpu_taint(kube, namespace):
    """A test's own fake GPU nodes (`gpu_nodes`) carry the GPU taint: a plain pod (an Alertmanager, an operator
    pod) is never put there, to be deleted with the node when that test ends; the operator's pods, which tolerate
    it, are."""
    core = client.CoreV1Api(kube)
    with gpu_nodes(kube, ["taint-node-0"], "NVIDIA-H100-80GB-HBM3-TAINT"):
        base = {"nodeSelector": {"kubernetes.io/hostname": "taint-node-0"},
                "containers": [{"name": "c", "image": "quay.io/prometheus/alertmanager:e2e"}]}
        core.create_namespaced_pod(namespace, {"metadata": {"name": "plain"}, "spec": base})
        tolerant = {**base, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
        core.create_namespaced_pod(namespace, {"metadata": {"name": "tolerant"}, "spec": tolerant})
        wait_for(lambda: core.read_namespaced_pod("tolerant", namespace).spec.node_name == "taint-node-0", 30,
                 "the tolerating pod on taint-node-0", interval=0.5)
        cond = wait_for(lambda: next((c for c in core.read_namespaced_pod("plain", namespace).status.conditions or []
                                      if c.type == "PodScheduled" and c.status == "False"), None), 30,
                        "PodScheduled=False on the plain pod", interval=0.5)
        assert "1 node(s) had untolerated taint" in cond.message, cond.message
        taints = core.read_node("taint-node-0").spec.taints
        assert [(t.key, t.value, t.effect) for t in taints] == [("nvidia.com/gpu", "present", "NoSchedule")], taints
        assert core.read_namespaced_pod("plain", namespace).spec.node_name is None


def test_deleting_owner_garbage_collects_dependents(kube, namespace):
    core = client.CoreV1Api(kube)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "child", "ownerReferences": [ref]}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "child", "ownerReferences": [ref]}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "bystander"}})

    core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")

    wait_for(
        lambda: _gone(lambda: core.read_namespaced_config_map("child", namespace)),
        30,
        "the garbage collector to delete ConfigMap child",
    )
    wait_for(
        lambda: _gone(lambda: core.read_namespaced_secret("child", namespace)),
        30,
        "the garbage collector to delete Secret child",
    )
    assert core.read_namespaced_config_map("bystander", namespace).metadata.name == "bystander"


def test_foreground_deletion_of_deployment_removes_replicaset_and_pods(kube, namespace):
    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    labels = {"app": "doomed"}
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "doomed"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": _gpu_pod_spec(1)},
            },
        },
    )
    wait_for(
        lambda: [p for p in core.list_namespaced_pod(namespace).items if _is_ready(p)],
        60,
        "a Ready pod of Deployment doomed",
    )

    apps.delete_namespaced_deployment("doomed", namespace, propagation_policy="Foreground")

    # Foreground: the Deployment itself is only removed after its ReplicaSet and pods are.
    wait_for(
        lambda: _gone(lambda: apps.read_namespaced_deployment("doomed", namespace)),
        60,
        "Deployment doomed to be deleted in the foreground",
    )
    assert apps.list_namespaced_replica_set(namespace).items == []
    assert core.list_namespaced_pod(namespace).items == []


def test_deleting_a_namespace_finishes(kube):
    core = client.CoreV1Api(kube)
    ns = core.create_namespace({"metadata": {"generateName": "t-doomed-ns-"}}).metadata.name
    wait_for(
        lambda: core.read_namespaced_service_account("default", ns),
        30,
        f"ServiceAccount {ns}/default",
        ignore=(ApiException,),
    )
    core.create_namespaced_config_map(ns, {"metadata": {"name": "data"}})
    core.create_namespaced_pod(ns, {"metadata": {"name": "runner"}, "spec": _gpu_pod_spec(1)})
    wait_for(lambda: _is_ready(core.read_namespaced_pod("runner", ns)), 60, f"pod {ns}/runner Ready")

    core.delete_namespace(ns)

    # The namespace controller must first delete the pod, which kwok finalises; until then the
    # namespace shows Terminating (reading it already gone would also be a finished deletion).
    try:
        assert core.read_namespace(ns).status.phase == "Terminating"
    except ApiException as e:
        assert e.status == 404
    wait_for(lambda: _gone(lambda: core.read_namespace(ns)), 90, f"namespace {ns} to finish deleting")


def _client_with_token(admin: client.ApiClient, token: str) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = admin.configuration.host
    cfg.ssl_ca_cert = admin.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


def test_unprivileged_service_account_is_denied_by_rbac(kube, namespace):
    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "nobody"}})
    token = core.create_namespaced_service_account_token(
        "nobody", namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token

    with _client_with_token(kube, token) as sa_api:
        sa_core = client.CoreV1Api(sa_api)
        with pytest.raises(ApiException) as denied:
            sa_core.list_namespaced_secret(namespace)
        assert denied.value.status == 403
        assert f"system:serviceaccount:{namespace}:nobody" in denied.value.body

        # Granting exactly one verb lets that request through and nothing else, so the 403 above
        # came from RBAC and not from a token the API server failed to authenticate (401).
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "list-pods"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "nobody-list-pods"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "list-pods"},
                "subjects": [{"kind": "ServiceAccount", "name": "nobody", "namespace": namespace}],
            },
        )
        wait_for(
            lambda: sa_core.list_namespaced_pod(namespace).items == [],
            15,
            "the RoleBinding to let nobody list pods",
            ignore=(ApiException,),
        )
        with pytest.raises(ApiException) as still_denied:
            sa_core.list_namespaced_secret(namespace)
        assert still_denied.value.status == 403


def _cel_crd(group: str) -> dict:
    spec_schema = {
        "type": "object",
        "required": ["minReplicas", "maxReplicas"],
        "properties": {"minReplicas": {"type": "integer"}, "maxReplicas": {"type": "integer"}},
        "x-kubernetes-validations": [
            {
                "rule": "self.minReplicas <= self.maxReplicas",
                "message": "minReplicas must not exceed maxReplicas",
            }
        ],
    }
    return {
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec_schema}}},
                }
            ],
        },
    }


def test_crd_cel_rule_rejects_bad_object(kube, namespace):
    ext, custom = client.ApiextensionsV1Api(kube), client.CustomObjectsApi(kube)
    group = f"{namespace}.testbed.vlm.dev"  # unique per test: CRDs are cluster-scoped
    ext.create_custom_resource_definition(_cel_crd(group))
    try:
        wait_for(
            lambda: any(
                c.type == "Established" and c.status == "True"
                for c in ext.read_custom_resource_definition(f"widgets.{group}").status.conditions or []
            ),
            30,
            f"CRD widgets.{group} Established",
        )

        def create(name: str, lo: int, hi: int) -> dict:
            return custom.create_namespaced_custom_object(
                group,
                "v1",
                namespace,
                "widgets",
                {
                    "apiVersion": f"{group}/v1",
                    "kind": "Widget",
                    "metadata": {"name": name},
                    "spec": {"minReplicas": lo, "maxReplicas": hi},
                },
            )

        # Established can precede the resource handler by a moment: retry the good object on 404.
        good = wait_for(
            lambda: create("good", 1, 3), 15, "Widget good to be accepted", ignore=(ApiException,)
        )
        assert good["spec"] == {"minReplicas": 1, "maxReplicas": 3}
        with pytest.raises(ApiException) as rejected:
            create("bad", 5, 2)
        assert rejected.value.status == 422
        assert "minReplicas must not exceed maxReplicas" in rejected.value.body
        assert _gone(lambda: custom.get_namespaced_custom_object(group, "v1", namespace, "widgets", "bad"))
    finally:
        ext.delete_custom_resource_definition(f"widgets.{group}")


def test_kubectl_helper_talks_to_the_testbed(cluster: Cluster, kubectl):
    nodes = kubectl("get", "nodes", "-l", f"nvidia.com/gpu.product={H100}", "-o", "name").split()
    assert sorted(nodes) == sorted(f"node/{n}" for n in FAKE_NODES)
    assert kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}") == "admin"


def _needs_pod_network(cluster: Cluster) -> None:
    if not cluster.pod_network:
        pytest.skip("testbed without its network namespace (VLM_TESTBED_NETNS=0): no pod network")


def test_pod_ip_is_an_address_reached_directly_and_through_the_api_server_proxy(cluster, kube, namespace):
    """The path a cluster takes: kwok's pod IP from the testbed's CIDR, a server listening on it, and the
    API server's pod proxy dialling that IP (what `kubectl vlm profile` uses)."""
    _needs_pod_network(cluster)
    core = client.CoreV1Api(kube)
    spec = _gpu_pod_spec(1)
    spec["containers"][0]["ports"] = [{"containerPort": 9400, "name": "profiler"}]
    core.create_namespaced_pod(namespace, {"metadata": {"name": "web"}, "spec": spec})
    pod = wait_for(lambda: (p := core.read_namespaced_pod("web", namespace)).status.pod_ip and p, 60, "a pod IP")
    ip = pod.status.pod_ip
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(cluster.pod_cidr), ip

    def hello(path: str, peer: str) -> tuple[int, dict]:
        return 200, {"path": path, "peer": peer}

    with serve_json(hello, ip, 9400):
        with urllib.request.urlopen(f"http://{ip}:9400/direct", timeout=5) as r:
            assert json.loads(r.read())["path"] == "/direct"
        out = cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{namespace}/pods/web:9400/proxy/windows.json")
        assert json.loads(out)["path"] == "/windows.json", out
    # Nothing listens there now: refused at once, as a pod whose sidecar is down.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((ip, 9400), timeout=5).close()


def test_everything_runs_in_the_namespace_with_only_lo_and_the_api_is_bridged_out(cluster):
    _needs_pod_network(cluster)
    ino = netns.inode(cluster.netns)
    assert ino is not None and netns.inside(cluster.netns)  # pytest's main thread, put there by `cluster`
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"):
        pid = int((cluster.run_dir / "pids" / f"{name}.pid").read_text())
        assert netns.pid_inode(pid) == ino, name
    # Only lo: no veth, no route out; the pod CIDR is local on lo.
    assert [n for _, n in socket.if_nameindex()] == ["lo"]
    routes = subprocess.run(["ip", "route", "show", "table", "local"], capture_output=True, text=True).stdout
    assert f"local {cluster.pod_cidr} dev lo" in routes, routes
    with pytest.raises(OSError):
        socket.create_connection(("192.0.2.1", 80), timeout=2).close()  # TEST-NET-1: unreachable, no route
    # From the namespace the session started in, kubectl reaches the API server through the bridge.
    with home_network():
        assert not netns.inside(cluster.netns)
        assert cluster.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}") == "admin"
        env = {**os.environ, "VLM_TESTBED_DIR": str(cluster.run_dir)}
        status = subprocess.run([str(TESTBED), "status"], capture_output=True, text=True, env=env, timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"netns                    ok    {cluster.netns}" in status.stdout
