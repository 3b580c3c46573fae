"""Fixtures for the sidecar tests: the SGLang stand-in as a real process, and py-spy."""

from __future__ import annotations

import os
import time

import pytest

from vlm_testing.sidecar import Standin


@pytest.fixture
def standin():
    started: list[Standin] = []

    def start(*args: str, env: dict[str, str] | None = None, warmup_s: float = 1.5) -> Standin:
        s = Standin(list(args), env)
        started.append(s)
        time.sleep(warmup_s)  # let the loop reach a steady state before sampling
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def pyspy() -> str:
    from vlm_sidecar.sampler import find_pyspy

    path = find_pyspy(None)
    assert path is not None and os.path.exists(path), "py-spy must be installed (pip install py-spy)"
    return path
