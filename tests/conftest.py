"""Shared pytest configuration: loads the control-plane fixtures (tests/cluster.py) for every tier."""

import sys
from pathlib import Path

# `tests` is a namespace package next to the project; with a plain `pytest` (not `python -m`)
# the repo root is not on sys.path, so put it there before pytest imports the plugin.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

pytest_plugins = ["tests.cluster"]
