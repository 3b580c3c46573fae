"""Pure builders: golden manifests per example, and the pod-shape rules DESIGN.md asks for.

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
OWNER = builders.Owner("svc", "ns", "00000000-0000-0000-0000-000000000001")
SETTINGS = Settings(sidecar_image="vlmops/vlm-sidecar:test")


def _desired(spec: dict) -> builders.Desired:
    return builders.build_desired(OWNER, api.parse_spec(spec), SETTINGS)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_golden(path):
    spec = api.parse_spec(yaml.safe_load(path.read_text())["spec"])
    d = builders.build_desired(OWNER, spec, SETTINGS)
    out = {
        "deployment": builders.build_deployment(OWNER, d.template, d.revision, builders.ROLE_STABLE, spec.replicas),
        "service": d.service,
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
