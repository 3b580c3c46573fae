"""Shared pytest configuration: loads the control-plane fixtures (tests/cluster.py) for every tier."""

import os
import sys
from pathlib import Path

# `tests` is a namespace package next to the project; with a plain `pytest` (not `python -m`)
# the repo root is not on sys.path, so put it there before pytest imports the plugin.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
# Test this checkout's packages even when the editable install points at another clone of the repo
# (a CI run in a fresh clone re-points it). Only this process: subprocesses use the install.
_PKGS = [str(Path(_ROOT) / d) for d in ("operator", "sidecar")]
for _p in reversed(_PKGS):
    if _p in sys.path:
        sys.path.remove(_p)
    sys.path.insert(0, _p)
for _m in [m for m in sys.modules if m.split(".")[0] in ("vlm_operator", "vlm_sidecar")]:
    del sys.modules[_m]

# Sample with the py-spy the sidecar image ships (hack/build-binaries.sh builds it; `make test` runs that
# first): first on PATH, for this process and every sidecar, stand-in and benchmark it starts.
# tests/unit/sidecar/test_sampler.py fails, with the command to run, when it was not built.
_PYSPY_DIR = Path.home() / ".cache" / "vlm-operator" / "pyspy"
if "VLM_CACHE" in os.environ:
    _PYSPY_DIR = Path(os.environ["VLM_CACHE"]) / "pyspy"
if (_PYSPY_DIR / "py-spy").exists() and str(_PYSPY_DIR) not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = f"{_PYSPY_DIR}{os.pathsep}{os.environ.get('PATH', '')}"

pytest_plugins = ["tests.cluster"]
