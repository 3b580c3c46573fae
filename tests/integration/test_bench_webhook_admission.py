"""bench/webhook_admission.py end to end at a tiny size on the testbed (the API server calls the bench's webhook
server for every pod of one namespace and for none of the other): the result is well formed and says every pod
was right. Its `--serve` part alone runs in the unit tier (tests/unit/bench/test_webhook_admission.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_admission_bench_injects_every_selected_pod_and_no_other(cluster, tmp_path):
    out = tmp_path / "webhook_admission.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "sidecar")])}
    res = subprocess.run([sys.executable, str(REPO / "bench" / "webhook_admission.py"), "--count", "6",
                          "--concurrency", "4", "--json", str(out)], capture_output=True, text=True, timeout=300,
                         env=env, cwd=REPO)
    r = json.loads(out.read_text())
    assert (r["injected"], r["of_pods"], r["untouched_without"], r["of_pods_without"]) == (6, 6, 6, 6), r
    assert r["errors"] == 0 and r["reviews"] == 6 and r["tls_connections"] >= 1
    assert 0 < r["webhook_handling_p50_ms"] <= r["webhook_handling_p99_ms"] <= r["webhook_handling_max_ms"]
    assert r["create_with_p50_ms"] > 0 and r["create_without_p50_ms"] > 0 and r["ratio_p50"] > 0
    # Exit 1 only for the latency target (a loaded machine); the pods were checked above.
    assert res.returncode in (0, 1) and res.stdout.strip().splitlines()[-1].startswith(("PASS", "FAIL")), res.stderr[-3000:]
