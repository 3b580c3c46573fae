#!/usr/bin/env python3
"""Autoscaling through a real KEDA (v2.21.0) and kube-controller-manager's HPA loop on the testbed, at the shipped
defaults of `spec.autoscaling` (the scheduler's busy share at 85% a replica, scale-up stabilisation 1 minute,
scale-down 10 minutes, KEDA polling every 30 s; the operator at its shipped resync, 15 s), beside the strongest
plain alternative: the same ScaledObject with the Kubernetes HPA's own defaults (scale-up at once, scale-down
stabilisation 5 minutes), which is what a KEDA ScaledObject without `advanced.horizontalPodAutoscalerConfig` gets.
Both services run in one namespace, side by side, from one load model and one noise stream each (same seed).

    hack/testbed up && hack/testbed exec -- .venv/bin/python bench/autoscaling.py [--noise-minutes 30]

The sidecars are stand-ins (vlm_testing.autoscaling.BusySidecars: no SGLang runs on the testbed's fake nodes): each
Running pod's scheduler busy share is the service's load spread over its Running pods (capped at 1) plus Gaussian
noise, and changes once a sidecar window (15 s, the API's default telemetry interval), a new pod's first series
after its first window. Prometheus (2 s scrapes), KEDA's operator and metrics server, the HPA loop and the operator
are real. kwok makes a pod Ready the moment it is scheduled: a real pod's model load (minutes) adds to the time to a
Ready replica, and is what the stabilisation windows are sized against.

1. **Time from saturation to a Ready new replica**: 1 replica at load 0.5, then load 1.105 (every pod 100% busy):
   the time until `spec.replicas` is 2 (the decision) and until 2 are Ready; then the same from 2 to 3.
2. **Decisions under a noisy signal**: load at the boundary of 3 replicas (2.55 schedulers: 85% a pod) with noise
   of `--noise` (0.15: a pod's share between 55% and 100% most windows) for `--noise-minutes`: every change of
   `spec.replicas` (a decision), the reversals (a change against the previous one's direction), and the most
   reversals in any one scale-down stabilisation window. Target: at most one.

Prints a table and writes out/autoscaling.json (every decision with its time)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kubernetes import client, config

from vlm_operator.api import names
from vlm_testing.autoscaling import SIDECAR_CADENCE_S, BusySidecars, free_port, prometheus
from vlm_testing.cluster import Cluster, wait_for
from vlm_testing.keda import Keda
from vlm_testing.operator_proc import GROUP, PLURAL, VERSION, OperatorProcess, install_crd, pod_network_here
from vlm_testing.specs import MINIMAL

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "bench-autoscaling"
TARGET = 0.85  # the shipped default target: the scheduler's busy share a replica
# name -> spec.autoscaling beyond min/max: ours at the shipped defaults, and the HPA's own defaults.
SERVICES = {"shipped": {},
            "hpa-defaults": {"scaleUpStabilization": "0s", "scaleDownStabilization": "5m"}}
WINDOW_S = {"shipped": 600.0, "hpa-defaults": 300.0}  # each one's scale-down stabilisation window


def testbed_cluster() -> Cluster:
    info = json.loads(subprocess.run([sys.executable, str(REPO / "hack" / "testbed"), "env", "--json"],
                                     capture_output=True, text=True, check=True).stdout)
    return Cluster(kubeconfig=Path(info["KUBECONFIG"]), bin_dir=Path(info["VLM_TESTBED_BIN"]),
                   run_dir=Path(info["VLM_TESTBED_DIR"]), api_url=info["VLM_TESTBED_API"], started_here=False,
                   netns=info.get("VLM_TESTBED_NETNS", ""), pod_cidr=info.get("VLM_TESTBED_POD_CIDR", ""))


class Recorder(threading.Thread):
    """Each service's spec.replicas and readyReplicas once a second, with the time each changed."""

    def __init__(self, api: client.CustomObjectsApi, names_: list[str]):
        super().__init__(daemon=True)
        self.api, self.names = api, names_
        self.now: dict[str, tuple[int, int]] = {}
        self.changes: dict[str, list[tuple[float, int]]] = {n: [] for n in names_}
        self.ready_at: dict[str, list[tuple[float, int]]] = {n: [] for n in names_}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            for n in self.names:
                try:
                    obj = self.api.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, n)
                except client.ApiException:
                    continue
                want = int(obj["spec"].get("replicas") or 0)
                ready = int((obj.get("status") or {}).get("readyReplicas") or 0)
                before = self.now.get(n, (None, None))
                t = time.time()
                if want != before[0]:
                    self.changes[n].append((t, want))
                if ready != before[1]:
                    self.ready_at[n].append((t, ready))
                self.now[n] = (want, ready)

    def when(self, name: str, replicas: int, since: float, ready: bool = False) -> float | None:
        for t, v in (self.ready_at if ready else self.changes)[name]:
            if t >= since and v == replicas:
                return t - since
        return None


