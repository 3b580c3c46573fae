"""The VLMService models: defaults, round trips, and invalid specs rejected with field-level messages."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from vlm_operator.api import v1alpha1 as api
from vlm_testing.specs import INVALID, MINIMAL

ROOT = Path(__file__).resolve().parents[4]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def test_defaults_of_a_minimal_spec():
    s = api.parse_spec(MINIMAL)
    assert s.replicas == 1
    assert s.sglang.image is None  # no CRD default: the operator's VLM_SGLANG_IMAGE fills it
    assert s.sglang.tensor_parallel == 1
    assert s.sglang.ipc_cache.mode == "Auto"
    assert s.gpu.product == api.DEFAULT_GPU_PRODUCT
    assert s.gpus_per_replica == 1
    assert s.resources.shm_size == "16Gi"
    assert s.telemetry.enabled and s.telemetry.rate == 1000
    assert "process_input_requests" in s.telemetry.watch_functions
    assert s.rollout is None and s.paused is False


def test_gpu_count_defaults_to_tensor_parallel():
    s = api.parse_spec({**MINIMAL, "sglang": {"tensorParallel": 4}})
    assert s.gpus_per_replica == 4


def test_rollout_defaults():
    s = api.parse_spec({**MINIMAL, "replicas": 2, "rollout": {}})
    assert s.rollout is not None
    assert s.rollout.steps is None  # not set: the default schedule for the replicas
    assert [st.replicas for st in s.rollout.schedule(s.replicas)] == [1]
    assert [st.replicas for st in s.rollout.schedule(1)] == [1]
    assert [st.replicas for st in s.rollout.schedule(8)] == [1, 2, 4]
    assert [st.replicas for st in s.rollout.schedule(9)] == [1, 2, 4, 8]
    assert all(st.analysis == "5m" for st in s.rollout.schedule(9))
    assert s.rollout.capacity == "Auto"
    assert s.rollout.baseline == "Stable"
    assert s.rollout.max_unavailable == 1
    written = api.parse_spec({**MINIMAL, "replicas": 8, "rollout": {"steps": [{"replicas": 3}]}}).rollout
    assert [st.replicas for st in written.schedule(8)] == [3]  # steps as written win
    a = s.rollout.analysis
    assert (a.source, a.interval, a.confidence, a.min_samples, a.on_inconclusive) == (
        "Auto",
        "1m",
        0.95,
        5,
        "Rollback",
    )
    assert a.max_regression.loop_latency == 3.0


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_round_trip(path):
    doc = yaml.safe_load(path.read_text())
    s = api.parse_spec(doc["spec"])
    dumped = s.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert api.parse_spec(dumped) == s
    # Every field the example sets survives with its camelCase name.
    def subset(a, b):
        if isinstance(a, dict):
            return all(k in b and subset(v, b[k]) for k, v in a.items())
        return a == b

    assert subset(doc["spec"], dumped)


def test_there_are_three_examples():
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("spec,field", INVALID, ids=[f"{i}-{f}" for i, (_, f) in enumerate(INVALID)])
def test_invalid_specs_are_rejected_naming_the_field(spec, field):
    with pytest.raises(ValidationError) as exc:
        api.parse_spec(spec)
    text = str(exc.value)
    assert field.split(".")[-1].split("[")[0] in text, text


def test_at_least_fifteen_invalid_specs():
    assert len(INVALID) >= 15


def test_status_round_trip_ignores_unknown_fields():
    raw = {
        "observedGeneration": 3,
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "AllReplicasReady", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}
        ],
        "rollout": {"phase": "Analysing", "step": 1, "signals": [{"name": "loop_latency", "delta": 0.07}]},
        "kopf": {"progress": {}},
    }
    st = api.VLMServiceStatus.model_validate(raw)
    assert st.rollout and st.rollout.signals[0].delta == 0.07
    assert "kopf" not in st.model_dump(by_alias=True)


def test_pod_block_and_env_references_round_trip():
    spec = {
        **MINIMAL,
        "sglang": {
            "env": [
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "EMPTY", "value": ""},  # an explicit empty value is still a value
            ],
            "envFrom": [{"configMapRef": {"name": "c", "optional": True}, "prefix": "C_"}],
        },
        "pod": {
            "labels": {"team": "vision", "example.com/tier": ""},
            "annotations": {"example.com/note": "any text, even with spaces"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]},
                                      {"key": "zone", "operator": "Exists"}]}]}}},
        },
        "telemetry": {"networkPolicy": "Off", "runAsUser": 1000},
    }
    s = api.parse_spec(spec)
    assert s.sglang.env[0].value is None and s.sglang.env[0].value_from.secret_key_ref.key == "token"
    assert s.sglang.env[2].value == ""
    assert s.telemetry.network_policy == "Off" and s.telemetry.run_as_user == 1000
    dumped = s.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert api.parse_spec(dumped) == s
    assert dumped["pod"] == spec["pod"]


def test_telemetry_defaults_keep_the_sidecar_as_before():
    t = api.parse_spec(MINIMAL).telemetry
    assert t.network_policy == "Auto" and t.run_as_user == 0


def test_status_reports_the_effective_sglang():
    st = api.VLMServiceStatus.model_validate({"sglang": {"image": "lmsysorg/sglang:v0.5.23", "version": "0.5.23"}})
    assert st.sglang and st.sglang.version == "0.5.23"
    assert any(c["jsonPath"] == ".status.sglang.version" for c in api.PRINTER_COLUMNS)


@pytest.mark.parametrize(("toleration", "why"), [
    ({"key": "", "operator": "Equal", "value": "x"}, "operator must be Exists"),
    ({"operator": "Equal"}, "operator must be Exists"),
    ({"key": "http://", "operator": "Exists"}, "key"),
    ({"key": "k", "operator": "Exists", "value": "v"}, "value must be empty"),
    ({"key": "k", "value": "a b"}, "value"),
    ({"key": "k", "operator": "Exists", "tolerationSeconds": 30}, "tolerationSeconds needs effect NoExecute"),
])
def test_tolerations_follow_the_pod_api_rules(toleration, why):
    """Each of these passed the CRD before and made a Deployment the API server refused (found by fuzzing the
    running operator); now the spec is refused, here and by the CRD's CEL rules."""
    spec = {"model": {"path": "m"}, "gpu": {"tolerations": [toleration]}}
    with pytest.raises(ValidationError, match=why):
        api.parse_spec(spec)


