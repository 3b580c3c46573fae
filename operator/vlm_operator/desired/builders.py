"""Pure builders: a VLMService spec -> the Kubernetes objects that serve it.

Nothing here talks to the API server or reads the clock; `apply` applies what
these return. Golden files in tests/golden/builders/ pin the output.

Names: one Deployment per revision, `<name>-<revision>` (a service from a release before revision Deployments
keeps its `<name>` as its stable revision's, adopted as it is); the fresh baseline's `<name>-baseline`; one
Service `<name>` selects every revision; the PodDisruptionBudget (replicas > 1) and the NetworkPolicy over the
sidecar's port are `<name>` too. The revision label is a hash of the pod template without the role label and the
operator's scheduling gate: a promoted canary keeps its pods (its role is a pod label the operator sets, not part
of the template).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from vlm_operator.api.errors import InvalidSpec

# The shared names (vlm_operator.api.names), re-exported: other modules use builders.LABEL_ROLE and the like.
from vlm_operator.api.names import (
    ANNOTATION_IPC,
    API_VERSION,
    KIND,
    LABEL_APP_COMPONENT,
    LABEL_APP_INSTANCE,
    LABEL_APP_NAME,
    LABEL_MANAGED_BY,
    LABEL_REVISION,
    LABEL_ROLE,
    LABEL_SERVICE,
    OPERATOR,
    SCHEDULING_GATE,
    SGLANG_PORT,
    SIDECAR_PORT,
)
from vlm_operator.api.names import PREFIX as PREFIX
from vlm_operator.api.names import ROLE_BASELINE as ROLE_BASELINE
from vlm_operator.api.names import ROLE_CANARY as ROLE_CANARY
from vlm_operator.api.names import ROLE_STABLE as ROLE_STABLE
from vlm_operator.api.settings import Settings
from vlm_operator.api.units import parse_duration
from vlm_operator.api.v1alpha1 import (
    DEFAULT_GRACE_SECONDS,
    SHM_PATH,
    SHUTDOWN_MARGIN_SECONDS,
    EnvVar,
    PodSpec,
    TelemetrySpec,
    VLMServiceSpec,
)
from vlm_operator.desired import sglang

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# The startup probe runs every STARTUP_PERIOD_S; spec.sglang.startupTimeout (20m by default: large VLMs can take 10+
# minutes to load their weights) sets its failureThreshold.
STARTUP_PERIOD_S = 10
# Liveness: about two minutes without an answer (never a generation, sglang.plan_liveness) before a restart.
LIVENESS = {"periodSeconds": 20, "timeoutSeconds": 10, "failureThreshold": 6}
# The sidecar's budget, requests equal to limits (every container's are: the pod is Guaranteed). The sidecar
# averages a small part of it, in bursts while a window is sampled (docs/benchmarks.md, "The sidecar's
# resource budget").
SIDECAR_RESOURCES = {"cpu": "500m", "memory": "512Mi"}
# The SGLang container's securityContext without spec.sglang.securityContext (each field there replaces one here).
SGLANG_SECURITY_DEFAULTS: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "seccompProfile": {"type": "RuntimeDefault"},
    "capabilities": {"drop": ["NET_RAW"]},  # SGLang opens no raw sockets
}

# preStop of the SGLang container: wait while SGLang has requests running or queued (its gauges, summed over the
# schedulers), for at most argv[1] seconds. It first lets the pod leave the Service's endpoints (requests routed
# before that still arrive), and stops at once when SGLang does not answer (nothing to drain). SIGTERM follows;
# SGLang then refuses new requests and finishes its own (its sigterm watchdog).
DRAIN_SCRIPT = r"""import re, sys, time, urllib.request
budget = float(sys.argv[1]); end = time.monotonic() + budget
time.sleep(min(5.0, budget))
gauge = re.compile(r"^(sglang:num_running_reqs|sglang:num_queue_reqs)(\{[^}]*\})?\s+(\S+)")
while time.monotonic() < end:
    try:
        text = urllib.request.urlopen(sys.argv[2], timeout=2).read().decode()
        busy = sum(float(m.group(3)) for m in map(gauge.match, text.splitlines()) if m)
    except Exception:
        break
    if not busy > 0:
        break
    time.sleep(1)
"""


@dataclass(frozen=True)
class Owner:
    """The VLMService the objects belong to."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def common_labels(owner: Owner) -> dict[str, str]:
    return {
        LABEL_APP_NAME: "sglang",
        LABEL_APP_INSTANCE: owner.name,
        LABEL_APP_COMPONENT: "inference",
        LABEL_MANAGED_BY: OPERATOR,
        LABEL_SERVICE: owner.name,
    }


