"""The core Kubernetes types a VLMService embeds (env, volumes, mounts, the security context, affinity,
topology spread, tolerations), as KServe and Argo Rollouts inline them: the same names and meaning, typed so that
the API server checks them at `kubectl apply` (OpenAPI and CEL) and the operator the same in Python. Trimmed to
the fields and sources the CRD offers; a volume source's other keys go to the pod as written (`OpenKubeModel`).
The VLMService's own types are in `v1alpha1`."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from vlm_operator.api import names
from vlm_operator.api.units import DURATION_PATTERN, QUANTITY_PATTERN

IMAGE_PATTERN = (
    r"^([a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?/)?[a-z0-9]+([._/-][a-z0-9]+)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)
VERSION_PATTERN = r"^[0-9]+\.[0-9]+\.[0-9]+([.-]?(post|rc|dev)[0-9]+)?$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
FUNCTION_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.<>]*$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
CONFIG_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
# Label and annotation keys: an optional DNS-subdomain prefix and a name of at most 63 characters.
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
# Pod labels the operator sets itself (builders.common_labels; the watch filters on managed-by); keys under
# the operator's prefix (selector, revision and role labels, the ipc-cache annotation) are refused as well.
OPERATOR_PREFIX = f"{names.PREFIX}/"
OPERATOR_LABELS = names.OPERATOR_LABELS

Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)]
Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=32)]


class KubeModel(BaseModel):
    """camelCase aliases, unknown fields rejected (the API server would prune them)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_default=True
    )
    # CEL rules attached to this object in the CRD: (rule, message, fieldPath or None).
    cel: ClassVar[tuple[tuple[str, str, str | None], ...]] = ()


class KeySelector(KubeModel):
    name: str = Field(description="Name of the object in the service's namespace.", pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)
    key: str = Field(description="Key in the object's data.", pattern=CONFIG_KEY_PATTERN, max_length=253)
    optional: bool | None = Field(None, description="Start the container even when the object or key is missing.")


class FieldSelector(KubeModel):
    field_path: str = Field(
        description="Pod field, e.g. metadata.name, metadata.namespace, status.podIP, spec.nodeName, "
        "metadata.labels['key'].",
        min_length=1,
        max_length=256,
    )
    api_version: str | None = Field(None, description="Schema version of fieldPath (v1).", max_length=32)


class EnvVarSource(KubeModel):
    cel = (
        (
            "(has(self.secretKeyRef) ? 1 : 0) + (has(self.configMapKeyRef) ? 1 : 0) + (has(self.fieldRef) ? 1 : 0) == 1",
            "valueFrom needs exactly one of secretKeyRef, configMapKeyRef, fieldRef",
            None,
        ),
    )

    secret_key_ref: KeySelector | None = Field(None, description="A key of a Secret (e.g. a Hugging Face token).")
    config_map_key_ref: KeySelector | None = Field(None, description="A key of a ConfigMap.")
    field_ref: FieldSelector | None = Field(None, description="A field of the pod (downward API).")

    @model_validator(mode="after")
    def _one(self) -> EnvVarSource:
        if sum(x is not None for x in (self.secret_key_ref, self.config_map_key_ref, self.field_ref)) != 1:
            raise ValueError("valueFrom needs exactly one of secretKeyRef, configMapKeyRef, fieldRef")
        return self


class EnvVar(KubeModel):
    cel = (("has(self.value) != has(self.valueFrom)", "env needs exactly one of value and valueFrom", None),)

    name: str = Field(description="Environment variable name.", pattern=ENV_NAME_PATTERN, max_length=256)
    value: str | None = Field(None, description="Value (exactly one of value and valueFrom).", max_length=4096)
    value_from: EnvVarSource | None = Field(
        None, description="Take the value from a Secret, a ConfigMap or a pod field; the spec never holds it."
    )

    @model_validator(mode="after")
    def _one(self) -> EnvVar:
        if (self.value is None) == (self.value_from is None):
            raise ValueError(f"env {self.name}: needs exactly one of value and valueFrom")
        return self


