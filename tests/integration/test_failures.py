"""Failures a person must fix, seen on the VLMService (issue: "Day two on a real GPU cluster").

The real operator against the real control plane: Pod Security admission (the API server's own plugin, enforcing
`baseline` on the namespace) refusing the pods, and kwok playing a kubelet whose SGLang container cannot pull
its image or crash-loops (hack/kwok-stages/pod-container-fault.yaml, driven by pod annotations that the
VLMService's spec.pod.annotations set). Each must reach Ready=False and Degraded=True with its own reason and
the cause in the message, a Warning Event, phase Failed, and the vlm_operator_service_failure_info series;
before this, each read `ReplicasNotReady 0/1`.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from vlm_testing.cluster import wait_for
from vlm_testing.integration import create, wait_condition
from vlm_testing.operator_proc import condition, get_vlms, run_operator

FAULT = "testbed.vlmops.dev/container-fault"


def service(name: str, annotations: dict[str, str] | None = None) -> dict:
    spec = {"model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"}, "replicas": 1,
            "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 1}}
    if annotations:
        spec["pod"] = {"annotations": annotations}
    return {"apiVersion": "serving.vlmops.dev/v1alpha1", "kind": "VLMService", "metadata": {"name": name},
            "spec": spec}


@pytest.fixture
def operator(cluster, crd, namespace, tmp_path):
    yield from run_operator(cluster.kubeconfig, namespace, tmp_path)


def warning_events(kube, namespace: str, name: str) -> dict[str, str]:
    evs = client.CoreV1Api(kube).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return {e.reason: e.message for e in evs if e.type == "Warning"}


def assert_failed(kube, namespace, name, reason, op, *must_say: str) -> dict:
    obj = wait_condition(kube, namespace, name, "Ready", "False", reason, timeout=90, op=op)
    ready, degraded = condition(obj, "Ready"), condition(obj, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == reason, degraded
    for text in must_say:
        assert text in ready["message"], ready["message"]
    assert obj["status"]["phase"] == "Failed"
    events = wait_for(lambda: (e := warning_events(kube, namespace, name)) and reason in e and e, 30,
                      f"a Warning Event {reason}")
    assert all(text in events[reason] for text in must_say), events[reason]
    series = f'vlm_operator_service_failure_info{{namespace="{namespace}",reason="{reason}",vlmservice="{name}"}} 1.0'
    wait_for(lambda: series in op.metrics(), 30, series)
    return obj


def test_pod_security_refusing_the_pods_is_failed_create_with_the_admission_message(kube, namespace, operator):
    client.CoreV1Api(kube).patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    create(kube, namespace, service("refused"))
    assert_failed(kube, namespace, "refused", "FailedCreate", operator, "PodSecurity", "SYS_PTRACE")


def test_an_image_that_cannot_be_pulled_is_image_pull_failed(kube, namespace, operator):
    msg = 'Back-off pulling image "lmsysorg/sglang:v0.5.99"'
    create(kube, namespace, service("nopull", {FAULT: "ImagePullBackOff",
                                                "testbed.vlmops.dev/container-fault-message": msg}))
    assert_failed(kube, namespace, "nopull", "ImagePullFailed", operator, "ImagePullBackOff", msg)


def test_a_crash_loop_killed_for_memory_is_oomkilled_with_the_last_log_line(kube, namespace, operator):
    create(kube, namespace, service("oom", {
        FAULT: "CrashLoopBackOff", "testbed.vlmops.dev/last-exit-reason": "OOMKilled",
        "testbed.vlmops.dev/last-exit-code": "137",
        "testbed.vlmops.dev/last-message": "Loading safetensors checkpoint shards: 75%\nKilled"}))
    obj = assert_failed(kube, namespace, "oom", "OOMKilled", operator, "OOMKilled", "exit code 137", "Killed")
    assert obj["status"]["readyReplicas"] == 0
    # Fixed (the fault annotation removed): the new pod runs, and the service is Ready again.
    from vlm_testing.integration import patch_spec

    patch_spec(kube, namespace, "oom", {"pod": None})
    obj = wait_condition(kube, namespace, "oom", "Ready", "True", timeout=90, op=operator)
    assert condition(obj, "Degraded")["status"] == "False"
    gone = f'vlm_operator_service_failure_info{{namespace="{namespace}",reason="OOMKilled",vlmservice="oom"}}'
    wait_for(lambda: gone not in operator.metrics(), 30, "no failure series once Ready")
    assert get_vlms(kube, namespace, "oom")["status"]["phase"] == "Ready"