def deployment_name(owner: Owner, revision: str) -> str:
    """A revision's Deployment (`ROLE_BASELINE` for the fresh baseline's)."""
    return f"{owner.name}-{revision}"


def selector(owner: Owner) -> str:
    """Label selector of all the service's pods (status.selector, for the scale subresource)."""
    return f"{LABEL_SERVICE}={owner.name}"


def revision_of(template: dict[str, Any]) -> str:
    """Stable short hash of a pod template (role-independent)."""
    blob = json.dumps(template, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def _sglang_args(spec: VLMServiceSpec, plan: sglang.IPCPlan) -> list[str]:
    args = ["--model-path", spec.model.path]
    if spec.model.revision:
        args += ["--revision", spec.model.revision]
    if spec.model.served_name:
        args += ["--served-model-name", spec.model.served_name]
    args += [
        "--host", "0.0.0.0",
        "--port", str(SGLANG_PORT),
        "--enable-metrics",
        "--tp", str(spec.sglang.tensor_parallel),
    ]
    return args + list(plan.args) + list(spec.sglang.args)


def _prune(node: Any) -> Any:
    """Drop empty lists and empty matchLabels: the API server omits them, and an object that differs from
    what the server returns would be applied again on every resync. Empty selectors ({}) mean "all" and stay."""
    if isinstance(node, dict):
        return {
            k: _prune(v) for k, v in node.items() if not (v == [] or (k == "matchLabels" and v == {}))
        }
    if isinstance(node, list):
        return [_prune(v) for v in node]
    return node


def _dump(model: BaseModel) -> dict[str, Any]:
    return _prune(model.model_dump(by_alias=True, exclude_none=True, mode="json"))


def _env_entry(e: EnvVar) -> dict[str, Any]:
    if e.value_from is not None:
        return {"name": e.name, "valueFrom": _dump(e.value_from)}  # by reference: the value never enters the spec
    return {"name": e.name, "value": e.value}


def _env(spec: VLMServiceSpec, plan: sglang.IPCPlan, liveness: sglang.LivenessPlan) -> list[dict[str, Any]]:
    env: dict[str, dict[str, Any]] = {k: {"name": k, "value": v} for k, v in plan.env.items()}
    # The liveness plan sets its variable only where the spec's env does not (plan_liveness reads the spec's).
    env.update({k: {"name": k, "value": v} for k, v in liveness.env.items()})
    for e in spec.sglang.env:
        env.setdefault(e.name, _env_entry(e))  # the plan wins; CEL already refuses conflicts when mode != Auto
    if wants_download(spec):
        # The weights Job filled the claim's hub cache: read it, never download (a spec's own value wins).
        for k, v in weights_env(spec).items():
            env.setdefault(k, {"name": k, "value": v})
    return list(env.values())


def wants_download(spec: VLMServiceSpec) -> bool:
    """model.cache with download Auto and model.path a hub id (a local path starts with /)."""
    c = spec.model.cache
    return c is not None and c.download.mode == "Auto" and not spec.model.path.startswith("/")


def weights_env(spec: VLMServiceSpec) -> dict[str, str]:
    """What SGLang's container gets when the operator fills the cache: the hub cache on the claim, offline."""
    assert spec.model.cache is not None
    return {"HF_HOME": f"{spec.model.cache.mount_path.rstrip('/')}/{WEIGHTS_DIR}", "HF_HUB_OFFLINE": "1"}


def liveness_plan(spec: VLMServiceSpec, version: str | None) -> sglang.LivenessPlan:
    return sglang.plan_liveness(version, {e.name: e.value for e in spec.sglang.env})


def startup_failures(spec: VLMServiceSpec) -> int:
    """The startup probe's failureThreshold: spec.sglang.startupTimeout in probe periods, rounded up."""
    return math.ceil(parse_duration(spec.sglang.startup_timeout) / STARTUP_PERIOD_S)


def grace_seconds(spec: VLMServiceSpec) -> int:
    grace = spec.pod.termination_grace_period_seconds if spec.pod else None
    return DEFAULT_GRACE_SECONDS if grace is None else grace


def _security_context(spec: VLMServiceSpec) -> dict[str, Any]:
    """The operator's defaults, each replaced by the spec's field of the same name. allowPrivilegeEscalation
    false is left out for a privileged or CAP_SYS_ADMIN container (the pod API refuses the pair)."""
    user = spec.sglang.security_context
    defaults = dict(SGLANG_SECURITY_DEFAULTS)
    if user is not None and user.escalates:
        defaults.pop("allowPrivilegeEscalation")
    return {**defaults, **(_dump(user) if user is not None else {})}


def _liveness_probe(liveness: sglang.LivenessPlan) -> dict[str, Any]:
    check: dict[str, Any] = (
        {"httpGet": {"path": "/health", "port": "http"}} if liveness.probe == "http" else {"tcpSocket": {"port": "http"}}
    )
    return {**check, **LIVENESS}


def _sglang_container(
    spec: VLMServiceSpec, plan: sglang.IPCPlan, liveness: sglang.LivenessPlan, image: str
) -> dict[str, Any]:
    res = spec.resources
    gpus = str(spec.gpus_per_replica)
    mounts = [{"name": "dshm", "mountPath": SHM_PATH}]
    if spec.model.cache:
        mounts.append(
            {"name": "model-cache", "mountPath": spec.model.cache.mount_path, "readOnly": spec.model.cache.read_only}
        )
    mounts += [_dump(m) for m in spec.sglang.volume_mounts or []]
    drain = grace_seconds(spec) - SHUTDOWN_MARGIN_SECONDS
    return {
        "name": "sglang",
        "image": image,
        "command": ["python3", "-m", "sglang.launch_server"],
        "args": _sglang_args(spec, plan),
        "env": _env(spec, plan, liveness),
        **({"envFrom": [_dump(e) for e in spec.sglang.env_from]} if spec.sglang.env_from else {}),
        "ports": [{"name": "http", "containerPort": SGLANG_PORT, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": res.cpu, "memory": res.memory, GPU_RESOURCE: gpus},
            "limits": {"cpu": res.cpu, "memory": res.memory, GPU_RESOURCE: gpus},
        },
        "volumeMounts": mounts,
        # A container that fails writes no termination message: the kubelet puts its last log lines there
        # instead, and the service's CrashLoopBackOff/OOMKilled reason quotes the last one (status.failure).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "startupProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "timeoutSeconds": 5,
            "periodSeconds": STARTUP_PERIOD_S,
            "failureThreshold": startup_failures(spec),
        },
        "readinessProbe": {
            "httpGet": {"path": "/health_generate", "port": "http"},
            "timeoutSeconds": 10,
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "livenessProbe": _liveness_probe(liveness),
        **({"lifecycle": {"preStop": {"exec": {"command": [
            "python3", "-c", DRAIN_SCRIPT, str(drain), f"http://127.0.0.1:{SGLANG_PORT}/metrics",
        ]}}}} if drain > 0 else {}),
        "securityContext": _security_context(spec),
    }


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


# The sidecar's identity env (what its metrics are labelled with) on a VLMService's pods: the operator's labels.
OPERATOR_IDENTITY = (
    _field_env("VLM_SERVICE_NAME", f"metadata.labels['{LABEL_SERVICE}']"),
    _field_env("VLM_REVISION", f"metadata.labels['{LABEL_REVISION}']"),
)
SIDECAR_NAME = "profiler"
SIDECAR_TMP_VOLUME = "profiler-tmp"


def sidecar_tmp_volume() -> dict[str, Any]:
    return {"name": SIDECAR_TMP_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}}


def _sidecar_container(spec: VLMServiceSpec, image: str) -> dict[str, Any]:
    return sidecar_container(spec.telemetry, image)


def sidecar_container(
    t: TelemetrySpec,
    image: str,
    identity: Sequence[Mapping[str, Any]] = OPERATOR_IDENTITY,
    sglang_port: int = SGLANG_PORT,
    run_as_user: int | None = None,
) -> dict[str, Any]:
    """The profiler sidecar, on the operator's pods and on the pods the admission webhook injects it into
    (vlm_operator.admission.inject): one builder, so both stay the same container. `identity`: the VLM_SERVICE_NAME and
    VLM_REVISION env entries; `run_as_user` overrides t.run_as_user (the injected pod's SGLang UID)."""
    uid = t.run_as_user if run_as_user is None else run_as_user
    return {
        "name": SIDECAR_NAME,
        "image": image,
        "command": ["vlm-sidecar"],
        "env": [
            {"name": "VLM_SIDECAR_PORT", "value": str(SIDECAR_PORT)},
            {"name": "VLM_PROFILE_INTERVAL", "value": t.interval},
            {"name": "VLM_PROFILE_DURATION", "value": t.duration},
            {"name": "VLM_PROFILE_RATE", "value": str(t.rate)},
            {"name": "VLM_WATCH_FUNCTIONS", "value": ",".join(t.watch_functions)},
            # Only when set: the default pod template (and so every existing revision) stays as it was.
            *([{"name": "VLM_FRONTEND_ROLES", "value": ",".join(t.frontend_roles)}] if t.frontend_roles else []),
            {"name": "VLM_SGLANG_METRICS_URL", "value": f"http://127.0.0.1:{sglang_port}/metrics"},
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_NAMESPACE", "metadata.namespace"),
            *(copy.deepcopy(dict(e)) for e in identity),
        ],
        "ports": [{"name": "profiler", "containerPort": SIDECAR_PORT, "protocol": "TCP"}],
        "resources": {"requests": dict(SIDECAR_RESOURCES), "limits": dict(SIDECAR_RESOURCES)},
        # py-spy reads the scheduler's memory through ptrace: SYS_PTRACE and nothing else (the runtime's default
        # seccomp profile allows ptrace and process_vm_readv to a holder of it). It runs as the scheduler's UID
        # (telemetry.runAsUser): root by default, because lmsysorg/sglang images run as root and ptrace needs
        # the same UID (or root).
        "securityContext": {
            "capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE"]},
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsUser": uid,
            **({"runAsNonRoot": True} if uid else {}),
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # /readyz never depends on finding a scheduler: the pod's readiness (every container's) must not follow
        # the profiler's; a lenient threshold, so a sidecar restart is over before the pod leaves the Service.
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "profiler"},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "profiler"},
            "periodSeconds": 20,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "volumeMounts": [{"name": SIDECAR_TMP_VOLUME, "mountPath": "/tmp"}],
    }


