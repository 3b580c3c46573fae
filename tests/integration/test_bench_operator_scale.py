"""bench/operator_scale.py's modes, end to end at a tiny size on the testbed (they need the API server: the unit
tier holds the pure part, tests/unit/bench/test_operator_scale.py): the operator's burst and steady state, its
burst alone (--burst-only), and the --direct and --direct-all floors; each writes a well-formed result whose
numbers are plausible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COUNT = 3


def _bench(tmp_path: Path, *args: str, timeout: float = 500) -> dict:
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "sidecar")])}
    res = subprocess.run([sys.executable, str(REPO / "bench" / "operator_scale.py"), "--count", str(COUNT),
                          "--json", str(out), *args], capture_output=True, text=True, timeout=timeout, env=env,
                         cwd=REPO)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    result = json.loads(out.read_text())
    assert result["services"] == COUNT
    assert f"{'services':28s} {COUNT}" in res.stdout  # the table printed
    return result


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["--direct", "--direct-all"])
def test_the_direct_floor_writes_every_object_and_times_it(cluster, crd, tmp_path, mode):
    r = _bench(tmp_path, mode)
    # Service, Deployment, NetworkPolicy (+ PodMonitor, PrometheusRule); --direct-all: + the VLMService, its
    # status and kopf's annotation
    assert r["writes_per_service"] == (5 if r["monitoring"] else 3) + (3 if mode == "--direct-all" else 0)
    assert 0 < r["direct_writes_s"] <= r["direct_all_deployments_s"] < 120
    assert r["all_objects_s"] == r["direct_writes_s"]  # every write answered: every object there
    assert r["deployments_seen_s"]["100%"] <= r["direct_all_deployments_s"]


@pytest.mark.slow
def test_the_operator_mode_reports_the_burst_and_the_steady_state(cluster, crd, tmp_path):
    r = _bench(tmp_path, "--steady", "5", "--dead", "0")
    assert r["sidecars_dead"] == 0 and r["sidecars_live"] >= COUNT - 1
    assert 0 < r["all_deployments_s"] <= r["all_status_s"] <= r["all_converged_s"] < 600
    assert r["deployments_seen_s"]["100%"] <= r["all_deployments_s"]
    assert 0 < r["services_seen_s"]["100%"] <= r["all_objects_s"]  # every Service came
    assert r["deployments_seen_s"]["100%"] <= r["all_objects_s"] <= r["all_converged_s"]
    assert 1 <= r["burst_writes_per_service"] < 50 and r["burst_operator_cpu_cores"] >= 0
    assert 20 < r["operator_peak_rss_mib"] < 1000 and r["steady_reconciles_per_s"] >= 0
    assert r["steady_writes_per_s"] >= 0 and r["sidecar_requests"] > 0


@pytest.mark.slow
def test_the_burst_only_mode_stops_once_every_object_exists(cluster, crd, tmp_path):
    r = _bench(tmp_path, "--burst-only", "--dead", "0")
    assert 0 < r["deployments_seen_s"]["100%"] <= r["all_deployments_s"] <= r["all_objects_s"] < 120
    assert r["services_seen_s"]["100%"] <= r["all_objects_s"]
    assert "all_status_s" not in r and "steady_writes_per_s" not in r  # it stopped at the burst
    assert 1 <= r["burst_writes_per_service"] < 50 and 20 < r["operator_peak_rss_mib"] < 1000
