"""The VLMService API (serving.vlmops.dev/v1alpha1) as pydantic models.

These models are the single source of truth: `vlm_operator.api.crdgen` turns them
into the CRD in crds/ (and the chart's copy), with the same patterns, bounds
and cross-field rules as CEL (`x-kubernetes-validations`). Python validators
below mirror every CEL rule, so the operator rejects exactly what the API
server rejects; an integration test checks that the two agree.

camelCase in YAML, snake_case in Python.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from vlm_operator.api import names
from vlm_operator.api.core import (
    _ONE_SOURCE_MSG as _ONE_SOURCE_MSG,
)
from vlm_operator.api.core import (
    _SELECTOR_VALUES_MSG as _SELECTOR_VALUES_MSG,
)
from vlm_operator.api.core import (
    _SYS_ADMIN as _SYS_ADMIN,
)
from vlm_operator.api.core import (
    CONFIG_KEY_PATTERN as CONFIG_KEY_PATTERN,
)
from vlm_operator.api.core import (
    DNS_LABEL_PATTERN as DNS_LABEL_PATTERN,
)
from vlm_operator.api.core import (
    DNS_SUBDOMAIN_PATTERN as DNS_SUBDOMAIN_PATTERN,
)
from vlm_operator.api.core import (
    ENV_NAME_PATTERN as ENV_NAME_PATTERN,
)
from vlm_operator.api.core import (
    FUNCTION_PATTERN as FUNCTION_PATTERN,
)
from vlm_operator.api.core import (
    IMAGE_PATTERN as IMAGE_PATTERN,
)
from vlm_operator.api.core import (
    LABEL_VALUE_PATTERN as LABEL_VALUE_PATTERN,
)
from vlm_operator.api.core import (
    OPERATOR_LABELS as OPERATOR_LABELS,
)
from vlm_operator.api.core import (
    OPERATOR_PREFIX as OPERATOR_PREFIX,
)
from vlm_operator.api.core import (
    QUALIFIED_NAME_PATTERN as QUALIFIED_NAME_PATTERN,
)
from vlm_operator.api.core import (
    RESERVED_VOLUMES as RESERVED_VOLUMES,
)
from vlm_operator.api.core import (
    SELECTOR_VALUES_CEL as SELECTOR_VALUES_CEL,
)
from vlm_operator.api.core import (
    SHM_PATH as SHM_PATH,
)
from vlm_operator.api.core import (
    VERSION_PATTERN as VERSION_PATTERN,
)
from vlm_operator.api.core import (
    VOLUME_SOURCES as VOLUME_SOURCES,
)

# The core Kubernetes types (re-exported: api.EnvVar, api.Volume, ...).
from vlm_operator.api.core import (
    Affinity as Affinity,
)
from vlm_operator.api.core import (
    Capabilities as Capabilities,
)
from vlm_operator.api.core import (
    Capability as Capability,
)
from vlm_operator.api.core import (
    ConfigMapVolumeSource as ConfigMapVolumeSource,
)
from vlm_operator.api.core import (
    CSIVolumeSource as CSIVolumeSource,
)
from vlm_operator.api.core import (
    DownwardAPIVolumeSource as DownwardAPIVolumeSource,
)
from vlm_operator.api.core import (
    Duration as Duration,
)
from vlm_operator.api.core import (
    EmptyDirVolumeSource as EmptyDirVolumeSource,
)
from vlm_operator.api.core import (
    EnvFromRef as EnvFromRef,
)
from vlm_operator.api.core import (
    EnvFromSource as EnvFromSource,
)
from vlm_operator.api.core import (
    EnvVar as EnvVar,
)
from vlm_operator.api.core import (
    EnvVarSource as EnvVarSource,
)
from vlm_operator.api.core import (
    EphemeralVolumeSource as EphemeralVolumeSource,
)
from vlm_operator.api.core import (
    FieldSelector as FieldSelector,
)
from vlm_operator.api.core import (
    HostPathVolumeSource as HostPathVolumeSource,
)
from vlm_operator.api.core import (
    ImageVolumeSource as ImageVolumeSource,
)
from vlm_operator.api.core import (
    KeySelector as KeySelector,
)
from vlm_operator.api.core import (
    KeyToPaths as KeyToPaths,
)
from vlm_operator.api.core import (
    KubeModel as KubeModel,
)
from vlm_operator.api.core import (
    LabelSelector as LabelSelector,
)
from vlm_operator.api.core import (
    LabelSelectorRequirement as LabelSelectorRequirement,
)
from vlm_operator.api.core import (
    LabelValue as LabelValue,
)
from vlm_operator.api.core import (
    LocalObjectReference as LocalObjectReference,
)
from vlm_operator.api.core import (
    NFSVolumeSource as NFSVolumeSource,
)
from vlm_operator.api.core import (
    NodeAffinity as NodeAffinity,
)
from vlm_operator.api.core import (
    NodeSelector as NodeSelector,
)
from vlm_operator.api.core import (
    NodeSelectorRequirement as NodeSelectorRequirement,
)
from vlm_operator.api.core import (
    NodeSelectorTerm as NodeSelectorTerm,
)
from vlm_operator.api.core import (
    OpenKubeModel as OpenKubeModel,
)
from vlm_operator.api.core import (
    PersistentVolumeClaimVolumeSource as PersistentVolumeClaimVolumeSource,
)
from vlm_operator.api.core import (
    PodAffinity as PodAffinity,
)
from vlm_operator.api.core import (
    PodAffinityTerm as PodAffinityTerm,
)
from vlm_operator.api.core import (
    PreferredSchedulingTerm as PreferredSchedulingTerm,
)
from vlm_operator.api.core import (
    ProfileRef as ProfileRef,
)
from vlm_operator.api.core import (
    ProjectedVolumeSource as ProjectedVolumeSource,
)
from vlm_operator.api.core import (
    Quantity as Quantity,
)
from vlm_operator.api.core import (
    SecretVolumeSource as SecretVolumeSource,
)
from vlm_operator.api.core import (
    SecurityContext as SecurityContext,
)
from vlm_operator.api.core import (
    SELinuxOptions as SELinuxOptions,
)
from vlm_operator.api.core import (
    Toleration as Toleration,
)
from vlm_operator.api.core import (
    TopologySpreadConstraint as TopologySpreadConstraint,
)
from vlm_operator.api.core import (
    Volume as Volume,
)
from vlm_operator.api.core import (
    VolumeMount as VolumeMount,
)
from vlm_operator.api.core import (
    WeightedPodAffinityTerm as WeightedPodAffinityTerm,
)
from vlm_operator.api.core import (
    _check_values as _check_values,
)

# Re-exported (api.GROUP, api.PLURAL, ...): the API's names, defined in vlm_operator.api.names.
from vlm_operator.api.names import GROUP as GROUP
from vlm_operator.api.names import KIND as KIND
from vlm_operator.api.names import PLURAL as PLURAL
from vlm_operator.api.names import SHORT_NAMES as SHORT_NAMES
from vlm_operator.api.names import SINGULAR as SINGULAR
from vlm_operator.api.names import VERSION as VERSION
from vlm_operator.api.units import DURATION_PATTERN as DURATION_PATTERN
from vlm_operator.api.units import QUANTITY_PATTERN as QUANTITY_PATTERN
from vlm_operator.api.units import parse_duration

# Literal types built from the shared names (pydantic and the CRD's enums see the same values).
FrontendRole = Literal[names.FRONTEND_ROLES]
RolloutPhase = Literal[names.PHASES]

DEFAULT_SGLANG_IMAGE = "lmsysorg/sglang:v0.5.23"
# A terminating pod's grace period without spec.pod.terminationGracePeriodSeconds; of any grace period, SGLang's
# preStop drain takes at most all but SHUTDOWN_MARGIN_SECONDS (SGLang's own shutdown after SIGTERM).
DEFAULT_GRACE_SECONDS = 120
SHUTDOWN_MARGIN_SECONDS = 15
DEFAULT_GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"

# Launch arguments the operator owns; users set them through spec fields.
MANAGED_ARGS = ("--model-path", "--model", "--tp", "--tp-size", "--tensor-parallel-size", "--host", "--port")
MANAGED_ARGS_CEL = r"^--(model-path|model|tp|tp-size|tensor-parallel-size|host|port)(=.*)?$"
# Env the operator owns when ipcCache.mode is On or Off.
IPC_ENV = ("SGLANG_USE_CUDA_IPC_TRANSPORT", "SGLANG_USE_IPC_POOL_HANDLE_CACHE")



# ---------------------------------------------------------------- spec


class ModelDownload(KubeModel):
    """How the weights get into the cache: once per model and revision, by a Job, before any pod starts."""

    mode: Literal["Auto", "Never"] = Field(
        "Auto",
        description="Auto: when model.path is a hub id (not a path starting with /), a Job of the operator's image "
        "downloads it into the claim once (huggingface_hub, resumable), condition ModelReady follows it, serving "
        "pods wait for it and run with HF_HOME on the claim and HF_HUB_OFFLINE=1. Never: the claim is filled by "
        "someone else; SGLang loads model.path as it is.",
    )
    token_secret_ref: KeySelector | None = Field(
        None, alias="tokenSecretRef",
        description="Secret key with a hub token (gated or private models), given to the download Job only as HF_TOKEN.",
    )
    endpoint: str | None = Field(
        None, description="Hub endpoint (HF_ENDPOINT): a mirror or a proxy instead of huggingface.co.",
        pattern=r"^https?://\S+$", max_length=512,
    )


class ModelCache(KubeModel):
    """A PersistentVolumeClaim that holds the weights, mounted read-only."""

    claim_name: str = Field(description="Name of a PVC in the service's namespace.", pattern=DNS_LABEL_PATTERN, max_length=253)
    mount_path: str = Field("/models", description="Where the PVC is mounted in the SGLang container.", pattern=r"^/.*")
    read_only: bool = Field(True, description="Mount the PVC read-only.")
    download: ModelDownload = Field(
        default_factory=ModelDownload,
        description="Fill the claim with model.path's weights once (a Job per model and revision) before pods start. "
        "The claim must be writable by the Job's pod (ReadWriteMany, or ReadWriteOnce on one node).",
    )


class ModelSpec(KubeModel):
    path: str = Field(
        description="Hugging Face id or a local path inside the container (e.g. Qwen/Qwen2.5-VL-3B-Instruct).",
        min_length=1,
        max_length=512,
        pattern=r"^\S+$",
    )
    revision: str | None = Field(None, description="Model revision (branch, tag or commit) to load.", max_length=128)
    served_name: str | None = Field(
        None, description="Name clients use in the OpenAI API (--served-model-name).", max_length=128, pattern=r"^\S+$"
    )
    cache: ModelCache | None = Field(None, description="PVC with the weights; without it SGLang downloads them.")


class IPCCache(KubeModel):
    mode: Literal["Auto", "On", "Off"] = Field(
        "Auto",
        description=(
            "CUDA IPC pool-handle cache for multimodal features (SGLang >= 0.5.10). Auto switches it on where the "
            "SGLang version has it; On refuses versions without it; Off forces it off."
        ),
    )
    feature_cache_mb: int | None = Field(
        None,
        alias="featureCacheMB",
        description="Size of the CUDA IPC feature pool in MiB (SGLANG_MM_FEATURE_CACHE_MB).",
        ge=64,
        le=65536,
    )


class SGLangSpec(KubeModel):
    cel = (
        (
            "!has(self.args) || !self.args.exists(a, a.matches('" + MANAGED_ARGS_CEL + "'))",
            "args must not set --model-path, --tp, --host or --port: use spec.model.path and "
            "spec.sglang.tensorParallel",
            ".args",
        ),
        (
            "!has(self.ipcCache) || !has(self.ipcCache.mode) || self.ipcCache.mode == 'Auto' || !has(self.env) "
            "|| !self.env.exists(e, e.name in "
            + str(list(IPC_ENV)).replace('"', "'")
            + ")",
            "env must not set SGLANG_USE_CUDA_IPC_TRANSPORT or SGLANG_USE_IPC_POOL_HANDLE_CACHE when "
            "ipcCache.mode is On or Off: the operator sets them",
            ".env",
        ),
        (
            "!has(self.startupTimeout) || (duration(self.startupTimeout) >= duration('1m') "
            "&& duration(self.startupTimeout) <= duration('6h'))",
            "startupTimeout must be between 1m and 6h",
            ".startupTimeout",
        ),
    )

    image: str | None = Field(
        None,
        description="SGLang container image; the operator's VLM_SGLANG_IMAGE when absent "
        "(status.sglang.image reports the one in use).",
        pattern=IMAGE_PATTERN,
        max_length=512,
    )
    version: str | None = Field(
        None,
        description="SGLang version (e.g. 0.5.10.post1). Derived from the image tag when absent.",
        pattern=VERSION_PATTERN,
        max_length=32,
    )
    tensor_parallel: int = Field(1, description="Tensor-parallel degree (--tp).", ge=1, le=16)
    args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list, description="Extra launch arguments for sglang.launch_server.", max_length=64
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        description="Extra environment variables; valueFrom takes a value from a Secret, a ConfigMap or the pod.",
        max_length=64,
    )
    env_from: list[EnvFromSource] = Field(
        default_factory=list, description="Secrets and ConfigMaps whose keys all become variables.", max_length=16
    )
    ipc_cache: IPCCache = Field(default_factory=IPCCache, description="CUDA IPC pool-handle cache.")
    volume_mounts: list[VolumeMount] | None = Field(
        None,
        description="Mounts of spec.pod.volumes in the SGLang container (not /dev/shm, not the model cache's path).",
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["mountPath"]},
    )
    security_context: SecurityContext | None = Field(
        None,
        description="The SGLang container's securityContext. The operator's defaults, allowPrivilegeEscalation "
        "false and seccompProfile RuntimeDefault, stay for every field not set here.",
    )
    startup_timeout: Duration = Field(
        "20m",
        description="How long SGLang may take to load the model and answer /health (1m-6h): the startup probe's "
        "budget; past it the kubelet restarts the container.",
    )

    @field_validator("args")
    @classmethod
    def _managed_args(cls, v: list[str]) -> list[str]:
        for a in v:
            if re.match(MANAGED_ARGS_CEL, a):
                raise ValueError(
                    f"{a!r}: args must not set --model-path, --tp, --host or --port: use spec.model.path and "
                    "spec.sglang.tensorParallel"
                )
        return v

    @field_validator("volume_mounts")
    @classmethod
    def _mounts_once(cls, v: list[VolumeMount] | None) -> list[VolumeMount] | None:
        # The CRD's list-type map (key mountPath) refuses a repeated path; so does the model.
        paths = [m.mount_path for m in v or []]
        if len(set(paths)) != len(paths):
            raise ValueError(f"a mountPath may appear once: {paths}")
        return v

    @field_validator("startup_timeout")
    @classmethod
    def _startup_bounds(cls, v: str) -> str:
        if not 60 <= parse_duration(v) <= 6 * 3600:
            raise ValueError(f"startupTimeout {v} must be between 1m and 6h")
        return v

    @model_validator(mode="after")
    def _ipc_env(self) -> SGLangSpec:
        if self.ipc_cache.mode != "Auto":
            for e in self.env:
                if e.name in IPC_ENV:
                    raise ValueError(
                        f"env: {e.name} must not be set when ipcCache.mode is {self.ipc_cache.mode}: "
                        "the operator sets it"
                    )
        return self


def _reserved_label(key: str) -> bool:
    return key.startswith(OPERATOR_PREFIX) or key in OPERATOR_LABELS


_KEYS_CEL = "self.all(k, k.matches('" + QUALIFIED_NAME_PATTERN + "'))"


def _qualified_keys(what: str, keys: Iterable[str]) -> None:
    """The Python side of `_KEYS_CEL`."""
    for k in keys:
        if not re.match(QUALIFIED_NAME_PATTERN, k):
            raise ValueError(f"{what}: {k!r} is not a qualified name (prefix/name)")


class PodSpec(KubeModel):
    """Pod-level settings of every serving pod (stable, canary and baseline alike)."""

    cel = (
        ("!has(self.labels) || " + _KEYS_CEL.replace("self.all", "self.labels.all"),
         "label keys must be qualified names (prefix/name)", ".labels"),
        (
            "!has(self.labels) || self.labels.all(k, !k.startsWith('" + OPERATOR_PREFIX + "') && !(k in "
            + str(list(OPERATOR_LABELS)).replace('"', "'") + "))",
            f"labels must not use the operator's prefix {OPERATOR_PREFIX} or its own labels "
            f"({', '.join(OPERATOR_LABELS)})",
            ".labels",
        ),
        ("!has(self.annotations) || " + _KEYS_CEL.replace("self.all", "self.annotations.all"),
         "annotation keys must be qualified names (prefix/name)", ".annotations"),
        (
            "!has(self.annotations) || self.annotations.all(k, !k.startsWith('" + OPERATOR_PREFIX + "'))",
            f"annotations must not use the operator's prefix {OPERATOR_PREFIX}",
            ".annotations",
        ),
    )

    labels: dict[str, LabelValue] | None = Field(
        None, description="Extra labels on the pods (not on the Deployments).", max_length=32
    )
    annotations: dict[str, Annotated[str, Field(max_length=4096)]] | None = Field(
        None, description="Extra annotations on the pods.", max_length=32
    )
    service_account_name: str | None = Field(
        None, description="ServiceAccount the pods run as (the namespace's default when absent).",
        pattern=DNS_SUBDOMAIN_PATTERN, max_length=253,
    )
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        None, description="Secrets for pulling the SGLang and the sidecar images (one pod, one list).", max_length=16
    )
    priority_class_name: str | None = Field(
        None, description="PriorityClass of the pods.", pattern=DNS_SUBDOMAIN_PATTERN, max_length=253
    )
    affinity: Affinity | None = Field(None, description="Kubernetes affinity (node, pod, pod anti-affinity).")
    topology_spread_constraints: list[TopologySpreadConstraint] | None = Field(
        None, description="How the pods spread over topology domains.", max_length=8
    )
    runtime_class_name: str | None = Field(
        None, description="RuntimeClass of the pods (e.g. nvidia, where the GPU runtime is not the node's default).",
        pattern=DNS_SUBDOMAIN_PATTERN, max_length=253,
    )
    scheduler_name: str | None = Field(
        None, description="Scheduler of the pods (e.g. a gang or topology-aware GPU scheduler); the default "
        "scheduler when absent.", pattern=DNS_SUBDOMAIN_PATTERN, max_length=253,
    )
    termination_grace_period_seconds: int | None = Field(
        None,
        description=f"Grace period of a terminating pod, {DEFAULT_GRACE_SECONDS} s when absent. SGLang's preStop "
        f"hook waits while requests are running or queued (sglang:num_running_reqs, sglang:num_queue_reqs), for "
        f"at most the grace period less {SHUTDOWN_MARGIN_SECONDS} s, which SGLang keeps for its own shutdown.",
        ge=1,
        le=3600,
    )
    automount_service_account_token: bool | None = Field(
        None, description="Mount the ServiceAccount's API token into the pods; false when absent (SGLang and the "
        "sidecar never call the Kubernetes API)."
    )
    volumes: list[Volume] | None = Field(
        None,
        description="Extra pod volumes, mounted into SGLang by spec.sglang.volumeMounts (the names dshm, "
        "profiler-tmp and model-cache are the operator's).",
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @field_validator("volumes")
    @classmethod
    def _volumes_once(cls, v: list[Volume] | None) -> list[Volume] | None:
        # The CRD's list-type map (key name) refuses a repeated name; so does the model.
        names_ = [x.name for x in v or []]
        if len(set(names_)) != len(names_):
            raise ValueError(f"a volume name may appear once: {names_}")
        return v

    @model_validator(mode="after")
    def _keys(self) -> PodSpec:
        for what, keys in (("labels", self.labels or {}), ("annotations", self.annotations or {})):
            _qualified_keys(what, keys)
            for k in keys:
                if k.startswith(OPERATOR_PREFIX) or (what == "labels" and k in OPERATOR_LABELS):
                    raise ValueError(f"{what}: {k!r} is the operator's own (prefix {OPERATOR_PREFIX})")
        return self


class GPUSpec(KubeModel):
    cel = (("!has(self.nodeSelector) || " + _KEYS_CEL.replace("self.all", "self.nodeSelector.all"),
            "nodeSelector keys must be qualified names (prefix/name)", ".nodeSelector"),)

    product: str = Field(
        DEFAULT_GPU_PRODUCT,
        description="Value of the nvidia.com/gpu.product node label the pods must run on.",
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    )
    count: int | None = Field(
        None, description="GPUs per replica; defaults to tensorParallel. Must be a multiple of it.", ge=1, le=16
    )
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict, description="Extra node selector labels (keys prefix/name, label values).", max_length=32
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Tolerations for GPU node taints.", max_length=32
    )

    @model_validator(mode="after")
    def _selector_keys(self) -> GPUSpec:
        _qualified_keys("nodeSelector", self.node_selector)
        return self


class ResourcesSpec(KubeModel):
    cpu: Quantity = Field("8", description="CPU request and limit of the SGLang container.")
    memory: Quantity = Field("64Gi", description="Memory request and limit of the SGLang container.")
    shm_size: Quantity = Field("16Gi", description="Size of the memory-backed /dev/shm.")


class TelemetrySpec(KubeModel):
    # has() guards: the API server also checks these rules against the `{}` default, before nested defaulting.
    cel = (
        (
            "!has(self.duration) || !has(self.interval) || duration(self.duration) <= duration(self.interval)",
            "duration must not exceed interval",
            ".duration",
        ),
    )

    enabled: bool = Field(True, description="Run the profiler sidecar.")
    interval: Duration = Field("15s", description="Time between the starts of two sampling windows.")
    duration: Duration = Field("5s", description="Length of one sampling window.")
    rate: int = Field(1000, description="py-spy sampling rate in Hz.", ge=1, le=2000)
    watch_functions: list[Annotated[str, Field(pattern=FUNCTION_PATTERN, max_length=128)]] = Field(
        default_factory=lambda: list(names.DEFAULT_WATCH_FUNCTIONS),
        description="Functions whose share is always exported (besides the top N).",
        max_length=32,
    )
    frontend_roles: list[FrontendRole] = Field(
        default_factory=list,
        description="SGLang front-end roles the sidecar samples besides the schedulers (the main server process's "
        "TokenizerManager loop, tokenizer workers, the image processor pool, the detokenizer): their busy shares "
        "are exported, gated (maxRegression.frontendBusy) and watched by VLMFrontendSaturated. Off by default for "
        "the sidecar's CPU (about 0.09 cores with every role, 0.06 without); gating it did not raise the "
        "false-rollback rate at the defaults (docs/canary-analysis.md).",
        max_length=4,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    image: str | None = Field(None, description="Sidecar image override.", pattern=IMAGE_PATTERN, max_length=512)
    network_policy: Literal["Auto", "On", "Off"] = Field(
        "Auto",
        description=f"A NetworkPolicy that admits only the operator and Prometheus to the sidecar's port "
        f"{names.SIDECAR_PORT} (SGLang's port stays open). Auto follows the operator's VLM_NETWORK_POLICY setting (on by default).",
    )
    run_as_user: int = Field(
        0,
        description="UID of the profiler sidecar. py-spy needs the scheduler's UID (or root): set the UID the "
        "SGLang image runs as; lmsysorg/sglang images run as root (0).",
        ge=0,
        le=2147483647,
    )

    @field_validator("frontend_roles")
    @classmethod
    def _roles_once(cls, v: list[str]) -> list[str]:
        # The CRD's x-kubernetes-list-type: set refuses a repeated role; so does the model.
        if len(set(v)) != len(v):
            raise ValueError(f"a role may appear once: {v}")
        return v

    @model_validator(mode="after")
    def _window_fits(self) -> TelemetrySpec:
        if parse_duration(self.duration) > parse_duration(self.interval):
            raise ValueError(f"duration {self.duration} must not exceed interval {self.interval}")
        return self


class RolloutStep(KubeModel):
    replicas: int = Field(description="Canary replicas during this step.", ge=1, le=64)
    analysis: Duration = Field("5m", description="How long to analyse this step before moving on.")


class MaxRegression(KubeModel):
    loop_latency: float = Field(3.0, description="Allowed increase of scheduler loop latency, percent.", ge=0, le=100)
    loop_p95: float | None = Field(
        None,
        alias="loopP95",
        description="Allowed increase of the scheduler loop's p95 latency, percent (LoopP95Regressed); absent: the "
        "p95 is reported but not gated.",
        ge=0,
        le=100,
    )
    ttft: float = Field(10.0, description="Allowed increase of time to first token, percent.", ge=0, le=100)
    itl: float = Field(10.0, description="Allowed increase of inter-token latency, percent.", ge=0, le=100)
    throughput: float = Field(
        5.0,
        description="Allowed drop of generation throughput, percent, compared in windows where the pod was "
        "saturated (requests waiting in SGLang's queue): its capacity, not its traffic.",
        ge=0,
        le=100,
    )
    stage_time: float = Field(
        5.0,
        description="Allowed growth of one scheduler stage's time per loop iteration, in percent of the baseline's "
        "loop time (share x loop latency, so a canary that is faster overall never fails it). Where SGLang (0.5.20 "
        "on) counts its stages itself, the same margin also holds each stage's share of the scheduler's wall time "
        "at the baseline's forward-pass rate (signal sglang_stage_time).",
        ge=0,
        le=100,
    )
    frontend_busy: float = Field(
        10.0,
        description="Allowed growth of one front-end role's busy share (tokenizer manager, tokenizer workers, "
        "image processor pool, detokenizer), in points, each pod's share scaled to the baseline's request rate; "
        "compared only where both revisions' sidecars sample the front end (telemetry.frontendRoles).",
        ge=0,
        le=100,
    )


class ExpandCeiling(KubeModel):
    """Fixed harm ceilings, per signal, in maxRegression's units; a signal not named gets the default derived at each
    look from one canary pod's standard error (a harmless canary expands 99% of the time at one look; the status
    shows the effective ceiling at each look). A fixed ceiling below that default caps the harm a step may expose
    and is warned about from the first look (Warning CanaryExpandCeilingCapped, status.rollout.warning: how often
    a harmless canary then expands): its steps may wait for maxDuration."""

    loop_latency: float | None = Field(None, ge=0, le=100)
    loop_p95: float | None = Field(None, alias="loopP95", ge=0, le=100)
    ttft: float | None = Field(None, ge=0, le=100)
    itl: float | None = Field(None, ge=0, le=100)
    throughput: float | None = Field(None, ge=0, le=100)
    stage_time: float | None = Field(None, ge=0, le=100)
    frontend_busy: float | None = Field(None, ge=0, le=100)


def _ceiling_rules() -> tuple[tuple[str, str, str], ...]:
    """One CEL rule per signal: a fixed ceiling is at least the signal's margin (set or default)."""
    out = []
    for name, f in MaxRegression.model_fields.items():
        key = f.alias or "".join(w if i == 0 else w.title() for i, w in enumerate(name.split("_")))
        default = f.default if f.default is not None else 0.0
        margin = (f"(has(self.maxRegression) && has(self.maxRegression.{key}) ? "
                  f"double(self.maxRegression.{key}) : {float(default)!r})")
        out.append((f"!has(self.expandCeiling) || !has(self.expandCeiling.{key}) || "
                    f"double(self.expandCeiling.{key}) >= {margin}",
                    f"expandCeiling.{key} must be at least maxRegression.{key}", f".expandCeiling.{key}"))
    return tuple(out)


