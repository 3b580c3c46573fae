"""The one fake cluster of the unit tier (and bench/rollout_moves.py): a fake of the operator's own `Kube` wrapper (vlm_operator.cluster.client), so `reconcile.reconcile` runs without
an API server.

It keeps objects in a dict, applies and patches with the same no-op rules as `Kube` (`is_subset` against the
observed object, `status_patch` for the status), records every write, and plays the parts of the cluster
the reconcile reads through kopf indexes: `observed()` builds the `Observed` of a service from what was
applied, and `settle()` plays the Deployment controller and the kubelet (every Deployment rolled out, its
pods Ready with a pod IP).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vlm_operator.analysis import sources
from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.errors import PermanentError, TemporaryError
from vlm_operator.api.settings import Settings
from vlm_operator.cluster.client import is_subset, status_patch
from vlm_operator.cluster.observed import JobInfo, Observed, PodInfo
from vlm_operator.controller import reconcile
from vlm_operator.controller.reconcile import Target
from vlm_operator.desired import builders

Key = tuple[str, str, str, str]  # (apiVersion, kind, namespace, name)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies a merge-patch+json body."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


@dataclass
class Write:
    verb: str  # apply | delete | status | annotation | refused (an apply the API server refused)
    kind: str
    namespace: str
    name: str
    body: Any = None


@dataclass
class FakeKube:
    gpus: int = 0  # no effect: free GPUs come from `nodes` (rooms); older tests still pass it
    objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    writes: list[Write] = field(default_factory=list)
    free_gpu_calls: int = 0
    revision: int = 0  # the last resourceVersion handed out
    conflicts: int = 0  # conditional status writes refused (the copy was outdated)
    fail_next: list[Exception] = field(default_factory=list)  # raised by the next writes, in order
    # What the API server says of an object (None to take it; an error message: its own validation refuses it,
    # a 422; or (code, message), e.g. 403 for RBAC, an admission policy or a quota): the apply raises
    # PermanentError(reason=f"Http{code}"), as `apply.classify` maps a 4xx other than 409 and 429.
    refuse: Any = None
    # The fake cluster's GPU nodes (name -> GPUs) and the pods its ReplicaSets, scheduler and kubelets made
    # (`settle`): (namespace, name) -> pod record.
    nodes: dict[str, int] = field(default_factory=lambda: {"node-0": 64})
    pod_store: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pod_counter: int = 0
    zones: dict[str, str] = field(default_factory=dict)
    # The HPA KEDA would make for a service's ScaledObject, as kopf's index would hold it: (namespace, name) -> info
    hpas: dict[tuple[str, str], Any] = field(default_factory=dict)

    # ------------------------------------------------------------- the KubeAPI the reconcile calls

    def _maybe_fail(self) -> None:
        if self.fail_next:
            raise self.fail_next.pop(0)

    def apply(self, obj: Mapping[str, Any], observed: Mapping[str, Any] | None) -> bool:
        if observed is not None and is_subset(obj, observed):
            return False
        self._maybe_fail()
        meta = obj["metadata"]
        if self.refuse is not None and (why := self.refuse(obj)):
            code, why = why if isinstance(why, tuple) else (422, why)
            self.writes.append(Write("refused", obj["kind"], meta["namespace"], meta["name"]))
            raise PermanentError(f"apply {obj['kind']} {meta['namespace']}/{meta['name']}: {code} {why}",
                                 reason=f"Http{code}")
        key = (obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        old = self.objects.get(key)
        new = copy.deepcopy(dict(obj))
        gen = int((old or {}).get("metadata", {}).get("generation") or 0)
        if old is None or old.get("spec") != new.get("spec"):
            gen += 1
        new["metadata"] = {**new["metadata"], "generation": gen, "uid": f"uid-{meta['name']}"}
        if old is not None and "status" in old:
            new["status"] = old["status"]
        self.objects[key] = new
        self.writes.append(Write("apply", obj["kind"], meta["namespace"], meta["name"], copy.deepcopy(dict(obj))))
        return True

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        key = (api_version, kind, namespace, name)
        if key not in self.objects:
            return False
        self._maybe_fail()
        del self.objects[key]
        self.writes.append(Write("delete", kind, namespace, name))
        return True

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((api_version, kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def patch_status(self, namespace: str, name: str, current: Mapping[str, Any], new: Mapping[str, Any],
                     resource_version: str | None = None) -> str | None:
        patch = status_patch(current, new)
        if patch is None:
            return None
        key = (f"{api.GROUP}/{api.VERSION}", api.KIND, namespace, name)
        if key not in self.objects:  # deleted meanwhile
            return None
        self._maybe_fail()
        obj = self.objects[key]
        if resource_version and resource_version != obj["metadata"].get("resourceVersion"):
            self.conflicts += 1
            raise TemporaryError(f"{namespace}/{name} changed since {resource_version}", reason="StaleCopy", delay=1)
        obj["status"] = merge_patch(obj.get("status") or {}, patch)
        self.writes.append(Write("status", api.KIND, namespace, name, copy.deepcopy(patch)))
        return self._bump(obj)

    def _bump(self, obj: dict[str, Any]) -> str:
        """A new resourceVersion for `obj` (one counter for the fake cluster, as etcd's revision is)."""
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        return str(self.revision)

    def clear_annotation(self, namespace: str, name: str, key: str) -> str | None:
        obj = self.objects.get((f"{api.GROUP}/{api.VERSION}", api.KIND, namespace, name))
        if obj is None:
            return
        self._maybe_fail()
        (obj["metadata"].get("annotations") or {}).pop(key, None)
        self.writes.append(Write("annotation", api.KIND, namespace, name, key))
        return self._bump(obj)

    def crd_exists(self, name: str) -> bool:
        return False

    def rooms(self, product: str, resource: str = "nvidia.com/gpu") -> dict[str, tuple[int, str]]:
        self.free_gpu_calls += 1
        used: dict[str, int] = {}
        for p in self.pod_store.values():
            if p["node"]:
                used[p["node"]] = used.get(p["node"], 0) + p["gpus"]
        return {n: (g - used.get(n, 0), self.zones.get(n, "")) for n, g in self.nodes.items()}

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        p = self.pod_store.get((namespace, name))
        if p is None:
            return False
        self._maybe_fail()
        meta = patch.get("metadata") or {}
        p["labels"].update(meta.get("labels") or {})
        p["annotations"].update(meta.get("annotations") or {})
        spec = patch.get("spec") or {}
        if "schedulingGates" in spec:
            if not p["gated"]:
                raise PermanentError(f"pod {name}: schedulingGates may only be removed", reason="Http422")
            p["gated"] = False
        if "affinity" in spec:
            if not p["gated"] and "schedulingGates" not in spec:
                raise PermanentError(f"pod {name}: node affinity may only change while gated", reason="Http422")
            terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            p["pin"] = [v for t in terms for f in t.get("matchFields") or [] for v in f["values"]]
        self.writes.append(Write("patch", "Pod", namespace, name, copy.deepcopy(dict(patch))))
        return True

    # ------------------------------------------------------------- the test's side

    def create_vlmservice(
        self, name: str, spec: Mapping[str, Any], namespace: str = "ns", annotations: Mapping[str, str] | None = None
    ) -> None:
        self.objects[(f"{api.GROUP}/{api.VERSION}", api.KIND, namespace, name)] = {
            "apiVersion": f"{api.GROUP}/{api.VERSION}",
            "kind": api.KIND,
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1,
                         "annotations": dict(annotations or {})},
            "spec": copy.deepcopy(dict(spec)),
            "status": {},
        }
        self._bump(self.objects[(f"{api.GROUP}/{api.VERSION}", api.KIND, namespace, name)])

    def vlmservice(self, name: str, namespace: str = "ns") -> dict[str, Any]:
        return self.objects[(f"{api.GROUP}/{api.VERSION}", api.KIND, namespace, name)]

    def update_spec(self, name: str, spec: Mapping[str, Any], namespace: str = "ns") -> None:
        obj = self.vlmservice(name, namespace)
        obj["spec"] = copy.deepcopy(dict(spec))
        obj["metadata"]["generation"] += 1
        self._bump(obj)

    def annotate(self, name: str, key: str, value: str, namespace: str = "ns") -> None:
        obj = self.vlmservice(name, namespace)
        obj["metadata"].setdefault("annotations", {})[key] = value
        self._bump(obj)

    def target(self, name: str, namespace: str = "ns") -> Target:
        obj = copy.deepcopy(self.vlmservice(name, namespace))
        meta = obj["metadata"]
        return Target(name, namespace, meta["uid"], meta.get("generation"), obj["spec"], obj.get("status") or {},
                      meta.get("annotations") or {}, meta.get("resourceVersion"))

    def deployments(self, namespace: str = "ns", service: str | None = None) -> dict[str, dict[str, Any]]:
        """revision (or "baseline" for the fresh baseline's) -> Deployment of one service (all services when
        `service` is None), as the operator's index keys them."""
        out = {}
        for (_, kind, ns, _name), obj in self.objects.items():
            labels = obj["metadata"].get("labels") or {}
            if kind == "Deployment" and ns == namespace and (service is None or labels.get(builders.LABEL_SERVICE) == service):
                key = "baseline" if labels.get(builders.LABEL_ROLE) == "baseline" else labels.get(builders.LABEL_REVISION, "")
                out[key] = obj
        return out

    def deployment(self, name: str, role: str, namespace: str = "ns") -> dict[str, Any]:
        """The service's Deployment of a role, as its status names the revisions (stable, canary, baseline)."""
        st = self.vlmservice(name, namespace).get("status") or {}
        rev = {"stable": st.get("stableRevision"), "canary": st.get("canaryRevision"), "baseline": "baseline"}[role]
        return self.deployments(namespace, name)[rev]

    def _gpus(self, d: Mapping[str, Any]) -> int:
        n = 0
        for c in d["spec"]["template"]["spec"].get("containers", []):
            n += int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
        return n

    def settle(self, name: str, namespace: str = "ns", *, ready: bool = True, rounds: int = 3) -> None:
        """What the ReplicaSets, the scheduler and the kubelets would do: each Deployment's pods made up to its
        replicas (behind its template's scheduling gates) or removed down to it (lowest deletion cost first, then
        not Ready, then the newest), released pods placed on their pinned node or the first with a free GPU (none
        free: unschedulable), placed pods Ready when `ready`. Pods whose Deployment was deleted go first (the
        garbage collector), so they no longer hold their GPUs."""
        owners = {obj["metadata"]["name"] for (_, kind, ns, _n), obj in self.objects.items()
                  if kind == "Deployment" and ns == namespace}
        for key, p in list(self.pod_store.items()):
            if p["namespace"] == namespace and p["owner"] not in owners:
                del self.pod_store[key]
        for _ in range(rounds):
            deps = self.deployments(namespace, name)
            for _key, d in sorted(deps.items()):
                dname = d["metadata"]["name"]
                mine = sorted((p for p in self.pod_store.values() if p["namespace"] == namespace and p["owner"] == dname),
                              key=lambda p: p["seq"])
                want = int(d["spec"].get("replicas") or 0)
                while len(mine) > want:
                    def rank(p: dict[str, Any]) -> tuple:
                        cost = int(p["annotations"].get("controller.kubernetes.io/pod-deletion-cost", "0"))
                        return (p["node"] is not None, p["ready"], cost, -p["seq"])
                    victim = min(mine, key=rank)
                    mine.remove(victim)
                    del self.pod_store[(namespace, victim["name"])]
                tmeta = d["spec"]["template"]["metadata"]
                gated = bool(d["spec"]["template"]["spec"].get("schedulingGates"))
                while len(mine) < want:
                    self.pod_counter += 1
                    pname = f"{dname}-{self.pod_counter}"
                    p = {"name": pname, "namespace": namespace, "owner": dname, "seq": self.pod_counter,
                         "labels": dict(tmeta.get("labels") or {}), "annotations": {}, "gated": gated, "node": None,
                         "pin": None, "ready": False, "gpus": self._gpus(d), "ip": f"10.0.0.{self.pod_counter % 250}"}
                    self.pod_store[(namespace, pname)] = p
                    mine.append(p)
            for p in sorted(self.pod_store.values(), key=lambda p: p["seq"]):
                if p["namespace"] != namespace or p["gated"] or p["node"]:
                    continue
                free = self.rooms("")
                for n in (p["pin"] or sorted(self.nodes)):
                    if n in free and free[n][0] >= p["gpus"]:
                        p["node"] = n
                        break
            for p in self.pod_store.values():
                if p["namespace"] == namespace and p["node"]:
                    p["ready"] = ready
        for d in self.deployments(namespace, name).values():
            dname = d["metadata"]["name"]
            mine = [p for p in self.pod_store.values() if p["namespace"] == namespace and p["owner"] == dname]
            nready = sum(1 for p in mine if p["ready"])
            d["status"] = {
                "observedGeneration": d["metadata"]["generation"],
                "replicas": len(mine),
                "updatedReplicas": len(mine),
                "readyReplicas": nready,
                "availableReplicas": nready,
            }

    def pods(self, name: str, namespace: str = "ns") -> list[PodInfo]:
        """The service's pods as the operator's index shows them (none before `settle`)."""
        out = []
        dnames = {d["metadata"]["name"] for d in self.deployments(namespace, name).values()}
        for p in sorted(self.pod_store.values(), key=lambda p: p["seq"]):
            if p["namespace"] != namespace or p["owner"] not in dnames:
                continue
            role = p["labels"].get(builders.LABEL_ROLE, "")
            out.append(PodInfo(
                p["name"], role, p["labels"].get(builders.LABEL_REVISION, ""), "Running" if p["node"] else "Pending",
                p["ready"], unschedulable=None if p["node"] or p["gated"] else "0/1 nodes are available: no free GPU",
                ip=p["ip"] if p["node"] else None, node=p["node"], gated=p["gated"],
                victim=p["annotations"].get("controller.kubernetes.io/pod-deletion-cost") == "-1000",
                labelled_role=role, affinity_nodes=tuple(p["pin"] or ())))
        return out

    def observed(self, name: str, namespace: str = "ns", *, pods: Sequence[PodInfo] | None = None) -> Observed:
        """What kopf's indexes would hold for the service: its Deployments, pods and Service, and which of its
        monitoring objects exist."""
        svc = self.objects.get(("v1", "Service", namespace, name))
        return Observed(
            deployments={role: copy.deepcopy(d) for role, d in self.deployments(namespace, name).items()},
            pods=tuple(self.pods(name, namespace) if pods is None else pods),
            service=copy.deepcopy(svc) if svc is not None else None,
            monitoring=frozenset(k for k in builders.MONITORING_KINDS
                                 if (builders.MONITORING_API_VERSION, k, namespace, name) in self.objects),
            jobs={k[3]: JobInfo.from_body(o) for k, o in self.objects.items()
                  if k[:3] == ("batch/v1", "Job", namespace)
                  and (o["metadata"].get("labels") or {}).get(builders.LABEL_SERVICE) == name},
            hpa=self.hpas.get((namespace, name)),
        )

    def written(self, verb: str | None = None, kind: str | None = None) -> list[Write]:
        return [w for w in self.writes if (verb is None or w.verb == verb) and (kind is None or w.kind == kind)]

    def reset_writes(self) -> None:
        self.writes.clear()