def _tolerations(spec: VLMServiceSpec) -> list[dict[str, Any]]:
    tol = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    for t in spec.gpu.tolerations:
        d = t.model_dump(by_alias=True, exclude_none=True)
        if d not in tol:
            tol.append(d)
    return tol


def build_pod_template(
    owner: Owner,
    spec: VLMServiceSpec,
    settings: Settings,
    plan: sglang.IPCPlan,
    liveness: sglang.LivenessPlan | None = None,
) -> dict[str, Any]:
    """The role-independent pod template; its hash is the revision. Every container's requests equal its limits:
    the pod is Guaranteed (docs/objects.md)."""
    image = spec.sglang.image or settings.sglang_image
    if liveness is None:
        liveness = liveness_plan(spec, sglang.resolve_version(spec.sglang.version, image))
    containers = [_sglang_container(spec, plan, liveness, image)]
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
    ]
    if spec.telemetry.enabled:
        containers.append(_sidecar_container(spec, spec.telemetry.image or settings.sidecar_image))
        volumes.append(sidecar_tmp_volume())
    if spec.model.cache:
        volumes.append(
            {
                "name": "model-cache",
                "persistentVolumeClaim": {
                    "claimName": spec.model.cache.claim_name,
                    "readOnly": spec.model.cache.read_only,
                },
            }
        )
    volumes += [_dump(v) for v in (spec.pod.volumes if spec.pod else None) or []]
    node_selector = {GPU_PRODUCT_LABEL: spec.gpu.product, **spec.gpu.node_selector}
    pod = spec.pod or PodSpec()
    return {
        "metadata": {
            # The spec's own keys cannot collide: the schema refuses the operator's labels and prefix.
            "labels": {**(pod.labels or {}), **common_labels(owner)},
            "annotations": {**(pod.annotations or {}), ANNOTATION_IPC: "active" if plan.active else "inactive"},
        },
        "spec": {
            "shareProcessNamespace": spec.telemetry.enabled,
            "enableServiceLinks": False,
            # Neither SGLang nor the sidecar calls the Kubernetes API.
            "automountServiceAccountToken": bool(pod.automount_service_account_token),
            "terminationGracePeriodSeconds": grace_seconds(spec),
            # The pod's default for every container, injected ones included (each container sets its own too).
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "nodeSelector": node_selector,
            "tolerations": _tolerations(spec),
            "containers": containers,
            "volumes": volumes,
            **_pod_fields(owner, pod, settings.sidecar_image_pull_secrets if spec.telemetry.enabled else ()),
        },
    }


