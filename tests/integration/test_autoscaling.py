"""spec.autoscaling on the real API server: the ScaledObject the operator writes, against KEDA's own CRD (v2.21.0,
from the Go module proxy in the setup step: hack/fetch-crds.sh) in a server-side dry run with every field kept (a
field KEDA does not know would be pruned without an error), then run by KEDA's own operator and metrics server and
kube-controller-manager's HPA loop (serial: tests/conftest.py SERIAL, since an aggregated API that is not up breaks
API discovery for every other test). The VLMService's own autoscaling rules are checked on the API server with the
other invalid specs (test_crd.py, vlm_testing.specs.INVALID)."""

from __future__ import annotations

import json

import pytest

from vlm_operator.api import v1alpha1 as api
from vlm_operator.desired import autoscaling as A
from vlm_operator.desired.builders import Owner
from vlm_testing import fetched
from vlm_testing.cluster import wait_for
from vlm_testing.integration import _dry_run, _established, _kept
from vlm_testing.specs import MINIMAL


@pytest.fixture
def keda_crds(cluster):
    """KEDA's CRDs for the test, removed after it: an operator started meanwhile by another test would otherwise
    find KEDA and write ScaledObjects' deletes for every spec change."""
    files = fetched.crds(fetched.KEDA)
    for f in files:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f), timeout=120)
    wait_for(lambda: _established(json.loads(cluster.kubectl("get", "crd/scaledobjects.keda.sh", "-o", "json"))),
             120, "CRD scaledobjects.keda.sh Established")
    yield
    for f in files:
        cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", str(f), timeout=120)


def test_the_scaled_object_passes_kedas_own_schema(cluster, namespace, keda_crds):
    spec = api.parse_spec({**MINIMAL, "telemetry": {"frontendRoles": ["mm_processor"]}, "autoscaling": {
        "minReplicas": 2, "maxReplicas": 8,
        "targets": {"schedulerBusyPercent": 85, "frontendBusyPercent": 85, "queuePerReplica": 4,
                    "kvCacheUsagePercent": 85, "ttftP95": "2s"}}})
    obj = A.build_scaled_object(Owner("qwen", namespace, "00000000-0000-0000-0000-000000000001"), spec.autoscaling,
                                "http://prometheus.monitoring:9090", trigger_auth="prometheus", frontend=True)
    back = _dry_run(cluster, obj)
    lost = _kept(obj["spec"], back["spec"], "ScaledObject.spec")
    assert not lost, f"KEDA's schema dropped or changed {lost}"
    assert len(back["spec"]["triggers"]) == 5


# ---------------------------------------------------------------- a real KEDA and the HPA loop