def reversals(changes: list[tuple[float, int]], since: float, window_s: float) -> tuple[int, int, int]:
    """(decisions, reversals, the most reversals in any window of window_s) among the changes after `since`: a
    decision is a change of the count, a reversal one against the direction of the decision before it."""
    before = [v for t, v in changes if t < since]
    last, last_dir = (before[-1] if before else None), 0
    decisions, rev_t = 0, []
    for t, v in changes:
        if t < since or last is None or v == last:
            last = v if last is None else last
            continue
        d = 1 if v > last else -1
        decisions += 1
        if last_dir and d != last_dir:
            rev_t.append(t)
        last, last_dir = v, d
    most = max((sum(1 for u in rev_t if t <= u < t + window_s) for t in rev_t), default=0)
    return decisions, len(rev_t), most


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--noise", type=float, default=0.15)
    ap.add_argument("--noise-minutes", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(REPO / "out" / "autoscaling.json"))
    args = ap.parse_args()
    if not pod_network_here():
        print("run inside the testbed's network namespace: hack/testbed exec -- .venv/bin/python "
              "bench/autoscaling.py (KEDA's metrics server listens on a pod-network address)", file=sys.stderr)
        return 2
    cluster = testbed_cluster()
    kube = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    custom = client.CustomObjectsApi(kube)
    install_crd(cluster.kubectl)
    cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=180)
    cluster.kubectl("create", "namespace", NAMESPACE)
    tmp = Path(tempfile.mkdtemp(prefix="bench-autoscaling-"))
    keda = Keda(cluster, tmp).start()
    sides = {n: BusySidecars(kube, NAMESPACE, n, cadence_s=SIDECAR_CADENCE_S, seed=args.seed) for n in SERVICES}
    servers = {n: s.serve() for n, s in sides.items()}
    op_port = free_port()
    prom_url, prom = prometheus(tmp, [p for p, _ in servers.values()], op_port)
    op = OperatorProcess(cluster.kubeconfig, NAMESPACE, tmp / "operator.log",
                         {"VLM_AUTOSCALING_PROMETHEUS_URL": prom_url, "VLM_METRICS_PORT": str(op_port),
                          "VLM_RESYNC_SECONDS": "15"}).start()
    rec = Recorder(custom, list(SERVICES))
    result: dict = {"defaults": {"target": TARGET, "scaleUpStabilization": "1m", "scaleDownStabilization": "10m",
                                 "pollingInterval": "30s", "sidecarWindowS": SIDECAR_CADENCE_S,
                                 "operatorResyncS": 15},
                    "services": SERVICES, "noise": args.noise, "noiseMinutes": args.noise_minutes}
    t_start = time.time()
    try:
        for n, extra in SERVICES.items():
            sides[n].load = 0.5
            body = {"apiVersion": names.API_VERSION, "kind": names.KIND,
                    "metadata": {"name": n, "namespace": NAMESPACE},
                    "spec": {**MINIMAL, "replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 4, **extra}}}
            custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
        rec.start()
        for n in SERVICES:
            wait_for(lambda n=n: any(c["type"] == "Autoscaling" and c["status"] == "True" for c in
                                     (custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, n)
                                      .get("status") or {}).get("conditions") or []), 180, f"{n} Autoscaling=True")
            wait_for(lambda n=n: rec.now.get(n, (0, 0))[1] == 1, 180, f"{n}: 1 replica Ready")
        # The HPA has read the metric at least once (it exists and reports a current value).
        wait_for(lambda: all(((custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, n)
                               .get("status") or {}).get("autoscaling") or {}).get("currentReplicas")
                             for n in SERVICES), 180, "every HPA reading its metric", interval=2)
        time.sleep(60)
        # 1. Saturation to a Ready new replica, 1 -> 2 and 2 -> 3.
        part1: dict[str, list[dict]] = {n: [] for n in SERVICES}
        for k, load in ((2, 1.105), (3, 2.21)):
            t0 = time.time()
            for s in sides.values():
                s.load = load
            wait_for(lambda k=k: all(rec.now.get(n, (0, 0))[1] >= k for n in SERVICES), 600,
                     f"{k} replicas Ready in every service", interval=1)
            for n in SERVICES:
                part1[n].append({"from": k - 1, "to": k, "load": load,
                                 "decision_s": rec.when(n, k, t0), "ready_s": rec.when(n, k, t0, ready=True)})
            print(f"[bench] {k - 1} -> {k}: {json.dumps({n: part1[n][-1] for n in SERVICES})}", flush=True)
            time.sleep(30)
        result["part1"] = part1
        # 2. A noisy signal at the boundary of 3 replicas.
        t_noise = time.time()
        for s in sides.values():
            s.load, s.noise = 3 * TARGET, args.noise
        time.sleep(args.noise_minutes * 60)
        part2 = {}
        for n in SERVICES:
            d, r, most = reversals(rec.changes[n], t_noise, WINDOW_S[n])
            part2[n] = {"decisions": d, "reversals": r, "most_reversals_in_a_window": most,
                        "window_s": WINDOW_S[n], "decisions_per_hour": round(d * 60 / args.noise_minutes, 1),
                        "replicas": [(round(t - t_noise), v) for t, v in rec.changes[n] if t >= t_noise]}
            print(f"[bench] noise {n}: {json.dumps(part2[n])}", flush=True)
        result["part2"] = part2
        result["timeline"] = {n: [(round(t - t_start, 1), v) for t, v in rec.changes[n]] for n in SERVICES}
        result["elapsed_s"] = round(time.time() - t_start)
    finally:
        rec.stop.set()
        op.stop()
        prom.terminate()
        for _, srv in servers.values():
            srv.shutdown()
        keda.stop()
        cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"\n| service | 1->2 decision | 1->2 Ready | 2->3 decision | 2->3 Ready | decisions/h (noise "
          f"{args.noise}) | reversals | most in one scale-down window |")
    print("|---|---|---|---|---|---|---|---|")
    for n in SERVICES:
        a, b = result["part1"][n]
        p = result["part2"][n]
        print(f"| {n} | {a['decision_s']:.0f} s | {a['ready_s']:.0f} s | {b['decision_s']:.0f} s | "
              f"{b['ready_s']:.0f} s | {p['decisions_per_hour']} | {p['reversals']} | "
              f"{p['most_reversals_in_a_window']} ({p['window_s'] / 60:.0f} min) |")
    print(f"\nwrote {out} ({result['elapsed_s']} s)")
    ok = result["part2"]["shipped"]["most_reversals_in_a_window"] <= 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
