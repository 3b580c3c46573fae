"""The load hook end to end: services whose stand-ins get no traffic of their own (`--standin-request-rate=0`, a
staging service nobody calls). With `spec.rollout.load` the operator runs a Job (its pod run here as a local
process by testing/vlm_testing/standin/podmap.JobPods: `python -m vlm_operator.jobs.loadgen`) that posts chat completions with
images to the canary and the stable pod at one rate; the stand-ins turn them into scheduler work, the gate gets
windows with traffic and promotes the unchanged canary; the Job is gone after the verdict. Without the hook the
step waits (NoTraffic, with advice) and pauses at maxDuration: it is never rolled back."""

from __future__ import annotations

import copy
import json

import pytest
from kubernetes import client

from vlm_testing.cluster import wait_for
from vlm_testing.e2e import SPEC, create, patch, ready, rollout, warnings
from vlm_testing.operator_proc import dump
from vlm_testing.standin.podmap import JobPods

LOADED, IDLE = "qwen-loaded", "qwen-idle"
LOAD = {"requestsPerSecond": 5, "imageFraction": 0.5, "imageSize": 64, "maxTokens": 8}


@pytest.fixture
def jobpods(kube, namespace, tmp_path, pod_network):
    j = JobPods(kube, namespace, tmp_path / "jobs").start()
    yield j
    j.stop()


def idle_spec(load: dict | None, max_duration: str) -> dict:
    spec = copy.deepcopy(SPEC)
    # no traffic of its own, and a scheduler that sleeps while idle (the stand-in's flags): windows without work
    spec["sglang"]["args"] = ["--standin-request-rate=0", "--standin-idle-ms=50"]
    spec["rollout"]["analysis"]["maxDuration"] = max_duration
    if load:
        spec["rollout"]["load"] = load
    return spec


def test_load_hook_brings_an_idle_service_to_a_verdict_and_no_traffic_pauses(
        kube, namespace, make_operator, podmap, jobpods):
    op = make_operator()
    create(kube, namespace, idle_spec(LOAD, "4m"), name=LOADED)
    create(kube, namespace, idle_spec(None, "90s"), name=IDLE)
    for n in (LOADED, IDLE):
        ready(kube, namespace, op, name=n, timeout=120)
    podmap.wait_mapped(2)
    for n in (LOADED, IDLE):
        patch(kube, namespace, {"sglang": {"env": [{"name": "HARMLESS", "value": "load"}]}}, name=n)

    batch = client.BatchV1Api(kube)
    targets: set[str] = set()

    def verdicts():
        for j in batch.list_namespaced_job(namespace, label_selector="app.kubernetes.io/component=load").items:
            args = j.spec.template.spec.containers[0].args
            targets.update(args[i + 1] for i, a in enumerate(args) if a == "--target")
        got = {n: rollout(kube, namespace, n) for n in (LOADED, IDLE)}
        return got if got[LOADED].get("phase") in ("Promoted", "RolledBack") and got[IDLE].get("phase") in (
            "Paused", "RolledBack", "Promoted") else None
    try:
        got = wait_for(verdicts, 480, "the loaded service's verdict and the idle one's pause", interval=2.0)
    except AssertionError:
        raise AssertionError(f"{dump({n: rollout(kube, namespace, n) for n in (LOADED, IDLE)})}\n"
                             f"operator:\n{op.log_tail(40)}") from None
    loaded, idle = got[LOADED], got[IDLE]
    assert loaded["phase"] == "Promoted", dump(loaded)
    assert jobpods.started, "no load Job pod ran"
    core = client.CoreV1Api(kube)
    ips = {f"{p.status.pod_ip}:30000" for p in core.list_namespaced_pod(namespace).items
           if p.metadata.name.startswith(f"{LOADED}-") and p.status.pod_ip}
    assert len(targets) >= 2 and targets & ips, (targets, ips)  # the canary and its stable pod, one Job
    log = (jobpods.workdir / f"{jobpods.started[0]}.log").read_text()
    last = json.loads([x for x in log.splitlines() if x.startswith("{")][-1])
    assert last["ok"] > 0 and all(t["images"] > 0 for t in last["targets"].values()), last
    sent = [t["sent"] for t in last["targets"].values()]
    assert max(sent) - min(sent) <= 1, last  # the same rate to every compared pod
    wait_for(lambda: not batch.list_namespaced_job(
        namespace, label_selector=f"app.kubernetes.io/component=load,serving.vlmops.dev/vlmservice={LOADED}").items,
        60, "the load Job deleted after the verdict", interval=1.0)

    assert (idle["phase"], idle["reason"]) == ("Paused", "NoTraffic"), dump(idle)
    assert "spec.rollout.load" in idle["message"], idle["message"]
    assert not warnings(kube, namespace, "CanaryRolledBack", name=IDLE)
    assert warnings(kube, namespace, "CanaryPaused", name=IDLE)
