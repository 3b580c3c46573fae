"""Golden tests: recorded py-spy output from the stand-in -> parser + estimators -> expected JSON.

Regenerate expected files after a deliberate change: VLM_REGEN_GOLDEN=1 pytest tests/unit/sidecar/test_golden.py
(re-record the inputs with tests/golden/sidecar/record.py).
"""

from __future__ import annotations

import json
import os

import pytest
from vlm_sidecar.estimators import summarize
from vlm_sidecar.parser import parse_chrometrace, parse_collapsed

from tests.unit.sidecar.helpers import GOLDEN

REGEN = os.environ.get("VLM_REGEN_GOLDEN") == "1"


def _rounded(obj):
    if isinstance(obj, float):
        return round(obj, 6)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_rounded(v) for v in obj]
    return obj


def _check(name: str, actual: dict) -> None:
    path = GOLDEN / f"{name}.expected.json"
    actual = _rounded(actual)
    if REGEN:
        path.write_text(json.dumps(actual, indent=1, sort_keys=True) + "\n")
    assert path.exists(), f"{path} missing: run with VLM_REGEN_GOLDEN=1"
    assert actual == json.loads(path.read_text())


@pytest.mark.parametrize("name", ["cache_off", "cache_on"])
def test_chrometrace_golden(name):
    trace = parse_chrometrace((GOLDEN / f"{name}.chrometrace.json").read_bytes())
    assert trace.error is None and not trace.truncated and trace.bad_events == 0
    summary, stacks = summarize(trace, window_id=1, tp_rank=0, pid=1, start=0.0, end=1.0, samples=None,
                                watch=("process_input_requests", "hash_feature", "reconstruct_on_target_device"),
                                top_n=5)
    out = summary.to_json()
    out["n_stacks"] = len(stacks)
    out["total_us"] = sum(stacks.values())
    _check(f"{name}.chrometrace", out)


def test_cache_off_golden_spends_more_in_input_processing():
    shares = {}
    for name in ("cache_off", "cache_on"):
        trace = parse_chrometrace((GOLDEN / f"{name}.chrometrace.json").read_bytes())
        s, _ = summarize(trace, window_id=1, tp_rank=0, pid=1, start=0, end=1, samples=None, watch=(), top_n=0)
        shares[name] = s.stage_shares["process_input_requests"]
    assert shares["cache_off"] > shares["cache_on"] + 0.05


def test_raw_golden():
    stacks, bad = parse_collapsed((GOLDEN / "cache_off.raw.txt").read_text())
    assert bad == 0
    out = {"stacks": sorted([";".join(k), v] for k, v in stacks.items())}
    _check("cache_off.raw", out)
    # Line numbers and directories are stripped so raw and chrometrace frames line up in diffs.
    assert all(":" not in f.split(" (")[-1] for k in stacks for f in k)
