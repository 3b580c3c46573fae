#!/usr/bin/env python3
"""N VLMServices (default 1000) applied at once on the testbed, every pod with a live sidecar endpoint
on its own pod IP (a tenth of them dead: they accept the connection and never answer, as a sidecar
behind a NetworkPolicy or a hung pod does). Reported: time until every Deployment exists, until every
service has a status, operator peak RSS and average CPU, API writes per second in steady state, and
reconcile latency p50 / p99 (from the operator's own histogram).

    hack/testbed up && hack/testbed exec -- python bench/operator_scale.py [--count 1000] [--dead 0.1]

Runs inside the testbed's network namespace (pod IPs are addresses there); adds kwok GPU nodes with room
for every pod and removes them after. It follows Deployments (metadata only) and pods with a list and a watch
each (raw JSON), so its own load on the API server and on the machine stays small, and reports when a quarter,
half, 90% and all of the Deployments existed (deployments_seen_s), the same for the Services (services_seen_s)
and, where the Prometheus Operator's CRDs exist, the PodMonitors and PrometheusRules; it starts once a previous big run's namespace
(50 pods or more) is gone. The steady state is measured once every service has converged (Progressing False:
the controller-manager has caught up with every Deployment), and reports which status fields its writes
changed (steady_status_changes). The operator runs at its
shipped settings (resync 15 s, sidecar timeout 1 s); the services at the API defaults (telemetry every 15 s). The sidecar endpoints answer
`/windows.json` with a new window per telemetry interval, like the real sidecar. Prints a table and
writes out/operator_scale.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client, config

from vlm_testing.operator_proc import GROUP, PLURAL, VERSION, OperatorProcess, install_crd, pod_network_here

REPO = Path(__file__).resolve().parents[1]

SIDECAR_PORT = 9400
PODS_PER_NODE = 100
BENCH_TAINT = "vlmops.dev/bench-scale"
BIG_PREVIOUS = 50  # pods left in a previous run's namespace that make a run wait for its deletion
TARGETS = {"all_deployments_s": 60.0, "steady_writes_per_s": 1.0, "operator_peak_rss_mib": 200.0,
           "reconcile_p99_s": 1.0}


def kubeconfig() -> Path:
    out = subprocess.run([sys.executable, str(REPO / "hack" / "testbed"), "env", "--json"], capture_output=True,
                         text=True, check=True).stdout
    return Path(json.loads(out)["KUBECONFIG"])


def rss_peak_kib(pid: int, field: str = "VmHWM") -> int:
    """Peak RSS (VmHWM), or with field="VmRSS" the RSS now, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def node(name: str) -> dict:
    # Room for PODS_PER_NODE pods at the API defaults (8 CPUs and 64 GiB for SGLang, 0.1 CPU and 128 MiB for
    # the sidecar), so every pod runs and every sidecar endpoint is mapped.
    alloc = {"cpu": str(9 * PODS_PER_NODE), "memory": f"{65 * PODS_PER_NODE}Gi", "pods": str(PODS_PER_NODE + 10),
             "nvidia.com/gpu": str(PODS_PER_NODE)}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"type": "kwok", "kubernetes.io/hostname": name,
                                "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        # Tainted: only the bench's services (which tolerate it) run here. Untainted, a test beside the bench's
        # smoke test on a shared testbed saw its pod of more GPUs than any node has scheduled on these.
        "spec": {"taints": [{"key": BENCH_TAINT, "value": "true", "effect": "NoSchedule"}]},
        "status": {"allocatable": alloc, "capacity": alloc},
    }