def _pod_fields(owner: Owner, pod: PodSpec, sidecar_pull_secrets: tuple[str, ...] = ()) -> dict[str, Any]:
    """spec.pod's scheduling and identity fields; only those set, so older specs keep their revision.
    `sidecar_pull_secrets` (the operator's VLM_SIDECAR_IMAGE_PULL_SECRETS) follow the spec's own pull secrets."""
    out: dict[str, Any] = {}
    if pod.service_account_name:
        out["serviceAccountName"] = pod.service_account_name
    secrets = [_dump(r) for r in pod.image_pull_secrets or []]  # the sidecar's image too
    secrets += [{"name": n} for n in sidecar_pull_secrets if {"name": n} not in secrets]
    if secrets:
        out["imagePullSecrets"] = secrets
    if pod.priority_class_name:
        out["priorityClassName"] = pod.priority_class_name
    if pod.runtime_class_name:
        out["runtimeClassName"] = pod.runtime_class_name
    if pod.scheduler_name:
        out["schedulerName"] = pod.scheduler_name
    if pod.affinity is not None and (affinity := _dump(pod.affinity)):
        out["affinity"] = affinity
    if pod.topology_spread_constraints:
        out["topologySpreadConstraints"] = [
            {"labelSelector": {"matchLabels": {LABEL_SERVICE: owner.name}}, **_dump(c)}
            for c in pod.topology_spread_constraints
        ]
    return out


