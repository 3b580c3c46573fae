"""apply.py: what counts as already applied, the status patch, error classes, and Kube's requests (through a
fake ApiClient: no server)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from vlm_operator.api.errors import PermanentError, TemporaryError
from vlm_operator.cluster import client as apply
from vlm_operator.cluster.connection import ApiError


def test_is_subset_ignores_server_defaults_but_not_changes():
    desired = {"spec": {"replicas": 2, "template": {"containers": [{"name": "a", "cpu": "8"}]}}}
    observed = {"spec": {"replicas": 2, "progress": 600, "template": {"containers": [{"name": "a", "cpu": "8",
                                                                                       "pull": "IfNotPresent"}]}}}
    assert apply.is_subset(desired, observed)
    assert not apply.is_subset({"spec": {"replicas": 3}}, observed)
    assert not apply.is_subset({"l": [1, 2]}, {"l": [1, 2, 3]})  # lists must match in length
    assert apply.is_subset({"port": "9400"}, {"port": 9400})  # a string the server returns as a number
    assert not apply.is_subset({"on": True}, {"on": 1})
    assert not apply.is_subset({"x": None}, {"x": "None"})


def test_status_patch_nulls_dropped_keys_and_is_none_when_equal():
    cur = {"phase": "Ready", "canaryRevision": "abc", "conditions": [{"type": "Ready"}]}
    assert apply.status_patch(cur, dict(cur)) is None
    assert apply.status_patch(cur, {"phase": "Ready", "conditions": [{"type": "Ready"}]}) == {
        "phase": "Ready", "conditions": [{"type": "Ready"}], "canaryRevision": None}
    assert apply.status_patch({}, {"phase": "Pending"}) == {"phase": "Pending"}


def test_status_patch_nulls_dropped_keys_inside_nested_objects():
    """A merge patch keeps what it does not mention: the last step's analysisStartedAt and reason must be nulled
    when a new step starts, or the stored status shows step 2 with step 1's clock."""
    cur = {"phase": "Canary", "rollout": {"step": 0, "phase": "Analysing", "reason": "NoRegression",
                                          "analysisStartedAt": "2027-01-15T08:02:10Z", "signals": [{"a": 1}]}}
    new = {"phase": "Canary", "rollout": {"step": 1, "phase": "Progressing"}}
    patch = apply.status_patch(cur, new)
    assert patch == {"phase": "Canary", "rollout": {"step": 1, "phase": "Progressing", "reason": None,
                                                    "analysisStartedAt": None, "signals": None}}
    from vlm_testing.fakekube import merge_patch
    assert merge_patch(cur, patch) == new
    assert apply.status_patch(new, {"phase": "Canary", "rollout": {"step": 1, "phase": "Progressing"}}) is None


@pytest.mark.parametrize(("code", "cls", "delay"), [(409, TemporaryError, 5), (429, TemporaryError, 15),
                                                     (503, TemporaryError, 15), (0, TemporaryError, 15),
                                                     (422, PermanentError, None), (403, PermanentError, None)])
def test_classify(code, cls, delay):
    e = apply.classify(ApiError(code, "r", json.dumps({"message": "the message"}).encode()), "apply X")
    assert isinstance(e, cls) and "apply X" in str(e) and "the message" in str(e)
    if delay is not None:
        assert e.delay == delay


@dataclass
class Resp:
    status: int
    data: bytes = b"{}"
    reason: str = "OK"


class FakeApiClient:
    """kubeconn.Connection's interface: records (method, url, headers, body) and answers from a list."""

    def __init__(self, answers=None):
        self.calls: list[tuple[str, str, dict, object]] = []
        self.answers = list(answers or [])

    def request(self, method, path, *, query=None, headers=None, body=None):
        q = "&".join(f"{k}={v}" for k, v in query or [])
        self.calls.append((method, path + (f"?{q}" if q else ""), dict(headers or {}),
                           json.loads(body) if body and headers.get("Content-Type", "").endswith("json") else body))
        r = self.answers.pop(0) if self.answers else Resp(200)
        if not 200 <= r.status < 300:
            raise ApiError(r.status, r.reason, r.data)
        return r.data


def writes(verb: str) -> float:
    return REGISTRY.get_sample_value("vlm_operator_api_writes_total", {"verb": verb}) or 0.0


DEP = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "ns"},
       "spec": {"replicas": 1}}


def test_apply_is_a_forced_server_side_apply_and_skipped_when_already_there():
    c = FakeApiClient()
    k = apply.Kube(c, "vlm-operator")
    before = writes("PATCH")
    assert k.apply(DEP, {**DEP, "status": {}}) is False and c.calls == []
    assert k.apply(DEP, None) is True
    method, url, headers, body = c.calls[0]
    assert method == "PATCH" and url == "/apis/apps/v1/namespaces/ns/deployments/d?fieldManager=vlm-operator&force=true"
    assert headers["Content-Type"] == "application/apply-patch+yaml" and yaml.safe_load(body) == DEP
    assert writes("PATCH") == before + 1


def test_patch_status_writes_only_a_difference_and_404_is_gone():
    c = FakeApiClient([Resp(200, b'{"metadata": {"resourceVersion": "42"}}'), Resp(404, b"{}", "Not Found")])
    k = apply.Kube(c, "m")
    assert k.patch_status("ns", "svc", {"phase": "Ready"}, {"phase": "Ready"}) is None and c.calls == []
    # The object's resourceVersion after the write (the reconcile orders later copies by it).
    assert k.patch_status("ns", "svc", {"phase": "Ready", "x": 1}, {"phase": "Pending"}) == "42"
    _, url, headers, body = c.calls[0]
    assert url == "/apis/serving.vlmops.dev/v1alpha1/namespaces/ns/vlmservices/svc/status"
    assert body == {"status": {"phase": "Pending", "x": None}}
    assert headers["Content-Type"] == "application/merge-patch+json"
    assert k.patch_status("ns", "svc", {}, {"phase": "Failed"}) is None


