"""The generated CRD: golden file, structural-schema rules, and the committed copies."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from vlm_operator.api import crdgen

ROOT = Path(__file__).resolve().parents[4]
GOLDEN = ROOT / "tests" / "golden" / "crd" / crdgen.CRD_FILE


def test_golden():
    """Regenerate with UPDATE_GOLDEN=1 pytest tests/unit/operator/api/test_crdgen.py."""
    text = crdgen.render()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert GOLDEN.read_text() == text


def test_committed_copies_match():
    assert crdgen.main(["--check", "--root", str(ROOT)]) == 0


def _walk(node, path="$"):
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


def test_schema_is_structural():
    schema = crdgen.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        if not isinstance(node, dict):
            continue
        assert "$ref" not in node, path
        assert "anyOf" not in node and "allOf" not in node and "oneOf" not in node, path
        assert "title" not in node or path.endswith(".properties"), path
        if "properties" in node and not path.endswith(".properties"):
            assert "additionalProperties" not in node, path
            assert node.get("type") == "object", path


def test_printer_columns_and_subresources():
    v = crdgen.build_crd()["spec"]["versions"][0]
    names = [c["name"] for c in v["additionalPrinterColumns"]]
    for want in ("Model", "Ready", "Phase", "Canary", "LoopP95", "TopFn", "Age"):
        assert want in names
    assert v["subresources"]["status"] == {}
    assert v["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"


def test_cel_rules_present():
    text = yaml.safe_dump(crdgen.build_crd())
    assert text.count("x-kubernetes-validations") >= 4
    assert "self.gpu.count % self.sglang.tensorParallel" in text


def test_nested_defaults_are_empty_objects():
    spec = crdgen.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["sglang"]["default"] == {}
    assert spec["properties"]["sglang"]["properties"]["ipcCache"]["default"] == {}
    assert spec["properties"]["telemetry"]["properties"]["watchFunctions"]["default"][0] == "process_input_requests"
    assert "default" not in spec["properties"]["model"]


def _spec_schema():
    return crdgen.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_passed_through_kubernetes_types_keep_their_unnamed_fields():
    """An open object (additionalProperties: true in pydantic's schema) is `x-kubernetes-preserve-unknown-fields`,
    never `additionalProperties` next to `properties`; the fields it names are still typed and required."""
    volume = _spec_schema()["properties"]["pod"]["properties"]["volumes"]
    assert volume["x-kubernetes-list-type"] == "map" and volume["x-kubernetes-list-map-keys"] == ["name"]
    item = volume["items"]
    csi = item["properties"]["csi"]
    assert csi["x-kubernetes-preserve-unknown-fields"] is True and csi["required"] == ["driver"]
    assert "additionalProperties" not in csi
    assert item["properties"]["persistentVolumeClaim"]["required"] == ["claimName"]
    assert "x-kubernetes-preserve-unknown-fields" not in item["properties"]["persistentVolumeClaim"]
    assert item["required"] == ["name"]
    rules = [r["rule"] for r in item["x-kubernetes-validations"]]
    assert any("== 1" in r and "has(self.csi)" in r for r in rules)


def test_day_two_rules_are_in_the_crd():
    spec = _spec_schema()
    rules = {r["message"]: r for r in spec["x-kubernetes-validations"]}
    assert any("telemetry.enabled" in m for m in rules)
    assert any("volumeMounts[].name" in m for m in rules)
    rollout = {r["message"] for r in spec["properties"]["rollout"]["x-kubernetes-validations"]}
    assert any("maxDuration" in m for m in rollout)
    sglang = spec["properties"]["sglang"]
    assert sglang["properties"]["startupTimeout"]["default"] == "20m"
    assert sglang["properties"]["volumeMounts"]["x-kubernetes-list-map-keys"] == ["mountPath"]
    assert "securityContext" in sglang["properties"] and "default" not in sglang["properties"]["securityContext"]
    loop_p95 = spec["properties"]["rollout"]["properties"]["analysis"]["properties"]["maxRegression"]["properties"][
        "loopP95"]
    assert "default" not in loop_p95 and loop_p95["maximum"] == 100
    pod = spec["properties"]["pod"]["properties"]
    for field in ("runtimeClassName", "schedulerName", "terminationGracePeriodSeconds",
                  "automountServiceAccountToken", "volumes", "topologySpreadConstraints"):
        assert field in pod, field


def test_exclusive_bounds_are_booleans():
    """apiextensions/v1 takes exclusiveMinimum/exclusiveMaximum as booleans (OpenAPI v3.0); a number (JSON Schema
    2020, pydantic's gt/lt) makes the API server refuse the whole CRD."""
    doc = yaml.safe_load(crdgen.render())
    bad = [p for p, n in _walk(doc) if isinstance(n, dict)
           for k in ("exclusiveMinimum", "exclusiveMaximum") if k in n and not isinstance(n[k], bool)]
    assert not bad, bad