class AnalysisSpec(KubeModel):
    cel = (
        *_ceiling_rules(),
        ("!has(self.source) || self.source != 'Prometheus' || has(self.prometheusURL)",
         "source Prometheus needs prometheusURL (or leave source Auto to use the operator's default)",
         ".prometheusURL"),
        (
            "!has(self.interval) || !has(self.maxDuration) || duration(self.interval) <= duration(self.maxDuration)",
            "interval must not exceed maxDuration",
            ".interval",
        ),
        ("!has(self.interval) || duration(self.interval) > duration('0s')", "interval must be positive", ".interval"),
        # The schema's `minimum: 0.5` lets a literal 0 through on kube-apiserver 1.34 (found by
        # tests/integration/test_spec_fuzz.py); the rule catches it.
        ("!has(self.confidence) || self.confidence >= 0.5", "confidence must be at least 0.5", ".confidence"),
    )

    source: Literal["Auto", "Prometheus", "Sidecar"] = Field(
        "Auto",
        description="Where signals come from: Prometheus (PromQL), Sidecar (scrape the sidecars directly), "
        "or Auto (Prometheus when a URL is known, else the sidecars).",
    )
    prometheus_url: str | None = Field(
        None, alias="prometheusURL", description="Prometheus base URL.", pattern=r"^https?://\S+$", max_length=512
    )
    interval: Duration = Field("1m", description="Time between two analyses.")
    max_regression: MaxRegression = Field(default_factory=MaxRegression, description="Allowed regression per signal.")
    expand_ceiling: ExpandCeiling | None = Field(
        None, description="Fixed harm ceilings before the last step (default: derived from one pod's standard error).")
    confidence: float = Field(
        0.95, description="1 - each test's error budget over the whole rollout (rolling back a canary within half "
        "its margin; promoting one beyond its promotion margin).", ge=0.5, le=0.999)
    # 3: the trimmed t-test needs two values per side left after trimming (vlm_operator.analysis.stats.MIN_PER_SIDE).
    min_samples: int = Field(5, description="Profiler windows needed per revision before any verdict.", ge=3, le=1000)
    max_duration: Duration = Field(
        "30m",
        description="Analysis time after which a step the evidence has not decided goes to onInconclusive: no step "
        "advances on an estimate alone.",
    )
    on_inconclusive: Literal["Rollback", "Promote", "Pause"] = Field(
        "Rollback",
        description="What to do at maxDuration when the evidence has decided nothing (not confidently worse, not "
        "under the ceiling or inside the margin) or data are missing; missing data never promote (Promote then "
        "pauses).",
    )

    @model_validator(mode="after")
    def _checks(self) -> AnalysisSpec:
        if self.source == "Prometheus" and not self.prometheus_url:
            raise ValueError("prometheusURL: source Prometheus needs prometheusURL")
        if parse_duration(self.interval) <= 0:
            raise ValueError(f"interval {self.interval} must be positive")
        if parse_duration(self.interval) > parse_duration(self.max_duration):
            raise ValueError(f"interval {self.interval} must not exceed maxDuration {self.max_duration}")
        if self.expand_ceiling is not None:
            for name in ExpandCeiling.model_fields:
                c, m = getattr(self.expand_ceiling, name), getattr(self.max_regression, name)
                if c is not None and c < (m if m is not None else 0.0):
                    key = "".join(w if i == 0 else w.title() for i, w in enumerate(name.split("_")))
                    raise ValueError(f"expandCeiling.{key}: {c} is below maxRegression.{key} {m}")
        return self


