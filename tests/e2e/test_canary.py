"""Canary gating end to end (issue 5's acceptance): real control plane, operator, Prometheus,
Alertmanager, sidecars with py-spy, and stand-ins that run slower when the IPC cache is off. The cache-off
canary rolled back beside a harmless change promoted is proved once, in test_node_pairs.py (merged there)."""

from __future__ import annotations

import copy
import os
import signal

from kubernetes import client

from vlm_testing.cluster import gpu_nodes, wait_for
from vlm_testing.e2e import (
    NAME,
    SPEC,
    create,
    operator_env,
    patch,
    ready,
    rollout,
    start_services,
    verdicts,
    wait_phase,
)
from vlm_testing.operator_proc import dump


def test_no_spare_gpu_replaces_a_stable_pod_on_its_node_and_promotes(kube, namespace, stack):
    """Two replicas of 8 GPUs fill both fake nodes: the canary pod must take the GPU of one stable pod, on that
    pod's node (a Replace pair), while the other stable pod stays to compare with; a harmless change is then
    promoted (the canary was compared with a stable pod all along: before, this path ran the canary alone and
    this test accepted either verdict), the promotion replaces the last stable pod on its own node, and no pod
    is left Pending. The two nodes are this test's own (a GPU product of their own), so tests on other xdist
    workers, whose pods go to the testbed's gpu-node-0/1, neither take their GPUs nor lose theirs."""
    op, _, pm = stack
    with gpu_nodes(kube, ["fill-node-0", "fill-node-1"], FILL_PRODUCT):
        _fill_both_nodes_and_promote(kube, namespace, op, pm)


FILL_PRODUCT = "NVIDIA-H100-80GB-HBM3-E2E-FILL"


def _fill_both_nodes_and_promote(kube, namespace, op, pm):
    spec = copy.deepcopy(SPEC)
    spec.update({"replicas": 2, "gpu": {"count": 8, "product": FILL_PRODUCT}})
    create(kube, namespace, spec)
    ready(kube, namespace, op)
    pm.wait_mapped(2)
    core = client.CoreV1Api(kube)
    nodes = {p.metadata.name: p.spec.node_name for p in core.list_namespaced_pod(namespace).items}
    patch(kube, namespace, {"sglang": {"env": [{"name": "HARMLESS", "value": "2"}]}})
    r = wait_phase(kube, namespace, {"Analysing", "Promoting", "Promoted", "RolledBack"}, 120, op)
    first = r["pairs"][0]
    assert first["kind"] == "Replace" and nodes[first["replaced"]] == first["node"], dump(r)
    r = wait_phase(kube, namespace, {"Promoted", "RolledBack"}, 240, op)
    assert r["phase"] == "Promoted", dump(r)
    placed = {p.metadata.name: p.spec.node_name for p in core.list_namespaced_pod(namespace).items}
    for pair in r["pairs"]:
        if pair.get("pod") and not pair.get("dropped"):
            assert placed.get(pair["pod"]) == pair["node"], (dump(r["pairs"]), placed)

    def pending():
        return [p.metadata.name for p in core.list_namespaced_pod(namespace).items if p.status.phase == "Pending"]
    wait_for(lambda: not pending(), 90, "no pod Pending after the rollout", interval=2.0)


UNPROVEN = "qwen-unproven"


def test_prometheus_down_never_promotes_and_a_killed_operator_resumes(kube, namespace, stack, make_operator):
    """Side by side, two faults with a known verdict. One service reads its signals from Prometheus, which is
    stopped: the gate applies onInconclusive (Rollback) at maxDuration on unreachable signals and never
    promotes. Another has a cache-off canary; the operator is SIGKILLed after its first analysis, and the
    restarted operator reaches the undisturbed verdict (RolledBack) for both."""
    op, mon, pm = stack
    unproven = copy.deepcopy(SPEC)
    unproven["rollout"]["analysis"]["maxDuration"] = "50s"
    unproven["rollout"]["analysis"]["source"] = "Auto"  # the operator's Prometheus (VLM_PROMETHEUS_URL), stopped below
    start_services(kube, namespace, op, pm, {NAME: SPEC, UNPROVEN: unproven})
    mon.stop_prometheus()
    patch(kube, namespace, {"sglang": {"ipcCache": {"mode": "Off"}}})
    patch(kube, namespace, {"sglang": {"env": [{"name": "HARMLESS", "value": "3"}]}}, name=UNPROVEN)
    wait_for(lambda: rollout(kube, namespace).get("analyses", 0) >= 1, 120, "first analysis", interval=1.0)
    os.kill(op.proc.pid, signal.SIGKILL)
    op.proc.wait(10)
    op2 = make_operator(**operator_env(mon))
    seen: dict[str, set[str]] = {}
    got = verdicts(kube, namespace, [NAME, UNPROVEN], 480, op2, seen=seen)
    assert got[NAME]["phase"] == "RolledBack", dump(got[NAME])
    r = got[UNPROVEN]
    assert r["phase"] == "RolledBack" and "Promoted" not in seen.get(UNPROVEN, set()), dump(r)
    # The gate itself applied onInconclusive (Rollback) at maxDuration, on unreachable signals.
    assert (r["reason"], r.get("verdict")) == ("MaxDurationReached", "Rollback"), dump(r)
    assert "SignalsUnavailable" in r.get("message", ""), dump(r)
