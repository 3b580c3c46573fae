"""Spec mutations for fuzzing VLMService specs (tests/integration/test_spec_fuzz.py against the API
server, tests/unit/operator/controller/test_reconcile_fuzz.py through the reconcile): one field of a full, valid
spec changed at a time, with paths and bounds read from the generated CRD schema."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st
from pydantic import ValidationError

from vlm_operator.api.v1alpha1 import VLMServiceSpec

REPO = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((REPO / "crds" / "serving.vlmops.dev_vlmservices.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
BASE = yaml.safe_load((REPO / "examples" / "qwen2.5-vl-canary.yaml").read_text())["spec"]
BASE["sglang"]["env"] = [{"name": "FOO", "value": "1"}]
BASE["gpu"] = {"product": "NVIDIA-H100-80GB-HBM3", "count": 1, "tolerations": [{"key": "k", "operator": "Exists"}]}
BASE["pod"] = {"labels": {"team": "a"}, "imagePullSecrets": [{"name": "regcred"}]}
MIN_INVALID = 500
EXAMPLES = 900
# Pass-through Kubernetes types (affinity, spread constraints): their own schema, not ours to fuzz.
SKIP = ("affinity", "topologySpreadConstraints", "valueFrom", "envFrom")


def _leaves(node: dict[str, Any], path: tuple) -> list[tuple]:
    if any(s in path for s in SKIP):
        return []
    t = node.get("type")
    if t == "object" and "properties" in node:
        out = [path] if path else []
        for k, v in node["properties"].items():
            out += _leaves(v, (*path, k))
        return out
    if t == "array":
        items = node.get("items", {})
        return [path] + (_leaves(items, (*path, 0)) if items.get("type") == "object" else [])
    return [path]


PATHS = _leaves(SCHEMA, ())


def _node(path: tuple) -> dict[str, Any]:
    node = SCHEMA
    for key in path:
        node = node["items"] if isinstance(key, int) else node["properties"][key]
    return node


# Numeric fields and the values around their bounds (and 0, which the API server treats specially).
NUMERIC = [p for p in PATHS if _node(p).get("type") in ("integer", "number")]


def edges(path: tuple) -> list[Any]:
    n = _node(path)
    out: list[Any] = [0, 0.0, -1]
    for bound, step in (("minimum", -1), ("maximum", 1)):
        if bound in n:
            b = n[bound]
            out += [b, b + step, b + step * 0.001] if n["type"] == "number" else [b, b + step]
    return out


edge_cases = st.sampled_from(NUMERIC).flatmap(lambda p: st.tuples(st.just(p), st.sampled_from(edges(p))))

values = st.one_of(
    st.integers(-(10**12), 10**12),
    st.sampled_from([-1, 0, 1, 2, 3, 101, 1001, 65536, 0.5, -0.5, 1.5, 1e300]),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=12),
    st.sampled_from(["", "0s", "5", "1x", "-1m", "1m1", "abc", "Auto", "On", "Bogus", "http://", "15s", "2h",
                     "lmsysorg/sglang:v0.4.0", "UPPER", "a" * 300]),
    st.booleans(),
    st.none(),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(["x", "name", "replicas"]), st.integers(0, 2), max_size=2),
)


def mutate(spec: dict[str, Any], path: tuple, value: Any, action: str) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    node: Any = out
    for i, key in enumerate(path[:-1]):
        nxt = path[i + 1]
        if isinstance(node, list):
            while len(node) <= key:
                node.append({} if not isinstance(nxt, int) else [])
            node = node[key]
        else:
            if not isinstance(node.get(key), (dict, list)):
                node[key] = [] if isinstance(nxt, int) else {}
            node = node[key]
    last = path[-1]
    if isinstance(node, list):
        while len(node) <= last:
            node.append({})
    if action == "delete" and isinstance(node, dict):
        node.pop(last, None)
    elif action == "unknown" and isinstance(node, dict):
        node[f"{last}Typo"] = value
    else:
        node[last] = value
    return out


# One field set to a drawn value or deleted, or a numeric field at one of its bounds.
mutants = st.one_of(
    st.tuples(st.sampled_from(PATHS), values, st.sampled_from(["set", "delete"])),
    edge_cases.map(lambda c: (c[0], c[1], "set")),
)
# What a valid spec's Ready condition may say after a reconcile.
READY_REASONS = {"AllReplicasReady", "ReplicasNotReady", "InvalidSpec", "Unschedulable", "WaitingForModel"}


def model_accepts(spec: dict[str, Any]) -> bool:
    try:
        VLMServiceSpec.model_validate(spec)
        return True
    except ValidationError:
        return False