def with_role(template: dict[str, Any], revision: str, role: str) -> dict[str, Any]:
    t = copy.deepcopy(template)
    t["metadata"]["labels"] = {**t["metadata"]["labels"], LABEL_REVISION: revision, LABEL_ROLE: role}
    return t


def progress_deadline_seconds(template: dict[str, Any]) -> int:
    """The SGLang container's startup budget (its startup probe's, from spec.sglang.startupTimeout) and 10 minutes."""
    probe = next(c for c in template["spec"]["containers"] if c["name"] == "sglang")["startupProbe"]
    return probe["periodSeconds"] * probe["failureThreshold"] + 600


def revision_selector(owner: Owner, revision: str) -> dict[str, Any]:
    """A revision Deployment's selector: its revision's pods, never the fresh baseline's (same revision)."""
    return {
        "matchLabels": {LABEL_SERVICE: owner.name, LABEL_REVISION: revision},
        "matchExpressions": [{"key": LABEL_ROLE, "operator": "NotIn", "values": [ROLE_BASELINE]}],
    }


def build_deployment(owner: Owner, template: dict[str, Any], revision: str, replicas: int) -> dict[str, Any]:
    """The Deployment of one revision. Its template never changes (a new template is a new revision), so its
    strategy never runs; the operator moves pods between revisions by scaling. Every pod starts behind the
    operator's scheduling gate, which the operator removes as it places the pod (pinned to a node when it pairs
    with a pod there)."""
    labels = {**common_labels(owner), LABEL_REVISION: revision}
    t = copy.deepcopy(template)
    t["metadata"]["labels"] = {**t["metadata"]["labels"], LABEL_REVISION: revision}
    t["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(owner, revision),
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 1,
            "progressDeadlineSeconds": progress_deadline_seconds(template),
            "selector": revision_selector(owner, revision),
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": t,
        },
    }


def build_baseline(owner: Owner, template: Mapping[str, Any], revision: str, replicas: int) -> dict[str, Any]:
    """The fresh baseline: new pods of the stable revision's template, labelled role baseline from their template
    (they pair with nothing and are never promoted). Gated like every pod the operator makes: it releases them
    once the canary's pods have their nodes, so none takes a GPU a canary pod is pinned to."""
    t = copy.deepcopy(dict(template))
    t.setdefault("spec", {})["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    labels = {k: v for k, v in ((t.get("metadata") or {}).get("labels") or {}).items() if k != LABEL_ROLE}
    t["metadata"] = {**(t.get("metadata") or {}), "labels": {**labels, LABEL_REVISION: revision, LABEL_ROLE: ROLE_BASELINE}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(owner, ROLE_BASELINE),
            "namespace": owner.namespace,
            "labels": {**common_labels(owner), LABEL_REVISION: revision, LABEL_ROLE: ROLE_BASELINE},
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 1,
            "selector": {"matchLabels": {LABEL_SERVICE: owner.name, LABEL_ROLE: ROLE_BASELINE}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": t,
        },
    }


def revision_deployments(owner: Owner, desired: Desired, observed: Mapping[str, Mapping[str, Any]],
                         replicas: Mapping[str, int], baseline: tuple[str, int] | None = None
                         ) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """The Deployments a rollout plan asks for, built after it decided: each revision at its replicas (an
    existing one rescaled as it is, the desired revision's built from its template; a revision that is neither
    is not made) and the fresh baseline, `(stable revision, pods)`, from the stable Deployment's template."""
    out: dict[str, dict[str, Any]] = {}
    for rev, n in replicas.items():
        if rev in observed:
            out[rev] = rescaled(owner, observed[rev], n)
        elif rev == desired.revision:
            out[rev] = build_deployment(owner, desired.template, rev, n)
    base = None
    if baseline is not None and baseline[0] in observed:
        base = build_baseline(owner, observed[baseline[0]]["spec"]["template"], baseline[0], baseline[1])
    return out, base


def rescaled(owner: Owner, observed: Mapping[str, Any], replicas: int) -> dict[str, Any]:
    """An existing revision Deployment re-applied as it is, only its replicas changed (an adopted one from an older
    release keeps its own name, selector, strategy and template: nothing of its pods changes)."""
    meta = observed.get("metadata") or {}
    spec = observed.get("spec") or {}
    out_spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": spec.get("selector"),
        "template": spec.get("template"),
    }
    for k in ("revisionHistoryLimit", "progressDeadlineSeconds", "strategy"):
        if k in spec:
            out_spec[k] = spec[k]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": meta.get("name"),
            "namespace": owner.namespace,
            "labels": {**common_labels(owner), **{k: v for k, v in (meta.get("labels") or {}).items() if k in (LABEL_REVISION, LABEL_ROLE)}},
            "ownerReferences": [owner.reference()],
        },
        "spec": out_spec,
    }


