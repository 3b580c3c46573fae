"""The reconcile's one way to write: the API client (`cluster.client.KubeAPI`) behind a write cache.

Every write a reconcile makes goes through `Writer`: objects (applied only where they differ, and not re-sent
while the watch has not yet shown our own write), deletions, and the status (one conditional patch, whose
resourceVersion tells the next reconcile whether its copy of the object is older than our last write).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vlm_operator.cluster import client
from vlm_operator.cluster.client import KubeAPI

UNCONFIRMED_TTL_S = 300.0  # an object applied and not yet in the index is not re-sent for this long (Writer.apply)
ObjectKey = tuple[str, str, str, str]  # apiVersion, kind, namespace, name


def _rv(text: str | None) -> int | None:
    """resourceVersions are opaque strings to clients; the API server's come from etcd's revision, an
    integer that only grows, which is what ordering two copies of one object needs. None otherwise."""
    try:
        return int(text) if text else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Apply:
    """Server-side apply of `obj` (only where it differs from `current`, the snapshot's copy; None: not seen)."""

    obj: Mapping[str, Any]
    current: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Delete:
    api_version: str
    kind: str
    namespace: str
    name: str


@dataclass(frozen=True)
class PatchPod:
    """A placement, a role label or a removal mark on one pod."""

    namespace: str
    name: str
    patch: Mapping[str, Any]


@dataclass(frozen=True)
class Confirm:
    """The snapshot shows this object: `Writer.apply` may send it again if asked."""

    key: ObjectKey


Write = Apply | Delete | PatchPod | Confirm


@dataclass
class Writer:
    kube: KubeAPI
    # uid -> the resourceVersion of the last status write (see `current`)
    written: dict[str, int] = field(default_factory=dict)
    # uid -> {object key: (digest, monotonic time)}: applied, not yet seen in the index (see `apply`)
    unconfirmed: dict[str, dict[ObjectKey, tuple[str, float]]] = field(default_factory=dict)
    # uid -> the generation whose objects the API server refused (400/422): not sent again until the spec changes
    refused: dict[str, int | None] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def forget(self, uid: str) -> None:
        with self._lock:
            self.written.pop(uid, None)
            self.unconfirmed.pop(uid, None)
            self.refused.pop(uid, None)

    def refuse(self, uid: str, generation: int | None) -> None:
        """Remember that the API server refused what this generation of the service makes."""
        with self._lock:
            self.refused[uid] = generation

    def is_refused(self, uid: str, generation: int | None) -> bool:
        with self._lock:
            return uid in self.refused and self.refused[uid] == generation

    def apply(self, uid: str, obj: Mapping[str, Any], observed: Mapping[str, Any] | None,
              now: float | None = None) -> bool:
        """`kube.apply`, without re-sending what this operator applied moments ago and the index has not shown yet.

        The indexes follow the API server's watch, which lags behind our own writes, most under a burst of
        creations: the create handler and the resync timer of a new service can both be queued before either
        writes, and the second, run after the first under the service's lock, still saw no Deployment and no
        Service and applied both again; in a large burst the index lags a Deployment the resync timer applied
        by far longer than a reconcile takes (docs/benchmarks.md, "Applies not re-sent before the index shows
        them"). The same object, byte for byte, applied less than `UNCONFIRMED_TTL_S` ago is not sent again
        while the index has not shown it; once the index shows the object the entry goes, so a Deployment
        deleted by hand afterwards is re-created at once (one deleted before the index ever showed it waits for
        the TTL)."""
        t = time.monotonic() if now is None else now
        pending = self._to_send(uid, obj, observed, t)
        if pending is False:
            return False
        try:
            return self.kube.apply(obj, observed)
        except BaseException:
            self._unsent(uid, [pending] if pending is not True else [])
            raise

    def _to_send(self, uid: str, obj: Mapping[str, Any], observed: Mapping[str, Any] | None,
                 t: float) -> bool | tuple[ObjectKey, str]:
        """Whether `apply` sends `obj`: False when this operator applied the same bytes less than
        UNCONFIRMED_TTL_S ago and the index has not shown them; else True (the snapshot has it: the client
        compares), or the (key, digest) now recorded as applied and unconfirmed (`_unsent` takes it back when the
        write fails)."""
        meta = obj["metadata"]
        key = (str(obj["apiVersion"]), str(obj["kind"]), str(meta["namespace"]), str(meta["name"]))
        if observed is not None:
            self.confirmed(uid, key)
            return True
        digest = hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()

        def fresh(entry: tuple[str, float]) -> bool:
            return 0 <= t - entry[1] < UNCONFIRMED_TTL_S

        with self._lock:
            hit = self.unconfirmed.get(uid, {}).get(key)
            if hit is not None and hit[0] == digest and fresh(hit):
                return False
            mine = {k: e for k, e in self.unconfirmed.get(uid, {}).items() if fresh(e)}
            mine[key] = (digest, t)
            self.unconfirmed[uid] = mine
        return key, digest

    def _unsent(self, uid: str, pending: list[tuple[ObjectKey, str]]) -> None:
        """Applies recorded by `_to_send` whose write failed, or never ran: the next reconcile sends them."""
        with self._lock:
            mine = self.unconfirmed.get(uid, {})
            for key, digest in pending:
                if key in mine and mine[key][0] == digest:
                    del mine[key]

    def write(self, uid: str, writes: list[Write], now: float | None = None) -> None:
        """A reconcile's intended writes, in order, handed to the client in one call (the first refusal raises
        and stops the rest; applies this operator made moments ago and the index has not shown are left out, as
        in `apply`)."""
        t = time.monotonic() if now is None else now
        ops: list[client.Op] = []
        pending: list[tuple[ObjectKey, str]] = []
        for x in writes:
            if isinstance(x, Apply):
                p = self._to_send(uid, x.obj, x.current, t)
                if p is False:
                    continue
                if p is not True:
                    pending.append(p)
                ops.append(("apply", x.obj, x.current))
            elif isinstance(x, Delete):
                self.confirmed(uid, (x.api_version, x.kind, x.namespace, x.name))
                ops.append(("delete", x.api_version, x.kind, x.namespace, x.name))
            elif isinstance(x, PatchPod):
                ops.append(("patch_pod", x.namespace, x.name, x.patch))
            else:
                self.confirmed(uid, x.key)
        try:
            client.send(self.kube, ops)
        except BaseException:
            # Which of them went out is not known here: the next reconcile sends each again (applies are
            # idempotent; what the API server already has, the snapshot then shows).
            self._unsent(uid, pending)
            raise

    def confirmed(self, uid: str, key: ObjectKey) -> None:
        """The index shows the object `key` (apiVersion, kind, namespace, name): `apply` sends it again if asked."""
        with self._lock:
            self.unconfirmed.get(uid, {}).pop(key, None)

    def delete(self, uid: str, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """`kube.delete`; what it deletes is no longer known to exist (the next apply of it is sent)."""
        self.confirmed(uid, (api_version, kind, namespace, name))
        return self.kube.delete(api_version, kind, namespace, name)

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        """One pod patch (a placement, a role label, a removal mark): always sent (the plan asks only for what
        the index shows missing)."""
        return self.kube.patch_pod(namespace, name, patch)

    def patch_status(self, uid: str, namespace: str, name: str, current: Mapping[str, Any],
                     body: Mapping[str, Any], resource_version: str | None) -> str | None:
        """One conditional status patch (none when nothing changed); remembers its resourceVersion."""
        rv = self.kube.patch_status(namespace, name, current, body, resource_version=resource_version)
        if rv is None:
            return None
        parsed = _rv(rv)
        with self._lock:
            if parsed is None:
                self.written.pop(uid, None)
            else:
                self.written[uid] = parsed
        return rv

    def current(self, uid: str, resource_version: str | None) -> bool:
        """False when a copy of the object at `resource_version` is older than this operator's last status write.

        kopf hands each handler the body it had when the handler was queued. The create (or update) handler
        and the resync timer of one service can both be queued before the first of them writes; the second
        would then start from the status before that write and redo what was just done (a second
        CanaryStarted, a rollout restarted). Such a copy is skipped: a fresh one follows (the watch event of
        that write, the next timer). Copies that predate another writer's change (a second replica, the
        plugin) are caught by the API server instead: the status write is conditional on the copy's
        resourceVersion (`KubeAPI.patch_status`)."""
        with self._lock:
            w = self.written.get(uid)
        rv = _rv(resource_version)
        return w is None or rv is None or rv >= w
