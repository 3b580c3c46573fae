"""Fetching the released SGLang wheels for the compat tier (hack/fetch-sglang-wheels.sh caches them)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FETCH = ROOT / "hack" / "fetch-sglang-wheels.sh"


def fetch_wheels(versions: Sequence[str]) -> dict[str, Path]:
    """version -> wheel path; fails the test (never skips) with what to do when a wheel cannot be had."""
    try:
        proc = subprocess.run(
            ["bash", str(FETCH), *versions], capture_output=True, text=True, timeout=900, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"downloading the SGLang wheels {', '.join(versions)} took more than 15 minutes")
    if proc.returncode != 0:
        pytest.fail(
            f"could not download the SGLang wheels {', '.join(versions)} with {FETCH.relative_to(ROOT)} "
            f"(PyPI must be reachable, or the wheels cached in ~/.cache/vlm-operator/wheels):\n{proc.stderr}"
        )
    paths = [Path(p) for p in proc.stdout.split()]
    assert len(paths) == len(versions), proc.stdout
    return dict(zip(versions, paths, strict=True))


FETCH = ROOT / "hack" / "fetch-sglang-wheels.sh"


SUPPORTED = ("0.5.10", "0.5.23")  # inclusive range the operator supports


def _v(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _fetched_versions() -> tuple[str, ...]:
    m = re.search(r"^DEFAULT_VERSIONS=\(([^)]*)\)", FETCH.read_text(), re.M)
    assert m, f"no DEFAULT_VERSIONS=(...) in {FETCH}"
    return tuple(m[1].split())


VERSIONS = _fetched_versions()


SUPPORTED_VERSIONS = tuple(v for v in VERSIONS if _v(SUPPORTED[0]) <= _v(v) <= _v(SUPPORTED[1]))