def owned_metadata(owner: Owner) -> dict[str, Any]:
    """Metadata of a per-service object named like the service, owned by it (garbage-collected with it)."""
    return {
        "name": owner.name,
        "namespace": owner.namespace,
        "labels": common_labels(owner),
        "ownerReferences": [owner.reference()],
    }


def build_service(owner: Owner) -> dict[str, Any]:
    """One Service over stable and canary pods: the canary takes traffic in proportion to its replicas."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owned_metadata(owner),
        "spec": {
            "type": "ClusterIP",
            "selector": {LABEL_SERVICE: owner.name},
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
                {"name": "profiler", "port": SIDECAR_PORT, "targetPort": "profiler", "protocol": "TCP"},
            ],
        },
    }


# The Prometheus Operator objects made per service where its CRDs exist (group monitoring.coreos.com, v1).
MONITORING_GROUP, MONITORING_VERSION = "monitoring.coreos.com", "v1"
MONITORING_API_VERSION = f"{MONITORING_GROUP}/{MONITORING_VERSION}"
MONITORING_KINDS = ("PodMonitor", "PrometheusRule")


def monitoring_metadata(owner: Owner, extra_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Metadata of the PodMonitor and PrometheusRule: owned, with the user's extra labels (the operator setting
    VLM_MONITORING_LABELS, e.g. `release: kube-prometheus-stack` for that chart's selectors) under ours."""
    meta = owned_metadata(owner)
    meta["labels"] = {**dict(extra_labels or {}), **meta["labels"]}
    return meta


def pod_monitor_intervals(telemetry_interval: str) -> tuple[str, str]:
    """The scrape intervals of SGLang's endpoint and of the profiler sidecar's.

    SGLang's: 15 s, or the telemetry interval when that is shorter. The sidecar's: half of that (1 s at
    least). Its per-window gauges hold one window until the next one ends, one telemetry interval later; a
    scrape at the same interval as the windows sees each once only while their phases stay apart, and the
    sidecar's windows end a little later or earlier each time (py-spy's start and flush), so some windows
    fell between two scrapes and others were read twice: the gate's Prometheus source missed them and read a
    different window set from the sidecars'. Two scrapes per window see every one (a 4 s telemetry interval
    under a 15 s scrape lost three windows in four)."""
    every = min(15.0, parse_duration(telemetry_interval))
    return _prom_duration(every), _prom_duration(max(1.0, every / 2))


def _prom_duration(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def build_pod_monitor(
    owner: Owner, extra_labels: Mapping[str, str] | None = None, telemetry_interval: str = "15s"
) -> dict[str, Any]:
    """Prometheus Operator PodMonitor for SGLang and the sidecar, at `pod_monitor_intervals` of the service's
    telemetry interval (only when its CRD exists).

    honorLabels: the sidecar labels its series with the VLMService's namespace, vlmservice, pod and revision
    itself; without it the target's labels would win a clash and move the series' own to `exported_*`."""
    interval, profiler_interval = pod_monitor_intervals(telemetry_interval)
    endpoint = {"path": "/metrics", "honorLabels": True}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": monitoring_metadata(owner, extra_labels),
        "spec": {
            "selector": {"matchLabels": {LABEL_SERVICE: owner.name}},
            "podTargetLabels": [LABEL_SERVICE, LABEL_REVISION, LABEL_ROLE],
            "podMetricsEndpoints": [{"port": "http", "interval": interval, **endpoint},
                                    {"port": "profiler", "interval": profiler_interval, **endpoint}],
        },
    }


