"""The VLMService models: defaults, round trips, and invalid specs rejected with field-level messages."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from vlm_operator import api

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
MINIMAL = {"model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"}}


def test_defaults_of_a_minimal_spec():
    s = api.parse_spec(MINIMAL)
    assert s.replicas == 1
    assert s.sglang.image == api.DEFAULT_SGLANG_IMAGE
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
    assert [st.replicas for st in s.rollout.steps] == [1]
    assert s.rollout.capacity == "Auto"
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
]


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