class LoadHook(KubeModel):
    """Requests the operator sends while a step is analysed, for a service without production traffic."""

    # The schema's `minimum: 0.01` lets a literal 0 through on kube-apiserver 1.34 (as confidence's minimum;
    # found by tests/integration/test_spec_fuzz.py); the rule catches it.
    cel = (("!has(self.requestsPerSecond) || self.requestsPerSecond >= 0.01",
            "requestsPerSecond must be at least 0.01", ".requestsPerSecond"),)

    requests_per_second: float = Field(
        1.0, description="Requests per second sent to each compared pod (every canary and stable/baseline pod gets "
        "the same rate, fixed intervals).", ge=0.01, le=100,
    )
    image_fraction: float = Field(
        0.5, description="Share of requests that carry images (the rest are text only), 0 to 1.", ge=0, le=1
    )
    images_per_request: int = Field(1, description="Images in a request that carries images.", ge=1, le=8)
    image_size: int = Field(448, description="Side of each generated image in pixels (a fresh PNG per request).",
                            ge=16, le=2048)
    max_tokens: int = Field(16, description="max_tokens of each request.", ge=1, le=4096)
    prompt: str = Field("Describe this image in one sentence.", description="The user message's text.",
                        min_length=1, max_length=2048)


class RolloutSpec(KubeModel):
    cel = (
        (
            "!has(self.steps) || !has(self.analysis) || !has(self.analysis.maxDuration) || self.steps.all(s, "
            "!has(s.analysis) || duration(s.analysis) <= duration(self.analysis.maxDuration))",
            "a step's analysis must not exceed analysis.maxDuration (a step's analysis is 5m when not set)",
            ".steps",
        ),
    )

    steps: list[RolloutStep] | None = Field(
        None,
        description="Canary steps, each analysed before the next: the canary's pods in the step (cumulative). Not "
        "set: 1, 2, 4, ... while a stable pod is left to compare with (a 1-replica service: one canary pod next to "
        "its stable pod on a free GPU). After the last step the remaining stable pods are replaced node by node, "
        "still analysed (phase Promoting).",
        min_length=1,
        max_length=10,
    )
    max_unavailable: int = Field(
        1,
        ge=0,
        le=64,
        description="Ready replicas never fall below spec.replicas minus this while pods are replaced (a step, the "
        "promotion, a rollback). 0: only surge, on free GPUs. Spec changes without a rollout block use 1.",
    )
    capacity: Literal["Auto", "Surge", "Borrow"] = Field(
        "Auto",
        description="How a new pod gets its GPU. Auto: on a free GPU of a node that runs the pod it pairs with "
        "(a surge: no capacity dip), else it replaces that pod on its node within maxUnavailable. Surge: only on "
        "free GPUs (waits for one). Borrow: always replaces.",
    )
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec, description="Canary analysis.")
    baseline: Literal["Fresh", "Stable"] = Field(
        "Stable",
        description="What the canary is compared with. Stable: the stable pods, each canary pod placed on the node "
        "of the stable pod it replaces (or next to it on a free GPU). Fresh: also as many new pods of the stable "
        "revision as the step has canary pods, started with them on free GPUs (same age; costs a GPU per canary "
        "pod); used where free GPUs allow, else Stable.",
    )
    startup_timeout: Duration = Field(
        "30m",
        description="How long a step's canary pods may take to become Ready; then the canary is rolled back "
        "(CanaryStartTimeout). Start-up never counts against analysis.maxDuration.",
    )
    load: LoadHook | None = Field(
        None,
        description="Drive load while a step is analysed: a Job of the operator's image sends chat completions "
        "(text and image) at the same rate to every compared pod, so a service without production traffic reaches "
        "a verdict. Not set: a step without traffic waits (NoTraffic) and, at maxDuration, pauses; it is never "
        "rolled back for want of traffic.",
    )

    def schedule(self, replicas: int) -> list[RolloutStep]:
        """The steps as written, or the default schedule for `replicas` (module placement)."""
        if self.steps:
            return list(self.steps)
        # each default step analysed 5m, or maxDuration when that is shorter
        analysis = self.analysis.max_duration if parse_duration(self.analysis.max_duration) < 300 else "5m"
        k = 1
        out = [RolloutStep(replicas=1, analysis=analysis)]
        while k * 2 < replicas:
            k *= 2
            out.append(RolloutStep(replicas=k, analysis=analysis))
        return out

    @model_validator(mode="after")
    def _steps_fit(self) -> RolloutSpec:
        limit = parse_duration(self.analysis.max_duration)
        for i, s in enumerate(self.steps or []):
            if parse_duration(s.analysis) > limit:
                raise ValueError(
                    f"steps[{i}].analysis {s.analysis} must not exceed analysis.maxDuration {self.analysis.max_duration}"
                )
        return self


