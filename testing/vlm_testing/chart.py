"""Shared by tests (moved out of tests/unit/packaging/test_chart.py, so no test imports another test module)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vlm_testing import REPO

CHART = REPO / "charts" / "vlm-operator"


GOLDEN = REPO / "tests" / "golden" / "chart"


RELEASE, NAMESPACE = "vlm", "vlm-system"


KUBE_VERSION = "1.34.4"  # the testbed's; helm template otherwise assumes an old default


def helm_bin() -> str:
    cache = Path(os.environ.get("VLM_CACHE") or Path.home() / ".cache" / "vlm-operator")
    for cand in (os.environ.get("VLM_HELM"), str(cache / "bin" / "helm"), shutil.which("helm")):
        if cand and Path(cand).exists():
            return cand
    pytest.fail("helm not found: run hack/build-binaries.sh (it installs helm into ~/.cache/vlm-operator/bin)")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm_bin(), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HELM_CACHE_HOME": "/tmp/vlm-helm-cache",
                               "HELM_CONFIG_HOME": "/tmp/vlm-helm-config", "HELM_DATA_HOME": "/tmp/vlm-helm-data"})
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stderr}"
    return proc


CRD_TEMPLATE = "# Source: vlm-operator/templates/crds.yaml\n"


def template(values: Path | None = None, *extra: str, crd: bool = False) -> str:
    """`helm template`, by default without the VLMService CRD's document (it is compared with crdgen's
    output instead, so an API change does not churn these golden files)."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    if values:
        args += ["-f", str(values)]
    text = helm(*args, *extra).stdout
    if crd:
        return text
    return "\n---\n".join(d for d in text.split("\n---\n") if not d.lstrip("-\n").startswith(CRD_TEMPLATE))


def docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]
