"""bench/operator_scale.py without an API server: its --direct floor writes what the operator writes for a new
service (held to a reconcile against the fake Kube, so a builder's change of signature or output fails here, not
at the next scale run), the --direct mode runs end to end against a recording fake, and the pure helpers it
reports with (histogram quantiles, the seen-curve, the steady status census) count right. Both modes run against
the real testbed in tests/integration/test_bench_operator_scale.py."""

from __future__ import annotations

import copy
import subprocess
import sys
import threading

import pytest

from vlm_operator.analysis import sources
from vlm_operator.api.settings import Settings
from vlm_operator.controller import reconcile
from vlm_testing import REPO as ROOT
from vlm_testing.benches import load_bench
from vlm_testing.fakekube import FakeKube

scale = load_bench("operator_scale")


def _strip(o: dict) -> dict:
    o = copy.deepcopy(o)
    o["metadata"].pop("ownerReferences", None)
    return o


@pytest.mark.parametrize("monitoring", [False, True])
def test_the_direct_objects_are_what_a_reconcile_of_a_new_service_writes(monitoring):
    kube = FakeKube()
    kube.create_vlmservice("svc-0000", scale.SPEC)
    reader = sources.SidecarReader(timeout_s=0.2, workers=1, fetch=lambda url, timeout: (_ for _ in ()).throw(
        ConnectionRefusedError(url)))
    rt = reconcile.Runtime(kube=kube, settings=Settings(), sidecars=reader, monitoring=monitoring)
    reconcile.reconcile(rt, kube.target("svc-0000"), kube.observed("svc-0000"), lambda *e: None, now=1.8e9)
    written = {(w.kind, w.name): _strip(w.body) for w in kube.written("apply")}
    direct = {(o["kind"], o["metadata"]["name"]): o for o in scale.direct_objects("ns", 0, monitoring)}
    kinds = {"Service", "Deployment", "NetworkPolicy"} | ({"PodMonitor", "PrometheusRule"} if monitoring else set())
    assert {k for k, _ in direct} == kinds
    assert set(direct) == set(written)
    for key, body in direct.items():
        assert body == written[key], key


class RecordingKube:
    """The two calls `direct` makes of the operator's Kube; every Deployment applied is shown to the bench's
    Deployment follower, as its watch on the API server would."""

    def __init__(self, deployments, monitoring: bool):
        self.deployments, self.monitoring = deployments, monitoring
        self.applied: list[dict] = []
        self.lock = threading.Lock()

    def crd_exists(self, name: str) -> bool:
        return self.monitoring and name == "podmonitors.monitoring.coreos.com"

    def apply(self, obj, observed) -> bool:
        assert observed is None and "ownerReferences" not in obj["metadata"]
        with self.lock:
            self.applied.append(obj)
        if obj["kind"] == "Deployment":
            self.deployments.see("ADDED", obj)
        return True

    def patch_status(self, namespace, name, current, new, resource_version=None):
        with self.lock:
            self.applied.append({"kind": "status", "metadata": {"namespace": namespace, "name": name}, "status": new})
        return "1"

    def request_json(self, method, path, *, body=None, query=None, content_type=None):
        assert (method, content_type) == ("PATCH", "application/merge-patch+json")
        with self.lock:
            self.applied.append({"kind": "annotation", "metadata": {"namespace": path.split("/")[-3],
                                                                    "name": path.rsplit("/", 1)[1]}, "body": body})


@pytest.mark.parametrize("monitoring", [False, True])
def test_the_direct_mode_writes_every_object_of_every_service_and_reports_it(monitoring, monkeypatch):
    monkeypatch.delenv("BENCH_DIRECT_NO_MONITORING", raising=False)
    deployments = scale.Counted()
    kube = RecordingKube(deployments, monitoring)
    result = scale.direct("bench-ns", 7, deployments, kube=kube)
    per = 5 if monitoring else 3
    assert result["services"] == 7 and result["writes_per_service"] == per and result["monitoring"] is monitoring
    assert len(kube.applied) == 7 * per
    assert len({(o["kind"], o["metadata"]["name"]) for o in kube.applied}) == 7 * per  # none written twice
    assert {o["metadata"]["namespace"] for o in kube.applied} == {"bench-ns"}
    assert 0 <= result["direct_writes_s"] <= result["direct_all_deployments_s"] < 60
    assert set(result["deployments_seen_s"]) == {"25%", "50%", "90%", "100%"}


