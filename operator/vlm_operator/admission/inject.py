"""Profiler sidecar injection: an AdmissionReview for a pod -> the JSON patch that adds the sidecar.

Pure: no I/O, no clock. `vlm_operator.admission.webhook` serves it over HTTPS; docs/injection.md is the user's page.

A pod the MutatingWebhookConfiguration sends here gets what a VLMService's pod has (`builders.sidecar_container`,
the same builder): the sidecar with SYS_PTRACE (and nothing else), shareProcessNamespace, the sidecar's /tmp
volume, its pull secrets, and the label that the PodMonitor selects. Its metrics are labelled with an identity
derived from the pod's own labels (`SERVICE_SOURCES`, `REVISION_SOURCES`). A review never fails: whatever goes
wrong, the pod is allowed unchanged and the reason is a warning in the response.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vlm_operator.api import names
from vlm_operator.api.names import OPERATOR, SGLANG_PORT
from vlm_operator.api.v1alpha1 import TelemetrySpec
from vlm_operator.desired.builders import (
    SIDECAR_NAME,
    SIDECAR_TMP_VOLUME,
    sidecar_container,
    sidecar_tmp_volume,
)

# The injection names, defined in vlm_operator.api.names (the chart and docs/injection.md use them too).
LABEL_PROFILE = names.LABEL_PROFILE
ANNOTATION_SGLANG_CONTAINER = names.ANNOTATION_SGLANG_CONTAINER
ANNOTATION_SERVICE = names.ANNOTATION_PROFILE_SERVICE
ANNOTATION_REVISION = names.ANNOTATION_PROFILE_REVISION
ANNOTATION_INJECTED = names.ANNOTATION_PROFILER_INJECTED
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
# Where the metrics' `vlmservice` label comes from, first match wins: an explicit annotation, then the serving
# stacks' own names (KServe InferenceService, LeaderWorkerSet), then the common app labels. Without any of them:
# the owner's name from generateName (Deployment / Argo Rollout pods: `<owner>-<hash>-`), else the pod's name.
SERVICE_SOURCES = (
    ("annotations", ANNOTATION_SERVICE),
    ("labels", "serving.kserve.io/inferenceservice"),
    ("labels", "leaderworkerset.sigs.k8s.io/name"),
    ("labels", "app.kubernetes.io/name"),
    ("labels", "app"),
)
# The metrics' `revision` label: the pod template's hash as the controller that made the pod writes it (Argo
# Rollouts' before the Deployment's: a Rollout's pods carry only theirs), then LWS's, Knative's (KServe
# serverless) and a StatefulSet's. Without any of them: "unknown".
REVISION_SOURCES = (
    ("annotations", ANNOTATION_REVISION),
    ("labels", "rollouts-pod-template-hash"),
    ("labels", "pod-template-hash"),
    ("labels", "leaderworkerset.sigs.k8s.io/template-revision-hash"),
    ("labels", "serving.knative.dev/revision"),
    ("labels", "controller-revision-hash"),
)
UNKNOWN_REVISION = "unknown"
ADMISSION_API = "admission.k8s.io/v1"
WARNING_MAX = 120
_PORT_FLAG = re.compile(r"^--port(?:=(\d+))?$")


@dataclass(frozen=True)
class InjectionConfig:
    """What the operator's settings say about injection."""

    image: str
    telemetry: TelemetrySpec = field(default_factory=TelemetrySpec)
    pull_secrets: tuple[str, ...] = ()
    # The system namespaces and the operator's own: never injected, whatever the webhook's selectors say.
    excluded_namespaces: frozenset[str] = SYSTEM_NAMESPACES


