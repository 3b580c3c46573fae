"""Parser behaviour on hand-made and damaged input, and hypothesis fuzzing: never raise, count errors."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vlm_sidecar.estimators import pick_scheduler_thread
from vlm_sidecar.parser import (
    collapse_segments,
    format_collapsed,
    frame_label,
    function_name,
    parse_chrometrace,
    parse_collapsed,
)
from vlm_testing.sidecar import GOLDEN

GOLD = (GOLDEN / "cache_off.chrometrace.json").read_bytes()


def ev(ph, name, ts, tid=1, filename="/srv/sglang/scheduler.py"):
    return {"ph": ph, "name": name, "ts": ts, "tid": tid, "pid": 7, "cat": "py-spy",
            "args": {"filename": filename, "line": 3}}


def test_segments_follow_begin_end_events():
    events = [ev("B", "event_loop", 0), ev("B", "Scheduler.run_batch", 0), ev("E", "Scheduler.run_batch", 10),
              ev("B", "Scheduler.recv_requests", 10), ev("E", "Scheduler.recv_requests", 13),
              ev("E", "event_loop", 13)]
    t = parse_chrometrace(json.dumps(events))
    segs = t.threads[1]
    assert [(s.start_us, s.end_us, function_name(s.stack[-1])) for s in segs] == [
        (0, 10, "run_batch"), (10, 13, "recv_requests")]
    assert segs[0].stack[0] == "event_loop (scheduler.py)"
    assert t.bad_events == 0 and not t.truncated and t.error is None


def test_mismatched_end_is_counted_and_recovered():
    events = [ev("B", "a", 0), ev("B", "b", 0), ev("E", "a", 5), ev("E", "zzz", 6), ev("B", "c", 6), ev("E", "c", 9)]
    t = parse_chrometrace(json.dumps(events))
    assert t.bad_events == 2
    assert [s.stack for s in t.threads[1]] == [("a (scheduler.py)", "b (scheduler.py)"), ("c (scheduler.py)",)]


def test_invalid_events_are_counted():
    events = [ev("B", "a", 0), {"ph": "B"}, "junk", ev("X", "a", 1), {**ev("B", "a", 1), "ts": "soon"},
              {**ev("B", "a", 1), "tid": True}, ev("E", "a", 4)]
    t = parse_chrometrace(json.dumps(events))
    assert t.bad_events == 5
    assert t.threads[1][0].duration_us == 4


def test_truncated_file_is_salvaged():
    cut = GOLD[: len(GOLD) // 2]
    full = parse_chrometrace(GOLD)
    half = parse_chrometrace(cut)
    assert half.truncated and half.error is None
    tid = pick_scheduler_thread(full)  # the busy thread: an idle one may have all its events at the ends
    assert 0 < len(half.threads[tid]) < len(full.threads[tid])


def test_garbage_is_an_error_not_an_exception():
    for data in (b"", b"\x00\xff garbage", b"{}", b'{"traceEvents": 3}', b"[[[[[[", b"[" * 100000, b"null"):
        t = parse_chrometrace(data)
        assert t.error is not None and not t.threads


def test_speedscope_style_object_with_trace_events_is_accepted():
    t = parse_chrometrace(json.dumps({"traceEvents": [ev("B", "a", 0), ev("E", "a", 2)]}))
    assert t.threads[1][0].duration_us == 2


def test_collapsed_round_trip_and_bad_lines():
    stacks, bad = parse_collapsed("a (x.py:3);b (y/z.py:9) 5\nnot a line\na (x.py:4) 2\n\nc;d -1\nc;d nan\n")
    assert bad == 3
    assert stacks == {("a (x.py)", "b (z.py)"): 5.0, ("a (x.py)",): 2.0}
    again, bad2 = parse_collapsed(format_collapsed(stacks))
    assert again == stacks and bad2 == 0


def test_frame_helpers():
    assert frame_label("Scheduler.run_batch", "/a/b/scheduler.py") == "Scheduler.run_batch (scheduler.py)"
    assert function_name("Scheduler.run_batch (scheduler.py)") == "run_batch"
    assert function_name("<module> (<string>)") == "<module>"
    assert function_name("plain") == "plain"


def test_collapse_segments_sums_time():
    t = parse_chrometrace(GOLD)
    segs = next(iter(t.threads.values()))
    stacks = collapse_segments(segs)
    assert abs(sum(stacks.values()) - sum(s.duration_us for s in segs)) < 1e-6


# --- fuzzing ---------------------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2000))
def test_fuzz_random_bytes(data):
    t = parse_chrometrace(data)
    assert t.error is not None or t.threads
    parse_collapsed(data)


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=len(GOLD)))
def test_fuzz_truncation_points(cut):
    t = parse_chrometrace(GOLD[:cut])
    if cut < len(GOLD) - 2:
        assert t.truncated or t.error is not None
    for segs in t.threads.values():
        assert all(s.end_us > s.start_us for s in segs)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(GOLD) - 1), st.integers(0, 255)), max_size=20))
def test_fuzz_byte_flips(flips):
    data = bytearray(GOLD)
    for pos, val in flips:
        data[pos] = val
    t = parse_chrometrace(bytes(data))
    assert t.bad_events >= 0
    for segs in t.threads.values():
        assert all(s.end_us > s.start_us for s in segs)


json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20)
event_like = st.fixed_dictionaries(
    {"ph": st.sampled_from(["B", "E", "X", 1]), "name": st.sampled_from(["a", "b", "c"]) | json_values,
     "ts": st.floats(allow_nan=True, allow_infinity=True) | st.integers() | json_values,
     "tid": st.integers(0, 3) | json_values},
    optional={"args": json_values})


@settings(max_examples=200, deadline=None)
@given(st.lists(event_like | json_values, max_size=40))
def test_fuzz_structured_garbage(events):
    t = parse_chrometrace(json.dumps(events))
    good = sum(1 for e in events if isinstance(e, dict) and e.get("ph") in ("B", "E"))
    assert t.bad_events >= len(events) - good
