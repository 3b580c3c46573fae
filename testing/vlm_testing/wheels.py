"""The released SGLang wheels of the compat tier, read from the cache that the setup step fills (`make fetch`:
hack/fetch-sglang-wheels.sh). The tests never download them: a wheel missing from the cache fails the test,
naming the command."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FETCH = ROOT / "hack" / "fetch-sglang-wheels.sh"
WHEELS = Path(os.environ.get("VLM_CACHE") or Path.home() / ".cache" / "vlm-operator") / "wheels"


def fetch_wheels(versions: Sequence[str]) -> dict[str, Path]:
    """version -> cached wheel path; fails the test (never skips) with what to run when a wheel is not cached."""
    found: dict[str, Path] = {}
    for v in versions:
        # Wheel names normalise the version (PEP 427), e.g. sglang-0.5.10.post1-py3-none-any.whl; as the script finds them.
        got = sorted(WHEELS.glob(f"sglang-{v}-*.whl"))
        if got:
            found[v] = got[0]
    missing = [v for v in versions if v not in found]
    if missing:
        pytest.fail(f"the SGLang wheels {', '.join(missing)} are not in {WHEELS}: run `make fetch` "
                    f"({FETCH.relative_to(ROOT)}) before the tests; they do not download them", pytrace=False)
    return found


SUPPORTED = ("0.5.10", "0.5.23")  # inclusive range the operator supports


def _v(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _fetched_versions() -> tuple[str, ...]:
    m = re.search(r"^DEFAULT_VERSIONS=\(([^)]*)\)", FETCH.read_text(), re.M)
    assert m, f"no DEFAULT_VERSIONS=(...) in {FETCH}"
    return tuple(m[1].split())


VERSIONS = _fetched_versions()


SUPPORTED_VERSIONS = tuple(v for v in VERSIONS if _v(SUPPORTED[0]) <= _v(v) <= _v(SUPPORTED[1]))