DEFAULT_BUSY_TARGET = 85.0


class AutoscalingTargets(KubeModel):
    """Per-replica targets; the autoscaler keeps every one at or below its target, so the replica count follows the
    signal furthest above its own (KEDA's HPA takes the largest of its triggers' desired counts). Only the targets
    set are used; none set: schedulerBusyPercent 85, and frontendBusyPercent 85 where telemetry.frontendRoles are
    sampled (`effective`)."""

    scheduler_busy_percent: float | None = Field(
        None,
        description="Mean busy share of the SGLang scheduler per replica, percent (1 - the idle stage's share, "
        "vlm_scheduler_stage_share_ratio, of its busiest TP rank). The scheduler loop is one CPU thread in front of "
        "the GPU; near 100% it is the bottleneck whatever the GPU shows.",
        ge=1, le=100,
    )
    frontend_busy_percent: float | None = Field(
        None,
        description="Mean busy share of the busiest front-end role per replica (tokenizer manager, tokenizer "
        "workers, image processor pool, detokenizer), percent (vlm_frontend_busy_share_ratio): image decoding and "
        "tokenization cap a VLM's throughput with the GPU idle. Needs telemetry.frontendRoles.",
        ge=1, le=100,
    )
    queue_per_replica: float | None = Field(
        None,
        description="Requests waiting in SGLang's queue per replica (sglang:num_queue_reqs).", ge=0.1, le=10000,
    )
    kv_cache_usage_percent: float | None = Field(
        None,
        description="Mean KV-cache usage per replica, percent (sglang:token_usage).", ge=1, le=100,
    )
    ttft_p95: Duration | None = Field(
        None,
        alias="ttftP95",
        description="Time to first token, p95 over the service (sglang:time_to_first_token_seconds): replicas "
        "scale in proportion to how far it is above this.",
    )

    def effective(self, frontend_sampled: bool) -> AutoscalingTargets:
        """The targets as set; none set: the busy shares at DEFAULT_BUSY_TARGET (the front end's only where it is
        sampled: a trigger over a series nobody exports would hold every scale-down)."""
        if self.model_dump(exclude_none=True):
            return self
        return AutoscalingTargets(scheduler_busy_percent=DEFAULT_BUSY_TARGET,
                                  frontend_busy_percent=DEFAULT_BUSY_TARGET if frontend_sampled else None)


