"""spec.autoscaling on the real API server: the ScaledObject the operator writes, against KEDA's own CRD (v2.21.0,
from the Go module proxy in the setup step: hack/fetch-crds.sh) in a server-side dry run with every field kept (a
field KEDA does not know would be pruned without an error). Serial (tests/conftest.py SERIAL): KEDA's CRDs, which
an operator started meanwhile would find. What KEDA's own operator and metrics server and the HPA loop do with it
is tests/e2e/test_autoscaling.py's subject; the VLMService's own autoscaling rules are checked on the API server
with the other invalid specs (test_crd.py, vlm_testing.specs.INVALID)."""

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
