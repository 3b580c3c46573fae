"""Attribution names the path, not only the leaf: a helper shared by several callers that grows because one
of them calls it more is named with that caller (`hash_feature -> helper`), from the sidecar's call-edge shares.

The windows are the sidecar's own: `summarize` over simulated py-spy samples of a loop in which `helper` runs
under hash_feature (process_input_requests) and under decode_batch (run_batch) (testing/vlm_testing/loopsim.py,
`shared_helper`), served as `/windows.json` entries and read back by `Window.from_sidecar`.
"""

from __future__ import annotations

import zlib
from dataclasses import replace

import pytest

from vlm_operator.analysis.gate import GatePolicy, Window, decide, regressed_function
from vlm_operator.analysis.gate.attribution import grown_caller
from vlm_operator.analysis.gate.samples import make_units
from vlm_sidecar.estimators import summarize
from vlm_sidecar.model import ParsedTrace
from vlm_testing.loopsim import shared_helper

T0 = 1_000_000.0
EVERY = 10.0
WATCH = ("process_input_requests", "hash_feature", "reconstruct_on_target_device", "run_batch")
POLICY = GatePolicy(max_regression={"loop_latency": 0.03, "stage_time": 0.05}, min_samples=5, max_duration_s=900,
                    interval_s=60, stale_after_s=120)
BASE_MS = {"hash_helper_ms": 1.0, "decode_helper_ms": 2.0}


def windows(revision: str, *, pods: int, n: int, seed: int, hash_helper_ms: float, decode_helper_ms: float,
            top_n: int = 10) -> list[Window]:
    out = []
    for p in range(pods):
        for k in range(n):
            sim = shared_helper(hash_helper_ms=hash_helper_ms, decode_helper_ms=decode_helper_ms,
                                seed=zlib.crc32(f"{revision}/{p}/{k}/{seed}".encode()))
            end = T0 + (k + 1) * EVERY
            s, _ = summarize(ParsedTrace(threads={1: sim.segments}), window_id=k, tp_rank=0, pid=1,
                             start=end - sim.window_s, end=end, samples=sim.samples, watch=WATCH, top_n=top_n)
            out.append(Window.from_sidecar(revision, f"{revision}-{p}", s.to_json()))
    return out


def run(base: list[Window], can: list[Window]):
    return decide(base, can, POLICY, started_at=T0, now=max(w.end for w in [*base, *can]) + 1,
                  step_duration_s=300.0, data_started_at=T0)


@pytest.fixture(scope="module")
def base() -> list[Window]:
    return windows("stable", pods=3, n=12, seed=1, **BASE_MS)


def named(base: list[Window], can: list[Window]) -> str | None:
    return regressed_function(make_units(base, 5.0), make_units(can, 5.0))


def test_a_shared_helper_grown_under_one_caller_names_that_caller(base):
    """helper: 1 ms under hash_feature and 2 ms under decode_batch per iteration; the canary's hash_feature
    calls it for 3 ms. hash_feature's own time grew as much and is smaller than helper's (helper also runs
    under decode_batch), so the leaf rule alone named hash_feature; the call edges follow its growth down
    into helper, and name the caller whose calls carry it."""
    can = windows("canary", pods=1, n=12, seed=2, hash_helper_ms=3.0, decode_helper_ms=2.0)
    assert all("hash_feature;helper" in w.edge_shares and "decode_batch;helper" in w.edge_shares
               for w in [*base, *can])
    assert named(base, can) == "hash_feature -> helper"
    # Without the edges (an older sidecar, either side) the leaf rule alone: hash_feature, never a caller.
    assert named(base, [replace(w, edge_shares={}) for w in can]) == "hash_feature"
    assert named([replace(w, edge_shares={}) for w in base], can) == "hash_feature"


