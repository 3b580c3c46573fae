"""Canary gating end to end (issue 5's acceptance): real control plane, operator, Prometheus,
Alertmanager, sidecars with py-spy, and stand-ins that run slower when the IPC cache is off."""

from __future__ import annotations

import copy
import os
import signal
import time

import pytest
from kubernetes import client

from tests.cluster import gpu_nodes, wait_for
from tests.e2e.conftest import operator_env
from tests.operator_proc import GROUP, PLURAL, VERSION, dump, get_vlms, vlms

NAME = "qwen-e2e"
# Small and quick: one stable replica, one canary replica, short windows, short steps. The
# stand-in's cache-off cost makes process_input_requests grow by well over the 5-point margin.
# The gate reads the sidecars: Prometheus scrapes at the PodMonitor's 15 s (the generated configuration),
# which sees one of these 4 s windows in four, too few for these short steps; the Prometheus source is
# exercised at the shipped cadence (SHIPPED below, and tests/e2e/test_monitoring.py, which checks that it
# reads the sidecar source's windows and verdict).
SPEC = {
    "model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"},
    "replicas": 1,
    "sglang": {"image": "lmsysorg/sglang:v0.5.23"},
    "telemetry": {"interval": "4s", "duration": "3s", "rate": 250},
    "rollout": {
        "capacity": "Auto",
        "steps": [{"replicas": 1, "analysis": "40s"}],
        "analysis": {
            "source": "Sidecar",
            "interval": "8s",
            "minSamples": 4,
            "maxDuration": "4m",
            "confidence": 0.95,
            "maxRegression": {"loopLatency": 25, "stageTime": 4, "ttft": 50, "itl": 50, "throughput": 50},
        },
    },
}


def create(kube, namespace, spec, name=NAME):
    vlms(kube).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL,
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLMService", "metadata": {"name": name}, "spec": spec},
    )


def patch(kube, namespace, spec_patch, name=NAME):
    vlms(kube).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": spec_patch})


def rollout(kube, namespace, name=NAME):
    return (get_vlms(kube, namespace, name).get("status") or {}).get("rollout") or {}


def wait_phase(kube, namespace, phases, timeout, op, name=NAME, seen=None):
    def check():
        r = rollout(kube, namespace, name)
        if seen is not None and r.get("phase"):
            seen.add(r["phase"])
        return r if r.get("phase") in phases else None
    try:
        return wait_for(check, timeout, f"rollout phase in {phases}", interval=1.0)
    except AssertionError:
        st = get_vlms(kube, namespace, name).get("status")
        raise AssertionError(f"phase {phases} not reached:\n{dump(st)}\noperator:\n{op.log_tail(40)}") from None


def ready(kube, namespace, op, name=NAME, timeout=90):
    def check():
        st = get_vlms(kube, namespace, name).get("status") or {}
        return any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions", []))
    wait_for(check, timeout, "Ready", interval=1.0)


def warnings(kube, namespace, reason, name=NAME):
    evs = client.CoreV1Api(kube).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return [e for e in evs if e.type == "Warning" and e.reason == reason]


@pytest.fixture
def stack(make_operator, monitoring, podmap):
    """The operator on the e2e monitoring (conftest: Prometheus on the Prometheus Operator's generated
    configuration, so the PodMonitor's 15 s scrape), with the short windows of SPEC."""
    op = make_operator(**operator_env(monitoring))
    return op, monitoring, podmap


def verdicts(kube, namespace, names, timeout, op, seen=None):
    """Wait until every named service's rollout has a verdict; {name: rollout}. Scenarios in one test run
    side by side (one operator, one namespace), which is how a fleet runs and keeps the tier short."""
    final = {"RolledBack", "Promoted"}
    got: dict[str, dict] = {}

    def check():
        for n in names:
            if n not in got:
                r = rollout(kube, namespace, n)
                if seen is not None and r.get("phase"):
                    seen.setdefault(n, set()).add(r["phase"])
                if r.get("phase") in final:
                    got[n] = r
        return len(got) == len(names)
    try:
        wait_for(check, timeout, f"verdicts for {names}", interval=1.0)
    except AssertionError:
        rest = {n: (get_vlms(kube, namespace, n).get("status") or {}) for n in names if n not in got}
        raise AssertionError(f"no verdict for {sorted(rest)}:\n{dump(rest)}\noperator:\n{op.log_tail(40)}") from None
    return got