@pytest.mark.parametrize("monitoring", [False, True])
def test_the_direct_all_floor_adds_the_service_its_status_and_kopfs_annotation_in_the_operators_order(
        monitoring, monkeypatch):
    monkeypatch.delenv("BENCH_DIRECT_NO_MONITORING", raising=False)
    deployments = scale.Counted()
    kube = RecordingKube(deployments, monitoring)
    result = scale.direct("bench-ns", 4, deployments, kube=kube, everything=True)
    per = (5 if monitoring else 3) + 3
    assert result["writes_per_service"] == per and result["everything"] is True
    assert len(kube.applied) == 4 * per
    one = [o["kind"] for o in kube.applied if o["metadata"]["name"].startswith("svc-0002")]
    assert one == ["VLMService", "NetworkPolicy", "Deployment", "Service",
                   *(["PodMonitor", "PrometheusRule"] if monitoring else []), "status", "annotation"]
    status = next(o["status"] for o in kube.applied if o["kind"] == "status")
    assert status["observedGeneration"] == 1 and len(status["conditions"]) == 5


def test_no_monitoring_objects_when_told_so(monkeypatch):
    monkeypatch.setenv("BENCH_DIRECT_NO_MONITORING", "1")
    deployments = scale.Counted()
    result = scale.direct("bench-ns", 2, deployments, kube=RecordingKube(deployments, True))
    assert result["writes_per_service"] == 3 and result["monitoring"] is False


def test_quantile_reads_the_histogram_between_two_readings():
    before = {0.1: 10.0, 0.5: 10.0, 1.0: 10.0, float("inf"): 10.0}
    after = {0.1: 60.0, 0.5: 108.0, 1.0: 110.0, float("inf"): 110.0}  # 100 new: 50 <= 0.1, 98 <= 0.5, all <= 1
    assert scale.quantile(before, after, 0.5) == 0.1
    assert scale.quantile(before, after, 0.9) == 0.5
    assert scale.quantile(before, after, 0.99) == 1.0
    assert scale.quantile(after, after, 0.5) is None  # nothing observed in between


def test_the_seen_curve_and_deletions():
    c = scale.Counted()
    for i in range(4):
        c.see("ADDED", {"metadata": {"name": f"d{i}"}})
    c.see("MODIFIED", {"metadata": {"name": "d0"}})  # seen once
    c.first_seen = [100.0, 101.0, 102.0, 110.0]
    assert c.curve(100.0, 4) == {"25%": 0.0, "50%": 1.0, "90%": 10.0, "100%": 10.0}
    assert c.curve(100.0, 8) == {"25%": 1.0, "50%": 10.0}  # half of 8 seen: the later points are not there
    c.see("DELETED", {"metadata": {"name": "d1"}})
    assert not c.wait(4, 0.01) and c.wait(3, 0.01)


def test_status_changes_count_fields_and_condition_flips():
    before = {"a": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True", "reason": "Up"}],
                    "profiler": {"lastSampleTime": "t0", "windows": 3}},
              "b": {"phase": "Ready"}}
    after = {"a": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "False", "reason": "Down"}],
                   "profiler": {"lastSampleTime": "t1", "windows": 3}},
             "b": {"phase": "Pending"}}
    assert scale.status_changes(before, after) == {"conditions.Ready True/Up -> False/Down": 1,
                                                   "profiler.lastSampleTime": 1, "phase": 1}
    assert scale.status_changes(after, after) == {}


def test_it_parses_its_modes():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "operator_scale.py"), "--help"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    for flag in ("--count", "--dead", "--steady", "--direct", "--direct-all", "--burst-only", "--env"):
        assert flag in out