def test_the_rollback_names_the_path(base):
    """Through the whole gate: the decision, and so the status and the message, carry `caller -> function`."""
    can = windows("canary", pods=1, n=12, seed=6, hash_helper_ms=6.0, decode_helper_ms=2.0)
    d = run(base, can)
    assert (d.verdict, d.regressed_function) == ("Rollback", "hash_feature -> helper"), d.message
    assert d.regressed_stage == "process_input_requests"
    assert "function hash_feature -> helper" in d.message


def test_a_shared_helper_grown_evenly_under_its_callers_is_named_alone(base):
    """helper grows 1 ms under each caller: neither caller's calls carry most of its growth."""
    can = windows("canary", pods=1, n=12, seed=3, hash_helper_ms=2.0, decode_helper_ms=3.0)
    assert named(base, can) == "helper"


def test_a_shared_helper_grown_under_the_other_caller_names_it(base):
    can = windows("canary", pods=1, n=12, seed=4, hash_helper_ms=1.0, decode_helper_ms=4.0)
    assert named(base, can) == "decode_batch -> helper"


def units(edges: list[dict[str, float]], fns: dict[str, float]):
    ws = [Window.from_sidecar("r", f"p{i}", {"id": i, "end": T0 + i, "samples": 10, "loop_mean_seconds": 0.02,
                                              "function_shares": fns, "edge_shares": e}) for i, e in enumerate(edges)]
    return make_units(ws, 5.0)


def test_a_caller_left_out_of_the_baseline_export_is_bounded_by_the_smallest_one_kept():
    """The sidecar exports the three largest callers of a function: one left out had at most the smallest
    kept. A new caller is named when its canary time minus that bound carries most of the growth, not when
    the bound leaves its growth unsure."""
    fns = {"helper": 0.30}
    kept = {"a;helper": 0.10, "b;helper": 0.10, "c;helper": 0.10}
    b = units([kept] * 4, fns)
    c = units([{**kept, "d;helper": 0.30}] * 4, {"helper": 0.60})
    assert grown_caller(b, c, "helper") == "d"  # grew by >= 0.30 - 0.10 of 0.30
    c2 = units([{**kept, "d;helper": 0.16}] * 4, {"helper": 0.46})
    assert grown_caller(b, c2, "helper") is None  # >= 0.16 - 0.10 of 0.16: unsure
    # A unit that did not export the function says nothing about its callers; too few that did: no caller.
    assert grown_caller(units([kept] * 4, {"other": 0.3}), c, "helper") is None


def test_a_function_with_one_caller_is_named_alone():
    """Its one caller tells nothing the profile does not: `hash_feature`, not `handle_generate_request ->
    hash_feature`."""
    b = units([{"handle_generate_request;hash_feature": 0.05}] * 4, {"hash_feature": 0.05, "loop": 0.95})
    c = units([{"handle_generate_request;hash_feature": 0.15}] * 4, {"hash_feature": 0.15, "loop": 0.95})
    assert grown_caller(b, c, "hash_feature") is None
    assert regressed_function(b, c) == "hash_feature"


@pytest.mark.parametrize("raw", [
    {"a;helper": 0.1, "b;helper": "0.2", ";helper": 0.3, "a;": 0.3, "helper": 0.3, "c;helper": -1,
     "d;helper": float("nan"), "e;helper": True, 7: 0.1},
    "nonsense", None, [["a;helper", 0.1]],
])
def test_edge_shares_are_read_leniently(raw):
    w = Window.from_sidecar("r", "p", {"id": 1, "end": T0, "edge_shares": raw})
    assert w.edge_shares == ({"a;helper": 0.1, "b;helper": 0.2} if isinstance(raw, dict) else {})
    assert Window.from_sidecar("r", "p", {"id": 1, "end": T0}).edge_shares == {}


def test_the_operator_splits_edges_where_the_sidecar_joins_them():
    from vlm_operator.analysis.window import EDGE_SEP as OPERATOR_SEP
    from vlm_sidecar.model import EDGE_SEP as SIDECAR_SEP

    assert OPERATOR_SEP == SIDECAR_SEP == ";"
