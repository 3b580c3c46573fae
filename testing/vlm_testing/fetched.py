"""Third-party CRDs the integration tier installs on the testbed, read from the cache the setup step fills.

`make fetch` (which `make test` and `make setup` run first) runs hack/fetch-crds.sh: the Go module proxy is
reached there, never at test time (the integration tests run inside the testbed's network namespace, where no
registry answers). A set missing from the cache fails the test with the command to run; it is never skipped.
The cache is VLM_CRD_CACHE, by default VLM_CACHE/crds (~/.cache/vlm-operator/crds).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FETCH = REPO / "hack" / "fetch-crds.sh"
CRD_CACHE = Path(os.environ.get("VLM_CRD_CACHE")
                 or Path(os.environ.get("VLM_CACHE") or Path.home() / ".cache" / "vlm-operator") / "crds")

# The sets the tests read, as hack/fetch-crds.sh names them (tests/unit/packaging/test_fetch.py keeps the two in step).
STACKS = ("kserve-v0.15.2", "lws-v0.7.0", "gaie-v1.6.2")  # the guides (test_guides.py)
FLAGGER = "flagger-v1.36.1"  # test_judge_flagger.py
ARGO_ROLLOUTS = "argo-rollouts-v1.8.3"  # test_judge_argo.py; the controller hack/build-argo-rollouts.sh builds
KEDA = "keda-v2.21.0"  # test_autoscaling.py: the ScaledObject spec.autoscaling makes


def crds(name: str) -> list[Path]:
    """The CRD files of one fetched set; fails the calling test, naming `make fetch`, when the set is not cached."""
    d = CRD_CACHE / name
    files = sorted(d.glob("*.yaml")) if (d / ".complete").is_file() else []
    if not files:
        pytest.fail(f"the {name} CRDs are not in {d}: run `make fetch` (hack/fetch-crds.sh) before the tests; "
                    "they do not download them (no registry is reachable from the testbed's network namespace)",
                    pytrace=False)
    return files
