"""The judge's Flagger example against Flagger's own CRDs (v1.36.1, from the Go module proxy in the
setup step: hack/fetch-crds.sh) on the real API server: a server-side dry run of the Canary, every field kept (a
webhook field Flagger does not know would be pruned without an error)."""

from __future__ import annotations

import json
from pathlib import Path

from vlm_testing import fetched
from vlm_testing.cluster import wait_for
from vlm_testing.integration import _dry_run, _established, _in, _kept

REPO = Path(__file__).resolve().parents[2]


def test_the_flagger_canary_passes_flaggers_own_schema(cluster, namespace):
    (crd,) = fetched.crds(fetched.FLAGGER)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd), timeout=120)
    wait_for(lambda: _established(json.loads(cluster.kubectl("get", "crd/canaries.flagger.app", "-o", "json"))),
             120, "CRD canaries.flagger.app Established")
    (canary,) = [d for d in _in(namespace, REPO / "examples" / "flagger" / "canary.yaml") if d["kind"] == "Canary"]
    back = _dry_run(cluster, canary)
    lost = _kept(canary["spec"], back["spec"], "Canary.spec")
    assert not lost, f"the API server dropped or changed {lost}"
    hook = back["spec"]["analysis"]["webhooks"][0]
    assert hook["type"] == "rollout" and "/v1/flagger" in hook["metadata"]["cmd"]
