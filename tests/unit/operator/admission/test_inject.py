"""Sidecar injection (vlm_operator.admission.inject): the patch for the pods of the serving stacks it is for, the derived
identity, idempotence, the namespaces it never touches, and reviews it cannot read (allowed, with a warning)."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from vlm_operator.admission import inject
from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.settings import Settings
from vlm_operator.desired import builders

ROOT = Path(__file__).resolve().parents[4]
IMAGE = "vlmops/vlm-sidecar:test"
CONFIG = inject.InjectionConfig(image=IMAGE, pull_secrets=("regcred",),
                                excluded_namespaces=inject.SYSTEM_NAMESPACES | {"vlm-system"})


def apply_patch(doc: dict, patch: list[dict]) -> dict:
    """RFC 6902 `add` (the only op the webhook emits), as the API server applies it."""
    out = copy.deepcopy(doc)
    for op in patch:
        assert op["op"] == "add", op
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node = out
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            node.append(op["value"]) if last == "-" else node.insert(int(last), op["value"])
        else:
            node[last] = copy.deepcopy(op["value"])
    return out


def pod(labels: dict | None = None, *, generate: str = "", name: str = "", annotations: dict | None = None,
        containers: list | None = None, **spec: Any) -> dict:
    meta: dict[str, Any] = {"labels": labels or {}}
    if generate:
        meta["generateName"] = generate
    if name:
        meta["name"] = name
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": containers or [
                {"name": "sglang", "image": "lmsysorg/sglang:v0.5.2",
                 "command": ["python3", "-m", "sglang.launch_server"], "args": ["--port", "8000"]}], **spec}}


def injected(p: dict, namespace: str = "team-a", config: inject.InjectionConfig = CONFIG) -> dict:
    d = inject.decide(p, namespace, config)
    assert d.outcome == "injected", d
    return apply_patch(p, d.patch)


def sidecar(p: dict) -> dict:
    (c,) = [c for c in p["spec"]["containers"] if c["name"] == "profiler"]
    return c


def env(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def label_ref(key: str) -> dict:
    return {"fieldRef": {"fieldPath": f"metadata.labels['{key}']"}}


def test_deployment_pod_gets_the_operators_sidecar():
    p = pod({"app": "qwen", "pod-template-hash": "5d8f7c9b4"}, generate="qwen-5d8f7c9b4-")
    out = injected(p)
    spec = out["spec"]
    assert spec["shareProcessNamespace"] is True
    assert [c["name"] for c in spec["containers"]] == ["sglang", "profiler"]
    side = sidecar(out)
    # The same container a VLMService's pod has, but for the identity and SGLang's port.
    ref = builders.sidecar_container(api.TelemetrySpec(), IMAGE)
    assert {k: v for k, v in side.items() if k != "env"} == {k: v for k, v in ref.items() if k != "env"}
    assert side["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert "securityContext" not in spec["containers"][0]  # SYS_PTRACE on the sidecar only
    assert side["resources"]["requests"] == side["resources"]["limits"]
    assert side["ports"] == [{"name": "profiler", "containerPort": 9400, "protocol": "TCP"}]
    e = env(side)
    assert e["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert e["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert e["VLM_SERVICE_NAME"] == label_ref("app")
    assert e["VLM_REVISION"] == label_ref("pod-template-hash")
    assert e["VLM_SGLANG_METRICS_URL"] == "http://127.0.0.1:8000/metrics"  # its --port, not 30000
    assert {"name": "profiler-tmp", "emptyDir": {"sizeLimit": "256Mi"}} in spec["volumes"]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert out["metadata"]["labels"][inject.LABEL_PROFILE] == "true"  # the PodMonitor's selector
    assert out["metadata"]["annotations"][inject.ANNOTATION_INJECTED] == IMAGE


def test_deployment_pod_without_app_labels_is_named_after_its_deployment():
    p = pod({"pod-template-hash": "5d8f7c9b4"}, generate="my-llm-5d8f7c9b4-")
    e = env(sidecar(injected(p)))
    assert e["VLM_SERVICE_NAME"] == "my-llm"
    assert e["VLM_REVISION"] == label_ref("pod-template-hash")


def test_argo_rollout_pod():
    p = pod({"rollouts-pod-template-hash": "7f9c", "app.kubernetes.io/name": "chat"}, generate="chat-7f9c-")
    e = env(sidecar(injected(p)))
    assert e["VLM_REVISION"] == label_ref("rollouts-pod-template-hash")
    assert e["VLM_SERVICE_NAME"] == label_ref("app.kubernetes.io/name")
    # Without the app label: the Rollout's name from generateName.
    p = pod({"rollouts-pod-template-hash": "7f9c"}, generate="chat-7f9c-")
    assert env(sidecar(injected(p)))["VLM_SERVICE_NAME"] == "chat"


def test_kserve_pod_prefers_the_inferenceservice_over_app_labels():
    p = pod({"serving.kserve.io/inferenceservice": "qwen-vl", "app": "qwen-vl-predictor",
             "app.kubernetes.io/name": "qwen-vl-predictor", "pod-template-hash": "abc12"},
            containers=[{"name": "queue-proxy", "image": "knative/queue"},
                        {"name": "kserve-container", "image": "lmsysorg/sglang", "args": ["--port=8080"]},
                        {"name": "other", "image": "x", "command": ["sglang"]}],
            annotations={inject.ANNOTATION_SGLANG_CONTAINER: "kserve-container"})
    e = env(sidecar(injected(p)))
    assert e["VLM_SERVICE_NAME"] == label_ref("serving.kserve.io/inferenceservice")
    assert e["VLM_REVISION"] == label_ref("pod-template-hash")
    assert e["VLM_SGLANG_METRICS_URL"] == "http://127.0.0.1:8080/metrics"  # the annotated container's port


def test_lws_pod():
    p = pod({"leaderworkerset.sigs.k8s.io/name": "ds-r1", "leaderworkerset.sigs.k8s.io/template-revision-hash": "h1",
             "leaderworkerset.sigs.k8s.io/worker-index": "0"}, name="ds-r1-0")
    e = env(sidecar(injected(p)))
    assert e["VLM_SERVICE_NAME"] == label_ref("leaderworkerset.sigs.k8s.io/name")
    assert e["VLM_REVISION"] == label_ref("leaderworkerset.sigs.k8s.io/template-revision-hash")


def test_explicit_annotations_win_and_a_bare_pod_has_an_unknown_revision():
    p = pod({"app": "a", "pod-template-hash": "h"}, name="x",
            annotations={inject.ANNOTATION_SERVICE: "svc", inject.ANNOTATION_REVISION: "v2"})
    e = env(sidecar(injected(p)))
    assert e["VLM_SERVICE_NAME"] == {"fieldRef": {"fieldPath": f"metadata.annotations['{inject.ANNOTATION_SERVICE}']"}}
    assert e["VLM_REVISION"] == {"fieldRef": {"fieldPath": f"metadata.annotations['{inject.ANNOTATION_REVISION}']"}}
    e = env(sidecar(injected(pod({}, name="bare"))))
    assert e["VLM_SERVICE_NAME"] == "bare" and e["VLM_REVISION"] == inject.UNKNOWN_REVISION


def test_which_container_is_sglang():
    helper = {"name": "proxy", "image": "envoy", "securityContext": {"runAsUser": 1}}
    server = {"name": "srv", "image": "img", "command": ["python3", "-m", "sglang.launch_server"],
              "securityContext": {"runAsUser": 1000}}
    # The first one mentioning sglang: its UID is the sidecar's (py-spy needs it), its default port 30000.
    side = sidecar(injected(pod({}, name="p", containers=[helper, server])))
    assert side["securityContext"]["runAsUser"] == 1000 and side["securityContext"]["runAsNonRoot"] is True
    assert env(side)["VLM_SGLANG_METRICS_URL"] == "http://127.0.0.1:30000/metrics"
    # None mentions it: the first container. The pod's UID where the container sets none.
    plain = {"name": "a", "image": "img"}
    side = sidecar(injected(pod({}, name="p", containers=[plain, server], securityContext={"runAsUser": 7})))
    assert side["securityContext"]["runAsUser"] == 1000  # server mentions sglang
    side = sidecar(injected(pod({}, name="p", containers=[plain], securityContext={"runAsUser": 7})))
    assert side["securityContext"]["runAsUser"] == 7
    # An annotation naming no container: guessed, and said so.
    p = pod({}, name="p", containers=[helper, server], annotations={inject.ANNOTATION_SGLANG_CONTAINER: "nope"})
    d = inject.decide(p, "ns", CONFIG)
    assert d.outcome == "injected" and "nope" in d.warnings[0]


def test_idempotent_on_readmission():
    p = pod({"app": "a", "pod-template-hash": "h"}, generate="a-h-")
    once = injected(p)
    again = inject.decide(once, "team-a", CONFIG)
    assert again.patch == [] and again.warnings == ()
    # A VLMService's pod (the operator's own sidecar) is left as it is, silently; so is one whose telemetry is
    # off, in a namespace that asks for the sidecar: its spec decides.
    managed = pod({"app.kubernetes.io/managed-by": "vlm-operator"}, name="m",
                  containers=[{"name": "sglang", "image": "x"}, {"name": "profiler", "image": IMAGE}])
    assert inject.decide(managed, "team-a", CONFIG) == inject.Decision([], "skipped")
    off = pod({"app.kubernetes.io/managed-by": "vlm-operator"}, name="m")
    assert inject.decide(off, "team-a", CONFIG) == inject.Decision([], "skipped")


def test_existing_labels_annotations_volumes_and_secrets_are_kept():
    p = pod({"app": "a", inject.LABEL_PROFILE: "true"}, name="p", annotations={"keep": "me"},
            volumes=[{"name": "dshm", "emptyDir": {}}], imagePullSecrets=[{"name": "regcred"}, {"name": "other"}])
    out = injected(p)
    assert out["metadata"]["annotations"] == {"keep": "me", inject.ANNOTATION_INJECTED: IMAGE}
    assert [v["name"] for v in out["spec"]["volumes"]] == ["dshm", "profiler-tmp"]
    assert out["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]
    # A label key with a slash is escaped in the JSON pointer.
    d = inject.decide(pod({"app": "a"}, name="p"), "ns", CONFIG)
    assert {"op": "add", "path": "/metadata/labels/serving.vlmops.dev~1profile", "value": "true"} in d.patch


@pytest.mark.parametrize("ns", ["kube-system", "kube-public", "kube-node-lease", "vlm-system"])
def test_system_and_operator_namespaces_are_never_injected(ns):
    d = inject.decide(pod({inject.LABEL_PROFILE: "true"}, name="p"), ns, CONFIG)
    assert d.patch == [] and d.outcome == "skipped"


def test_pods_that_cannot_take_the_sidecar_are_allowed_with_a_warning():
    cases = {
        "hostPID": pod({}, name="p", hostPID=True),
        "already named": pod({}, name="p", containers=[{"name": "profiler", "image": "mine"}]),
        "volume": pod({}, name="p", volumes=[{"name": "profiler-tmp", "emptyDir": {}}]),
    }
    for what, p in cases.items():
        d = inject.decide(p, "ns", CONFIG)
        assert d.patch == [] and len(d.warnings) == 1, what
    assert inject.decide(pod({inject.LABEL_PROFILE: "false"}, name="p"), "ns", CONFIG).patch == []


def _review(obj: Any, **request: Any) -> bytes:
    req = {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
           "namespace": "team-a", "object": obj, **request}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}).encode()


def test_review_round_trip():
    p = pod({"app": "a", "pod-template-hash": "h"}, generate="a-h-")
    resp, decision = inject.review(_review(p), CONFIG)
    r = resp["response"]
    assert resp["apiVersion"] == "admission.k8s.io/v1" and resp["kind"] == "AdmissionReview"
    assert r["uid"] == "u-1" and r["allowed"] is True and r["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(r["patch"])) == decision.patch
    assert sidecar(apply_patch(p, decision.patch))["image"] == IMAGE
    # Not a pod CREATE: allowed unchanged, no warning.
    resp, _ = inject.review(_review(p, operation="UPDATE"), CONFIG)
    assert resp["response"] == {"uid": "u-1", "allowed": True}


@pytest.mark.parametrize("body", [
    b"", b"not json", b"[]", b"{}", b'{"request": null}', b'{"request": {"uid": "u-2"}}',
    _review({"metadata": {}}), _review({"spec": {"containers": "nope"}}), _review(None),
    _review({"spec": {"containers": [None]}}), _review({"metadata": [], "spec": {"containers": [{}]}}),
])
def test_garbage_reviews_are_allowed_with_a_warning(body):
    resp, decision = inject.review(body, CONFIG)
    r = resp["response"]
    assert r["allowed"] is True and "patch" not in r
    assert decision.outcome in ("error", "skipped")
    if decision.outcome == "error":
        assert r["warnings"] and r["warnings"][0].startswith("profiler sidecar not injected")
        assert all(len(w) <= inject.WARNING_MAX for w in r["warnings"])


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
                        st.sampled_from(["metadata", "spec", "containers", "labels", "name", "args", "volumes",
                                         "annotations", "generateName", "securityContext", "runAsUser"]),
                        kids, max_size=4), max_leaves=20))
def test_any_object_is_answered_never_raised(obj):
    resp, _ = inject.review(_review(obj), CONFIG)
    assert resp["response"]["allowed"] is True and resp["response"]["uid"] == "u-1"


def test_injected_sidecar_matches_the_operators_for_the_same_settings():
    """Both paths build the sidecar with one function: a VLMService pod's profiler container and an injected
    one differ only in their identity env and SGLang's port (both defaults here)."""
    doc = yaml.safe_load((ROOT / "examples" / "qwen2.5-vl-3b.yaml").read_text())
    desired = builders.build_desired(builders.Owner("svc", "ns", "uid"), api.parse_spec(doc["spec"]),
                                     Settings(sidecar_image=IMAGE))
    template = desired.template
    op_side = next(c for c in template["spec"]["containers"] if c["name"] == "profiler")
    inj_side = sidecar(injected(pod({}, name="p", containers=[{"name": "s", "image": "x"}]),
                                config=inject.InjectionConfig(image=IMAGE)))
    strip = [e for e in op_side["env"] if e["name"] not in ("VLM_SERVICE_NAME", "VLM_REVISION")]
    assert [e for e in inj_side["env"] if e["name"] not in ("VLM_SERVICE_NAME", "VLM_REVISION")] == strip
    assert {k: v for k, v in inj_side.items() if k != "env"} == {k: v for k, v in op_side.items() if k != "env"}
