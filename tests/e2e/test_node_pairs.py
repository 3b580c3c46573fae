"""Node-paired analysis end to end, a service's first rollout at the shipped margins: stand-ins whose speed depends
on their node (as a node's CPU, memory and GPU clocks set a real pod's), four replicas filling both fake GPU nodes,
so every canary pod takes a stable pod's GPU and has the node's other stable pod beside it. No calibration is
seeded: the gate learns how much of the spread is the node's from the stable pods that share a node. An unchanged
revision is promoted on evidence although the nodes differ by 5%, with Ready pods never below replicas -
maxUnavailable; the IPC cache switched off (the input path slower) is rolled back in its first step on evidence,
naming the stage and the function it slowed, with its Event, the stable revision kept. (This scenario also
stands for the parallel pass's former cache-off/harmless pair in test_canary.py, merged here.)"""

from __future__ import annotations

import copy
import threading
import time

import pytest
from kubernetes import client

from vlm_testing.cluster import gpu_nodes, wait_for
from vlm_testing.e2e import SPEC, create, patch, ready, rollout, wait_phase, warnings
from vlm_testing.operator_proc import dump, get_vlms

NAME = "qwen-pairs"
# Two nodes of this test's own (a GPU product of their own, shaped as the testbed's gpu-node-0/1): tests on other
# xdist workers, whose pods go to gpu-node-0/1, neither take their GPUs nor lose theirs.
SLOW, FAST = "pairs-node-0", "pairs-node-1"
PRODUCT = "NVIDIA-H100-80GB-HBM3-E2E-PAIRS"
FACTOR = 1.05  # every scheduler stage on pairs-node-0 takes 5% longer: same-SKU nodes differ by a few percent
SHIPPED_MARGINS = {"loopLatency": 3, "stageTime": 5, "ttft": 10, "itl": 10, "throughput": 5}


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
    spec["rollout"]["analysis"]["maxRegression"] = SHIPPED_MARGINS
    create(kube, namespace, spec, name=NAME)
    ready(kube, namespace, op, name=NAME, timeout=120)
    pm.wait_mapped(4)
    core = client.CoreV1Api(kube)
    placed = {p.metadata.name: p.spec.node_name for p in core.list_namespaced_pod(namespace).items
              if p.metadata.name.startswith(f"{NAME}-")}
    assert sorted(placed.values()) == sorted([SLOW, SLOW, FAST, FAST]), placed
    time.sleep(40)  # ten 4 s windows of pre-period (the gate reads it once, at the rollout's first round)

    floor: list[int] = []  # Ready serving pods, sampled through the rollouts
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                pods = core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/managed-by=vlm-operator")
                floor.append(sum(1 for p in pods.items if p.metadata.name.startswith(f"{NAME}-")
                                 and not p.metadata.deletion_timestamp
                                 and any(c.type == "Ready" and c.status == "True"
                                         for c in (p.status.conditions or []))))
            except Exception:
                pass
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    patch(kube, namespace, {"sglang": {"env": [{"name": "HARMLESS", "value": "pairs"}]}}, name=NAME)
    deltas: list[float] = []  # loop latency's estimate at each look while analysing

    def done():
        r = rollout(kube, namespace, NAME)
        if r.get("phase") == "Analysing":
            deltas.extend(s["delta"] for s in r.get("signals", []) if s["name"] == "loop_latency" and "delta" in s)
        return r if r.get("phase") in ("Promoted", "RolledBack") else None
    r = wait_for(done, 420, "the unchanged canary's verdict", interval=1.0)
    assert r["phase"] == "Promoted", dump(r)
    by = [d["decidedBy"] for d in r.get("decisions", [])]
    assert len(by) == 2 and "timeout" not in by, dump(r)  # both steps decided by evidence or the ceiling
    assert r["before"] and r["resolvableMargin"]["loopLatency"] > 0, dump(r)
    assert r.get("comparison"), dump(r)  # how the pods were compared (the smallest variance the gate knows)
    first = r["pairs"][0]
    assert first["kind"] == "Replace" and first["node"] in (SLOW, FAST), dump(r["pairs"])
    assert deltas, r  # looks while analysing recorded loop latency's estimate
    assert r["decisions"][-1]["reason"] == "NoRegression", dump(r)  # the last step: every promotion bound inside
    status = get_vlms(kube, namespace, NAME).get("status") or {}
    assert status["calibration"]["rollouts"] == 1, dump(status.get("calibration"))  # a first rollout
    # What it learned about the node's share on its own: the stable pods sharing a node, the rollout's pairs.
    assert status["calibration"]["restartDf"] >= 2, dump(status.get("calibration"))

    assert status["stableRevision"] == r["revision"], dump(status)  # promoted: the new revision is the stable one
    assert not warnings(kube, namespace, "CanaryRolledBack", name=NAME)

    # The classic regression (the IPC cache off): rolled back in the first step, with one canary pod.
    promoted = r["revision"]
    patch(kube, namespace, {"sglang": {"ipcCache": {"mode": "Off"}}}, name=NAME)
    wait_for(lambda: rollout(kube, namespace, NAME).get("revision") not in (None, promoted), 60, "the next rollout",
             interval=1.0)
    r = wait_phase(kube, namespace, {"RolledBack", "Promoted"}, 300, op, name=NAME)
    stop.set()
    sampler.join(5)
    assert (r["phase"], r["step"]) == ("RolledBack", 0), dump(r)
    assert r["decisions"][-1]["decidedBy"] == "evidence", dump(r)
    # Named: the stage that calls the slowed code (process_input_requests) and, under it, the function that grew
    # most (the feature's reconstruct, re-opening its IPC handle), not the watched hash_feature beside it.
    assert r["regressedStage"] == "process_input_requests", dump(r)
    assert "reconstruct" in r["regressedFunction"], dump(r)
    # The rollout's Events follow its status write (an operator stopped in between never posts them twice).
    wait_for(lambda: warnings(kube, namespace, "CanaryRolledBack", name=NAME), 30, "the CanaryRolledBack Event",
             interval=0.5)
    assert get_vlms(kube, namespace, NAME)["status"]["stableRevision"] == promoted
    assert floor and min(floor) >= 4 - 1, floor  # replicas - maxUnavailable (1), through both rollouts