def test_tolerations_the_pod_api_takes_are_taken():
    for t in ({"operator": "Exists"}, {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
              {"key": "k", "operator": "Equal", "value": "v"},
              {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}):
        api.parse_spec({"model": {"path": "m"}, "gpu": {"tolerations": [t]}})
    with pytest.raises(ValidationError, match="qualified name"):
        api.parse_spec({"model": {"path": "m"}, "gpu": {"nodeSelector": {"bad key": "v"}}})
    with pytest.raises(ValidationError):
        api.parse_spec({"model": {"path": "m"}, "gpu": {"nodeSelector": {"k": "not a label value"}}})


# ---------------------------------------------------------------- day two on a real GPU cluster


def test_day_two_fields_round_trip_and_default_to_absent():
    plain = api.parse_spec(MINIMAL)
    assert plain.sglang.startup_timeout == "20m"  # the fixed budget before, now the default
    assert plain.sglang.volume_mounts is None and plain.sglang.security_context is None
    assert plain.pod is None
    spec = {
        **MINIMAL,
        "sglang": {
            "startupTimeout": "45m",
            "volumeMounts": [{"name": "compile-cache", "mountPath": "/root/.cache"},
                             {"name": "chat", "mountPath": "/templates", "readOnly": True, "subPath": "qwen"}],
            "securityContext": {"runAsUser": 1000, "runAsNonRoot": True, "capabilities": {"drop": ["NET_RAW"]},
                                "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/sglang.json"}},
        },
        "pod": {
            "runtimeClassName": "nvidia",
            "schedulerName": "volcano",
            "terminationGracePeriodSeconds": 300,
            "automountServiceAccountToken": True,
            "volumes": [
                {"name": "compile-cache", "emptyDir": {"sizeLimit": "20Gi"}},
                {"name": "chat", "configMap": {"name": "templates", "items": [{"key": "qwen", "path": "qwen"}]}},
                {"name": "nvme", "hostPath": {"path": "/mnt/nvme", "type": "Directory"}},
                {"name": "weights", "csi": {"driver": "s3.csi.aws.com", "volumeAttributes": {"bucket": "w"}}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
                {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
                {"name": "fleet", "image": {"reference": "registry.example.com/weights:1", "pullPolicy": "IfNotPresent"}},
            ],
        },
        "rollout": {"analysis": {"maxRegression": {"loopP95": 8}}},
    }
    s = api.parse_spec(spec)
    assert s.pod.volumes[1].config_map.model_extra == {}  # items is a named field; unnamed ones pass through
    assert s.rollout.analysis.max_regression.loop_p95 == 8
    dumped = s.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert api.parse_spec(dumped) == s
    assert dumped["pod"] == spec["pod"] and dumped["sglang"]["volumeMounts"] == spec["sglang"]["volumeMounts"]
    assert dumped["sglang"]["securityContext"] == spec["sglang"]["securityContext"]


def test_open_volume_sources_keep_what_they_do_not_name():
    """A field of a Kubernetes volume source the model does not name goes through to the pod (the API server
    checks it when the operator applies the Deployment); the typed ones are checked here."""
    s = api.parse_spec({**MINIMAL, "pod": {"volumes": [
        {"name": "w", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "s"}, "fsType": "ext4"}}]}})
    dumped = s.model_dump(by_alias=True, exclude_none=True, mode="json")["pod"]["volumes"][0]
    assert dumped == {"name": "w", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "s"}, "fsType": "ext4"}}


