"""Canary gating end to end (issue 5's acceptance): real control plane, operator, Prometheus,
Alertmanager, sidecars with py-spy, and stand-ins that run slower when the IPC cache is off."""

from __future__ import annotations

import copy
import os
import signal
import time

import pytest
from kubernetes import client

from tests.cluster import wait_for
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


def test_cache_off_canary_is_rolled_back_with_the_input_path_named_and_alerted(kube, namespace, stack):
    op, mon, pm = stack
    create(kube, namespace, copy.deepcopy(SPEC))
    ready(kube, namespace, op)
    pm.wait_mapped(1)
    time.sleep(8)  # a few baseline windows in Prometheus
    patch(kube, namespace, {"sglang": {"ipcCache": {"mode": "Off"}}})
    r = wait_phase(kube, namespace, {"RolledBack", "Promoted"}, 240, op)
    assert r["phase"] == "RolledBack", dump(r)
    named = {r.get("regressedStage"), r.get("regressedFunction")}
    assert named & {"process_input_requests", "handle_generate_request", "hash_feature", "reconstruct_on_target_device"}, dump(r)
    assert warnings(kube, namespace, "CanaryRolledBack")
    # The canary Deployment is gone, stable untouched.
    deps = client.AppsV1Api(kube).list_namespaced_deployment(namespace).items
    assert [d.metadata.name for d in deps] == [NAME]
    # The alert reaches Alertmanager, naming the function.
    def alerted():
        return [a for a in mon.alerts() if a["labels"].get("alertname") == "VLMCanaryRolledBack"]
    got = wait_for(alerted, 60, "VLMCanaryRolledBack in Alertmanager", interval=2.0)
    assert got[0]["labels"]["vlmservice"] == NAME and got[0]["labels"]["function"] != "unknown"


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


@pytest.fixture
def shipped_stack(make_operator, monitoring, podmap):
    op = make_operator(**operator_env(monitoring))
    return op, monitoring, podmap


def test_faster_canary_is_promoted(kube, namespace, shipped_stack):
    """The change the operator exists to ship: stable runs with the IPC cache off, the canary turns it on.
    Its loop is faster and process_input_requests shrinks, so every other stage's share grows with its time
    unchanged; a share-based gate held such canaries back or rolled them back."""
    op, _, pm = shipped_stack
    spec = copy.deepcopy(SHIPPED)
    spec["sglang"]["ipcCache"] = {"mode": "Off"}
    create(kube, namespace, spec)
    ready(kube, namespace, op)
    pm.wait_mapped(1)
    time.sleep(8)
    patch(kube, namespace, {"sglang": {"ipcCache": {"mode": "Auto"}}})
    r = wait_phase(kube, namespace, {"Promoted", "RolledBack"}, 420, op)
    assert r["phase"] == "Promoted", dump(r)
    assert r.get("baseline") == "Fresh", dump(r)
    loop = next(s for s in r["signals"] if s["name"] == "loop_latency")
    assert loop["delta"] < 0, dump(r)  # it really was faster
    deps = client.AppsV1Api(kube).list_namespaced_deployment(namespace).items
    assert [d.metadata.name for d in deps] == [NAME]  # canary and fresh baseline gone


def test_ttft_only_regression_is_rolled_back(kube, namespace, shipped_stack):
    """A front-end delay before the first token (the stand-in's --standin-ttft-delay-ms) doubles TTFT and
    leaves the scheduler loop alone: only the request signal, read per window from SGLang's own
    histogram through Prometheus, can catch it."""
    op, _, pm = shipped_stack
    create(kube, namespace, copy.deepcopy(SHIPPED))
    ready(kube, namespace, op)
    pm.wait_mapped(1)
    time.sleep(8)
    patch(kube, namespace, {"sglang": {"args": ["--standin-ttft-delay-ms", "400"]}})
    r = wait_phase(kube, namespace, {"Promoted", "RolledBack"}, 420, op)
    assert (r["phase"], r["reason"]) == ("RolledBack", "TTFTRegressed"), dump(r)
    loop = next(s for s in r["signals"] if s["name"] == "loop_latency")
    assert abs(loop["delta"]) < 0.25, dump(r)  # the loop did not regress beyond its margin


