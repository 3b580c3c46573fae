"""Golden tests: recorded py-spy output from the stand-in -> parser + estimators.

Two checks per chrometrace golden:
- against the truth recorded with it (<name>.chrometrace.truth.json: the stand-in's own accounting of the
  iterations inside the recorded span): loop mean within 5%, p95 within 10%, every stage share within
  3 percentage points. These are the accuracy targets; they do not move when the estimator changes.
- against the last output (<name>.chrometrace.expected.json), so any change in an estimate shows up in a
  diff. Regenerate after a deliberate change: VLM_REGEN_GOLDEN=1 pytest tests/unit/sidecar/test_golden.py

Re-record the inputs and truths with tests/golden/sidecar/record.py (version-shaped stand-ins: 0.5.10,
0.5.17 and 0.5.23 loops, image prefills several times a decode step, consecutive prefills that run the
previous batch's result before run_batch).
"""

from __future__ import annotations

import json
import os

import pytest

from vlm_sidecar.estimators import summarize
from vlm_sidecar.parser import function_name, parse_chrometrace, parse_collapsed
from vlm_testing.sidecar import GOLDEN

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


CHROMETRACE = ["cache_off", "cache_on", "v0_5_10_prefill", "v0_5_23_prefill", "v0_5_23_consecutive"]
MEAN_TOL, P95_TOL, SHARE_TOL = 0.05, 0.10, 0.03


def _summary(name: str):
    trace = parse_chrometrace((GOLDEN / f"{name}.chrometrace.json").read_bytes())
    assert trace.error is None and not trace.truncated and trace.bad_events == 0
    return summarize(trace, window_id=1, tp_rank=0, pid=1, start=0.0, end=1.0, samples=None,
                     watch=("process_input_requests", "hash_feature", "reconstruct_on_target_device"), top_n=5)


@pytest.mark.parametrize("name", CHROMETRACE)
def test_chrometrace_estimate_matches_truth(name):
    truth = json.loads((GOLDEN / f"{name}.chrometrace.truth.json").read_text())
    summary, _ = _summary(name)
    est = summary.to_json()
    share_err = {k: est["stage_shares"][k] - v for k, v in truth["stage_shares"].items()}
    mean_err = est["loop_mean_seconds"] / truth["loop_mean_seconds"] - 1
    p95_err = est["loop_p95_seconds"] / truth["loop_p95_seconds"] - 1
    report = (f"{name} ({truth['version']}, batches {truth['batches']}, overlap disabled "
              f"{truth['overlap_disabled_iterations']}x): mean {est['loop_mean_seconds'] * 1e3:.2f} vs "
              f"{truth['loop_mean_seconds'] * 1e3:.2f} ms ({mean_err:+.1%}), p95 {est['loop_p95_seconds'] * 1e3:.2f} "
              f"vs {truth['loop_p95_seconds'] * 1e3:.2f} ms ({p95_err:+.1%}), iterations {est['iterations']} vs "
              f"{truth['iterations']}, worst share error {max(share_err.values(), key=abs):+.3f} "
              f"({max(share_err, key=lambda k: abs(share_err[k]))})")
    print(report)
    assert max(abs(e) for e in share_err.values()) <= SHARE_TOL, (report, share_err)
    assert abs(mean_err) <= MEAN_TOL, report
    assert abs(p95_err) <= P95_TOL, report


def test_truth_files_describe_their_shapes():
    """The recordings cover what they claim: the version's loop shape, image prefills, consecutive prefills."""
    t = {n: json.loads((GOLDEN / f"{n}.chrometrace.truth.json").read_text()) for n in CHROMETRACE}
    assert t["cache_off"]["shape"]["wrappers"] == 0 and t["v0_5_23_prefill"]["shape"]["ingest"]
    for n in CHROMETRACE:
        assert t[n]["batches"]["prefill"] > 0 and t[n]["batches"]["decode"] > 0, n
        assert sum(t[n]["stage_shares"].values()) == pytest.approx(1.0)
    assert t["v0_5_10_prefill"]["overlap_disabled_iterations"] > 0
    assert t["v0_5_23_consecutive"]["overlap_disabled_iterations"] > 0
    assert t["v0_5_23_prefill"]["overlap_disabled_iterations"] == 0
    names = {function_name(e["name"]) for e in json.loads((GOLDEN / "v0_5_23_prefill.chrometrace.json").read_text())}
    assert {"ingest_requests", "wrapper", "pop_and_process"} <= names  # launch_batch_sample_if_needed: too short
    old = {function_name(e["name"]) for e in json.loads((GOLDEN / "cache_off.chrometrace.json").read_text())}
    assert "wrapper" not in old and "ingest_requests" not in old


@pytest.mark.parametrize("name", CHROMETRACE)
def test_chrometrace_golden(name):
    summary, stacks = _summary(name)
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