def build_pod_disruption_budget(owner: Owner) -> dict[str, Any]:
    """At most one of the service's pods down at a time through voluntary disruptions (drains, node upgrades),
    whatever its revision (a canary pod serves traffic too)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": owned_metadata(owner),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": {LABEL_SERVICE: owner.name}},
        },
    }


def build_network_policy(owner: Owner, peers: Any) -> dict[str, Any]:
    """Ingress to the service's pods: SGLang's port from anywhere (as without a policy), the sidecar's
    port (profiles, flamegraphs, windows) only from `peers` (the operator and Prometheus by default).
    Any other port is closed once a policy selects the pods; the pods listen on no other."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": owned_metadata(owner),
        "spec": {
            "podSelector": {"matchLabels": {LABEL_SERVICE: owner.name}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": SGLANG_PORT}]},
                {"ports": [{"protocol": "TCP", "port": SIDECAR_PORT}], "from": copy.deepcopy(list(peers))},
            ],
        },
    }


def wants_network_policy(spec: VLMServiceSpec, settings: Settings) -> bool:
    mode = spec.telemetry.network_policy
    return spec.telemetry.enabled and (mode == "On" or (mode == "Auto" and settings.network_policy))


@dataclass(frozen=True)
class Desired:
    """Everything one VLMService should own, plus facts the status needs."""

    template: dict[str, Any]
    revision: str
    plan: sglang.IPCPlan
    service: dict[str, Any]
    image: str = ""  # the effective SGLang image (spec or the operator's default) and its version
    version: str | None = None
    pdb: dict[str, Any] | None = None  # None: there must be none (replicas <= 1)
    network_policy: dict[str, Any] | None = None


def _check_env_refs(spec: VLMServiceSpec, plan: sglang.IPCPlan) -> None:
    for e in spec.sglang.env:
        if e.value_from is not None and e.name in plan.env:
            raise InvalidSpec(
                f"env {e.name} comes from valueFrom, but the operator sets it for ipcCache ({e.name}="
                f"{plan.env[e.name]}); set spec.sglang.ipcCache instead",
                field="spec.sglang.env",
            )


def build_desired(owner: Owner, spec: VLMServiceSpec, settings: Settings) -> Desired:
    """Raises errors.InvalidSpec when the spec cannot be honoured (e.g. ipcCache On on an old SGLang)."""
    image = spec.sglang.image or settings.sglang_image
    version = sglang.resolve_version(spec.sglang.version, image)
    plan = sglang.plan_ipc_cache(
        version, spec.sglang.ipc_cache.mode, spec.sglang.tensor_parallel, spec.sglang.ipc_cache.feature_cache_mb
    )
    _check_env_refs(spec, plan)
    sglang.check_user_overrides(
        plan, spec.sglang.args, {e.name: e.value for e in spec.sglang.env if e.value is not None}
    )
    template = build_pod_template(owner, spec, settings, plan, liveness_plan(spec, version))
    return Desired(
        template=template,
        revision=revision_of(template),
        plan=plan,
        service=build_service(owner),
        image=image,
        version=version,
        pdb=build_pod_disruption_budget(owner) if spec.replicas > 1 else None,
        network_policy=build_network_policy(owner, settings.network_policy_peers)
        if wants_network_policy(spec, settings) else None,
    )


# ---- the operator's Jobs: the load hook (spec.rollout.load) and the weights download (model.cache.download) ----
LOAD_COMPONENT = "load"
WEIGHTS_COMPONENT = "weights"
WEIGHTS_DIR = "hf"  # HF_HOME under the cache's mountPath (the hub cache is <mountPath>/hf/hub)
WEIGHTS_RESOURCES = {"cpu": "1", "memory": "1Gi"}
WEIGHTS_BACKOFF_LIMIT = 6  # pods a download may take (each resumes the files the last one left half done)
JOB_UID = 65532  # the operator image's user
LABEL_JOB_OF = f"{PREFIX}/job-of"  # on the pods of the operator's Jobs (not the managed labels: no serving pod)
LOAD_RESOURCES = {"cpu": "500m", "memory": "256Mi"}


def _job_pod(**security: Any) -> dict[str, Any]:
    """The pod fields the operator's Jobs share: never restarted in place (a retry is a new pod), no service-account
    token, no service links, uid JOB_UID (with `security`'s extra pod securityContext fields)."""
    return {"restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": JOB_UID, **security,
                                "seccompProfile": {"type": "RuntimeDefault"}}}


def _job_container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]}}


def load_job_name(owner: Owner, targets: list[str], load: Any, model: str) -> str:
    """`<name>-load-<hash>`: a new Job when the compared pods or the load change (a Job's template is immutable)."""
    blob = json.dumps([sorted(targets), _dump(load), model], sort_keys=True).encode()
    return f"{owner.name[:46].rstrip('-.')}-load-{hashlib.sha256(blob).hexdigest()[:10]}"


