"""A fake of the operator's own `Kube` wrapper (vlm_operator.apply), so `reconcile.reconcile` runs without
an API server.

It keeps objects in a dict, applies and patches with the same no-op rules as `Kube` (`is_subset` against the
observed object, `status_patch` for the status), records every write, and plays the parts of the cluster
the reconcile reads through kopf indexes: `observed()` builds the `Observed` of a service from what was
applied, and `settle()` plays the Deployment controller and the kubelet (every Deployment rolled out, its
pods Ready with a pod IP).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vlm_operator import api, builders
from vlm_operator.apply import is_subset, status_patch
from vlm_operator.errors import PermanentError, TemporaryError
from vlm_operator.observed import Observed, PodInfo
from vlm_operator.reconcile import Target

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
    gpus: int = 0  # what free_gpus answers
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

    def free_gpus(self, product: str, resource: str = "nvidia.com/gpu") -> int:
        self.free_gpu_calls += 1
        return self.gpus

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
        """role -> Deployment of one service (all services when `service` is None)."""
        out = {}
        for (_, kind, ns, _name), obj in self.objects.items():
            labels = obj["metadata"].get("labels") or {}
            if kind == "Deployment" and ns == namespace and (service is None or labels.get(builders.LABEL_SERVICE) == service):
                out[labels.get(builders.LABEL_ROLE, "")] = obj
        return out

    def settle(self, name: str, namespace: str = "ns", *, ready: bool = True) -> None:
        """Every Deployment of the service rolled out (all replicas updated; Ready when `ready`)."""
        for d in self.deployments(namespace, name).values():
            want = int(d["spec"].get("replicas") or 0)
            d["status"] = {
                "observedGeneration": d["metadata"]["generation"],
                "replicas": want,
                "updatedReplicas": want,
                "readyReplicas": want if ready else 0,
                "availableReplicas": want if ready else 0,
            }

    def pods(self, name: str, namespace: str = "ns") -> list[PodInfo]:
        """The pods the settled Deployments run (none before `settle`): `<deployment>-<i>`, IP 10.0.<d>.<i>,
        the first `readyReplicas` of them Ready."""
        out = []
        for d_index, (role, d) in enumerate(sorted(self.deployments(namespace, name).items())):
            labels = d["spec"]["template"]["metadata"]["labels"]
            st = d.get("status") or {}
            for i in range(int(st.get("replicas") or 0)):
                out.append(PodInfo(f"{d['metadata']['name']}-{i}", role, labels.get(builders.LABEL_REVISION, ""),
                                   "Running", i < int(st.get("readyReplicas") or 0), ip=f"10.0.{d_index}.{i}"))
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
        )

    def written(self, verb: str | None = None, kind: str | None = None) -> list[Write]:
        return [w for w in self.writes if (verb is None or w.verb == verb) and (kind is None or w.kind == kind)]

    def reset_writes(self) -> None:
        self.writes.clear()
