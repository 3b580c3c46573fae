"""The judge's Argo Rollouts examples against Argo Rollouts' own CRDs (v1.8.3, from the Go module proxy:
hack/build-argo-rollouts.sh --stage crds) on the real API server: a server-side dry run of the AnalysisTemplate,
the Rollout and the caller's objects, and every field we wrote survives the CRDs' structural schemas (a field
Argo does not know would be pruned without an error, and the metric would run without it)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import wait_for

REPO = Path(__file__).resolve().parents[2]
ARGO = REPO / "examples" / "argo-rollouts"
SCRIPT = REPO / "hack" / "build-argo-rollouts.sh"


@pytest.fixture(scope="module")
def argo_crds(cluster) -> Path:
    """Argo Rollouts' CRDs installed (server-side apply; left in place, as other tests' CRDs are)."""
    built = subprocess.run([str(SCRIPT), "--stage", "crds"], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    crds = Path(subprocess.run([str(SCRIPT), "--print-crds"], capture_output=True, text=True).stdout.strip())
    for f in sorted(crds.glob("*-crd.yaml")):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f), timeout=120)
    for name in ("rollouts", "analysistemplates", "analysisruns"):
        # The whole object is read: a jsonpath filter fails on a CRD the API server has given no condition yet.
        wait_for(lambda n=name: _established(json.loads(cluster.kubectl("get", f"crd/{n}.argoproj.io", "-o", "json"))),
                 120, f"CRD {name}.argoproj.io Established")
    return crds


def _established(crd: dict) -> bool:
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


def _in(namespace: str, path: Path) -> list[dict]:
    out = []
    for d in yaml.safe_load_all(path.read_text()):
        if d:
            d["metadata"]["namespace"] = namespace
            for s in (d.get("subjects") or []):
                s["namespace"] = namespace
            out.append(d)
    return out


def _dry_run(cluster, obj: dict) -> dict:
    got = cluster.kubectl("apply", "--server-side", "--dry-run=server", "--field-manager=vlm-test", "-o", "json",
                          "-f", "-", stdin=json.dumps(obj))
    return json.loads(got)


def _kept(sent: Any, got: Any, where: str = "") -> list[str]:
    """Paths of `sent` missing or changed in `got` (what the schema pruned or rewrote)."""
    if isinstance(sent, dict):
        if not isinstance(got, dict):
            return [where]
        return [p for k, v in sent.items() for p in (_kept(v, got[k], f"{where}.{k}") if k in got else [f"{where}.{k}"])]
    if isinstance(sent, list):
        if not isinstance(got, list) or len(got) != len(sent):
            return [where]
        return [p for i, (a, b) in enumerate(zip(sent, got, strict=True)) for p in _kept(a, b, f"{where}[{i}]")]
    return [] if sent == got or str(sent) == str(got) else [where]


def test_the_argo_examples_pass_argos_own_schemas(cluster, argo_crds, namespace):
    for path in (ARGO / "analysis-template.yaml", ARGO / "rollout.yaml", ARGO / "judge-caller.yaml"):
        for obj in _in(namespace, path):
            if obj["kind"] == "RoleBinding":  # its ClusterRole is in examples/judge/operator.yaml
                continue
            got = _dry_run(cluster, obj)
            lost = _kept(obj.get("spec", {}), got.get("spec", {}), f"{obj['kind']}.spec")
            assert not lost, f"{path.name}: the API server dropped or changed {lost}"
            if obj["kind"] == "AnalysisTemplate":
                web = got["spec"]["metrics"][0]["provider"]["web"]
                assert web["method"] == "POST" and "{{args.canary-hash}}" in web["body"]
                assert got["spec"]["metrics"][0]["consecutiveSuccessLimit"] == 1