def test_loop_p95_is_not_gated_unless_set():
    a = api.parse_spec({**MINIMAL, "rollout": {}}).rollout.analysis.max_regression
    assert a.loop_p95 is None and a.loop_latency == 3.0


def test_a_step_may_last_exactly_max_duration_and_defaults_fit():
    api.parse_spec({**MINIMAL, "rollout": {"steps": [{"replicas": 1, "analysis": "30m"}]}})
    api.parse_spec({**MINIMAL, "rollout": {"analysis": {"maxDuration": "5m"}}})  # the default step: 5m
    api.parse_spec({**MINIMAL, "telemetry": {"enabled": False}})  # no rollout: no sidecar needed


def test_privileged_without_an_explicit_escalation_setting_is_taken():
    """The operator's allowPrivilegeEscalation false is dropped for such a container (builders), so the spec
    itself is valid; only an explicit false together with privileged or CAP_SYS_ADMIN is refused."""
    for sc in ({"privileged": True}, {"capabilities": {"add": ["CAP_SYS_ADMIN"]}},
               {"privileged": True, "allowPrivilegeEscalation": True}):
        api.parse_spec({**MINIMAL, "sglang": {"securityContext": sc}})


def test_every_cel_rule_has_a_python_twin_message():
    """Each new CEL rule's message (or its gist) is what the model says too, so the API server and the
    operator refuse a spec with the same words."""
    checks = [
        (api.Volume, {"name": "a"}, "exactly one source"),
        (api.VolumeMount, {"name": "a", "mountPath": "/dev/shm"}, "/dev/shm"),
        (api.ProfileRef, {"type": "Localhost"}, "localhostProfile is required"),
        (api.SecurityContext, {"privileged": True, "allowPrivilegeEscalation": False}, "cannot be false"),
    ]
    for model, value, words in checks:
        assert any(words in m for _, m, _ in model.cel), (model, words)
        with pytest.raises(ValidationError, match=words.replace("/", ".")):
            model.model_validate(value)