class AutoscalingSpec(KubeModel):
    cel = (
        ("!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
         "autoscaling.minReplicas must not exceed maxReplicas", ".minReplicas"),
    )

    min_replicas: int = Field(1, description="Fewest replicas the autoscaler keeps.", ge=1, le=64)
    max_replicas: int = Field(description="Most replicas the autoscaler makes.", ge=1, le=64)
    targets: AutoscalingTargets = Field(
        default_factory=AutoscalingTargets,
        description="What each replica may carry. None set: the scheduler's busy share at 85%, and the front end's "
        "where telemetry.frontendRoles are sampled.",
    )
    scale_up_stabilization: Duration = Field(
        "1m",
        description="How long a higher replica count must be wanted before replicas are added (HPA behavior "
        "scaleUp.stabilizationWindowSeconds); at most 2 replicas are added a minute.",
    )
    scale_down_stabilization: Duration = Field(
        "10m",
        description="How long a lower count must be wanted before replicas are removed; at most one replica every "
        "5 minutes. Longer than scale-up: a replica removed too early costs a model load of minutes to get back.",
    )
    polling_interval: Duration = Field(
        "30s", description="How often KEDA queries Prometheus (ScaledObject pollingInterval).")

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"autoscaling.minReplicas {self.min_replicas} must not exceed maxReplicas "
                             f"{self.max_replicas}")
        return self