def test_harmless_change_is_promoted(kube, namespace, stack):
    op, _, pm = stack
    create(kube, namespace, copy.deepcopy(SPEC))
    ready(kube, namespace, op)
    pm.wait_mapped(1)
    time.sleep(8)
    before = get_vlms(kube, namespace, NAME)["status"]["stableRevision"]
    patch(kube, namespace, {"sglang": {"env": [{"name": "HARMLESS", "value": "1"}]}})
    seen: set[str] = set()
    r = wait_phase(kube, namespace, {"Promoted", "RolledBack"}, 240, op, seen=seen)
    assert r["phase"] == "Promoted", dump(r)
    st = get_vlms(kube, namespace, NAME)["status"]
    assert st["stableRevision"] != before and st["stableRevision"] == r["revision"]
    deps = client.AppsV1Api(kube).list_namespaced_deployment(namespace).items
    assert [d.metadata.name for d in deps] == [NAME]


def test_no_spare_gpu_borrows_and_finishes(kube, namespace, stack):
    """Two replicas of 8 GPUs fill both fake nodes: the canary must borrow a stable replica."""
    op, _, pm = stack
    spec = copy.deepcopy(SPEC)
    spec.update({"replicas": 2, "gpu": {"count": 8}})
    create(kube, namespace, spec)
    ready(kube, namespace, op)
    pm.wait_mapped(2)
    patch(kube, namespace, {"sglang": {"env": [{"name": "HARMLESS", "value": "2"}]}})
    r = wait_phase(kube, namespace, {"Progressing", "Analysing", "Promoted", "RolledBack"}, 60, op)
    assert r["capacity"] == "Borrow", dump(r)
    r = wait_phase(kube, namespace, {"Promoted", "RolledBack"}, 240, op)
    # After the verdict the stable Deployment rolls: its new pods wait for the GPUs of terminating ones
    # for a moment. What must not happen is a pod that stays Pending.
    def pending():
        pods = client.CoreV1Api(kube).list_namespaced_pod(namespace).items
        return [p.metadata.name for p in pods if p.status.phase == "Pending"]
    wait_for(lambda: not pending(), 90, "no pod Pending after the rollout", interval=2.0)


def test_prometheus_down_is_inconclusive_never_promoted(kube, namespace, stack):
    op, mon, pm = stack
    spec = copy.deepcopy(SPEC)
    spec["rollout"]["analysis"]["maxDuration"] = "50s"
    spec["rollout"]["analysis"]["source"] = "Auto"  # the operator's Prometheus (VLM_PROMETHEUS_URL), stopped below
    create(kube, namespace, spec)
    ready(kube, namespace, op)
    pm.wait_mapped(1)
    mon.stop_prometheus()
    patch(kube, namespace, {"sglang": {"env": [{"name": "HARMLESS", "value": "3"}]}})
    seen: set[str] = set()
    r = wait_phase(kube, namespace, {"Promoted", "RolledBack"}, 180, op, seen=seen)
    assert r["phase"] == "RolledBack" and "Promoted" not in seen, dump(r)
    # The gate itself applied onInconclusive (Rollback) at maxDuration, on unreachable signals.
    assert (r["reason"], r.get("verdict")) == ("MaxDurationReached", "Rollback"), dump(r)
    assert "SignalsUnavailable" in r.get("message", ""), dump(r)


def test_operator_killed_mid_analysis_resumes_to_the_same_verdict(kube, namespace, stack, make_operator):
    op, mon, pm = stack
    create(kube, namespace, copy.deepcopy(SPEC))
    ready(kube, namespace, op)
    pm.wait_mapped(1)
    time.sleep(8)
    patch(kube, namespace, {"sglang": {"ipcCache": {"mode": "Off"}}})
    wait_for(lambda: rollout(kube, namespace).get("analyses", 0) >= 1, 120, "first analysis", interval=1.0)
    os.kill(op.proc.pid, signal.SIGKILL)
    op.proc.wait(10)
    op2 = make_operator(**operator_env(mon))
    r = wait_phase(kube, namespace, {"RolledBack", "Promoted"}, 240, op2)
    assert r["phase"] == "RolledBack", dump(r)
