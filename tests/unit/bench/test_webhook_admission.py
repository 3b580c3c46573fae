"""bench/webhook_admission.py without an API server: its `--serve` mode (the operator's webhook server in a process
of its own, as the bench starts it) answers an AdmissionReview over TLS with the sidecar injected and writes each
review's handling time on SIGTERM; the pods and the configuration the bench sends are well formed. The whole bench
(both namespaces, the API server calling the webhook) runs in tests/integration/test_bench_webhook_admission.py."""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import time

from vlm_testing import REPO as ROOT
from vlm_testing.benches import load_bench
from vlm_testing.operator_proc import free_port

wa = load_bench("webhook_admission")


def _review(pod: dict) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u-1", "kind": {"kind": "Pod"}, "operation": "CREATE",
                                   "namespace": "bench-hook", "object": pod}}).encode()


def test_the_serve_mode_injects_over_tls_and_records_each_review(tmp_path):
    port, ca, out = free_port(), tmp_path / "ca.pem", tmp_path / "durations.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "sidecar")])}
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "webhook_admission.py"), "--serve", str(port),
                             str(ca), str(out)], env=env)
    try:
        deadline = time.time() + 60
        while not ca.exists() or not ca.read_bytes():
            assert proc.poll() is None and time.time() < deadline, "the webhook server did not start"
            time.sleep(0.1)
        time.sleep(0.2)  # the CA is written once serving; give the file a moment to be complete
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10,
                                           context=ssl.create_default_context(cadata=ca.read_text()))
        for _ in range(2):
            conn.request("POST", "/mutate", _review(wa._pod("p-00001")), {"Content-Type": "application/json"})
            r = conn.getresponse()
            assert r.status == 200
            resp = json.loads(r.read())["response"]
            assert resp["uid"] == "u-1" and resp["allowed"] is True
            patch = json.loads(base64.b64decode(resp["patch"]))
            assert any("profiler" in json.dumps(op.get("value")) for op in patch), patch
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    record = json.loads(out.read_text())
    assert len(record["durations"]) == 2 and all(0 < d < 5 for d in record["durations"])
    assert sum(record["outcomes"].values()) == 2 and record["connections"] == 1


def test_the_pods_and_the_configuration_it_sends():
    pod = wa._pod("p-00007")
    assert pod["metadata"]["labels"][wa.LABEL] == "true" and pod["spec"]["schedulingGates"]
    mwc = wa._mwc("vlm-bench-x", 4443, b"CA", "bench-hook-x")
    hook = mwc["webhooks"][0]
    assert hook["clientConfig"] == {"url": "https://127.0.0.1:4443/mutate", "caBundle": base64.b64encode(b"CA").decode()}
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["bench-hook-x"]
    assert hook["objectSelector"] == {"matchLabels": {wa.LABEL: "true"}}
    assert wa._pct([3.0, 1.0, 2.0], 0.5) == 2.0 and wa._pct([1.0, 2.0], 0.99) == 2.0