def test_a_real_keda_scales_a_vlmservice_up_on_a_busy_scheduler_and_down_after_stabilisation(
        cluster, crd, kube, namespace, tmp_path):
    """The ScaledObject the operator writes, run by KEDA v2.21.0's own operator and metrics server, read by
    kube-controller-manager's HPA loop through the API server's aggregation layer, scaling the VLMService's scale
    subresource: busy schedulers (80% a replica against a 50% target) take 1 replica to 2 (maxReplicas), and idle
    ones take it back to 1 once the scale-down window (20 s here) has passed. The operator follows spec.replicas
    with its Deployment."""
    import time

    from vlm_operator.api import names
    from vlm_testing import dashboard
    from vlm_testing.autoscaling import BusySidecars, Prom, free_port, prometheus
    from vlm_testing.integration import wait_condition
    from vlm_testing.keda import Keda
    from vlm_testing.operator_proc import get_vlms, run_operator

    keda = Keda(cluster, tmp_path).start()
    side = BusySidecars(kube, namespace, "auto")
    port, srv = side.serve()
    op_port = free_port()
    prom_url, prom = prometheus(tmp_path, port, op_port)
    op_run = run_operator(cluster.kubeconfig, namespace, tmp_path, VLM_AUTOSCALING_PROMETHEUS_URL=prom_url,
                          VLM_METRICS_PORT=str(op_port))
    op = next(op_run)
    t_begin = time.time()
    try:
        body = {"apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": {"name": "auto", "namespace": namespace},
                "spec": {**MINIMAL, "replicas": 1, "autoscaling": {
                    "minReplicas": 1, "maxReplicas": 2, "targets": {"schedulerBusyPercent": 50},
                    "scaleUpStabilization": "0s", "scaleDownStabilization": "20s", "pollingInterval": "5s"}}}
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(body))
        wait_condition(kube, namespace, "auto", "Autoscaling", "True", timeout=90, op=op)
        so = json.loads(cluster.kubectl("get", "scaledobject", "auto", "-n", namespace, "-o", "json"))
        assert [t["name"] for t in so["spec"]["triggers"]] == ["schedulerBusy"]

        def replicas() -> int:
            return get_vlms(kube, namespace, "auto")["spec"]["replicas"]

        def hpa() -> str:
            return cluster.kubectl("get", "hpa", "-n", namespace, "-o", "yaml", check=False)

        wait_condition(kube, namespace, "auto", "Ready", "True", timeout=120, op=op)
        side.idle = 0.2  # busy 80% on the one replica: the HPA wants ceil(0.8 / 0.5) = 2
        try:
            wait_for(lambda: replicas() == 2, 180, "spec.replicas scaled to 2 by KEDA's HPA")
            wait_for(lambda: (get_vlms(kube, namespace, "auto").get("status") or {}).get("readyReplicas") == 2, 120,
                     "2 replicas Ready")
        except AssertionError as e:
            raise AssertionError(f"{e}\nHPA:\n{hpa()}\nScaledObject:\n"
                                 f"{cluster.kubectl('get', 'scaledobject', '-n', namespace, '-o', 'yaml', check=False)}"
                                 f"\n{keda.logs()}\noperator:\n{op.log_tail(30)}") from None
        # What the operator read of the HPA: the count, the signal that drove it, one Event for the decision,
        # the columns of `kubectl get -o wide`.
        wait_for(lambda: ((get_vlms(kube, namespace, "auto").get("status") or {}).get("autoscaling") or {})
                 .get("desiredReplicas") == 2, 60, "status.autoscaling.desiredReplicas 2")
        st = get_vlms(kube, namespace, "auto")["status"]["autoscaling"]
        assert st["signal"] == "schedulerBusy" and st["target"] == pytest.approx(0.5), st
        assert st["currentReplicas"] in (1, 2) and st["maxReplicas"] == 2, st
        wide = cluster.kubectl("get", "vlms", "auto", "-n", namespace, "-o", "wide")
        assert "DESIRED" in wide and "SCALEDON" in wide and "schedulerBusy" in wide, wide
        side.idle = 0.95  # 5% busy a replica: the HPA wants 1, after the 20 s window
        try:
            wait_for(lambda: replicas() == 1, 180, "spec.replicas scaled back to 1")
        except AssertionError as e:
            raise AssertionError(f"{e}\nHPA:\n{hpa()}\n{keda.logs()}") from None
        hpas = json.loads(cluster.kubectl("get", "hpa", "-n", namespace, "-o", "json"))["items"]
        assert [h["spec"]["scaleTargetRef"]["kind"] for h in hpas] == ["VLMService"], hpas
        wait_for(lambda: ((get_vlms(kube, namespace, "auto").get("status") or {}).get("autoscaling") or {})
                 .get("desiredReplicas") == 1, 60, "status.autoscaling.desiredReplicas 1")
        events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json",
                                            "--field-selector", "reason=Autoscaled"))["items"]
        msgs = [e["message"] for e in events]
        assert [m.split(":")[0] for m in sorted(msgs, key=lambda m: "1 replicas" in m)] == [
            "the autoscaler wants 2 replicas (has 1)", "the autoscaler wants 1 replicas (has 2)"], msgs
        # The dashboard's autoscaling panels draw from what Prometheus scraped of the operator and the sidecars.
        mon, now = Prom(prom_url), time.time()
        empty = [(title, t["refId"]) for title, t in dashboard.targets(dashboard.load())
                 if (title, t["refId"]) in dashboard.AUTOSCALING_TARGETS
                 and not dashboard.has_data(mon, t, namespace, "auto", t_begin, now)]
        assert not empty, f"autoscaling panels without data: {empty}"
    finally:
        next(op_run, None)
        prom.terminate()
        srv.shutdown()
        keda.stop()