def build_load_job(owner: Owner, spec: VLMServiceSpec, settings: Settings, targets: list[str],
                   deadline_s: float) -> dict[str, Any]:
    """The Job that sends `spec.rollout.load` to every compared pod (`targets`: pod IPs) while a step is analysed;
    it runs `python -m vlm_operator.jobs.loadgen` from the operator's image and stops by itself after `deadline_s`."""
    load = spec.rollout.load if spec.rollout else None
    if load is None:
        raise ValueError("build_load_job: spec.rollout.load is not set")
    model = spec.model.served_name or spec.model.path
    addrs = [f"[{ip}]:{SGLANG_PORT}" if ":" in ip else f"{ip}:{SGLANG_PORT}" for ip in sorted(targets)]
    args = ["-m", "vlm_operator.jobs.loadgen"]
    for a in addrs:
        args += ["--target", a]
    args += ["--rate", f"{load.requests_per_second:g}", "--image-fraction", f"{load.image_fraction:g}",
             "--images-per-request", str(load.images_per_request), "--image-size", str(load.image_size),
             "--max-tokens", str(load.max_tokens), "--prompt", load.prompt, "--model", model]
    name = load_job_name(owner, addrs, load, model)
    labels = {**common_labels(owner), LABEL_APP_COMPONENT: LOAD_COMPONENT}
    container = {
        "name": "load",
        "image": settings.operator_image,
        "command": ["python"],
        "args": args,
        "resources": {"requests": dict(LOAD_RESOURCES), "limits": dict(LOAD_RESOURCES)},
        "securityContext": _job_container_security(),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": owner.namespace, "labels": labels,
                     "ownerReferences": [owner.reference()]},
        "spec": {
            "backoffLimit": 3,
            "activeDeadlineSeconds": max(60, math.ceil(deadline_s)),
            "ttlSecondsAfterFinished": 600,
            "template": {
                "metadata": {"labels": {LABEL_JOB_OF: owner.name, LABEL_APP_COMPONENT: LOAD_COMPONENT}},
                "spec": {**_job_pod(), "containers": [container]},
            },
        },
    }


def weights_job_name(owner: Owner, spec: VLMServiceSpec) -> str:
    """`<name>-weights-<hash>` of model.path and model.revision: one Job per model and revision."""
    blob = f"{spec.model.path}@{spec.model.revision or ''}".encode()
    return f"{owner.name[:44].rstrip('-.')}-weights-{hashlib.sha256(blob).hexdigest()[:10]}"


def build_weights_job(owner: Owner, spec: VLMServiceSpec, settings: Settings) -> dict[str, Any]:
    """The Job that fills model.cache's claim with model.path (`python -m vlm_operator.jobs.weights` from the operator's
    image): the claim mounted read-write, HF_HOME on it, the token by reference, retried with resumption."""
    cache = spec.model.cache
    if cache is None or not wants_download(spec):
        raise ValueError("build_weights_job: the spec wants no download")
    d = cache.download
    args = ["-m", "vlm_operator.jobs.weights", "--repo", spec.model.path]
    if spec.model.revision:
        args += ["--revision", spec.model.revision]
    env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": weights_env(spec)["HF_HOME"]},
                                 {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}]
    if d.endpoint:
        env.append({"name": "HF_ENDPOINT", "value": d.endpoint})
    if d.token_secret_ref is not None:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": _dump(d.token_secret_ref)}})
    labels = {**common_labels(owner), LABEL_APP_COMPONENT: WEIGHTS_COMPONENT}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": weights_job_name(owner, spec), "namespace": owner.namespace, "labels": labels,
                     "annotations": {f"{PREFIX}/model": f"{spec.model.path}@{spec.model.revision or 'main'}"},
                     "ownerReferences": [owner.reference()]},
        "spec": {
            "backoffLimit": WEIGHTS_BACKOFF_LIMIT,
            "template": {
                "metadata": {"labels": {LABEL_JOB_OF: owner.name, LABEL_APP_COMPONENT: WEIGHTS_COMPONENT}},
                "spec": {
                    **_job_pod(fsGroup=JOB_UID),
                    "containers": [{
                        "name": "download",
                        "image": settings.operator_image,
                        "command": ["python"],
                        "args": args,
                        "env": env,
                        "volumeMounts": [{"name": "model-cache", "mountPath": cache.mount_path},
                                         {"name": "tmp", "mountPath": "/tmp"}],
                        "resources": {"requests": dict(WEIGHTS_RESOURCES), "limits": dict(WEIGHTS_RESOURCES)},
                        "terminationMessagePolicy": "FallbackToLogsOnError",
                        "securityContext": _job_container_security(),
                    }],
                    "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": cache.claim_name}},
                                {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}],
                },
            },
        },
    }
