"""The guides' manifests (docs/guides/, examples/guides/) against the real CRDs of the stacks they are for.

KServe 0.15.2 (InferenceService), LeaderWorkerSet 0.7.0 and the Gateway API Inference Extension 1.6.2
(InferencePool, llm-d's) publish their CRDs in their Go modules; hack/fetch-crds.sh takes them from the Go module
proxy into the cache in the setup step (`make fetch`), this test installs them on the testbed's API server and sends every manifest as a
server-side dry run with strict field validation: an unknown or misplaced field, a wrong type or a CEL rule the
object breaks fails the test, as `kubectl apply` would fail for the reader. Each pod template the stack makes
pods from must carry the injection label."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from vlm_testing import fetched
from vlm_testing.cluster import wait_for

REPO = Path(__file__).resolve().parents[2]
GUIDES = REPO / "examples" / "guides"
PROFILE = "serving.vlmops.dev/profile"


@pytest.fixture(scope="module")
def stack_crds(cluster):
    files = [f for name in fetched.STACKS for f in fetched.crds(name)]
    assert len(files) == 4, files
    names = []
    for f in files:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f), timeout=120)
        names.append(yaml.safe_load(f.read_text())["metadata"]["name"])
    for n in names:
        wait_for(lambda n=n: "True" in cluster.kubectl(
            "get", "crd", n, "-o", "jsonpath={.status.conditions[?(@.type=='Established')].status}"), 60,
            f"CRD {n} established", interval=0.5)
    return names


def manifests() -> list[Path]:
    return sorted(GUIDES.glob("*/*.yaml"))


def pod_templates(doc: dict) -> list[dict]:
    """The pod templates a stack makes pods from, by kind."""
    kind, spec = doc["kind"], doc.get("spec") or {}
    if kind in ("Deployment", "Rollout", "StatefulSet"):
        return [spec["template"]]
    if kind == "LeaderWorkerSet":
        t = spec["leaderWorkerTemplate"]
        return [t[k] for k in ("leaderTemplate", "workerTemplate") if k in t]
    if kind == "InferenceService":
        p = spec["predictor"]
        return [{"metadata": {"labels": p.get("labels") or {}, "annotations": p.get("annotations") or {}}}]
    return []


def test_every_guide_has_manifests_that_ask_for_the_sidecar():
    by_guide = {p.parent.name for p in manifests()}
    assert by_guide == {"kserve", "lws", "llm-d"}, by_guide
    for guide in by_guide:
        assert (REPO / "docs" / "guides" / f"{'leaderworkerset' if guide == 'lws' else guide}.md").exists(), guide
    templates = [t for p in manifests() for d in yaml.safe_load_all(p.read_text()) if d for t in pod_templates(d)]
    assert len(templates) >= 4
    for t in templates:
        assert (t.get("metadata") or {}).get("labels", {}).get(PROFILE) == "true", t.get("metadata")


@pytest.mark.parametrize("path", manifests(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_guide_manifest_is_valid_against_the_real_crds(cluster, stack_crds, namespace, path):
    out = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-n", namespace, "-f", str(path),
                          check=False, timeout=60)
    proc = subprocess.run([str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "apply",
                           "--dry-run=server", "--validate=strict", "-n", namespace, "-f", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Warning" not in proc.stderr, f"{path}:\n{proc.stderr}\n{out}"
    kinds = [d["kind"] for d in yaml.safe_load_all(path.read_text()) if d]
    assert proc.stdout.count("(server dry run)") == len(kinds), proc.stdout