def start_services(kube, namespace, op, pm, specs: dict[str, dict], settle_s: float = 8.0) -> None:
    """Create each service, wait until all are Ready with their stable pods mapped, let a few baseline windows
    pass."""
    for n, spec in specs.items():
        create(kube, namespace, copy.deepcopy(spec), name=n)
    for n in specs:
        ready(kube, namespace, op, name=n)
    pm.wait_mapped(sum(spec.get("replicas", 1) for spec in specs.values()))
    time.sleep(settle_s)


HARMLESS = "qwen-harmless"


def test_cache_off_rolled_back_and_harmless_change_promoted(kube, namespace, stack):
    """Side by side: a canary with the IPC cache off is rolled back, its input path named and alerted; a
    harmless change to another service is promoted."""
    op, mon, pm = stack
    start_services(kube, namespace, op, pm, {NAME: SPEC, HARMLESS: SPEC})
    before = get_vlms(kube, namespace, HARMLESS)["status"]["stableRevision"]
    patch(kube, namespace, {"sglang": {"ipcCache": {"mode": "Off"}}})
    patch(kube, namespace, {"sglang": {"env": [{"name": "HARMLESS", "value": "1"}]}}, name=HARMLESS)
    got = verdicts(kube, namespace, [NAME, HARMLESS], 480, op)  # one pod a side: a verdict may take maxDuration (4m)

    r = got[NAME]
    assert r["phase"] == "RolledBack", dump(r)
    named = {r.get("regressedStage"), r.get("regressedFunction")}
    assert named & {"process_input_requests", "handle_generate_request", "hash_feature", "reconstruct_on_target_device"}, dump(r)
    # The rollout's Events follow its status write (an operator stopped in between never posts them twice).
    wait_for(lambda: warnings(kube, namespace, "CanaryRolledBack"), 30, "the CanaryRolledBack Event", interval=0.5)

    h = got[HARMLESS]
    assert h["phase"] == "Promoted", dump(h)
    st = get_vlms(kube, namespace, HARMLESS)["status"]
    assert st["stableRevision"] != before and st["stableRevision"] == h["revision"]
    assert not warnings(kube, namespace, "CanaryRolledBack", name=HARMLESS)

    # One Deployment per service left, its stable revision's (the refused canary's and the fresh baseline's gone;
    # the promoted canary's kept: its pods were never restarted).
    def deployments():
        return sorted(d.metadata.name for d in client.AppsV1Api(kube).list_namespaced_deployment(namespace).items)
    stables = sorted(f"{n}-{get_vlms(kube, namespace, n)['status']['stableRevision']}" for n in (NAME, HARMLESS))
    wait_for(lambda: deployments() == stables, 60, f"only the stable Deployments {stables}", interval=1.0)

    # The alert reaches Alertmanager, naming the function, for the rolled-back service only.
    def alerted():
        return [a for a in mon.alerts() if a["labels"].get("alertname") == "VLMCanaryRolledBack"]
    got_alerts = wait_for(alerted, 60, "VLMCanaryRolledBack in Alertmanager", interval=2.0)
    assert {a["labels"]["vlmservice"] for a in got_alerts} == {NAME}, got_alerts
    assert got_alerts[0]["labels"]["function"] != "unknown"


# The shipped cadence: the PodMonitor's 15 s scrape and the default telemetry (5 s windows every 15 s);
# only the analysis is shortened (15 s looks, a 90 s step, at most 6 minutes).
SHIPPED = {
    **{k: v for k, v in SPEC.items() if k not in ("telemetry", "rollout")},  # telemetry: the defaults
    "rollout": {
        "steps": [{"replicas": 1, "analysis": "90s"}],
        "analysis": {"interval": "15s", "minSamples": 5, "maxDuration": "6m",
                     "maxRegression": {"loopLatency": 25, "stageTime": 4, "ttft": 20, "itl": 50, "throughput": 50}},
    },
}


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