class Sidecars:
    """One asyncio loop serving /windows.json on <pod IP>:9400 for every pod it is given; `dead` ones accept
    and never answer."""

    def __init__(self, interval_s: float, dead_share: float, seed: int = 1):
        self.interval = interval_s
        self.dead_share = dead_share
        self.rng = random.Random(seed)
        self.loop = asyncio.new_event_loop()
        self.servers: dict[str, asyncio.base_events.Server] = {}
        self.dead: set[str] = set()
        self.requests = 0
        threading.Thread(target=self.loop.run_forever, name="sidecars", daemon=True).start()

    def windows(self) -> bytes:
        now = time.time()
        last = int(now // self.interval)
        out = [{"id": k, "end": k * self.interval, "samples": 1250, "loop_mean_seconds": 0.028 * (1 + 0.02 * (k % 3)),
                "loop_p95_seconds": 0.04, "iterations": 170, "stage_shares": {"run_batch": 0.6, "idle": 0.1},
                "function_shares": {"run_batch": 0.6}, "exported_functions": ["run_batch"], "stale": False}
               for k in range(last - 7, last + 1)]
        return json.dumps(out).encode()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, dead: bool) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            if dead:
                await asyncio.sleep(3600)
                return
            body = self.windows()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:  # `close` at the end of the run: a dead endpoint ends quietly (asyncio
            pass                        # logged each cancelled connection with a traceback)
        finally:
            writer.close()

    def add(self, ip: str) -> None:
        if ip in self.servers:
            return
        dead = self.rng.random() < self.dead_share
        if dead:
            self.dead.add(ip)

        async def start() -> asyncio.base_events.Server:
            return await asyncio.start_server(lambda r, w: self._handle(r, w, dead), ip, SIDECAR_PORT,
                                              reuse_address=True)

        self.servers[ip] = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)

    def close(self) -> None:
        async def shutdown() -> None:
            for srv in self.servers.values():
                srv.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


def metrics_text(op: OperatorProcess, timeout_s: float = 30.0, tries: int = 4) -> str:
    """The operator's /metrics, waiting longer than the test helper does and retrying: on a loaded 2-core
    machine a thousand services' series can take more than a few seconds to come."""
    for attempt in range(tries):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=timeout_s) as r:
                return r.read().decode()
        except OSError as e:
            if attempt == tries - 1:
                raise
            print(f"[bench] reading /metrics failed ({e}), again", file=sys.stderr)
            time.sleep(2.0)
    raise AssertionError("unreachable")


def metric_sum(op: OperatorProcess, name: str) -> float:
    total = 0.0
    for line in metrics_text(op).splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def histogram(op: OperatorProcess, name: str) -> dict[float, float]:
    """le -> cumulative count, summed over label sets."""
    out: dict[float, float] = {}
    for line in metrics_text(op).splitlines():
        if line.startswith(f"{name}_bucket{{"):
            le_text = line.split('le="', 1)[1].split('"', 1)[0]
            le = float("inf") if le_text == "+Inf" else float(le_text)
            out[le] = out.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """Upper bucket bound holding the q-quantile of the observations between two histogram readings."""
    les = sorted(after)
    counts = [after[le] - before.get(le, 0.0) for le in les]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    for le, c in zip(les, counts, strict=True):
        if c >= q * total:
            return le
    return les[-1]


META = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
META_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


def status_changes(before: dict[str, dict], after: dict[str, dict]) -> dict[str, int]:
    """{status field (conditions as conditions.<type>, profiler as profiler.<key>): services whose value changed}."""
    out: dict[str, int] = {}

    def count(key: str) -> None:
        out[key] = out.get(key, 0) + 1

    for name, new in after.items():
        old = before.get(name, {})
        for key in sorted(set(old) | set(new)):
            if old.get(key) == new.get(key):
                continue
            if key == "conditions":
                was = {c["type"]: c for c in old.get(key) or []}
                for c in new.get(key) or []:
                    w = was.get(c["type"]) or {}
                    if w != c:
                        count(f"conditions.{c['type']} {w.get('status')}/{w.get('reason')} -> "
                              f"{c.get('status')}/{c.get('reason')}")
            elif key == "profiler" and isinstance(new.get(key), dict):
                for k in sorted(set(old.get(key) or {}) | set(new[key])):
                    if (old.get(key) or {}).get(k) != new[key].get(k):
                        count(f"profiler.{k}")
            else:
                count(key)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def get_json(api: client.ApiClient, path: str, accept: str | None = None) -> dict:
    _, url, headers, _, _ = api.param_serialize("GET", path, header_params={"Accept": accept} if accept else None,
                                                auth_settings=["BearerToken"])
    r = api.rest_client.pool_manager.request("GET", url, headers=headers, timeout=60)
    if r.status != 200:
        raise RuntimeError(f"GET {path}: {r.status} {r.data[:200]!r}")
    return json.loads(r.data)


