"""Fuzzing the gate's inputs: whatever a sidecar's /windows.json or a Prometheus answer holds, parsing
gives windows or SignalsUnavailable and the gate gives a Decision; nothing else escapes into the
reconcile (where an exception would become a handler error loop)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vlm_operator.analysis import gate, sources
from vlm_operator.analysis.sources import base, prometheus

T0 = 1_700_000_000.0
POLICY = gate.GatePolicy(max_duration_s=900, interval_s=60, min_samples=3)

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(), st.text(max_size=8),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e309", "0.02", "", "true"]),
)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)), max_leaves=12)
keys = st.sampled_from([
    "id", "end", "samples", "loop_mean_seconds", "loop_p95_seconds", "iterations", "stage_shares",
    "function_shares", "self_shares", "exported_functions", "stale", "tp_rank", "ttft_seconds", "itl_seconds",
    "throughput", "effective_rate_hz",
])
entries = st.one_of(
    json_values,
    st.dictionaries(keys, json_values, max_size=10),
    st.fixed_dictionaries({"id": scalars, "end": st.floats(T0, T0 + 900) | scalars,
                           "samples": st.integers(-5, 5000) | scalars,
                           "loop_mean_seconds": st.floats(-1, 1) | scalars,
                           "stage_shares": st.dictionaries(st.sampled_from(gate.STAGES), st.floats() | scalars)
                           | json_values}),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(entries, max_size=12), st.lists(entries, max_size=12))
def test_any_sidecar_answer_gives_windows_and_a_decision(base, can):
    b = [gate.Window.from_sidecar("stable", f"s{i % 3}", e) for i, e in enumerate(base)]
    c = [gate.Window.from_sidecar("canary", f"c{i % 2}", e) for i, e in enumerate(can)]
    d = gate.decide(b, c, POLICY, started_at=T0, now=T0 + 901, step_duration_s=300)
    assert d.verdict in ("Promote", "Continue", "Rollback", "Inconclusive", "Pause")


prom_series = st.fixed_dictionaries({
    "metric": st.dictionaries(st.sampled_from(["pod", "revision", "tp_rank", "stage", "function", "kind", "role", "x"]),
                              st.text(max_size=5) | st.sampled_from(["stable", "canary", "0", "self", "inclusive",
                                                                     "mm_processor"]), max_size=6)
    | json_values,
    "values": st.lists(st.tuples(st.floats(T0, T0 + 900) | scalars, st.sampled_from(
        ["0.02", "0.03", "NaN", "+Inf", "x", "", str(T0 + 100)]) | scalars).map(list), max_size=6) | json_values,
})
prom_answers = st.one_of(
    json_values,
    st.fixed_dictionaries({"status": st.sampled_from(["success", "error"]) | scalars,
                           "data": st.fixed_dictionaries({"result": st.lists(prom_series, max_size=4) | json_values})
                           | json_values}),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(answer=prom_answers)
def test_any_prometheus_answer_gives_windows_or_unavailable(monkeypatch, answer):
    monkeypatch.setattr(prometheus, "get_json", lambda url, timeout=base.TIMEOUT_S: json.loads(json.dumps(answer)))
    try:
        ws = prometheus.from_prometheus("http://prom", "ns", "svc", ["stable", "canary"], since=T0, now=T0 + 600,
                                     step=15)
    except sources.SignalsUnavailable:
        return
    assert all(isinstance(w, gate.Window) for w in ws)
    gate.decide([w for w in ws if w.revision == "stable"], [w for w in ws if w.revision == "canary"], POLICY,
                started_at=T0, now=T0 + 600, step_duration_s=300)


def test_a_prometheus_answer_of_the_wrong_shape_is_unavailable_not_a_crash(monkeypatch):
    for answer in ([], {"status": "success"}, {"status": "success", "data": []},
                   {"status": "success", "data": {"result": {"a": 1}}}, "null"):
        monkeypatch.setattr(prometheus, "get_json", lambda url, timeout=base.TIMEOUT_S, a=answer: a)
        with pytest.raises(sources.SignalsUnavailable):
            prometheus._query_range("http://prom", "up", T0, T0 + 60, 15)
