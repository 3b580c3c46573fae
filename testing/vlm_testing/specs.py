"""Shared by tests (moved out of tests/unit/operator/api/test_api.py, so no test imports another test module)."""

from __future__ import annotations

import copy

MINIMAL = {"model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"}}


def _with(path: str, value):
    spec = copy.deepcopy(MINIMAL)
    node = spec
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return spec


INVALID = [
    # (spec, text the error must contain: the field's name)
    ({}, "model"),
    ({"model": {"path": ""}}, "path"),
    ({"model": {"path": "has space"}}, "path"),
    (_with("replicas", -1), "replicas"),
    (_with("replicas", 65), "replicas"),
    (_with("sglang.image", "Not A Valid/Image::tag"), "image"),
    (_with("sglang.version", "latest"), "version"),
    (_with("sglang.tensorParallel", 0), "tensorParallel"),
    (_with("sglang.ipcCache", {"mode": "Sometimes"}), "mode"),
    (_with("telemetry.frontendRoles", ["scheduler"]), "frontendRoles"),
    (_with("telemetry.frontendRoles", ["mm_processor", "mm_processor"]), "frontendRoles"),
    (_with("rollout.analysis.maxRegression.frontendBusy", 101), "frontendBusy"),
    (_with("sglang.ipcCache", {"featureCacheMB": 1}), "featureCacheMB"),
    (_with("sglang.args", ["--tp", "2"]), "args"),
    (_with("sglang.args", ["--port=8000"]), "args"),
    (
        _with("sglang", {"ipcCache": {"mode": "Off"}, "env": [{"name": "SGLANG_USE_IPC_POOL_HANDLE_CACHE", "value": "1"}]}),
        "SGLANG_USE_IPC_POOL_HANDLE_CACHE",
    ),
    (_with("sglang.env", [{"name": "1BAD", "value": "x"}]), "name"),
    ({**MINIMAL, "sglang": {"tensorParallel": 2}, "gpu": {"count": 3}}, "gpu.count"),
    (_with("gpu.count", 17), "count"),
    (_with("resources.shmSize", "lots"), "shmSize"),
    (_with("resources.cpu", "-1"), "cpu"),
    (_with("telemetry.interval", "soon"), "interval"),
    (_with("telemetry", {"interval": "5s", "duration": "10s"}), "duration"),
    (_with("telemetry.rate", 5000), "rate"),
    (_with("telemetry.watchFunctions", ["not a function"]), "watchFunctions"),
    ({**MINIMAL, "replicas": 1, "rollout": {"steps": [{"replicas": 2}]}}, "rollout.steps[0].replicas"),
    ({**MINIMAL, "rollout": {"steps": []}}, "steps"),
    ({**MINIMAL, "rollout": {"capacity": "Steal"}}, "capacity"),
    ({**MINIMAL, "rollout": {"analysis": {"source": "Prometheus"}}}, "prometheusURL"),
    ({**MINIMAL, "rollout": {"analysis": {"prometheusURL": "ftp://x"}}}, "prometheusURL"),
    ({**MINIMAL, "rollout": {"analysis": {"confidence": 1.5}}}, "confidence"),
    ({**MINIMAL, "rollout": {"analysis": {"interval": "1h", "maxDuration": "30m"}}}, "interval"),
    ({**MINIMAL, "rollout": {"analysis": {"maxRegression": {"loopLatency": 150}}}}, "loopLatency"),
    ({**MINIMAL, "rollout": {"analysis": {"onInconclusive": "Shrug"}}}, "onInconclusive"),
    ({**MINIMAL, "unknownField": 1}, "unknownField"),
    # issue 15: env by reference, envFrom, the pod block, telemetry's network policy and UID
    (_with("sglang.env", [{"name": "HF_TOKEN", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]), "env"),
    (_with("sglang.env", [{"name": "HF_TOKEN"}]), "env"),
    (_with("sglang.env", [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"},
                                                      "fieldRef": {"fieldPath": "metadata.name"}}}]), "valueFrom"),
    (_with("sglang.env", [{"name": "A", "valueFrom": {}}]), "valueFrom"),
    (_with("sglang.env", [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s"}}}]), "key"),
    (_with("sglang.env", [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "Not_A_Name", "key": "k"}}}]), "name"),
    (_with("sglang.envFrom", [{"secretRef": {"name": "s"}, "configMapRef": {"name": "c"}}]), "envFrom"),
    (_with("sglang.envFrom", [{"prefix": "P_"}]), "envFrom"),
    (_with("pod.labels", {"serving.vlmops.dev/role": "stable"}), "labels"),
    (_with("pod.labels", {"app.kubernetes.io/managed-by": "me"}), "labels"),
    (_with("pod.labels", {"team": "has space"}), "labels"),
    (_with("pod.labels", {"-bad-key": "x"}), "labels"),
    (_with("pod.annotations", {"serving.vlmops.dev/ipc-cache": "inactive"}), "annotations"),
    (_with("pod.imagePullSecrets", [{"name": "Bad_Name"}]), "imagePullSecrets"),
    (_with("pod.serviceAccountName", "Runner"), "serviceAccountName"),
    (_with("pod.priorityClassName", "high priority"), "priorityClassName"),
    (_with("pod.affinity", {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}}), "topologyKey"),
    (_with("pod.affinity", {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In"}]}]}}}), "values"),
    (_with("pod.affinity", {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
        "matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["many"]}]}}]}}), "values"),
    (_with("pod.affinity", {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 101, "podAffinityTerm": {
        "topologyKey": "kubernetes.io/hostname"}}]}}), "weight"),
    (_with("pod.topologySpreadConstraints", [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                              "whenUnsatisfiable": "Whatever"}]), "whenUnsatisfiable"),
    (_with("pod.topologySpreadConstraints", [{"maxSkew": 0, "topologyKey": "kubernetes.io/hostname",
                                              "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchExpressions": [
                                                  {"key": "a", "operator": "Exists", "values": ["x"]}]}}]), "maxSkew"),
    (_with("pod.topologySpreadConstraints", [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                              "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchExpressions": [
                                                  {"key": "a", "operator": "Exists", "values": ["x"]}]}}]), "values"),
    (_with("pod.hostNetwork", True), "hostNetwork"),
    (_with("telemetry.networkPolicy", "Maybe"), "networkPolicy"),
    (_with("telemetry.runAsUser", -1), "runAsUser"),
    # Day two on a real GPU cluster: pod knobs, volumes, the container's securityContext, validation
    (_with("pod.runtimeClassName", "Nvidia Runtime"), "runtimeClassName"),
    (_with("pod.schedulerName", "My_Scheduler"), "schedulerName"),
    (_with("pod.terminationGracePeriodSeconds", 0), "terminationGracePeriodSeconds"),
    (_with("pod.terminationGracePeriodSeconds", 3601), "terminationGracePeriodSeconds"),
    (_with("pod.volumes", [{"name": "cache"}]), "exactly one source"),
    (_with("pod.volumes", [{"name": "cache", "emptyDir": {}, "configMap": {"name": "c"}}]), "exactly one source"),
    (_with("pod.volumes", [{"name": "dshm", "emptyDir": {}}]), "operator's"),
    (_with("pod.volumes", [{"name": "Cache", "emptyDir": {}}]), "name"),
    (_with("pod.volumes", [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]), "volumes"),
    (_with("pod.volumes", [{"name": "a", "persistentVolumeClaim": {}}]), "claimName"),
    (_with("pod.volumes", [{"name": "a", "hostPath": {"path": "relative"}}]), "path"),
    (_with("pod.volumes", [{"name": "a", "nfs": {"server": "nas"}}]), "path"),
    (_with("pod.volumes", [{"name": "a", "csi": {"readOnly": True}}]), "driver"),
    (_with("pod.volumes", [{"name": "a", "secret": {"defaultMode": 1000, "secretName": "s"}}]), "defaultMode"),
    (_with("pod.volumes", [{"name": "a", "awsElasticBlockStore": {"volumeID": "v"}}]), "awsElasticBlockStore"),
    (_with("sglang.volumeMounts", [{"name": "nope", "mountPath": "/x"}]), "volumeMounts"),
    ({**MINIMAL, "pod": {"volumes": [{"name": "a", "emptyDir": {}}]},
      "sglang": {"volumeMounts": [{"name": "a", "mountPath": "/dev/shm"}]}}, "mountPath"),
    ({**MINIMAL, "pod": {"volumes": [{"name": "a", "emptyDir": {}}]},
      "sglang": {"volumeMounts": [{"name": "a", "mountPath": "x"}]}}, "mountPath"),
    ({**MINIMAL, "pod": {"volumes": [{"name": "a", "emptyDir": {}}]},
      "sglang": {"volumeMounts": [{"name": "a", "mountPath": "/x"}, {"name": "a", "mountPath": "/x"}]}}, "mountPath"),
    ({**MINIMAL, "pod": {"volumes": [{"name": "a", "emptyDir": {}}]},
      "sglang": {"volumeMounts": [{"name": "a", "mountPath": "/x", "subPath": "a", "subPathExpr": "$(B)"}]}},
     "subPath"),
    ({"model": {"path": "m", "cache": {"claimName": "w"}}, "pod": {"volumes": [{"name": "a", "emptyDir": {}}]},
      "sglang": {"volumeMounts": [{"name": "a", "mountPath": "/models"}]}}, "volumeMounts"),
    (_with("sglang.securityContext", {"privileged": True, "allowPrivilegeEscalation": False}),
     "allowPrivilegeEscalation"),
    (_with("sglang.securityContext", {"capabilities": {"add": ["SYS_ADMIN"]}, "allowPrivilegeEscalation": False}),
     "allowPrivilegeEscalation"),
    (_with("sglang.securityContext", {"seccompProfile": {"type": "Localhost"}}), "localhostProfile"),
    (_with("sglang.securityContext", {"seccompProfile": {"type": "RuntimeDefault", "localhostProfile": "p"}}),
     "localhostProfile"),
    (_with("sglang.securityContext", {"capabilities": {"add": ["net admin"]}}), "add"),
    (_with("sglang.securityContext", {"runAsUser": -1}), "runAsUser"),
    (_with("sglang.securityContext", {"hostNetwork": True}), "hostNetwork"),
    (_with("sglang.startupTimeout", "30s"), "startupTimeout"),
    (_with("sglang.startupTimeout", "7h"), "startupTimeout"),
    (_with("sglang.startupTimeout", "soon"), "startupTimeout"),
    ({**MINIMAL, "telemetry": {"enabled": False}, "rollout": {}}, "telemetry.enabled"),
    ({**MINIMAL, "rollout": {"steps": [{"replicas": 1, "analysis": "45m"}]}}, "maxDuration"),
    ({**MINIMAL, "rollout": {"steps": [{"replicas": 1}], "analysis": {"maxDuration": "3m", "interval": "1m"}}},
     "maxDuration"),
    ({**MINIMAL, "rollout": {"analysis": {"maxRegression": {"loopP95": 101}}}}, "loopP95"),
    ({**MINIMAL, "rollout": {"maxUnavailable": -1}}, "maxUnavailable"),
    ({**MINIMAL, "rollout": {"analysis": {"maxRegression": {"loopP95": -1}}}}, "loopP95"),
    ({**MINIMAL, "autoscaling": {"minReplicas": 3, "maxReplicas": 2}}, "minReplicas"),
    ({**MINIMAL, "autoscaling": {"minReplicas": 0, "maxReplicas": 2}}, "minReplicas"),
    ({**MINIMAL, "autoscaling": {}}, "maxReplicas"),
    ({**MINIMAL, "autoscaling": {"maxReplicas": 2, "targets": {"schedulerBusyPercent": 120}}}, "schedulerBusyPercent"),
    ({**MINIMAL, "autoscaling": {"maxReplicas": 2, "targets": {"ttftP95": "soon"}}}, "ttftP95"),
    ({**MINIMAL, "autoscaling": {"maxReplicas": 2, "targets": {"frontendBusyPercent": 80}}}, "frontendBusyPercent"),
    ({**MINIMAL, "replicas": 4, "autoscaling": {"minReplicas": 1, "maxReplicas": 4},
      "rollout": {"steps": [{"replicas": 2}]}}, "minReplicas"),
]
