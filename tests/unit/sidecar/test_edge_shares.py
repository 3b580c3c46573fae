"""Call-edge shares: which caller a function's time came from (`edge_shares` in /windows.json, "caller;callee")."""

from __future__ import annotations

import json

import pytest

from vlm_sidecar.collector import ProfileStore, build_families
from vlm_sidecar.estimators import EDGE_CALLERS, edge_shares, function_shares, select_edges, summarize
from vlm_sidecar.model import EDGE_SEP, ParsedTrace, Segment
from vlm_sidecar.parser import function_name, parse_chrometrace
from vlm_testing.loopsim import shared_helper
from vlm_testing.sidecar import GOLDEN

LOOP = ("<module> (<string>)", "Scheduler.event_loop_overlap (scheduler.py)")
WATCH = ("process_input_requests", "hash_feature", "reconstruct_on_target_device", "run_batch")


def stack(*frames: str) -> tuple[str, ...]:
    return (*LOOP, *(f"Scheduler.{f} (scheduler.py)" for f in frames))


def window(sim) -> dict:
    s, _ = summarize(ParsedTrace(threads={1: sim.segments}), window_id=1, tp_rank=0, pid=1, start=0.0, end=2.0,
                     samples=sim.samples, watch=WATCH, top_n=10)
    return s.to_json()


def test_edge_shares_are_inclusive_time_weighted_and_counted_once_per_stack():
    segs = [Segment(0, 30, stack("hash_feature", "helper")),
            Segment(30, 40, stack("hash_feature", "helper", "helper")),  # recursion: no helper;helper edge
            Segment(40, 50, stack("hash_feature", "helper", "copy", "helper")),  # helper under helper: once
            Segment(50, 100, stack("decode_batch", "helper"))]
    e = edge_shares(segs)
    assert e[("hash_feature", "helper")] == pytest.approx(0.5)
    assert e[("decode_batch", "helper")] == pytest.approx(0.5)
    assert e[("helper", "copy")] == e[("copy", "helper")] == pytest.approx(0.1)
    assert e[("event_loop_overlap", "hash_feature")] == pytest.approx(0.5)
    assert ("helper", "helper") not in e
    incl, _ = function_shares(segs)
    assert all(v <= incl[callee] + 1e-12 for (_, callee), v in e.items())
    assert edge_shares([]) == {}


def test_only_edges_into_exported_functions_and_their_largest_callers_are_kept():
    e = {(f"caller_{i}", "helper"): 0.01 * (i + 1) for i in range(5)}
    e |= {("x", "not_exported"): 0.5, ("caller_0", "other"): 0.2}
    out = select_edges(e, ["helper", "other"])
    assert out == {"caller_4;helper": 0.05, "caller_3;helper": 0.04, "caller_2;helper": 0.03, "caller_0;other": 0.2}
    assert EDGE_CALLERS == 3
    # An edge left out is bounded by the smallest one kept into its callee (the rule the gate reads it by).
    kept = [v for k, v in out.items() if k.endswith(f"{EDGE_SEP}helper")]
    assert all(v <= min(kept) for (a, b), v in e.items() if b == "helper" and f"{a};{b}" not in out)


def _true_share(sim, caller: str) -> float:
    """The share of the window's time in `helper` called from `caller`, from the simulated pieces."""
    end = sim.window_s * 1e6
    inside = [(max(a, 0.0), min(b, end), st) for a, b, st in sim.pieces if b > 0 and a < end]
    return sum(b - a for a, b, st in inside if [function_name(f) for f in st[-2:]] == [caller, "helper"]) / end


@pytest.mark.parametrize("seed", range(5))
def test_a_shared_helper_is_split_by_caller(seed):
    """`helper` runs 1 ms per iteration under hash_feature and 2 ms under decode_batch in a 15 ms loop: the
    window says so, edge by edge, within 2 points of the truth (py-spy's sampling: ~2000 samples)."""
    sim = shared_helper(hash_helper_ms=1.0, decode_helper_ms=2.0, seed=seed)
    w = window(sim)
    hashed, decoded = _true_share(sim, "hash_feature"), _true_share(sim, "decode_batch")
    assert hashed == pytest.approx(1 / 15, abs=0.005) and decoded == pytest.approx(2 / 15, abs=0.005)
    assert w["edge_shares"]["hash_feature;helper"] == pytest.approx(hashed, abs=0.02)
    assert w["edge_shares"]["decode_batch;helper"] == pytest.approx(decoded, abs=0.02)
    assert w["function_shares"]["helper"] == pytest.approx(
        w["edge_shares"]["hash_feature;helper"] + w["edge_shares"]["decode_batch;helper"])
    # Each edge's callee is exported, with at most EDGE_CALLERS callers each.
    callees = [k.split(EDGE_SEP)[1] for k in w["edge_shares"]]
    assert set(callees) <= set(w["exported_functions"])
    assert max(callees.count(c) for c in callees) <= EDGE_CALLERS
    assert json.loads(json.dumps(w))["edge_shares"] == w["edge_shares"]


@pytest.mark.parametrize("name", ["cache_off", "cache_on", "v0_5_23_prefill"])
def test_the_separator_is_in_no_function_name(name):
    """`;` separates frames in py-spy's collapsed stacks, so no name holds it; `>` would not do (`<genexpr>`)."""
    trace = parse_chrometrace((GOLDEN / f"{name}.chrometrace.json").read_bytes())
    names = {function_name(f) for segs in trace.threads.values() for s in segs for f in s.stack}
    assert names and not any(EDGE_SEP in n for n in names)
    s, _ = summarize(trace, window_id=1, tp_rank=0, pid=1, start=0.0, end=1.0, samples=None, watch=WATCH, top_n=5)
    assert s.edge_shares and all(len(k.split(EDGE_SEP)) == 2 for k in s.edge_shares)
    assert function_name("<genexpr> (x.py)") == "<genexpr>"


def test_edges_are_exported_as_a_gauge():
    """One series per edge, caller and callee as labels (the operator's Prometheus source joins them back)."""
    sim = shared_helper(hash_helper_ms=1.0, decode_helper_ms=2.0, seed=4)
    s, stacks = summarize(ParsedTrace(threads={1: sim.segments}), window_id=1, tp_rank=0, pid=1, start=0.0,
                          end=2.0, samples=sim.samples, watch=WATCH, top_n=10)
    store = ProfileStore()
    store.add_window(s, stacks, 1000.0)
    [fam] = [f for f in build_families(store.snapshot(), {"pod": "p"}, 2.0, 60.0)
             if f.name == "vlm_scheduler_edge_share_ratio"]
    got = {f"{x.labels['caller']}{EDGE_SEP}{x.labels['callee']}": x.value for x in fam.samples}
    assert got == s.edge_shares and "hash_feature;helper" in got
    assert all(x.labels["tp_rank"] == "0" and x.labels["pod"] == "p" for x in fam.samples)
