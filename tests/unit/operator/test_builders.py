"""Pure builders: golden manifests per example, and the pod-shape rules the README states.

Regenerate the golden files with UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from vlm_operator import api, builders
from vlm_operator.errors import InvalidSpec
from vlm_operator.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "golden" / "builders"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
# Golden inputs that are not examples (they name objects a bare cluster lacks); same output format.
INPUTS = sorted((GOLDEN / "inputs").glob("*.yaml"))
OWNER = builders.Owner("svc", "ns", "00000000-0000-0000-0000-000000000001")
SETTINGS = Settings(sidecar_image="vlmops/vlm-sidecar:test")


def _desired(spec: dict) -> builders.Desired:
    return builders.build_desired(OWNER, api.parse_spec(spec), SETTINGS)


@pytest.mark.parametrize("path", EXAMPLES + INPUTS, ids=lambda p: p.stem)
def test_golden(path):
    spec = api.parse_spec(yaml.safe_load(path.read_text())["spec"])
    d = builders.build_desired(OWNER, spec, SETTINGS)
    out = {
        "deployment": builders.build_deployment(OWNER, d.template, d.revision, builders.ROLE_STABLE, spec.replicas),
        "service": d.service,
        "podDisruptionBudget": d.pdb,
        "networkPolicy": d.network_policy,
    }
    text = yaml.safe_dump(out, sort_keys=True)
    golden = GOLDEN / f"{path.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.read_text() == text


def _containers(d: builders.Desired) -> dict:
    return {c["name"]: c for c in d.template["spec"]["containers"]}


def test_pod_shape():
    d = _desired({"model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"}, "sglang": {"tensorParallel": 2}})
    pod = d.template["spec"]
    c = _containers(d)
    args = c["sglang"]["args"]
    for flag, value in (("--host", "0.0.0.0"), ("--port", "30000"), ("--tp", "2")):
        assert args[args.index(flag) + 1] == value
    assert "--enable-metrics" in args
    assert c["sglang"]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == api.DEFAULT_GPU_PRODUCT
    assert pod["shareProcessNamespace"] is True
    startup = c["sglang"]["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    sc = c["profiler"]["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    env = {e["name"]: e for e in c["profiler"]["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "revision" in env["VLM_REVISION"]["valueFrom"]["fieldRef"]["fieldPath"]


def test_ipc_cache_flags_follow_the_version():
    new = _containers(_desired({"model": {"path": "m"}, "sglang": {"image": "lmsysorg/sglang:v0.5.23"}}))["sglang"]
    assert "--mm-feature-transport" in new["args"]
    old = _desired({"model": {"path": "m"}, "sglang": {"image": "lmsysorg/sglang:v0.5.10"}})
    env = {e["name"]: e["value"] for e in _containers(old)["sglang"]["env"]}
    assert env["SGLANG_USE_IPC_POOL_HANDLE_CACHE"] == "1"
    assert env["SGLANG_USE_CUDA_IPC_TRANSPORT"] == "1"
    assert old.plan.active


def test_on_with_a_version_without_the_cache_is_invalid():
    with pytest.raises(InvalidSpec) as e:
        _desired({"model": {"path": "m"}, "sglang": {"image": "lmsysorg/sglang:v0.5.9", "ipcCache": {"mode": "On"}}})
    assert "ipcCache" in str(e.value)


def test_auto_on_an_old_version_is_inactive_not_an_error():
    d = _desired({"model": {"path": "m"}, "sglang": {"image": "lmsysorg/sglang:v0.5.9"}})
    assert not d.plan.active and d.plan.reason == "SGLangTooOld"


def test_revision_is_stable_and_sensitive():
    a = _desired({"model": {"path": "m"}})
    b = _desired({"model": {"path": "m"}})
    c = _desired({"model": {"path": "m"}, "sglang": {"ipcCache": {"mode": "Off"}}})
    assert a.revision == b.revision != c.revision
    # The role label is not part of the revision: stable and canary of one spec agree.
    s = builders.build_deployment(OWNER, a.template, a.revision, builders.ROLE_STABLE, 1)
    k = builders.build_deployment(OWNER, a.template, a.revision, builders.ROLE_CANARY, 1)
    assert s["spec"]["template"]["metadata"]["labels"][builders.LABEL_REVISION] == k["spec"]["template"]["metadata"][
        "labels"
    ][builders.LABEL_REVISION]
    assert s["metadata"]["name"] == "svc" and k["metadata"]["name"] == "svc-canary"


def test_deployment_never_surges_gpus():
    d = _desired({"model": {"path": "m"}})
    dep = builders.build_deployment(OWNER, d.template, d.revision, builders.ROLE_STABLE, 3)
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert dep["metadata"]["ownerReferences"][0]["controller"] is True


def test_user_env_that_contradicts_the_plan_is_invalid():
    with pytest.raises(InvalidSpec) as e:
        _desired(
            {"model": {"path": "m"}, "sglang": {"image": "lmsysorg/sglang:v0.5.10", "env": [{"name": "SGLANG_USE_IPC_POOL_HANDLE_CACHE", "value": "0"}]}}
        )
    assert e.value.field == "spec.sglang.env"
    d = _desired({"model": {"path": "m"}, "sglang": {"env": [{"name": "HF_HOME", "value": "/x"}]}})
    env = {e["name"]: e["value"] for e in _containers(d)["sglang"]["env"]}
    assert env["HF_HOME"] == "/x"


def test_template_is_json_serialisable():
    json.dumps(_desired({"model": {"path": "m", "cache": {"claimName": "weights"}}}).template)


# ---------------------------------------------------------------- issue 15: pod template, image, security

def test_no_image_and_the_old_crd_default_give_the_same_revision():
    """Objects stored with the old CRD default (image: lmsysorg/sglang:v0.5.23) keep their revision."""
    old = _desired({"model": {"path": "m"}, "sglang": {"image": api.DEFAULT_SGLANG_IMAGE}})
    new = _desired({"model": {"path": "m"}})
    assert old.template == new.template and old.revision == new.revision
    assert new.image == api.DEFAULT_SGLANG_IMAGE and new.version == "0.5.23"


def test_the_operator_setting_fills_the_image_and_its_version():
    s = Settings(sidecar_image="vlmops/vlm-sidecar:test", sglang_image="registry.example.com/sglang:v0.5.10")
    d = builders.build_desired(OWNER, api.parse_spec({"model": {"path": "m"}}), s)
    assert _containers(d)["sglang"]["image"] == "registry.example.com/sglang:v0.5.10"
    assert (d.image, d.version) == ("registry.example.com/sglang:v0.5.10", "0.5.10")
    pinned = builders.build_desired(
        OWNER, api.parse_spec({"model": {"path": "m"}, "sglang": {"image": "lmsysorg/sglang:v0.5.22"}}), s
    )
    assert (pinned.image, pinned.version) == ("lmsysorg/sglang:v0.5.22", "0.5.22")


def test_env_from_a_secret_is_a_reference_never_a_value():
    d = _desired(
        {
            "model": {"path": "m"},
            "sglang": {
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
                "envFrom": [{"configMapRef": {"name": "cm"}}],
            },
        }
    )
    c = _containers(d)["sglang"]
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert c["envFrom"] == [{"configMapRef": {"name": "cm"}}]
    # The plan's env stays first, as before: older specs keep their revision.
    assert list(env)[-1] == "HF_TOKEN" and all(n.startswith("SGLANG_") for n in list(env)[:-1])


def test_value_from_on_an_env_the_operator_sets_is_invalid():
    with pytest.raises(InvalidSpec) as e:
        _desired(
            {
                "model": {"path": "m"},
                "sglang": {
                    "env": [
                        {
                            "name": "SGLANG_USE_IPC_POOL_HANDLE_CACHE",
                            "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}},
                        }
                    ]
                },
            }
        )
    assert e.value.field == "spec.sglang.env"


def test_pod_fields_reach_the_pod_and_only_when_set():
    bare = _desired({"model": {"path": "m"}}).template
    for k in ("serviceAccountName", "imagePullSecrets", "priorityClassName", "affinity", "topologySpreadConstraints"):
        assert k not in bare["spec"]
    d = _desired(
        {
            "model": {"path": "m"},
            "pod": {
                "labels": {"team": "vision"},
                "annotations": {"example.com/a": "b"},
                "serviceAccountName": "runner",
                "imagePullSecrets": [{"name": "pull"}],
                "priorityClassName": "high",
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname", "namespaceSelector": {}}]}},
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
                ],
            },
        }
    )
    t = d.template
    assert t["metadata"]["labels"]["team"] == "vision"
    assert t["metadata"]["labels"][builders.LABEL_SERVICE] == "svc"
    assert t["metadata"]["annotations"] == {"example.com/a": "b", builders.ANNOTATION_IPC: "active"}
    pod = t["spec"]
    assert pod["serviceAccountName"] == "runner" and pod["priorityClassName"] == "high"
    assert pod["imagePullSecrets"] == [{"name": "pull"}]  # one list for both containers' images
    # An empty namespaceSelector means "all namespaces" and must survive the pruning of empty fields.
    term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term == {"topologyKey": "kubernetes.io/hostname", "namespaceSelector": {}}
    # Without a labelSelector a spread constraint counts the service's own pods.
    assert pod["topologySpreadConstraints"][0]["labelSelector"] == {"matchLabels": {builders.LABEL_SERVICE: "svc"}}
    assert d.revision != _desired({"model": {"path": "m"}}).revision


def test_operator_labels_cover_what_the_schema_refuses():
    """Every pod label the operator sets is one the spec may not set (so a user label never shadows it)."""
    d = _desired({"model": {"path": "m"}})
    s = builders.build_deployment(OWNER, d.template, d.revision, builders.ROLE_STABLE, 1)
    for k in s["spec"]["template"]["metadata"]["labels"]:
        assert k in api.OPERATOR_LABELS or k.startswith(api.OPERATOR_PREFIX), k
    for k in s["spec"]["template"]["metadata"]["annotations"]:
        assert k.startswith(api.OPERATOR_PREFIX), k


def test_pdb_only_with_more_than_one_replica_and_over_the_stable_pods():
    assert _desired({"model": {"path": "m"}, "replicas": 1}).pdb is None
    assert _desired({"model": {"path": "m"}, "replicas": 0}).pdb is None
    pdb = _desired({"model": {"path": "m"}, "replicas": 2}).pdb
    assert pdb["apiVersion"] == "policy/v1" and pdb["metadata"]["name"] == "svc"
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {builders.LABEL_SERVICE: "svc", builders.LABEL_ROLE: builders.ROLE_STABLE}},
    }
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid


@pytest.mark.parametrize(
    "mode,setting,telemetry,want",
    [
        ("Auto", True, True, True),
        ("Auto", False, True, False),
        ("On", False, True, True),
        ("Off", True, True, False),
        ("On", True, False, False),  # no sidecar, no port to guard
    ],
)
def test_network_policy_follows_the_mode_and_the_setting(mode, setting, telemetry, want):
    s = Settings(sidecar_image="x/y:1", network_policy=setting)
    spec = api.parse_spec({"model": {"path": "m"}, "telemetry": {"networkPolicy": mode, "enabled": telemetry}})
    assert (builders.build_desired(OWNER, spec, s).network_policy is not None) is want


def test_network_policy_guards_only_the_sidecar_port():
    np = _desired({"model": {"path": "m"}}).network_policy
    assert np["spec"]["podSelector"] == {"matchLabels": {builders.LABEL_SERVICE: "svc"}}
    assert np["spec"]["policyTypes"] == ["Ingress"]
    open_rule, sidecar_rule = np["spec"]["ingress"]
    assert open_rule == {"ports": [{"protocol": "TCP", "port": builders.SGLANG_PORT}]}  # no `from`: anyone
    assert sidecar_rule["ports"] == [{"protocol": "TCP", "port": builders.SIDECAR_PORT}]
    assert sidecar_rule["from"] == list(SETTINGS.profiler_peers)
    names = [p["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for p in sidecar_rule["from"]]
    assert names == ["vlm-operator", "prometheus"]


def test_sidecar_uid_follows_telemetry_run_as_user():
    root = _containers(_desired({"model": {"path": "m"}}))["profiler"]["securityContext"]
    assert root["runAsUser"] == 0 and "runAsNonRoot" not in root
    sc = _containers(_desired({"model": {"path": "m"}, "telemetry": {"runAsUser": 1000}}))["profiler"]["securityContext"]
    assert sc["runAsUser"] == 1000 and sc["runAsNonRoot"] is True
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}


def test_front_end_sampling_reaches_the_sidecar_only_when_asked_for():
    def env(spec):
        d = _desired(spec)
        return d.revision, {e["name"]: e.get("value") for e in _containers(d)["profiler"]["env"]}

    rev, plain = env({"model": {"path": "m"}})
    assert "VLM_FRONTEND_ROLES" not in plain  # the default pod template, and so its revision, is unchanged
    assert rev == env({"model": {"path": "m"}, "telemetry": {"frontendRoles": []}})[0]
    rev2, on = env({"model": {"path": "m"}, "telemetry": {"frontendRoles": ["mm_processor", "tokenizer_manager"]}})
    assert on["VLM_FRONTEND_ROLES"] == "mm_processor,tokenizer_manager" and rev2 != rev
    with pytest.raises(ValueError, match="frontendRoles"):  # the CRD's enum refuses it first
        _desired({"model": {"path": "m"}, "telemetry": {"frontendRoles": ["scheduler"]}})
    with pytest.raises(ValueError, match="a role may appear once"):  # the CRD's list-type set refuses it too
        _desired({"model": {"path": "m"}, "telemetry": {"frontendRoles": ["mm_processor", "mm_processor"]}})