class EnvFromRef(KubeModel):
    name: str = Field(description="Name of the object in the service's namespace.", pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)
    optional: bool | None = Field(None, description="Start the container even when the object is missing.")


class EnvFromSource(KubeModel):
    cel = (
        (
            "has(self.secretRef) != has(self.configMapRef)",
            "envFrom needs exactly one of secretRef and configMapRef",
            None,
        ),
    )

    prefix: str | None = Field(None, description="Prepended to every key.", pattern=ENV_NAME_PATTERN, max_length=128)
    secret_ref: EnvFromRef | None = Field(None, description="Every key of a Secret becomes a variable.")
    config_map_ref: EnvFromRef | None = Field(None, description="Every key of a ConfigMap becomes a variable.")

    @model_validator(mode="after")
    def _one(self) -> EnvFromSource:
        if (self.secret_ref is None) == (self.config_map_ref is None):
            raise ValueError("envFrom needs exactly one of secretRef and configMapRef")
        return self


# ---------------------------------------------------------------- container: volume mounts and the security context
# (Kubernetes' own types, typed so that the API server checks them at apply time; the pod API's own rules mirrored
# where a spec would otherwise make a Deployment the API server refuses).

# Volumes the operator adds itself (builders): a spec's own volumes may not take these names.
RESERVED_VOLUMES = ("dshm", "profiler-tmp", "model-cache")
SHM_PATH = "/dev/shm"


class VolumeMount(KubeModel):
    cel = (("!has(self.subPath) || !has(self.subPathExpr)", "subPath and subPathExpr are mutually exclusive",
            ".subPathExpr"),
           (f"self.mountPath != '{SHM_PATH}'", f"{SHM_PATH} is the operator's (resources.shmSize)", ".mountPath"))

    name: str = Field(description="Name of a volume in spec.pod.volumes.", pattern=DNS_LABEL_PATTERN, max_length=63)
    mount_path: str = Field(description="Where the volume is mounted in the SGLang container.", pattern=r"^/.*",
                            max_length=1024)
    read_only: bool | None = Field(None, description="Mount read-only.")
    sub_path: str | None = Field(None, description="Path within the volume to mount instead of its root.",
                                 max_length=1024)
    sub_path_expr: str | None = Field(None, description="subPath with $(VAR) expansion from the container's env.",
                                      max_length=1024)
    mount_propagation: Literal["None", "HostToContainer", "Bidirectional"] | None = None
    recursive_read_only: Literal["Disabled", "IfPossible", "Enabled"] | None = None

    @model_validator(mode="after")
    def _checks(self) -> VolumeMount:
        if self.sub_path is not None and self.sub_path_expr is not None:
            raise ValueError("subPath and subPathExpr are mutually exclusive")
        if self.mount_path == SHM_PATH:
            raise ValueError(f"mountPath: {SHM_PATH} is the operator's (resources.shmSize)")
        return self


Capability = Annotated[str, Field(pattern=r"^[A-Z][A-Z0-9_]*$", max_length=64)]
_SYS_ADMIN = ("SYS_ADMIN", "CAP_SYS_ADMIN")


class Capabilities(KubeModel):
    add: list[Capability] | None = Field(None, max_length=64)
    drop: list[Capability] | None = Field(None, max_length=64)


class ProfileRef(KubeModel):
    """A seccomp or AppArmor profile: Localhost needs localhostProfile, the others take none."""

    cel = (("self.type == 'Localhost' ? has(self.localhostProfile) : !has(self.localhostProfile)",
            "localhostProfile is required with type Localhost and forbidden otherwise", ".localhostProfile"),)

    type: Literal["RuntimeDefault", "Unconfined", "Localhost"]
    localhost_profile: str | None = Field(None, min_length=1, max_length=4096)

    @model_validator(mode="after")
    def _localhost(self) -> ProfileRef:
        if (self.type == "Localhost") != (self.localhost_profile is not None):
            raise ValueError("localhostProfile is required with type Localhost and forbidden otherwise")
        return self


