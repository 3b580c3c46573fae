"""Node-paired analysis end to end: stand-ins whose speed depends on their node (as a node's CPU, memory and GPU
clocks set a real pod's), four replicas filling both fake GPU nodes, so every canary pod takes a stable pod's GPU
and has the node's other stable pod beside it. An unchanged revision is promoted although the nodes differ by
60%; a slower one is rolled back in its first step, naming the function."""

from __future__ import annotations

import copy
import time

import pytest
from kubernetes import client
from vlm_testing.cluster import gpu_nodes, wait_for
from vlm_testing.e2e import SPEC, create, patch, ready, rollout, wait_phase
from vlm_testing.operator_proc import GROUP, PLURAL, VERSION, dump, get_vlms

NAME = "qwen-pairs"
# Two nodes of this test's own (a GPU product of their own, shaped as the testbed's gpu-node-0/1): tests on other
# xdist workers, whose pods go to gpu-node-0/1, neither take their GPUs nor lose theirs.
SLOW, FAST = "pairs-node-0", "pairs-node-1"
PRODUCT = "NVIDIA-H100-80GB-HBM3-E2E-PAIRS"
FACTOR = 1.6  # every scheduler stage on pairs-node-0 takes 1.6 times as long


@pytest.fixture
def pair_nodes(kube):
    with gpu_nodes(kube, [SLOW, FAST], PRODUCT) as names:
        yield names


def test_an_unchanged_canary_on_a_slow_node_is_promoted_and_a_slower_one_rolled_back_in_step_one(
        kube, namespace, pair_nodes, stack, monkeypatch):
    op, _, pm = stack
    monkeypatch.setenv("STANDIN_NODE_SPEED", f"{SLOW}={FACTOR},{FAST}=1.0")  # read by each stand-in at its start
    spec = copy.deepcopy(SPEC)
    spec.update({"replicas": 4, "gpu": {"count": 4, "product": PRODUCT}})
    spec["rollout"]["steps"] = [{"replicas": 1, "analysis": "40s"}, {"replicas": 2, "analysis": "40s"}]
    spec["rollout"]["analysis"]["maxDuration"] = "3m"
    create(kube, namespace, spec, name=NAME)
    ready(kube, namespace, op, name=NAME, timeout=120)
    pm.wait_mapped(4)
    core = client.CoreV1Api(kube)
    placed = {p.metadata.name: p.spec.node_name for p in core.list_namespaced_pod(namespace).items
              if p.metadata.name.startswith(f"{NAME}-")}
    assert sorted(placed.values()) == sorted([SLOW, SLOW, FAST, FAST]), placed
    # What the service's earlier rollouts would have taught the gate: pods differ by 20%, nearly all of it
    # with the node (a restart on the same node moves a pod by 1.5%). Without it the gate starts at f = 0 and
    # compares with the stable mean until this rollout's own pairs show the restart spread.
    client.CustomObjectsApi(kube).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, NAME,
        {"status": {"calibration": {"podSpread": 20.0, "podDf": 30, "restartSpread": 1.5, "restartDf": 30,
                                    "rollouts": 3}}})
    time.sleep(40)  # ten 4 s windows of pre-period (the gate reads it once, at the rollout's first round)

    patch(kube, namespace, {"sglang": {"env": [{"name": "HARMLESS", "value": "pairs"}]}}, name=NAME)
    deltas: list[float] = []  # loop latency's estimate at each look while analysing

    def done():
        r = rollout(kube, namespace, NAME)
        if r.get("phase") == "Analysing":
            deltas.extend(s["delta"] for s in r.get("signals", []) if s["name"] == "loop_latency" and "delta" in s)
        return r if r.get("phase") in ("Promoted", "RolledBack") else None
    r = wait_for(done, 420, "the unchanged canary's verdict", interval=1.0)
    assert r["phase"] == "Promoted", dump(r)
    assert r["before"] and r["resolvableMargin"]["loopLatency"] > 0, dump(r)
    assert "Concurrent" in r.get("comparison", []), dump(r)  # beside the node's other stable pod
    first = r["pairs"][0]
    assert first["kind"] == "Replace" and first["node"] in (SLOW, FAST), dump(r["pairs"])
    assert deltas and max(abs(d) for d in deltas) < 0.15, deltas  # the nodes differ by 60%; pairs on a node do not
    # The stable mean the first canary pod would have been compared with without pairing: on the slow node it
    # reads 1.6 / ((1.6 + 1 + 1) / 3) - 1 = +33%, beyond the 25% margin; on the fast node -17%.
    status = get_vlms(kube, namespace, NAME).get("status") or {}
    assert status["calibration"]["rollouts"] == 4, dump(status.get("calibration"))

    # The classic regression (the IPC cache off): rolled back in the first step, with one canary pod.
    promoted = r["revision"]
    patch(kube, namespace, {"sglang": {"ipcCache": {"mode": "Off"}}}, name=NAME)
    wait_for(lambda: rollout(kube, namespace, NAME).get("revision") not in (None, promoted), 60, "the next rollout",
             interval=1.0)
    r = wait_phase(kube, namespace, {"RolledBack", "Promoted"}, 300, op, name=NAME)
    assert (r["phase"], r["step"]) == ("RolledBack", 0), dump(r)
    assert r["regressedFunction"], dump(r)
