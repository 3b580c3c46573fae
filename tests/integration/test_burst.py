"""A burst of new services through the real operator: more services wait for their first reconcile than it
has handler threads (here one thread and six services, all there before it starts). Each service gets all its
objects in its first pass, its NetworkPolicy before its Deployment (no pod runs without it) and its Service
after; the resync is far off, so no later pass can have made them."""

from __future__ import annotations

import copy

from kubernetes import client

from vlm_testing.cluster import wait_for
from vlm_testing.integration import EXAMPLES, create
from vlm_testing.operator_proc import run_operator

COUNT = 6


def test_a_burst_gets_every_object_of_a_service_in_its_first_pass(cluster, kube, crd, namespace, tmp_path):
    names = [f"burst-{i}" for i in range(COUNT)]
    for name in names:
        doc = copy.deepcopy(EXAMPLES["qwen2.5-vl-3b"])
        doc["metadata"]["name"] = name
        create(kube, namespace, doc)
    apps, core, net = client.AppsV1Api(kube), client.CoreV1Api(kube), client.NetworkingV1Api(kube)

    def present(lister) -> set[str]:
        return {o.metadata.name for o in lister(namespace).items} & set(names)

    def deployed() -> set[str]:
        """The services that have a Deployment (named by its revision: `NAME-REVISION`)."""
        return {(d.metadata.labels or {}).get("serving.vlmops.dev/vlmservice")
                for d in apps.list_namespaced_deployment(namespace).items} & set(names)

    gen = run_operator(cluster.kubeconfig, namespace, tmp_path, VLM_HANDLER_THREADS="1", VLM_RESYNC_SECONDS="600")
    next(gen)
    try:
        wait_for(lambda: deployed() == set(names), 60,
                 f"the {COUNT} Deployments", interval=0.1)
        policies = present(net.list_namespaced_network_policy)
        assert policies == set(names), f"Deployments without their NetworkPolicy: {set(names) - policies}"
        # The last service's Service follows its Deployment in the same pass, milliseconds later.
        wait_for(lambda: present(core.list_namespaced_service) == set(names), 20,
                 "every Service, from its service's first pass (the resync is 600 s away)")
        svc = core.read_namespaced_service(names[0], namespace)
        assert svc.spec.selector == {"serving.vlmops.dev/vlmservice": names[0]}
    finally:
        next(gen, None)
