#!/usr/bin/env python3
"""200 VLMServices applied at once on the testbed: time until every Deployment exists, the operator's
peak RSS, and API writes per steady resync (goal: 0).

    hack/testbed up && python bench/operator_scale.py [--count 200] [--resync 5]

Needs the testbed (hack/testbed up) and the CRD; prints a table and writes out/operator_scale.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client, config

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.operator_proc import GROUP, PLURAL, VERSION, OperatorProcess, install_crd  # noqa: E402


def kubeconfig() -> Path:
    import subprocess

    out = subprocess.run([sys.executable, str(REPO / "hack" / "testbed"), "env", "--json"], capture_output=True,
                         text=True, check=True).stdout
    return Path(json.loads(out)["KUBECONFIG"])


def rss_peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--resync", type=float, default=5.0)
    p.add_argument("--steady-rounds", type=int, default=4)
    a = p.parse_args()
    kc = kubeconfig()
    api = config.new_client_from_config(config_file=str(kc))
    core, apps, co = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)

    def kubectl(*args: str) -> str:
        import subprocess

        return subprocess.run([str(Path.home() / ".cache/vlm-operator/bin/kubectl"), f"--kubeconfig={kc}", *args],
                              capture_output=True, text=True, check=True).stdout

    install_crd(kubectl)
    ns = core.create_namespace({"metadata": {"generateName": "bench-scale-"}}).metadata.name
    tmp = Path(tempfile.mkdtemp(prefix="vlm-bench-"))
    op = OperatorProcess(kc, ns, tmp / "operator.log", {"VLM_RESYNC_SECONDS": str(a.resync)}).start()
    try:
        spec = {"model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"}, "replicas": 1}
        t0 = time.time()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: co.create_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL,
                {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLMService", "metadata": {"name": f"svc-{i:03d}"},
                 "spec": spec}), range(a.count)))
        t_applied = time.time() - t0
        while len(apps.list_namespaced_deployment(ns).items) < a.count:
            if time.time() - t0 > 900:
                raise SystemExit("not all Deployments after 900 s")
            time.sleep(0.5)
        t_deploy = time.time() - t0

        def statused() -> int:
            items = co.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
            return sum(1 for o in items if (o.get("status") or {}).get("observedGeneration"))

        while statused() < a.count:
            time.sleep(1)
        t_status = time.time() - t0
        # Settle: pods of 200 services come up (or stay Pending) over a while; wait until a resync
        # period passes with no write, at most 120 s, and report how long that took.
        quiet_since, last = time.time(), op.metric_sum("vlm_operator_api_writes_total")
        while time.time() - quiet_since < 2 * a.resync and time.time() - t0 < t_status + 120:
            time.sleep(1)
            now_w = op.metric_sum("vlm_operator_api_writes_total")
            if now_w != last:
                quiet_since, last = time.time(), now_w
        t_settled = time.time() - t0
        w0 = op.metric_sum("vlm_operator_api_writes_total")
        r0 = op.metric_sum("vlm_operator_reconcile_duration_seconds_count")
        time.sleep(a.steady_rounds * a.resync)
        w1 = op.metric_sum("vlm_operator_api_writes_total")
        r1 = op.metric_sum("vlm_operator_reconcile_duration_seconds_count")
        rounds = (r1 - r0) / a.count
        result = {
            "services": a.count,
            "create_requests_s": round(t_applied, 1),
            "all_deployments_s": round(t_deploy, 1),
            "all_status_s": round(t_status, 1),
            "settled_s": round(t_settled, 1),
            "operator_peak_rss_mib": round(rss_peak_kib(op.proc.pid) / 1024, 1),
            "steady_reconciles_per_service": round(rounds, 2),
            "steady_writes": w1 - w0,
            "writes_per_steady_resync": round((w1 - w0) / rounds, 2) if rounds else None,
        }
    finally:
        op.stop()
        core.delete_namespace(ns)
    out = REPO / "out"
    out.mkdir(exist_ok=True)
    (out / "operator_scale.json").write_text(json.dumps(result, indent=1))
    for k, v in result.items():
        print(f"{k:32s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