def test_server_errors_become_temporary_and_client_errors_permanent():
    k = apply.Kube(FakeApiClient([Resp(500, b'{"message":"etcd down"}', "Internal")]), "m")
    with pytest.raises(TemporaryError, match="etcd down"):
        k.apply(DEP, None)
    k = apply.Kube(FakeApiClient([Resp(422, b'{"message":"spec.replicas: Invalid"}', "Unprocessable")]), "m")
    with pytest.raises(PermanentError, match=r"spec\.replicas"):
        k.apply(DEP, None)
    assert (REGISTRY.get_sample_value("vlm_operator_errors_total", {"reason": "Http422"}) or 0) >= 1


def test_delete_of_a_missing_object_is_false_and_get_is_none():
    k = apply.Kube(FakeApiClient([Resp(404, b"{}", "NF"), Resp(404, b"{}", "NF")]), "m")
    assert k.delete("apps/v1", "Deployment", "ns", "d") is False
    assert k.get("v1", "Service", "ns", "s") is None


def test_rooms_are_each_schedulable_nodes_free_gpus_and_zone():
    nodes = {"items": [
        {"metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "z1"}},
         "status": {"allocatable": {"nvidia.com/gpu": "8"}}},
        {"metadata": {"name": "n2"}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}},
        {"metadata": {"name": "cordoned"}, "spec": {"unschedulable": True},
         "status": {"allocatable": {"nvidia.com/gpu": "8"}}},
    ]}
    # one read per schedulable node of the product (the API server filters by spec.nodeName)
    on_n1 = {"items": [
        {"spec": {"nodeName": "n1", "containers": [{"resources": {"requests": {"nvidia.com/gpu": "3"}}}, {}]}},
        {"spec": {"nodeName": "n1", "containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}}]}},
    ]}
    on_n2 = {"items": []}
    c = FakeApiClient([Resp(200, json.dumps(nodes).encode()), Resp(200, json.dumps(on_n1).encode()),
                       Resp(200, json.dumps(on_n2).encode())])
    assert apply.Kube(c, "m").rooms("H100") == {"n1": (3, "z1"), "n2": (4, "")}
    assert "labelSelector=nvidia.com/gpu.product=H100" in c.calls[0][1]
    assert len(c.calls) == 3  # the cordoned node is not read
    assert "spec.nodeName=n1" in c.calls[1][1] and "status.phase!=Succeeded" in c.calls[1][1]
    assert "spec.nodeName=n2" in c.calls[2][1]
    c = FakeApiClient([Resp(403, b'{"message":"nodes is forbidden"}', "Forbidden")])
    with pytest.raises(PermanentError, match="nodes is forbidden"):
        apply.Kube(c, "m").rooms("H100")


def test_a_pod_patch_is_a_strategic_merge_and_a_gone_pod_is_false():
    c = FakeApiClient([Resp(200), Resp(404, b"{}", "Not Found"), Resp(422, b'{"message":"spec: Forbidden"}', "U")])
    k = apply.Kube(c, "m")
    patch = {"metadata": {"labels": {"serving.vlmops.dev/role": "canary"}}}
    assert k.patch_pod("ns", "svc-abc-1", patch) is True
    method, url, headers, body = c.calls[0]
    assert (method, url, body) == ("PATCH", "/api/v1/namespaces/ns/pods/svc-abc-1", patch)
    assert headers["Content-Type"] == "application/strategic-merge-patch+json"
    assert k.patch_pod("ns", "gone", patch) is False
    with pytest.raises(PermanentError, match="Forbidden"):
        k.patch_pod("ns", "svc-abc-1", patch)


def test_a_conditional_status_write_carries_the_copy_s_resource_version_and_a_conflict_is_a_stale_copy():
    c = FakeApiClient([Resp(200, b'{"metadata": {"resourceVersion": "8"}}'), Resp(409, b"{}", "Conflict")])
    k = apply.Kube(c, "m")
    assert k.patch_status("ns", "svc", {}, {"phase": "Ready"}, resource_version="7") == "8"
    assert c.calls[0][3] == {"status": {"phase": "Ready"}, "metadata": {"resourceVersion": "7"}}
    with pytest.raises(TemporaryError) as e:
        k.patch_status("ns", "svc", {}, {"phase": "Pending"}, resource_version="7")
    assert e.value.reason == "StaleCopy" and e.value.delay <= 1


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=12))
def test_apply_bodies_read_back_unchanged_by_a_yaml_reader(obj):
    """A server-side apply is read as YAML: any string, emoji and control characters included, comes back as it
    was (Python's own json.dumps wrote an emoji as a surrogate-pair escape the API server refuses)."""
    body = apply.yaml_json({"data": obj})
    assert yaml.safe_load(body.decode("utf-8")) == {"data": obj}


def test_an_emoji_is_sent_as_utf8_not_as_a_surrogate_pair():
    body = apply.yaml_json({"model": "qwen-\U0001f600", "env": "a\x85b\u2028c"})
    assert "\U0001f600".encode() in body and b"\\ud83d" not in body
    assert b"\\u0085" in body and b"\\u2028" in body  # YAML 1.1 line breaks, escaped