class SELinuxOptions(KubeModel):
    user: str | None = Field(None, max_length=256)
    role: str | None = Field(None, max_length=256)
    type: str | None = Field(None, max_length=256)
    level: str | None = Field(None, max_length=256)


class SecurityContext(KubeModel):
    """The SGLang container's securityContext; each field set here replaces the operator's default for it
    (allowPrivilegeEscalation false, seccompProfile RuntimeDefault)."""

    cel = (
        ("!(has(self.allowPrivilegeEscalation) && !self.allowPrivilegeEscalation && "
         "((has(self.privileged) && self.privileged) || (has(self.capabilities) && has(self.capabilities.add) "
         "&& self.capabilities.add.exists(c, c in " + str(list(_SYS_ADMIN)).replace('"', "'") + "))))",
         "allowPrivilegeEscalation cannot be false with privileged or CAP_SYS_ADMIN", ".allowPrivilegeEscalation"),
    )

    allow_privilege_escalation: bool | None = Field(None, description="Default false (no_new_privs).")
    capabilities: Capabilities | None = None
    privileged: bool | None = None
    proc_mount: Literal["Default", "Unmasked"] | None = None
    read_only_root_filesystem: bool | None = None
    run_as_user: int | None = Field(None, ge=0, le=2147483647)
    run_as_group: int | None = Field(None, ge=0, le=2147483647)
    run_as_non_root: bool | None = None
    se_linux_options: SELinuxOptions | None = None
    seccomp_profile: ProfileRef | None = Field(None, description="Default {type: RuntimeDefault}.")
    app_armor_profile: ProfileRef | None = None

    @property
    def escalates(self) -> bool:
        """privileged or CAP_SYS_ADMIN: the pod API refuses allowPrivilegeEscalation false with either."""
        return bool(self.privileged) or any(
            c in _SYS_ADMIN for c in ((self.capabilities.add or []) if self.capabilities else []))

    @model_validator(mode="after")
    def _as_the_pod_api(self) -> SecurityContext:
        if self.allow_privilege_escalation is False and self.escalates:
            raise ValueError("allowPrivilegeEscalation cannot be false with privileged or CAP_SYS_ADMIN")
        return self


# ---------------------------------------------------------------- pod: the Kubernetes types, as KServe and
# Argo Rollouts inline them (same names, same meaning), typed so that the API server checks them at apply time.

SELECTOR_VALUES_CEL = (
    "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) "
    ": (self.operator in ['Gt', 'Lt'] ? (has(self.values) && size(self.values) == 1 "
    "&& self.values[0].matches('^-?[0-9]+$')) : (!has(self.values) || size(self.values) == 0))"
)
_SELECTOR_VALUES_MSG = "values must be non-empty for In and NotIn, one integer for Gt and Lt, and empty for Exists and DoesNotExist"


def _check_values(operator: str, values: list[str] | None) -> None:
    n = len(values or [])
    if operator in ("In", "NotIn"):
        ok = n > 0
    elif operator in ("Gt", "Lt"):
        ok = n == 1 and re.match(r"^-?[0-9]+$", (values or [""])[0]) is not None
    else:
        ok = n == 0
    if not ok:
        raise ValueError(f"operator {operator}: {_SELECTOR_VALUES_MSG}")


LabelValue = Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=63)]


class LabelSelectorRequirement(KubeModel):
    cel = ((SELECTOR_VALUES_CEL, _SELECTOR_VALUES_MSG, ".values"),)

    key: str = Field(pattern=QUALIFIED_NAME_PATTERN, max_length=316)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[Annotated[str, Field(max_length=63)]] | None = Field(None, max_length=64)

    @model_validator(mode="after")
    def _values(self) -> LabelSelectorRequirement:
        _check_values(self.operator, self.values)
        return self


class LabelSelector(KubeModel):
    match_labels: dict[str, LabelValue] | None = Field(None, max_length=32)
    match_expressions: list[LabelSelectorRequirement] | None = Field(None, max_length=16)