class VLMServiceSpec(KubeModel):
    cel = (
        (
            "!has(self.gpu) || !has(self.gpu.count) || !has(self.sglang) || !has(self.sglang.tensorParallel) "
            "|| self.gpu.count % self.sglang.tensorParallel == 0",
            "gpu.count must be a multiple of sglang.tensorParallel",
            ".gpu.count",
        ),
        (
            "!has(self.rollout) || !has(self.rollout.steps) || !has(self.replicas) "
            "|| self.rollout.steps.all(s, s.replicas <= self.replicas)",
            "rollout steps must not ask for more canary replicas than spec.replicas",
            ".rollout.steps",
        ),
        (
            "!has(self.rollout) || !has(self.telemetry) || !has(self.telemetry.enabled) || self.telemetry.enabled",
            "a rollout needs telemetry.enabled: the canary gate reads the profiler sidecars",
            ".rollout",
        ),
        (
            "!has(self.sglang) || !has(self.sglang.volumeMounts) || self.sglang.volumeMounts.all(m, has(self.pod) "
            "&& has(self.pod.volumes) && self.pod.volumes.exists(v, v.name == m.name))",
            "every sglang.volumeMounts[].name must be a volume in spec.pod.volumes",
            ".sglang.volumeMounts",
        ),
        (
            "!has(self.sglang) || !has(self.sglang.volumeMounts) || !has(self.model.cache) || "
            "self.sglang.volumeMounts.all(m, m.mountPath != "
            "(has(self.model.cache.mountPath) ? self.model.cache.mountPath : '/models'))",
            "sglang.volumeMounts must not use model.cache.mountPath",
            ".sglang.volumeMounts",
        ),
        (
            "!has(self.autoscaling) || !has(self.autoscaling.targets) || "
            "!has(self.autoscaling.targets.frontendBusyPercent) || (has(self.telemetry) && "
            "has(self.telemetry.frontendRoles) && size(self.telemetry.frontendRoles) > 0)",
            "autoscaling.targets.frontendBusyPercent needs telemetry.frontendRoles (the sidecar samples no front end "
            "without them)",
            ".autoscaling.targets.frontendBusyPercent",
        ),
        (
            "!has(self.autoscaling) || !has(self.rollout) || !has(self.rollout.steps) "
            "|| self.rollout.steps.all(s, s.replicas <= (has(self.autoscaling.minReplicas) ? "
            "self.autoscaling.minReplicas : 1))",
            "rollout steps must not ask for more canary replicas than autoscaling.minReplicas (the autoscaler may "
            "scale spec.replicas down to it)",
            ".autoscaling.minReplicas",
        ),
    )

    model: ModelSpec = Field(description="The model to serve.")
    replicas: int = Field(1, description="Number of serving replicas.", ge=0, le=64)
    sglang: SGLangSpec = Field(default_factory=SGLangSpec, description="SGLang runtime.")
    gpu: GPUSpec = Field(default_factory=GPUSpec, description="GPU placement.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Container resources.")
    telemetry: TelemetrySpec = Field(default_factory=TelemetrySpec, description="Profiler sidecar.")
    rollout: RolloutSpec | None = Field(
        None, description="Canary rollout; without it a template change rolls the Deployment in place."
    )
    pod: PodSpec | None = Field(
        None,
        description="Pod-level settings: labels, annotations, serviceAccountName, imagePullSecrets, "
        "priorityClassName, affinity, topologySpreadConstraints, runtimeClassName, schedulerName, "
        "terminationGracePeriodSeconds, automountServiceAccountToken, volumes.",
    )
    paused: bool = Field(False, description="Stop reconciling changes (status is still updated).")
    autoscaling: AutoscalingSpec | None = Field(
        None,
        description="Scale spec.replicas on the signals the sidecar and SGLang export, through a KEDA ScaledObject "
        "the operator writes (KEDA must be installed; without it the Autoscaling condition says so). The "
        "autoscaler then owns spec.replicas.",
    )

    @model_validator(mode="after")
    def _checks(self) -> VLMServiceSpec:
        tp = self.sglang.tensor_parallel
        if self.gpu.count is not None and self.gpu.count % tp:
            raise ValueError(f"gpu.count {self.gpu.count} must be a multiple of sglang.tensorParallel {tp}")
        if self.rollout:
            for i, s in enumerate(self.rollout.steps or []):
                if s.replicas > self.replicas:
                    raise ValueError(
                        f"rollout.steps[{i}].replicas {s.replicas} must not exceed spec.replicas {self.replicas}"
                    )
            if not self.telemetry.enabled:
                raise ValueError("rollout: a rollout needs telemetry.enabled: the canary gate reads the profiler sidecars")
        if self.autoscaling and self.autoscaling.targets.frontend_busy_percent is not None \
                and not self.telemetry.frontend_roles:
            raise ValueError("autoscaling.targets.frontendBusyPercent needs telemetry.frontendRoles (the sidecar "
                             "samples no front end without them)")
        if self.rollout and self.autoscaling:
            for i, s in enumerate(self.rollout.steps or []):
                if s.replicas > self.autoscaling.min_replicas:
                    raise ValueError(
                        f"rollout.steps[{i}].replicas {s.replicas} must not exceed autoscaling.minReplicas "
                        f"{self.autoscaling.min_replicas} (the autoscaler may scale spec.replicas down to it)")
        volumes = {v.name for v in (self.pod.volumes if self.pod else None) or []}
        for m in self.sglang.volume_mounts or []:
            if m.name not in volumes:
                raise ValueError(f"sglang.volumeMounts: {m.name!r} is not a volume in spec.pod.volumes")
            if self.model.cache and m.mount_path == self.model.cache.mount_path:
                raise ValueError(f"sglang.volumeMounts: {m.mount_path} is model.cache.mountPath")
        return self

    @property
    def gpus_per_replica(self) -> int:
        return self.gpu.count or self.sglang.tensor_parallel

    def steps(self) -> list[RolloutStep]:
        """The rollout's steps: as written, or the default schedule for spec.replicas; with spec.autoscaling, for
        autoscaling.minReplicas, so that a scale event during a rollout moves only the stable revision and never
        the canary's step (docs/autoscaling.md, "Rollouts")."""
        if self.rollout is None:
            return []
        return self.rollout.schedule(self.autoscaling.min_replicas if self.autoscaling else self.replicas)


