"""The names the operator's modules share, each defined once: the API's, the labels and annotations, the
sidecar's port, pod roles, scheduler stages, front-end roles and rollout phases.

No imports: every module may import this one, the kubectl plugin too (it runs with the kubernetes client
alone, and the krew archive carries this file next to it as vlm_names.py). The sidecar keeps its own copies
(vlm_sidecar.names: the two packages are independent); tests/unit/packaging/test_shared_names.py fails
when they disagree.
"""

from __future__ import annotations

# ---- the API: serving.vlmops.dev/v1alpha1 VLMService ----
GROUP = "serving.vlmops.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "VLMService"
PLURAL = "vlmservices"
SINGULAR = "vlmservice"
SHORT_NAMES = ("vlms", "vlmsvc")
CATEGORIES = ("vlmops",)

# ---- labels and annotations ----
# The operator's own keys live under the API group (spec.pod.labels/annotations may not use it).
PREFIX = GROUP
LABEL_SERVICE = f"{PREFIX}/vlmservice"
LABEL_REVISION = f"{PREFIX}/revision"
LABEL_ROLE = f"{PREFIX}/role"
ANNOTATION_IPC = f"{PREFIX}/ipc-cache"
# Set by a person (kubectl vlm promote|abort|pause|resume) to drive a canary; the operator acts and clears it.
ANNOTATION_ROLLOUT_ACTION = f"{PREFIX}/rollout-action"
ROLLOUT_ACTIONS = ("promote", "abort", "pause", "resume")
# The operator's name: the managed-by value on what it creates, the chart's app.kubernetes.io/name.
OPERATOR = "vlm-operator"
LABEL_APP_NAME = "app.kubernetes.io/name"
LABEL_APP_INSTANCE = "app.kubernetes.io/instance"
LABEL_APP_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
# The well-known labels the operator sets on its pods (builders.common_labels): nobody else may set them.
OPERATOR_LABELS = (LABEL_APP_NAME, LABEL_APP_INSTANCE, LABEL_APP_COMPONENT, LABEL_MANAGED_BY)

# Profiler sidecar injection (vlm_operator.admission.inject, docs/injection.md). On a pod or a namespace, "true" asks for
# the sidecar; "false" on a pod keeps it out of a namespace that asks. The webhook sets "true" on each pod it
# injects (the chart's PodMonitor selects it).
LABEL_PROFILE = f"{PREFIX}/profile"
# On a pod: the container SGLang runs in; the metrics' vlmservice and revision labels; set by the webhook.
ANNOTATION_SGLANG_CONTAINER = f"{PREFIX}/sglang-container"
ANNOTATION_PROFILE_SERVICE = f"{PREFIX}/profile-service"
ANNOTATION_PROFILE_REVISION = f"{PREFIX}/profile-revision"
ANNOTATION_PROFILER_INJECTED = f"{PREFIX}/profiler-injected"

# ---- pods ----
SGLANG_PORT = 30000
# The profiler sidecar's HTTP port (/metrics, /windows.json, /profile/*); vlm_sidecar's default too.
SIDECAR_PORT = 9400
# Pod roles (the LABEL_ROLE value). A revision's pods change role without a restart (a canary promoted stays the
# same pod), so the role is not in the pod template: the operator labels each pod as it places it, and again when
# its revision's role changes. Only the fresh baseline's pods carry theirs from their template.
ROLE_STABLE = "stable"
ROLE_CANARY = "canary"
# Pods of the stable revision started next to the canary's, at the same time and in the same number: the
# gate's baseline with rollout.baseline Fresh (Kayenta's practice: same age, same time, same traffic).
ROLE_BASELINE = "baseline"
ROLES = (ROLE_STABLE, ROLE_CANARY, ROLE_BASELINE)
# Every pod of a revision Deployment starts behind this scheduling gate: the operator removes it, and where the
# pod replaces another on a node, pins it to that node in the same write (node affinity may be added only while a
# pod is gated).
SCHEDULING_GATE = f"{PREFIX}/placement"
# The ReplicaSet controller removes the pods with the lowest cost first: the operator marks the pods it replaces.
ANNOTATION_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
VICTIM_COST = "-1000"
# Where a node-paired pod's partner ran (on the new pod): the node it was pinned to.
ANNOTATION_PAIRED_NODE = f"{PREFIX}/paired-node"

# ---- what the sidecar reports ----
# The scheduler stages, in the order SGLang's event loop runs them, then idle and the rest.
LOOP_STAGES = (
    "recv_requests",
    "process_input_requests",
    "get_next_batch_to_run",
    "run_batch",
    "process_batch_result",
)
STAGES = (*LOOP_STAGES, "idle", "other")
# Functions whose shares the sidecar always exports (spec.telemetry.watchFunctions' default): the multimodal
# input path whose CUDA IPC handle re-opening vlm-operator exists to catch.
DEFAULT_WATCH_FUNCTIONS = ("process_input_requests", "hash_feature", "reconstruct_on_target_device")
# The SGLang processes around the scheduler the sidecar samples when told to (spec.telemetry.frontendRoles).
FRONTEND_ROLES = ("tokenizer_manager", "tokenizer_worker", "mm_processor", "detokenizer")

# ---- rollout phases (status.rollout.phase) ----
# A canary in progress: the operator keeps the canary (and the baseline) running. Promoting: the analysed steps
# passed and the remaining stable pods are replaced, node by node, still under analysis.
ACTIVE_PHASES = ("Progressing", "Analysing", "Paused", "Promoting")
# A spec change without a rollout block: the pods are replaced the same way (node by node, within the availability
# budget), with no analysis and no canary; status.rollout is cleared when it ends.
UPDATING = "Updating"
# Ended, the canary refused: the operator holds the stable revision until the spec changes (or kubectl vlm
# retry clears status.rollout).
HELD_PHASES = ("RolledBack", "Aborted")
ENDED_PHASES = ("Promoted", *HELD_PHASES)
PHASES = (*ACTIVE_PHASES, UPDATING, *ENDED_PHASES)