class NodeSelectorRequirement(KubeModel):
    cel = ((SELECTOR_VALUES_CEL, _SELECTOR_VALUES_MSG, ".values"),)

    key: str = Field(min_length=1, max_length=316)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[Annotated[str, Field(max_length=63)]] | None = Field(None, max_length=64)

    @model_validator(mode="after")
    def _values(self) -> NodeSelectorRequirement:
        _check_values(self.operator, self.values)
        return self


class NodeSelectorTerm(KubeModel):
    match_expressions: list[NodeSelectorRequirement] | None = Field(None, max_length=16)
    match_fields: list[NodeSelectorRequirement] | None = Field(None, max_length=16)


class NodeSelector(KubeModel):
    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1, max_length=16)


class PreferredSchedulingTerm(KubeModel):
    weight: int = Field(ge=1, le=100)
    preference: NodeSelectorTerm


class NodeAffinity(KubeModel):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = Field(None, max_length=16)


class PodAffinityTerm(KubeModel):
    label_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    namespaces: list[Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)]] | None = Field(None, max_length=32)
    topology_key: str = Field(min_length=1, max_length=316, pattern=QUALIFIED_NAME_PATTERN)
    match_label_keys: list[Annotated[str, Field(max_length=316)]] | None = Field(None, max_length=16)
    mismatch_label_keys: list[Annotated[str, Field(max_length=316)]] | None = Field(None, max_length=16)


class WeightedPodAffinityTerm(KubeModel):
    weight: int = Field(ge=1, le=100)
    pod_affinity_term: PodAffinityTerm


class PodAffinity(KubeModel):
    """Used for both podAffinity and podAntiAffinity (Kubernetes' two types have the same fields)."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(None, max_length=16)
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = Field(None, max_length=16)


class Affinity(KubeModel):
    node_affinity: NodeAffinity | None = Field(None, description="Node affinity (beyond gpu.product and gpu.nodeSelector).")
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = Field(None, description="E.g. spread replicas over nodes.")


class TopologySpreadConstraint(KubeModel):
    max_skew: int = Field(ge=1)
    topology_key: str = Field(min_length=1, max_length=316, pattern=QUALIFIED_NAME_PATTERN)
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    label_selector: LabelSelector | None = Field(
        None, description=f"Pods counted; the service's own pods ({names.LABEL_SERVICE}) when absent."
    )
    min_domains: int | None = Field(None, ge=1)
    node_affinity_policy: Literal["Honor", "Ignore"] | None = None
    node_taints_policy: Literal["Honor", "Ignore"] | None = None
    match_label_keys: list[Annotated[str, Field(max_length=316)]] | None = Field(None, max_length=16)


class LocalObjectReference(KubeModel):
    name: str = Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)


class OpenKubeModel(KubeModel):
    """A Kubernetes type passed through: the fields named here are typed and checked; the API server keeps any
    other field (x-kubernetes-preserve-unknown-fields) and checks it when the operator applies the Deployment."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow", validate_default=True)


KeyToPaths = list[dict[str, Any]]


class ConfigMapVolumeSource(OpenKubeModel):
    name: str = Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)
    optional: bool | None = None
    default_mode: int | None = Field(None, ge=0, le=0o777)
    items: KeyToPaths | None = Field(None, max_length=64)


class SecretVolumeSource(OpenKubeModel):
    secret_name: str = Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)
    optional: bool | None = None
    default_mode: int | None = Field(None, ge=0, le=0o777)
    items: KeyToPaths | None = Field(None, max_length=64)


class EmptyDirVolumeSource(KubeModel):
    medium: Literal["", "Memory"] | None = None
    size_limit: Quantity | None = None


class PersistentVolumeClaimVolumeSource(KubeModel):
    claim_name: str = Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)
    read_only: bool | None = None


class HostPathVolumeSource(KubeModel):
    path: str = Field(pattern=r"^/.*", max_length=4096)
    type: Literal["", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice",
                  "BlockDevice"] | None = None


class NFSVolumeSource(KubeModel):
    server: str = Field(min_length=1, max_length=253)
    path: str = Field(pattern=r"^/.*", max_length=4096)
    read_only: bool | None = None