T0 = 1_800_000_000.0


SPEC = {"model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"}, "replicas": 2}


def no_sidecars(url: str, timeout: float):
    raise ConnectionRefusedError(f"nothing at {url}")


ROLLOUT = {
    **SPEC,
    "rollout": {"steps": [{"replicas": 1, "analysis": "2m"}],
                "analysis": {"interval": "1m", "maxDuration": "10m", "minSamples": 3}},
}


INTERVAL = 15.0


def window(k: int, loop: float, *, top: tuple[str, float] = ("run_batch", 0.6), jitter: float = 0.01) -> dict:
    wobble = 1 + jitter * ((k * 7) % 5 - 2) / 2  # deterministic +-jitter
    fn = {"event_loop_overlap": 0.99, "process_input_requests": 0.2, top[0]: top[1]}
    return {
        "id": k, "end": k * INTERVAL, "samples": 5000, "iterations": 250,
        "loop_mean_seconds": loop * wobble, "loop_p95_seconds": loop * 1.3 * wobble,
        "stage_shares": {"recv_requests": 0.05, "process_input_requests": 0.2, "get_next_batch_to_run": 0.05,
                         "run_batch": 0.6, "process_batch_result": 0.05, "idle": 0.05},
        "function_shares": fn,
    }


class Sidecars:
    """Answers /windows.json for the pods FakeKube runs; `loop(pod)` gives a pod's loop time, `dead` pods
    time out. Every call is counted per pod."""

    def __init__(self, kube: FakeKube, loop: Callable[[str], float] = lambda pod: 0.020, top=None, extra=None):
        self.kube, self.loop, self.top = kube, loop, top
        self.extra: Callable[[str, int], dict] | None = extra  # (pod, window) -> more keys of the window
        self.now = T0
        self.dead: set[str] = set()
        self.calls: dict[str, int] = {}

    def fetch(self, url: str, timeout: float):
        ip = url.split("//", 1)[1].split(":", 1)[0]
        pod = next(p for p in self.kube.pods("svc") if p.ip == ip)
        self.calls[pod.name] = self.calls.get(pod.name, 0) + 1
        if pod.name in self.dead:
            raise TimeoutError("timed out")
        last = int(self.now // INTERVAL)
        return [{**window(k, self.loop(pod.name), **({"top": self.top(k)} if self.top else {})),
                 **(self.extra(pod.name, k) if self.extra else {})}
                for k in range(last - 63, last + 1)]


class FakeCluster:
    """The one fake cluster of the unit tier: a FakeKube, the operator's Runtime over it, and one reconcile of one
    service at a time. `sidecars=True` puts fake sidecars (`Sidecars`, given `sidecar_kw`) behind the
    SidecarReader and waits for its background retries after each reconcile; otherwise `fetch` answers the
    reader (default: nothing listens)."""

    def __init__(self, spec=SPEC, *, gpus: int = 0, fetch=no_sidecars, settings: Settings | None = None, name="svc",
                 sidecars: bool = False, **sidecar_kw):
        self.kube = FakeKube(gpus=gpus)
        self.sidecars = Sidecars(self.kube, **sidecar_kw) if sidecars else None
        self.reader = sources.SidecarReader(timeout_s=0.2, workers=2,
                                            fetch=self.sidecars.fetch if self.sidecars else fetch)
        self.rt = reconcile.Runtime(kube=self.kube, settings=settings or Settings(), sidecars=self.reader)
        self.name = name
        self.events: list = []
        self.kube.create_vlmservice(name, spec)

    def run(self, now: float = T0, *, pods=None):
        if self.sidecars is not None:
            self.sidecars.now = now
        t = self.kube.target(self.name)
        observed = self.kube.observed(self.name, pods=pods)
        reconcile.reconcile(self.rt, t, observed, lambda *e: self.events.append(e), now=now)
        if self.sidecars is not None:
            self.reader.wait_idle()  # retries of failed pods run in the background

    def up(self, now: float) -> None:
        """The pods the Deployments ask for made, placed and Ready: the ReplicaSets make them behind the operator's
        scheduling gate (settle), a reconcile releases them, and the scheduler and kubelets run them (settle)."""
        self.kube.settle(self.name)
        self.run(now)
        self.kube.settle(self.name)

    @property
    def status(self) -> dict:
        return self.kube.vlmservice(self.name)["status"]

    def condition(self, type_: str) -> dict:
        return next(c for c in self.status["conditions"] if c["type"] == type_)

    def profiler_writes(self) -> int:
        return sum(1 for w in self.kube.written("status") if "profiler" in w.body)


class SidecarCluster(FakeCluster):
    """FakeCluster with fake sidecars behind the reader (`sidecar_kw`: Sidecars' loop, top, extra)."""

    def __init__(self, spec=SPEC, *, gpus: int = 0, settings: Settings | None = None, **sidecar_kw):
        super().__init__(spec, gpus=gpus, settings=settings, sidecars=True, **sidecar_kw)


def ready(c: SidecarCluster, t: float = T0) -> float:
    c.run(t - 30)
    place(c, t - 20)  # (a round before the pods have IPs: the next profiler read is one interval later)
    c.run(t + 1)
    return t + 1


def place(c: SidecarCluster, t: float) -> None:
    """The ReplicaSets' pods made (behind the operator's gate), released by a reconcile, then scheduled and Ready.
    That reconcile, the first with a stable revision, reads no sidecar (no pod has an IP yet) but spends the
    service's profiler read of the interval."""
    c.kube.settle("svc")
    c.run(t)
    c.kube.settle("svc")
