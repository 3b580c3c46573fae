"""The benchmarks under bench/ are scripts, not a package: load one by path as a module for its tests."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from vlm_testing import REPO


def load_bench(name: str, *siblings: str) -> ModuleType:
    """bench/<name>.py as a module (`name` may hold a folder: "gpu/summary"), registered under its file's stem.
    `siblings` are loaded first: a bench imports them by name, as bench/ (its own folder) is on sys.path when it
    runs as a script."""
    for s in siblings:
        load_bench(s)
    stem = name.rsplit("/", 1)[-1]
    spec = importlib.util.spec_from_file_location(stem, REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(stem, mod)
    spec.loader.exec_module(mod)
    return sys.modules[stem]