class CSIVolumeSource(OpenKubeModel):
    driver: str = Field(min_length=1, max_length=63)
    read_only: bool | None = None
    volume_attributes: dict[str, Annotated[str, Field(max_length=4096)]] | None = Field(None, max_length=64)


class EphemeralVolumeSource(OpenKubeModel):
    volume_claim_template: dict[str, Any] = Field(description="A PersistentVolumeClaimTemplate (metadata, spec).")


class ProjectedVolumeSource(OpenKubeModel):
    sources: list[dict[str, Any]] = Field(max_length=32)
    default_mode: int | None = Field(None, ge=0, le=0o777)


class DownwardAPIVolumeSource(OpenKubeModel):
    items: list[dict[str, Any]] = Field(max_length=64)
    default_mode: int | None = Field(None, ge=0, le=0o777)


class ImageVolumeSource(KubeModel):
    reference: str = Field(min_length=1, max_length=512)
    pull_policy: Literal["Always", "Never", "IfNotPresent"] | None = None


VOLUME_SOURCES = ("configMap", "secret", "emptyDir", "persistentVolumeClaim", "hostPath", "nfs", "csi", "ephemeral",
                  "projected", "downwardAPI", "image")
_ONE_SOURCE_MSG = f"a volume needs exactly one source of {', '.join(VOLUME_SOURCES)}"


class Volume(KubeModel):
    """A pod volume, as in a PodSpec (the in-tree cloud-disk sources Kubernetes deprecated are left out: use csi
    or a persistentVolumeClaim). Mounted into the SGLang container by spec.sglang.volumeMounts."""

    cel = (
        (" + ".join(f"(has(self.{v}) ? 1 : 0)" for v in VOLUME_SOURCES) + " == 1", _ONE_SOURCE_MSG, None),
        ("!(self.name in " + str(list(RESERVED_VOLUMES)).replace('"', "'") + ")",
         f"volume names {', '.join(RESERVED_VOLUMES)} are the operator's", ".name"),
    )

    name: str = Field(pattern=DNS_LABEL_PATTERN, max_length=63)
    config_map: ConfigMapVolumeSource | None = None
    secret: SecretVolumeSource | None = None
    empty_dir: EmptyDirVolumeSource | None = None
    persistent_volume_claim: PersistentVolumeClaimVolumeSource | None = None
    host_path: HostPathVolumeSource | None = None
    nfs: NFSVolumeSource | None = None
    csi: CSIVolumeSource | None = None
    ephemeral: EphemeralVolumeSource | None = None
    projected: ProjectedVolumeSource | None = None
    downward_api: DownwardAPIVolumeSource | None = Field(None, alias="downwardAPI")
    image: ImageVolumeSource | None = None

    @model_validator(mode="after")
    def _checks(self) -> Volume:
        if sum(getattr(self, f) is not None for f in Volume.model_fields if f != "name") != 1:
            raise ValueError(_ONE_SOURCE_MSG)
        if self.name in RESERVED_VOLUMES:
            raise ValueError(f"volume name {self.name!r}: {', '.join(RESERVED_VOLUMES)} are the operator's")
        return self


class Toleration(KubeModel):
    """A toleration as the pod's API validates it: the same rules here, so a spec the API server takes never
    makes a Deployment it refuses (the operator could only report that after the fact, every resync)."""

    cel = (
        ("(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
         "a toleration without a key matches every taint: its operator must be Exists", ".operator"),
        ("!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
         "value must be empty when operator is Exists", ".value"),
        ("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
         "tolerationSeconds needs effect NoExecute", ".tolerationSeconds"),
    )

    key: str | None = Field(None, description="Taint key: a qualified name (prefix/name); empty matches every key.",
                            pattern=f"^$|{QUALIFIED_NAME_PATTERN}", max_length=316)
    operator: Literal["Exists", "Equal"] | None = None
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _as_the_pod_api(self) -> Toleration:
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key matches every taint: its operator must be Exists")
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty when operator is Exists")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds needs effect NoExecute")
        return self