@dataclass(frozen=True)
class Decision:
    """The patch for one pod (empty: allowed unchanged) and why."""

    patch: list[dict[str, Any]]
    outcome: str  # injected | skipped | error
    warnings: tuple[str, ...] = ()


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _field_ref(kind: str, key: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": f"metadata.{kind}['{key}']"}}


def _identity_entry(env: str, meta: Mapping[str, Any], sources: Sequence[tuple[str, str]]) -> dict[str, Any] | None:
    for kind, key in sources:
        if (meta.get(kind) or {}).get(key):
            return {"name": env, "valueFrom": _field_ref(kind, key)}
    return None


def identity(meta: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The VLM_SERVICE_NAME and VLM_REVISION env entries: downward-API references to the first label or
    annotation of SERVICE_SOURCES / REVISION_SOURCES the pod has (so they read what the pod carries), else
    fixed values derived from its names."""
    revision = _identity_entry("VLM_REVISION", meta, REVISION_SOURCES) or {
        "name": "VLM_REVISION", "value": UNKNOWN_REVISION}
    service = _identity_entry("VLM_SERVICE_NAME", meta, SERVICE_SOURCES)
    if service is None:
        name = meta.get("name") or ""
        generate = meta.get("generateName") or ""
        hashes = [(meta.get("labels") or {}).get(k) for _, k in REVISION_SOURCES[1:3]]
        for h in filter(None, hashes):
            if generate.endswith(f"-{h}-"):
                name = generate[: -len(h) - 2]
                break
        else:
            name = name or generate.rstrip("-")
        service = {"name": "VLM_SERVICE_NAME", "value": name or "unknown"}
    return service, revision


def _mentions_sglang(c: Mapping[str, Any]) -> bool:
    return any("sglang" in str(x).lower() for x in [*(c.get("command") or []), *(c.get("args") or [])])


def sglang_container(pod: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The container SGLang runs in: the one the annotation names, else the first whose command or args mention
    sglang, else the first. The second value is a warning (an annotation naming no container)."""
    containers = pod["spec"]["containers"]
    wanted = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SGLANG_CONTAINER)
    warning = None
    if wanted:
        for c in containers:
            if c.get("name") == wanted:
                return c, None
        warning = f"{ANNOTATION_SGLANG_CONTAINER}: no container {wanted!r}; guessed"
    return next((c for c in containers if _mentions_sglang(c)), containers[0]), warning


def sglang_port(container: Mapping[str, Any]) -> int:
    """SGLang's --port in the container's command line (its default, 30000, without one)."""
    argv = [str(x) for x in [*(container.get("command") or []), *(container.get("args") or [])]]
    for i, arg in enumerate(argv):
        m = _PORT_FLAG.match(arg)
        value = m and (m.group(1) or (argv[i + 1] if i + 1 < len(argv) else ""))
        if value and value.isdigit() and 0 < int(value) < 65536:
            return int(value)
    return SGLANG_PORT


def _run_as_user(pod: Mapping[str, Any], container: Mapping[str, Any]) -> int | None:
    # py-spy needs the scheduler's UID (or root): SGLang's own, where the pod says it.
    for ctx in (container.get("securityContext"), pod["spec"].get("securityContext")):
        uid = (ctx or {}).get("runAsUser")
        if isinstance(uid, int):
            return uid
    return None


def _skip(reason: str | None = None) -> Decision:
    return Decision([], "skipped", (reason,) if reason else ())


def _check_shape(pod: Any) -> None:
    """What `decide` reads has the types a Pod's fields have (the API server sends a valid pod; anything else
    is answered as an error, never patched on a guess)."""
    def is_map(x: Any, optional: bool = True) -> bool:
        return isinstance(x, Mapping) or (optional and x is None)

    def is_list_of_maps(x: Any) -> bool:
        return x is None or (isinstance(x, list) and all(isinstance(i, Mapping) for i in x))

    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    ok = (is_map(pod, optional=False) and is_map(meta) and is_map(spec, optional=False)
          and all(is_map((meta or {}).get(k)) for k in ("labels", "annotations"))
          and all(is_list_of_maps(spec.get(k)) for k in ("containers", "volumes", "imagePullSecrets"))
          and all(isinstance(c.get("name"), str) for c in spec.get("containers") or []))
    if not ok:
        raise ValueError("not a Pod")


def decide(pod: Mapping[str, Any], namespace: str, config: InjectionConfig) -> Decision:
    """The JSON patch that injects the sidecar into `pod` (a Pod as admission sees it), or none and why.
    ValueError for an object that is not a Pod."""
    _check_shape(pod)
    meta = pod.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    if namespace in config.excluded_namespaces:
        return _skip()
    if labels.get(LABEL_PROFILE) == "false":
        return _skip()
    if labels.get("app.kubernetes.io/managed-by") == OPERATOR:
        # A VLMService's pod: its spec.telemetry decides (a namespace-wide opt-in must not add a second opinion).
        return _skip()
    containers = spec.get("containers") or []
    if any(c.get("name") == SIDECAR_NAME for c in containers):
        # Re-admission (reinvocation, a second matching webhook) or a VLMService's pod: already there.
        return _skip(None if ANNOTATION_INJECTED in annotations
                     else f"profiler sidecar not injected: a container is already named {SIDECAR_NAME!r}")
    if not containers:
        return _skip("profiler sidecar not injected: the pod has no containers")
    if spec.get("hostPID"):
        return _skip("profiler sidecar not injected: hostPID pods cannot share a process namespace")
    if any(v.get("name") == SIDECAR_TMP_VOLUME for v in spec.get("volumes") or []):
        return _skip(f"profiler sidecar not injected: a volume is already named {SIDECAR_TMP_VOLUME!r}")
    target, warning = sglang_container(pod)
    service, revision = identity(meta)
    sidecar = sidecar_container(config.telemetry, config.image, identity=(service, revision),
                                sglang_port=sglang_port(target), run_as_user=_run_as_user(pod, target))
    patch: list[dict[str, Any]] = [
        {"op": "add", "path": "/spec/shareProcessNamespace", "value": True},
        {"op": "add", "path": "/spec/containers/-", "value": sidecar},
    ]
    if "volumes" in spec:
        patch.append({"op": "add", "path": "/spec/volumes/-", "value": sidecar_tmp_volume()})
    else:
        patch.append({"op": "add", "path": "/spec/volumes", "value": [sidecar_tmp_volume()]})
    have = [s.get("name") for s in spec.get("imagePullSecrets") or []]
    missing = [{"name": n} for n in config.pull_secrets if n not in have]
    if missing and "imagePullSecrets" in spec:
        patch += [{"op": "add", "path": "/spec/imagePullSecrets/-", "value": s} for s in missing]
    elif missing:
        patch.append({"op": "add", "path": "/spec/imagePullSecrets", "value": missing})
    for kind, key, value, present in (("labels", LABEL_PROFILE, "true", labels),
                                      ("annotations", ANNOTATION_INJECTED, config.image, annotations)):
        if kind not in meta or meta[kind] is None:
            patch.append({"op": "add", "path": f"/metadata/{kind}", "value": {key: value}})
        elif present.get(key) != value:
            patch.append({"op": "add", "path": f"/metadata/{kind}/{_pointer(key)}", "value": value})
    return Decision(patch, "injected", (warning,) if warning else ())


def _response(uid: str, decision: Decision) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(decision.patch, separators=(",", ":")).encode()).decode()
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    return {"apiVersion": ADMISSION_API, "kind": "AdmissionReview", "response": response}


def review(body: bytes, config: InjectionConfig) -> tuple[dict[str, Any], Decision]:
    """An AdmissionReview request (the raw body) -> the AdmissionReview response, and the decision. Never
    raises: a body it cannot read, or a bug in `decide`, allows the pod unchanged with a warning."""
    uid = ""
    try:
        doc = json.loads(body)
        request = doc["request"]
        uid = str(request["uid"])
        if request.get("kind", {}).get("kind") != "Pod" or request.get("operation", "CREATE") != "CREATE":
            decision = _skip()
        else:
            decision = decide(request["object"], str(request.get("namespace") or ""), config)
    except Exception as e:  # the webhook refuses nothing: any failure is an allowed pod and a warning
        # The API server cuts a warning at 120 characters.
        decision = Decision([], "error", (f"profiler sidecar not injected: {type(e).__name__}: {e}"[:WARNING_MAX],))
    return _response(uid, decision), decision
