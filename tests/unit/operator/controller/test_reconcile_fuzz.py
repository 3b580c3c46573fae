"""Valid but unusual specs through the reconcile (fake Kube wrapper): one field of the full canary example
changed at a time (testing/vlm_testing/specfuzz.py), kept only where the model accepts it, then reconciled with and
without GPUs to spare on the node, pods made, released and settled, a template change made and reconciled again. Never an exception,
and the service always ends with a Ready condition whose reason says what happened."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vlm_operator.api import v1alpha1 as api
from vlm_testing.fakekube import T0, FakeCluster
from vlm_testing.specfuzz import BASE, READY_REASONS, model_accepts, mutants, mutate


@settings(max_examples=500, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(mutants, st.integers(0, 8))
def test_unusual_valid_specs_reconcile_to_a_condition(case, gpus):
    path, value, action = case
    spec = mutate(BASE, path, value, action)
    assume(model_accepts(spec))
    c = FakeCluster(spec, gpus=gpus)
    model = api.parse_spec(spec)
    c.kube.nodes = {"node-0": model.replicas * model.gpus_per_replica + gpus}  # `gpus` to spare once all run
    c.run(T0)
    c.up(T0 + 5)
    c.run(T0 + 15)
    # A pod-template change: a canary where the spec has a rollout.
    changed = {**spec, "sglang": {**(spec.get("sglang") or {}), "args": ["--fuzz-change"]}}
    if model_accepts(changed):
        c.kube.update_spec("svc", changed)
    c.run(T0 + 30)
    c.up(T0 + 40)
    c.run(T0 + 45)
    ready = c.condition("Ready")
    assert ready["reason"] in READY_REASONS, ready
    assert ready["status"] == ("True" if ready["reason"] == "AllReplicasReady" else "False"), ready
    assert {"Progressing", "Degraded"} <= {x["type"] for x in c.status["conditions"]}

