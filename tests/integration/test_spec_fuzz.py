"""Fuzzing VLMService specs against the real API server, with the pydantic model as the oracle.

Hypothesis mutates one field of a full, valid spec (the canary example) at a time: a value of the
wrong type, out of range, a bad duration or enum, a missing required field, an unknown field. Each
mutant goes to the API server (server-side dry run, strict field validation) and to
`VLMServiceSpec`. What must hold, for every mutant:
- a spec the model refuses is refused by the API server too, with the field's name in the message
  (bad input stops at the earliest point, and says where);
- a spec the API server accepts is one the operator can run (the model accepts it): nothing gets
  past the server only to fail in the reconcile.
The mutations are drawn until at least MIN_INVALID invalid ones have been checked.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from vlm_operator.api.v1alpha1 import VLMServiceSpec
from vlm_testing.specfuzz import BASE, EXAMPLES, MIN_INVALID, PATHS, edge_cases, mutate, values


def _model_ok(spec: dict[str, Any]) -> tuple[bool, str]:
    try:
        VLMServiceSpec.model_validate(spec)
        return True, ""
    except ValidationError as e:
        return False, str(e)


def test_fuzzed_specs_are_refused_by_the_api_server_exactly_when_the_operator_would_refuse_them(
    crd, kube, namespace
):
    assert _model_ok(BASE)[0], "the base spec must be valid"
    api = client.CustomObjectsApi(kube)
    seen = {"refused": 0, "accepted": 0, "stricter": 0}
    problems: list[str] = []

    def server(spec: dict[str, Any]) -> tuple[bool, str, dict[str, Any] | None]:
        body = {"apiVersion": "serving.vlmops.dev/v1alpha1", "kind": "VLMService",
                "metadata": {"generateName": "fuzz-"}, "spec": spec}
        try:
            got = api.create_namespaced_custom_object("serving.vlmops.dev", "v1alpha1", namespace, "vlmservices",
                                                      body, dry_run="All", field_validation="Strict")
            return True, "", got.get("spec")
        except ApiException as e:
            if e.status not in (400, 422):
                raise
            return False, e.body or "", None

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(st.sampled_from(PATHS), values, st.sampled_from(["set", "set", "set", "delete", "unknown"]))
    def check(path: tuple, value: Any, action: str) -> None:
        if action == "unknown" and isinstance(path[-1], int):
            action = "set"
        spec = mutate(BASE, path, value, action)
        ok_server, text, stored = server(spec)
        where = ".".join(map(str, path))
        if ok_server:
            seen["accepted"] += 1
            # What the operator reads is the stored object (nulls pruned, defaults filled): it must run.
            ok_model, why = _model_ok(stored or {})
            if not ok_model:
                problems.append(f"server accepted what the operator refuses: {action} {where}={value!r}: "
                                f"{why.splitlines()[:3]}")
        else:
            seen["refused"] += 1
            if "spec." not in text:
                problems.append(f"server refused {action} {where}={value!r} without a field path: {text[:300]}")
            ok_model, _ = _model_ok(spec)
            if ok_model:
                seen["stricter"] += 1  # e.g. true for an integer: pydantic's lax mode would take it

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(edge_cases)
    @example((("rollout", "analysis", "confidence"), 0))  # the schema's minimum let this through
    def check_edges(case: tuple[tuple, Any]) -> None:
        check.hypothesis.inner_test(case[0], case[1], "set")

    check_edges()
    while seen["refused"] < MIN_INVALID:
        check()
    assert not problems, f"{len(problems)} of {sum(seen.values())} mutants disagree:\n" + "\n".join(problems[:25])
    assert seen["refused"] >= MIN_INVALID and seen["accepted"] > 0, seen
