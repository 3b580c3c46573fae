"""The generated CRD on the real API server: accepted, examples valid, invalid objects refused by the
server itself (OpenAPI schema or CEL) with field-level messages; and the server agrees with the
pydantic models on every case of the unit tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from vlm_testing.specs import INVALID

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def _dry_run(cluster, namespace: str, obj: dict) -> tuple[bool, str]:
    proc = subprocess.run(
        [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "create", "--dry-run=server",
         "--validate=strict", "-n", namespace, "-f", "-"],
        input=json.dumps(obj), capture_output=True, text=True, timeout=30,
    )
    return proc.returncode == 0, proc.stderr + proc.stdout


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_are_accepted_and_defaulted(crd, kubectl, namespace, path):
    doc = yaml.safe_load(path.read_text())
    out = kubectl("create", "--dry-run=server", "-o", "json", "-n", namespace, "-f", str(path))
    created = json.loads(out)
    # Server-side defaulting filled nested objects from the CRD defaults.
    assert created["spec"]["sglang"]["ipcCache"]["mode"] in ("Auto", "On", "Off")
    assert created["spec"]["telemetry"]["rate"] == doc["spec"].get("telemetry", {}).get("rate", 1000)
    if "rollout" in doc["spec"]:
        assert created["spec"]["rollout"]["analysis"]["onInconclusive"] == "Rollback"


@pytest.mark.parametrize("spec,field", INVALID, ids=[f"{i}-{f}" for i, (_, f) in enumerate(INVALID)])
def test_api_server_rejects_invalid_specs_naming_the_field(crd, cluster, namespace, spec, field):
    obj = {"apiVersion": "serving.vlmops.dev/v1alpha1", "kind": "VLMService", "metadata": {"name": "bad"}, "spec": spec}
    ok, text = _dry_run(cluster, namespace, obj)
    assert not ok, f"API server accepted an invalid spec {spec}"
    leaf = field.split(".")[-1].split("[")[0]
    assert leaf in text or field in text, text


def test_at_least_twenty_invalid_objects_checked_against_the_server():
    assert len(INVALID) >= 20