def watch_json(api: client.ApiClient, path: str, rv: str, stop: threading.Event, accept: str | None = None):
    """The watch events of `path` from resourceVersion `rv`, as dicts, until the server ends the watch (at most
    20 s, so the caller can stop within that) or `stop` is set."""
    _, url, headers, _, _ = api.param_serialize(
        "GET", path, query_params=[("watch", "1"), ("resourceVersion", rv), ("timeoutSeconds", "20")],
        header_params={"Accept": accept} if accept else None, auth_settings=["BearerToken"])
    r = api.rest_client.pool_manager.request("GET", url, headers=headers, preload_content=False, timeout=90)
    try:
        if r.status != 200:
            raise RuntimeError(f"watch {path}: {r.status}")
        buf = b""
        for chunk in r.stream(65536):
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line.strip():
                    yield json.loads(line)
            if stop.is_set():
                return
    finally:
        r.release_conn()


def follow(api: client.ApiClient, path: str, see: Callable[[str, dict], None], stop: threading.Event,
           metadata_only: bool = False) -> None:
    """List `path` once, then watch it, calling `see(event type, object)` for every object as it changes (the
    list's objects as ADDED), until `stop` is set: each change arrives once, where a list every second or few
    had the API server encode, and this process decode, every object each time (load the bench added to what
    it measures). `metadata_only` asks for the objects' metadata alone."""
    rv = ""
    while not stop.is_set():
        try:
            if not rv:
                listed = get_json(api, path, META_LIST if metadata_only else None)
                for o in listed.get("items") or []:  # null when there are none yet
                    see("ADDED", o)
                rv = listed["metadata"]["resourceVersion"]
            for event in watch_json(api, path, rv, stop, META if metadata_only else None):
                if event["type"] == "ERROR":  # 410 Gone: list again
                    rv = ""
                    break
                rv = event["object"]["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    see(event["type"], event["object"])
        except Exception as e:  # keep following through API hiccups
            print(f"[bench] watch of {path} failed: {e}", file=sys.stderr)
            rv = ""
            stop.wait(2.0)


class Counted:
    """The names of the objects a `follow` has seen and not seen deleted; `wait(n)` until there are n."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.first_seen: list[float] = []  # when each name was first seen (time.time())
        self.cond = threading.Condition()

    def see(self, type_: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        with self.cond:
            if type_ == "DELETED":
                self.names.discard(name)
            elif name not in self.names:
                self.names.add(name)
                self.first_seen.append(time.time())
            self.cond.notify_all()

    def curve(self, t0: float, n: int) -> dict[str, float]:
        """Seconds from t0 until a quarter, half, 90% and all of n objects had been seen: where the time goes."""
        seen = sorted(self.first_seen)
        return {f"{int(q * 100)}%": round(seen[max(0, math.ceil(q * n) - 1)] - t0, 1)
                for q in (0.25, 0.5, 0.9, 1.0) if len(seen) >= q * n}

    def wait(self, n: int, timeout_s: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.names) >= n, timeout_s)


def release(co: client.CustomObjectsApi, ns: str) -> None:
    """Drop kopf's finalizer from every service: the operator is stopped before the namespace goes, and its
    finalizer (kopf adds one for the resync timer) would keep the namespace Terminating, and its objects loading
    the API server, for good."""
    items = co.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _request_timeout=120)["items"]
    patch = {"metadata": {"finalizers": None}}
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda o: co.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, o["metadata"]["name"],
                                                                  patch), items))


# Every service's, in every mode; it tolerates the bench nodes' taint.
SPEC = {"model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"}, "replicas": 1,
        "gpu": {"tolerations": [{"key": BENCH_TAINT, "operator": "Exists", "effect": "NoSchedule"}]}}


def direct_objects(ns: str, i: int, monitoring: bool, settings=None) -> list[dict]:
    """What the operator writes for a new service `svc-<i>` at SPEC (its Service, its one Deployment, its
    NetworkPolicy, and where the Prometheus Operator's CRDs exist its PodMonitor and PrometheusRule), built by
    the operator's own builders, without owner references (the garbage collector would remove what names a
    missing owner). Pure: tests/unit/bench/test_operator_scale.py holds it to what a reconcile writes."""
    from vlm_operator.api import v1alpha1 as vapi
    from vlm_operator.api.settings import Settings
    from vlm_operator.desired import alerts
    from vlm_operator.desired import builders as B

    settings = settings or Settings()
    spec = vapi.parse_spec(SPEC)
    owner = B.Owner(f"svc-{i:04d}", ns, f"00000000-0000-0000-0000-{i:012d}")
    d = B.build_desired(owner, spec, settings)
    out = [d.service, B.build_deployment(owner, d.template, d.revision, spec.replicas),
           *([d.network_policy] if d.network_policy else []), *([d.pdb] if d.pdb else [])]
    if monitoring:
        out += [B.build_pod_monitor(owner, settings.monitoring_labels, spec.telemetry.interval),
                alerts.build_prometheus_rule(owner.name, ns, {}, B.common_labels(owner),
                                             extra_labels=settings.monitoring_labels, overrides=settings.alert_overrides)]
    for o in out:
        o["metadata"].pop("ownerReferences", None)
    return out


# What the operator writes of its own for a new service besides its objects: the status (one merge patch, here a
# first status of its size and shape) and kopf's record of the handled spec (one annotation merge patch).
FIRST_STATUS = {"observedGeneration": 1, "phase": "Pending", "replicas": 1, "readyReplicas": 0,
                "selector": "serving.vlmops.dev/vlmservice=svc", "stableRevision": "0123456789",
                "sglang": {"image": "lmsysorg/sglang:v0.5.23", "version": "0.5.23"},
                "conditions": [{"type": t, "status": "False", "reason": "ReplicasNotReady", "observedGeneration": 1,
                                "lastTransitionTime": "2026-01-01T00:00:00Z", "message": "0/1 replicas ready"}
                               for t in ("Ready", "Degraded", "Progressing", "IPCCacheActive", "ModelReady")]}
KOPF_ANNOTATION = "serving.vlmops.dev/last-applied-spec"  # the operator's kopf diff base (controller/handlers.py)


def vlmservice(ns: str, i: int) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLMService",
            "metadata": {"name": f"svc-{i:04d}", "namespace": ns}, "spec": SPEC}


def direct(ns: str, count: int, deployments: Counted, kube=None, everything: bool = False) -> dict:
    """The operator's writes for `count` new services, from a client that does nothing else (`kube`: the
    operator's `Kube` on the testbed's kubeconfig unless given, e.g. a fake in the unit test). With
    `everything` (--direct-all), every request a new service costs the API server through an operator, in the
    operator's order: the VLMService created (as the operator mode's bench does), its objects, its first status
    and kopf's annotation, with no operator computing anything: the floor all_objects_s is held to."""
    if kube is None:
        from vlm_operator.cluster.client import Kube
        from vlm_operator.cluster.connection import Connection

        kube = Kube(Connection(pool_size=16), "bench-direct")
    # The operator writes a PodMonitor and a PrometheusRule too where the Prometheus Operator's CRDs exist.
    monitoring = kube.crd_exists("podmonitors.monitoring.coreos.com") and not os.environ.get("BENCH_DIRECT_NO_MONITORING")

    def one(i: int) -> None:
        if everything:
            kube.apply(vlmservice(ns, i), None)
        objs = direct_objects(ns, i, monitoring)
        if everything:  # the operator's order: the policy before the Deployment, the Service after it
            order = ["NetworkPolicy", "PodDisruptionBudget", "Deployment", "Service", "PodMonitor", "PrometheusRule"]
            objs.sort(key=lambda o: order.index(o["kind"]))
        for o in objs:
            kube.apply(o, None)
        if everything:
            name = f"svc-{i:04d}"
            kube.patch_status(ns, name, {}, FIRST_STATUS)
            kube.request_json("PATCH", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}/{name}",
                              body={"metadata": {"annotations": {KOPF_ANNOTATION: json.dumps({"spec": SPEC})}}},
                              content_type="application/merge-patch+json")

    t0 = time.time()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(count)))
    t_written = time.time() - t0
    if not deployments.wait(count, 900):
        raise SystemExit(f"only {len(deployments.names)} of {count} Deployments after 900 s")
    # (every write answered is every object there: all_objects_s, the floor the operator's is held to)
    return {"services": count, "direct_writes_s": round(t_written, 1), "all_objects_s": round(t_written, 1),
            "direct_all_deployments_s": round(time.time() - t0, 1), "deployments_seen_s": deployments.curve(t0, count),
            "writes_per_service": len(direct_objects(ns, 0, monitoring)) + (3 if everything else 0),
            "monitoring": monitoring, "everything": everything}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--dead", type=float, default=0.1, help="share of sidecars that never answer")
    p.add_argument("--steady", type=float, default=120.0, help="seconds of steady state measured")
    p.add_argument("--direct", action="store_true",
                   help="no operator: write the objects it would write for each service (Service, Deployment, "
                        "NetworkPolicy, server-side apply on 16 threads, like its handler threads) and time them: "
                        "what this control plane allows, the floor for all_deployments_s")
    p.add_argument("--direct-all", action="store_true",
                   help="--direct with every other request a new service costs through an operator: the VLMService "
                        "created, its first status and kopf's annotation (3 more per service): the like-for-like "
                        "floor for the operator's all_objects_s")
    p.add_argument("--burst-only", action="store_true",
                   help="stop once every object of every service exists (all_objects_s, against --direct's floor); "
                        "no statuses, convergence or steady state")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra environment for the operator (an experiment; the default is the shipped settings)")
    p.add_argument("--json", type=Path, default=None,
                   help="where the result goes (default out/operator_scale.json, with --direct out/operator_scale_direct.json)")
    a = p.parse_args()
    if not pod_network_here():
        raise SystemExit("run inside the testbed's network namespace: hack/testbed exec -- python "
                         "bench/operator_scale.py (pod IPs must be addresses for the sidecar endpoints)")
    kc = kubeconfig()
    os.environ["KUBECONFIG"] = str(kc)  # the testbed's, for --direct's own connection (kubeconn reads it)
    api = config.new_client_from_config(config_file=str(kc))
    core, co = client.CoreV1Api(api), client.CustomObjectsApi(api)

    def kubectl(*args: str) -> str:
        cache = Path(os.environ.get("VLM_CACHE") or Path.home() / ".cache" / "vlm-operator")
        return subprocess.run([str(cache / "bin" / "kubectl"), f"--kubeconfig={kc}", *args],
                              capture_output=True, text=True, check=True).stdout

    install_crd(kubectl)
    # A previous run's namespace (1000 services, their objects and pods) takes minutes to be deleted; a run
    # started meanwhile shares the API server and the controller-manager with that deletion. A small one's (the
    # tests' 3 services) costs them nothing to speak of, but still takes the namespace controller a minute: not
    # waited for (the tests' four runs in a row waited 70 s each, 2026-12-07).
    def big_previous() -> list[str]:
        out = []
        for n in core.list_namespace().items:
            if n.metadata.name.startswith("bench-scale-"):
                pods = core.list_namespaced_pod(n.metadata.name, limit=BIG_PREVIOUS).items
                if len(pods) >= BIG_PREVIOUS:
                    out.append(n.metadata.name)
        return out

    t_wait = time.time()
    while big_previous():
        if time.time() - t_wait > 900:
            raise SystemExit("a previous bench-scale-* namespace is still there after 15 minutes")
        time.sleep(5)
    if time.time() - t_wait > 1:
        print(f"[bench] waited {time.time() - t_wait:.0f} s for a previous run's namespace to go", file=sys.stderr)
    nodes = [f"bench-gpu-{i}" for i in range(-(-a.count // PODS_PER_NODE))]
    for n in nodes:
        for attempt in range(60):  # a previous run's node of that name, deleted as it ended, may still be going
            try:
                core.create_node(node(n))
                break
            except client.ApiException as e:
                if e.status != 409 or attempt == 59:
                    raise
                time.sleep(1)
    ns = core.create_namespace({"metadata": {"generateName": "bench-scale-"}}).metadata.name
    tmp = Path(tempfile.mkdtemp(prefix="vlm-bench-"))
    sidecars = Sidecars(interval_s=15.0, dead_share=a.dead)
    # This checkout's operator, whatever the editable install points at.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), str(REPO / "sidecar"),
                                                *filter(None, [os.environ.get("PYTHONPATH")])])
    extra = dict(e.split("=", 1) for e in a.env)
    op = OperatorProcess(kc, ns, tmp / "operator.log", {"VLM_RESYNC_SECONDS": "15", **extra})
    stop = threading.Event()

    def see_pod(_type: str, pod: dict) -> None:
        st = pod.get("status") or {}
        if st.get("podIP") and st.get("phase") == "Running":
            sidecars.add(st["podIP"])

    deployments, services = Counted(), Counted()
    watched = [("pods", f"/api/v1/namespaces/{ns}/pods", see_pod, {}),
               ("deployments", f"/apis/apps/v1/namespaces/{ns}/deployments", deployments.see, {"metadata_only": True}),
               # (in a burst the operator creates a new service's Service at its next resync, after the Deployments)
               ("services", f"/api/v1/namespaces/{ns}/services", services.see, {"metadata_only": True})]
    # Where the Prometheus Operator's CRDs exist, each service gets a PodMonitor and a PrometheusRule too: when
    # all of those exist is reported as well (in a burst the operator creates them after the Deployments).
    monitoring = {kind: Counted() for kind in ("podmonitors", "prometheusrules")
                  if kubectl("get", "crd", "-o", "name").count(f"{kind}.monitoring.coreos.com")}
    watched += [(kind, f"/apis/monitoring.coreos.com/v1/namespaces/{ns}/{kind}", c.see, {"metadata_only": True})
                for kind, c in monitoring.items()]
    followers = [threading.Thread(target=follow, args=(api, path, see, stop), kwargs=kw, name=name, daemon=True)
                 for name, path, see, kw in watched]
    for f in followers:
        f.start()
    try:
        if a.direct or a.direct_all:
            result = direct(ns, a.count, deployments, everything=a.direct_all)
            out_name = "operator_scale_direct_all.json" if a.direct_all else "operator_scale_direct.json"
        else:
            op.start()
            print(f"[bench] operator pid {op.proc.pid}, log {op.log_path}", file=sys.stderr)
            cpu_start = cpu_seconds(op.proc.pid)
            t0 = time.time()
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda i: co.create_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL,
                    {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLMService", "metadata": {"name": f"svc-{i:04d}"},
                     "spec": SPEC}), range(a.count)))
            t_applied = time.time() - t0
            if not deployments.wait(a.count, 900 - (time.time() - t0)):
                raise SystemExit(f"only {len(deployments.names)} of {a.count} Deployments after 900 s")
            t_deploy = time.time() - t0
            # The creation burst: is the operator busy (a core is all one Python process gets) or waiting?
            burst_cpu, burst_writes = cpu_seconds(op.proc.pid) - cpu_start, metric_sum(op, "vlm_operator_api_writes_total")
            print(f"[bench] all {a.count} Deployments at {t_deploy:.1f} s, operator peak RSS "
                  f"{rss_peak_kib(op.proc.pid) / 1024:.0f} MiB", file=sys.stderr)
            for kind, c in [("Services", services), *monitoring.items()]:
                if not c.wait(a.count, 900 - (time.time() - t0)):
                    raise SystemExit(f"only {len(c.names)} of {a.count} {kind} after 900 s")
            t_objects = time.time() - t0
            print(f"[bench] every object of every service at {t_objects:.1f} s", file=sys.stderr)
            burst = {
                "services": a.count,
                "create_requests_s": round(t_applied, 1),
                "all_deployments_s": round(t_deploy, 1),
                "all_objects_s": round(max([t_deploy, *[c.curve(t0, a.count)["100%"]
                                                        for c in [services, *monitoring.values()]]]), 1),
                "deployments_seen_s": deployments.curve(t0, a.count),
                "services_seen_s": services.curve(t0, a.count),
                **{f"{kind}_seen_s": c.curve(t0, a.count) for kind, c in monitoring.items()},
                "burst_operator_cpu_cores": round(burst_cpu / t_deploy, 2),
                "burst_writes_per_service": round(burst_writes / a.count, 1),
                "operator_peak_rss_mib": round(rss_peak_kib(op.proc.pid) / 1024, 1),
                "operator_env": extra,
            }

            if a.burst_only:
                result, out_name = burst, "operator_scale_burst.json"
            else:
                def statuses() -> dict[str, dict]:
                    """Every service's status, by name (the one list each wait and the steady census read)."""
                    for attempt in range(5):  # a full list of 1000 services can break off on a loaded API server
                        try:
                            items = co.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _request_timeout=120)["items"]
                            return {o["metadata"]["name"]: o.get("status") or {} for o in items}
                        except Exception as e:
                            if attempt == 4:
                                raise
                            print(f"[bench] service list failed ({e}), again", file=sys.stderr)
                            time.sleep(3.0)
                    raise AssertionError("unreachable")

                def profiled() -> tuple[int, int]:
                    st = statuses().values()
                    return (sum(1 for s in st if s.get("observedGeneration")),
                            sum(1 for s in st if (s.get("profiler") or {}).get("lastSampleTime")))

                while profiled()[0] < a.count:
                    time.sleep(3)
                t_status = time.time() - t0
                print(f"[bench] all statuses at {t_status:.1f} s", file=sys.stderr)
                # Every pod mapped to an endpoint, then 95% of the live ones shown in status.profiler.
                # (allowing 1%: kwok may hand a recreated pod the IP of one still terminating)
                while (len(sidecars.servers) < a.count - max(1, a.count // 100)
                       or profiled()[1] < 0.95 * (len(sidecars.servers) - len(sidecars.dead))):
                    if time.time() - t0 > t_status + 300:
                        print(f"[bench] only {profiled()[1]} services profiled after 300 s", file=sys.stderr)
                        break
                    time.sleep(2)
                t_profiled = time.time() - t0
                # Converged: every service's Deployment caught up with (Progressing False: the controller-manager,
                # starved on a 2-core machine by the burst, can trail the creations by minutes; each catch-up is one
                # status write, which is the burst's tail, not the steady state).
                def converged() -> int:
                    return sum(1 for st in statuses().values() for c in st.get("conditions") or []
                               if c["type"] == "Progressing" and c["status"] == "False")

                while converged() < a.count and time.time() - t0 < t_profiled + 300:
                    time.sleep(3)
                t_converged = time.time() - t0
                time.sleep(30)  # past the first-read burst: dead sidecars are now remembered
                before = statuses()
                w0, h0 = metric_sum(op, "vlm_operator_api_writes_total"), histogram(op, "vlm_operator_reconcile_duration_seconds")
                c0, r0, s0 = cpu_seconds(op.proc.pid), metric_sum(op, "vlm_operator_reconcile_duration_seconds_count"), time.time()
                time.sleep(a.steady)
                # What the steady writes changed: per status field (conditions by type), how many services.
                changed = status_changes(before, statuses())
                if "VLM_TRACEMALLOC_DUMP" in extra:  # the operator writes its allocation sites on SIGUSR1
                    os.kill(op.proc.pid, signal.SIGUSR1)
                    time.sleep(20)
                w1, h1 = metric_sum(op, "vlm_operator_api_writes_total"), histogram(op, "vlm_operator_reconcile_duration_seconds")
                c1, r1, s1 = cpu_seconds(op.proc.pid), metric_sum(op, "vlm_operator_reconcile_duration_seconds_count"), time.time()
                result = {
                    **burst,
                    "sidecars_live": len(sidecars.servers) - len(sidecars.dead),
                    "sidecars_dead": len(sidecars.dead),
                    "all_status_s": round(t_status, 1),
                    "profiled_95pct_of_live_s": round(t_profiled, 1),
                    "all_converged_s": round(t_converged, 1),
                    "operator_peak_rss_mib": round(rss_peak_kib(op.proc.pid) / 1024, 1),
                    "operator_steady_rss_mib": round(rss_peak_kib(op.proc.pid, "VmRSS") / 1024, 1),
                    "steady_cpu_cores": round((c1 - c0) / (s1 - s0), 3),
                    "steady_reconciles_per_s": round((r1 - r0) / (s1 - s0), 1),
                    "steady_writes_per_s": round((w1 - w0) / (s1 - s0), 3),
                    "reconcile_p50_s": quantile(h0, h1, 0.5),
                    "reconcile_p99_s": quantile(h0, h1, 0.99),
                    "sidecar_requests": sidecars.requests,
                    "steady_status_changes": changed,
                }
                out_name = "operator_scale.json"
    finally:
        stop.set()
        for f in followers:
            f.join(30)  # not mid-request when the interpreter exits
        op.stop()
        sidecars.close()
        release(co, ns)
        core.delete_namespace(ns)
        for n in nodes:
            core.delete_node(n)
    path = a.json or REPO / "out" / out_name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    for k, v in result.items():
        goal = f"  (target <= {TARGETS[k]})" if k in TARGETS else ""
        print(f"{k:28s} {v}{goal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