# ---------------------------------------------------------------- status


class Condition(KubeModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    message: str = Field("", max_length=32768)
    observed_generation: int | None = Field(None, ge=0)
    last_transition_time: str = Field(description="RFC 3339 time of the last status flip.")


class SignalStatus(KubeModel):
    name: str
    baseline: float | None = None
    canary: float | None = None
    delta: float | None = Field(None, description="Relative change canary vs baseline.")
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    verdict: str | None = Field(
        None, description="pass: the promotion bound inside promoteMargin; expand: the expand bound under the "
        "ceiling; fail: confidently beyond half the margin and estimated beyond it; insufficient: none yet.")
    margin: float | None = Field(None, description="The margin asked for (fraction; shares in points / 100).")
    promote_margin: float | None = Field(
        None, description="The margin the promotion bound is held to: the margin, or what the schedule's last "
        "step can resolve at the pods' spread where that is wider (a Warning says so).")
    ceiling: float | None = Field(None, description="The harm ceiling the expand bound is held to before the last step.")
    expand_bound: float | None = Field(None, description="The expand test's bound on the worse side.")
    information: float | None = Field(
        None, description="This look's information over the boundary's target (1: where the bounds are tightest).")
    covariate_cut: float | None = Field(
        None, description="The share of the stable pods' window variance the request mix (prompt tokens per "
        "request) explained, where the signal was adjusted for it; absent: compared as measured.")


class StepDecision(KubeModel):
    step: int = Field(ge=0, description="The step (0-based) this decided.")
    verdict: str = Field(description="Promote (expand, or promote at the last step), Rollback or Pause.")
    decided_by: Literal["evidence", "ceiling", "timeout"] = Field(
        description="evidence: a bound crossed its margin; ceiling: every expand bound under its harm ceiling; "
        "timeout: maxDuration, onInconclusive.")
    reason: str | None = None
    at: str | None = None
    information: float | None = Field(None, description="Loop latency's information at the decision (see signals).")


class PairStatus(KubeModel):
    node: str = Field(description="The node both pods ran on.")
    kind: Literal["Surge", "Replace"] = Field(
        description="Surge: the new pod was added on a free GPU next to the old one; Replace: it took the old one's.")
    replaced: str | None = Field(None, description="The old pod it pairs with (removed, or kept until the step ends).")
    revision: str = Field(description="The new pod's revision.")
    pod: str | None = Field(None, description="The new pod, once placed.")
    started_at: str | None = None
    ready_at: str | None = None
    dropped: str | None = Field(None, description="Why the pair no longer counts (its pod or node went away).")


class BeforeStatus(KubeModel):
    pod: str = Field(description="A stable pod as it ran before the rollout replaced any pod.")
    node: str | None = None
    loop_seconds: float = Field(description="Its scheduler loop latency (geometric mean of its windows), seconds.")
    windows: int = Field(0, ge=0)


class CalibrationStatus(KubeModel):
    pod_spread: float = Field(
        description="How much pods of one revision differ in loop latency (sd of their means, percent), from the "
        "rollouts this service has finished.")
    pod_df: float = Field(0.0, ge=0, description="Degrees of freedom behind podSpread.")
    restart_spread: float | None = Field(
        None, description="How much a pod restarted on the same node differs from the one before (sd, percent), "
        "from the same-node pairs of finished rollouts.")
    restart_df: float = Field(0.0, ge=0)
    node_bound_share: float | None = Field(
        None, description="Share of the pod spread that stays with the node (1 - restart / pod variance).")
    rollouts: int = Field(0, ge=0, description="Rollouts whose evidence is in here.")


class RolloutStatus(KubeModel):
    phase: RolloutPhase
    revision: str | None = Field(None, description="Canary revision this rollout is about.")
    from_revision: str | None = Field(None, description="The stable revision the rollout started from.")
    step: int = Field(0, ge=0)
    steps: int | None = Field(None, ge=0, description="How many analysed steps the rollout has.")
    pairs: list[PairStatus] = Field(
        default_factory=list, max_length=512,
        description="Each new pod and the pod it replaced or joined on its node, in order.")
    waiting: str | None = Field(None, description="Why pods are not being replaced now (budget, no free GPU).")
    capacity: Literal["Surge", "Borrow"] | None = None
    baseline: Literal["Fresh", "Stable"] | None = Field(None, description="The baseline this rollout compares with.")
    verdict: str | None = None
    reason: str | None = None
    message: str | None = None
    started_at: str | None = None
    step_started_at: str | None = None
    analysis_started_at: str | None = Field(None, description="When the step's canary pods were all Ready.")
    data_started_at: str | None = Field(
        None,
        description="End of the step's first fresh canary profiler window after analysisStartedAt: the step's "
        "analysis clock (analysisTime, maxDuration) counts from here.",
    )
    last_analysis_at: str | None = None
    analyses: int = Field(0, ge=0)
    signals: list[SignalStatus] = Field(default_factory=list)
    regressed_function: str | None = None
    regressed_stage: str | None = None
    warning: str | None = Field(None, description="Why the gate may be unable to resolve the margin (one line), and "
                                "(one line per setting, from the first look) an expandCeiling below what one canary "
                                "pod's noise calls for (Warning CanaryExpandCeilingCapped).")
    before: list[BeforeStatus] = Field(
        default_factory=list, max_length=512,
        description="The stable pods' loop latency before any was replaced: the pre-period of same-node pairs.")
    before_at: str | None = Field(None, description="When `before` was read (set even when nothing could be).")
    comparison: list[Literal["Concurrent", "Replace", "Unpaired"]] = Field(
        default_factory=list, description="How the last look compared the canary pods: with a stable pod on the "
        "same node now (Concurrent), with the replaced pod's pre-period corrected by the fleet (Replace), or with "
        "the stable pods' mean (Unpaired).")
    analysed_seconds: float = Field(
        0.0, ge=0, description="Seconds of analysis in the steps already passed (the gate's spending clock).")
    evidence_since: str | None = Field(
        None, description="When the first step's analysis began: windows from then on count at every step.")
    warmup_shift: float | None = Field(
        None, description="How much slower (percent) the canary pods ran in the first minute after Ready, which "
        "the gate leaves out, than after it.")
    sglang_agreement: dict[str, float] | None = Field(
        None, description="Per side (baseline, canary), how far apart (percentage points) the sidecar's stage shares "
        "and SGLang's own stage counters (sglang:scheduler_stage_seconds_total, SGLang 0.5.20 on) were at the last "
        "look: per pod window the largest difference over the stages both know, each side renormalised over them, "
        "the median over the windows. Absent where SGLang exports no stage counters. Above 2 points one of the two "
        "no longer measures the scheduler the other sees (the alert VLMProfilerDisagreesWithSGLang, per pod).")
    decisions: list[StepDecision] = Field(
        default_factory=list, max_length=32,
        description="What decided each step of this rollout: the evidence, the harm ceiling or the clock.")
    expand_ceiling: dict[str, float] | None = Field(
        None, description="Per gated signal, the harm ceiling (percent) the expand test holds a step to: loopLatency "
        "before the rollout starts (the fixed expandCeiling, or the default at one canary pod's spread), every signal "
        "from each look (with the windows' noise: signals[].ceiling). A fixed ceiling below the default gets the "
        "Warning CanaryExpandCeilingCapped.")
    resolvable_margin: dict[str, float] | None = Field(
        None, description="Per gated signal, the smallest margin (percent) this rollout can resolve from the pods' "
        "spread, its schedule and (from the first look) the windows' noise left at maxDuration: loopLatency before "
        "the rollout starts, the others (ttft, stageTime:run_batch, ...) from the first look. A margin below it is "
        "widened to it for promotion (signals[].promoteMargin); loop latency's gets the Warning "
        "CanaryMarginUnresolvable.")


class ProfilerStatus(KubeModel):
    last_sample_time: str | None = None
    loop_p50: str | None = Field(None, description="Scheduler loop latency p50, e.g. 21.3ms.")
    loop_p95: str | None = Field(None, description="Scheduler loop latency p95, e.g. 24.0ms.")
    top_function: str | None = None


class SGLangStatus(KubeModel):
    image: str | None = Field(None, description="The SGLang image the pods run (spec.sglang.image or the operator's default).")
    version: str | None = Field(None, description="Its SGLang version (spec.sglang.version or the image tag).")


class AutoscalingStatus(KubeModel):
    """spec.autoscaling as its HPA (made by KEDA from the operator's ScaledObject) last saw it."""

    min_replicas: int | None = None
    max_replicas: int | None = None
    current_replicas: int | None = Field(None, description="The replicas the HPA counted at its last look.")
    desired_replicas: int | None = Field(None, description="The replicas the HPA wants (it writes spec.replicas).")
    signal: str | None = Field(
        None, description="The target that wants the most replicas (schedulerBusy, frontendBusy, queuePerReplica, "
        "kvCacheUsage, ttftP95): what drives the count.")
    value: float | None = Field(None, description="Its current value, per replica for the per-replica targets.")
    target: float | None = Field(None, description="Its target, in the same unit.")
    at_max_replicas: bool | None = Field(
        None, description="At maxReplicas with the driving signal still above its target (alert "
        "VLMServiceAutoscalerAtMax).")
    last_scale_time: str | None = None


class VLMServiceStatus(KubeModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    observed_generation: int | None = None
    phase: str | None = Field(None, description="Summary for humans: Pending, Ready, Canary, RolledBack, Failed.")
    conditions: list[Condition] = Field(default_factory=list)
    replicas: int = 0
    ready_replicas: int = 0
    selector: str | None = Field(None, description="Label selector of the pods, for the scale subresource.")
    stable_revision: str | None = None
    canary_revision: str | None = None
    rollout: RolloutStatus | None = None
    profiler: ProfilerStatus | None = None
    calibration: CalibrationStatus | None = Field(
        None, description="What the gate learned about this service's pods from its finished rollouts.")
    sglang: SGLangStatus | None = Field(None, description="The effective SGLang image and version.")
    autoscaling: AutoscalingStatus | None = Field(None, description="spec.autoscaling's HPA, as last seen.")


PRINTER_COLUMNS = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.path"},
    {"name": "Version", "type": "string", "jsonPath": ".status.sglang.version"},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Canary", "type": "string", "jsonPath": ".status.rollout.phase"},
    {"name": "LoopP95", "type": "string", "jsonPath": ".status.profiler.loopP95"},
    {"name": "TopFn", "type": "string", "jsonPath": ".status.profiler.topFunction"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.readyReplicas", "priority": 1},
    {"name": "Revision", "type": "string", "jsonPath": ".status.stableRevision", "priority": 1},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.autoscaling.desiredReplicas", "priority": 1},
    {"name": "ScaledOn", "type": "string", "jsonPath": ".status.autoscaling.signal", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def parse_spec(spec: dict[str, Any]) -> VLMServiceSpec:
    """Validate a spec as read from the API server (camelCase)."""
    return VLMServiceSpec.model_validate(spec)
