"""The only module that talks to the Kubernetes API server.

Server-side apply with one field manager; an object is applied only when the
desired fields are not already a subset of what the server has, so a resync
with nothing changed writes nothing. Errors are classified here: conflicts,
429 and 5xx are temporary, anything else from the server is permanent.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from vlm_operator.api import metrics
from vlm_operator.api.errors import PermanentError, TemporaryError
from vlm_operator.api.v1alpha1 import GROUP, PLURAL, VERSION
from vlm_operator.cluster.connection import ApiError

log = logging.getLogger("vlm_operator.cluster.client")

_PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "PodMonitor": "podmonitors",
    "PrometheusRule": "prometheusrules",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "NetworkPolicy": "networkpolicies",
    "Pod": "pods",
    "Job": "jobs",
    "ScaledObject": "scaledobjects",
    "VLMService": PLURAL,
}


def object_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{_PLURALS[kind]}"
    return f"{path}/{name}" if name else path


def is_subset(desired: Any, observed: Any) -> bool:
    """Every field we want is already there with the same value (server defaults may add more)."""
    if isinstance(desired, Mapping):
        return isinstance(observed, Mapping) and all(is_subset(v, observed.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(observed, list)
            and len(desired) == len(observed)
            and all(is_subset(d, o) for d, o in zip(desired, observed, strict=True))
        )
    if isinstance(desired, bool) or isinstance(observed, bool):
        return desired is observed  # True is not 1
    if isinstance(desired, int | float) and isinstance(observed, int | float):
        return desired == observed
    return desired == observed or (isinstance(desired, str) and str(observed) == desired and observed is not None)


def classify(e: ApiError, what: str) -> Exception:
    status = e.status or 0
    try:
        message = json.loads(e.body or b"{}").get("message") or e.reason
    except (ValueError, AttributeError):
        message = str(e.reason)
    metrics.ERRORS.labels(reason=f"Http{status}").inc()
    if status in (409, 429) or status >= 500 or status == 0:
        return TemporaryError(f"{what}: {status} {message}", reason=f"Http{status}", delay=5 if status == 409 else 15)
    return PermanentError(f"{what}: {status} {message}", reason=f"Http{status}")


# Characters a YAML decoder takes as they are, inside a double-quoted scalar: YAML's printable set, less the
# line breaks of YAML 1.1 (NEL, LS, PS) and the byte-order mark, which it would fold or drop.
_YAML_RAW = "\t\n\r\x20-\x7e\xa0-\u2027\u202a-\ufefe\uff00-\ufffd\U00010000-\U0010ffff"
_NOT_YAML_RAW = re.compile(f"[^{_YAML_RAW}]")


def yaml_json(obj: Any) -> bytes:
    """JSON that the API server's YAML decoder reads back as the same object (a server-side apply is YAML).

    Python's json writes a character outside the Basic Multilingual Plane as a surrogate-pair escape
    (`\\ud83d\\ude00`), which that decoder refuses ("found invalid Unicode character escape code"): a spec
    value such as an emoji in `model.path` or an env value made every apply of the Deployment fail. Here such
    characters are written as they are (UTF-8), and the few a YAML reader would not take raw (control
    characters, YAML 1.1's line breaks) as `\\uXXXX` escapes, which it does take."""
    text = json.dumps(obj, ensure_ascii=False)  # ", " and ": ": a YAML 1.1 reader wants the space after ":"
    return _NOT_YAML_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode()


def status_patch(current: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that turns status `current` into `new` (keys no longer set are nulled, at every depth:
    a merge patch keeps what it does not mention, so `rollout.analysisStartedAt` of a finished step would
    otherwise outlive the step); None when they are equal, so a resync that changes nothing writes nothing.
    `new` is as `status_body` makes it: no None values (the API server stores none)."""
    if current == new:
        return None
    return _with_nulls(current, new)


def _with_nulls(current: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = dict(new)
    for k, old in current.items():
        if k not in new:
            patch[k] = None
        elif isinstance(old, Mapping) and isinstance(new[k], Mapping):
            patch[k] = _with_nulls(old, new[k])
    return patch


# One write of a round, as the writer hands it to `send`: ("apply", obj, observed), ("delete", apiVersion, kind,
# namespace, name) or ("patch_pod", namespace, name, patch).
Op = tuple[Any, ...]


def send(kube: KubeAPI, ops: Sequence[Op]) -> None:
    """A round's writes, in order, through one client (the first refusal raises and stops the rest)."""
    for verb, *args in ops:
        if verb == "apply":
            kube.apply(*args)
        elif verb == "delete":
            kube.delete(*args)
        elif verb == "patch_pod":
            kube.patch_pod(*args)
        else:
            raise ValueError(f"not a write: {verb!r}")


class KubeAPI(Protocol):
    """What the reconcile needs of the API server: `Kube` in the operator, a fake in unit tests."""

    def apply(self, obj: Mapping[str, Any], observed: Mapping[str, Any] | None) -> bool: ...

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool: ...

    def patch_status(
        self, namespace: str, name: str, current: Mapping[str, Any], new: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> str | None: ...

    def clear_annotation(self, namespace: str, name: str, key: str) -> str | None: ...

    def rooms(self, product: str, resource: str = "nvidia.com/gpu") -> dict[str, tuple[int, str]]: ...

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool: ...


class Connection(Protocol):
    """What Kube needs of the wire: `cluster.connection.Connection` in the operator, a fake in unit tests."""

    def request(
        self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
        headers: Mapping[str, str] | None = None, body: bytes | None = None,
    ) -> bytes: ...


class Kube:
    """A thin, typed facade over the API server for the reconcile loop."""

    def __init__(self, conn: Connection, field_manager: str):
        self.conn = conn
        self.field_manager = field_manager

    def _call(
        self, method: str, path: str, *, body: Any = None, query: list | None = None, content_type: str | None = None
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
            if not isinstance(body, bytes):
                body = json.dumps(body).encode()
        if method != "GET":
            metrics.API_WRITES.labels(verb=method).inc()
        data = self.conn.request(method, path, query=query, headers=headers, body=body)
        return json.loads(data or b"null")

    def request_json(self, method: str, path: str, *, body: Any = None, query: list | None = None,
                     content_type: str | None = None) -> Any:
        """A request of a caller outside the reconcile (the webhook's certificate keeper, the judge), through the
        same connection: the answer as JSON (None when empty). An error answer raises `ApiError` as the server gave
        it: the caller knows what a 404 or a 409 means to it."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
            body = json.dumps(body).encode()
        data = self.conn.request(method, path, query=query, headers=headers, body=body)
        return json.loads(data) if data else None

    def apply(self, obj: Mapping[str, Any], observed: Mapping[str, Any] | None) -> bool:
        """Server-side apply `obj` unless `observed` already has it. Returns True when it wrote.
        The body is JSON written for the API server's YAML decoder (`yaml_json`)."""
        if observed is not None and is_subset(obj, observed):
            return False
        meta = obj["metadata"]
        what = f"apply {obj['kind']} {meta['namespace']}/{meta['name']}"
        try:
            self._call(
                "PATCH",
                object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]),
                body=yaml_json(obj),
                query=[("fieldManager", self.field_manager), ("force", "true")],
                content_type="application/apply-patch+yaml",
            )
        except ApiError as e:
            raise classify(e, what) from e
        log.info("%s %s %s/%s", "Created" if observed is None else "Updated", obj["kind"], meta["namespace"], meta["name"])
        return True

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        try:
            self._call(
                "DELETE",
                object_path(api_version, kind, namespace, name),
                body={"propagationPolicy": "Background"},
            )
        except ApiError as e:
            if e.status == 404:
                return False
            raise classify(e, f"delete {kind} {namespace}/{name}") from e
        log.info("Deleted %s %s/%s", kind, namespace, name)
        return True

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", object_path(api_version, kind, namespace, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise classify(e, f"get {kind} {namespace}/{name}") from e

    def patch_status(
        self, namespace: str, name: str, current: Mapping[str, Any], new: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> str | None:
        """Merge-patch the status subresource; keys we no longer set are nulled. No-op when equal. The
        object's resourceVersion after the write ("" if the answer had none); None when nothing was written.

        With `resource_version` (that of the copy `current` was read from) the write is conditional: the
        API server refuses it with 409 when the object changed since, so a status planned from an outdated
        copy (a handler queued before another one's write, a standby replica whose cache lags the replica
        it replaces) is never written, and its Events never posted; the reconcile is retried on a fresh copy."""
        patch = status_patch(current, new)
        if patch is None:
            return None
        body: dict[str, Any] = {"status": patch}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            out = self._call(
                "PATCH",
                f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status",
                body=body,
                content_type="application/merge-patch+json",
            )
        except ApiError as e:
            if e.status == 404:  # deleted meanwhile
                return None
            if e.status == 409 and resource_version:
                metrics.ERRORS.labels(reason="StaleCopy").inc()
                raise TemporaryError(
                    f"VLMService {namespace}/{name} changed since resourceVersion {resource_version}: "
                    "status not written, reconciling again on a fresh copy",
                    reason="StaleCopy",
                    delay=1,
                ) from e
            raise classify(e, f"patch status of VLMService {namespace}/{name}") from e
        return str(((out or {}).get("metadata") or {}).get("resourceVersion") or "")

    def clear_annotation(self, namespace: str, name: str, key: str) -> str | None:
        """Remove one annotation; the object's resourceVersion after that (None when it is gone)."""
        try:
            out = self._call(
                "PATCH",
                f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}",
                body={"metadata": {"annotations": {key: None}}},
                content_type="application/merge-patch+json",
            )
        except ApiError as e:
            if e.status != 404:
                raise classify(e, f"clear annotation on {namespace}/{name}") from e
            return None
        return str(((out or {}).get("metadata") or {}).get("resourceVersion") or "") or None

    def crd_exists(self, name: str) -> bool:
        try:
            self._call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            return True
        except ApiError as e:
            if e.status in (404, 403):
                return False
            raise classify(e, f"get CRD {name}") from e

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        """A strategic merge patch of one pod (labels, annotations, a scheduling gate removed with a node pin);
        False when the pod is gone."""
        try:
            self._call("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", body=dict(patch),
                       content_type="application/strategic-merge-patch+json")
        except ApiError as e:
            if e.status == 404:
                return False
            raise classify(e, f"patch pod {namespace}/{name}") from e
        return True

    def rooms(self, product: str, resource: str = "nvidia.com/gpu") -> dict[str, tuple[int, str]]:
        """node -> (free GPUs, zone) for the schedulable nodes of a GPU product: allocatable less what the pods
        bound to the node request (one read of the nodes, then one per node)."""
        try:
            nodes = self._call("GET", "/api/v1/nodes", query=[("labelSelector", f"nvidia.com/gpu.product={product}")])
            out = {
                n["metadata"]["name"]: [
                    int((n.get("status") or {}).get("allocatable", {}).get(resource, 0)),
                    ((n["metadata"].get("labels") or {}).get("topology.kubernetes.io/zone") or ""),
                ]
                for n in nodes.get("items", [])
                if not (n.get("spec") or {}).get("unschedulable")
            }
            for node in out:  # one read per node of the product (not every pod of the cluster)
                pods = self._call("GET", "/api/v1/pods", query=[
                    ("fieldSelector", f"spec.nodeName={node},status.phase!=Succeeded,status.phase!=Failed")])
                for p in pods.get("items", []):
                    for c in p["spec"].get("containers", []):
                        out[node][0] -= int(((c.get("resources") or {}).get("requests") or {}).get(resource, 0))
            return {k: (int(v[0]), str(v[1])) for k, v in out.items()}
        except ApiError as e:
            raise classify(e, "read the nodes' free GPUs") from e

