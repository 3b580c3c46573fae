"""Pure: observed objects -> the VLMService status (conditions, replicas, profiler summary).

`Observed` is what the operator knows about the cluster (from kopf indexes or
a list call); `build_status` is deterministic given it and `now`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import api
from . import conditions as C
from .builders import LABEL_REVISION, LABEL_ROLE, ROLE_CANARY, ROLE_STABLE


@dataclass(frozen=True)
class PodInfo:
    name: str
    role: str
    revision: str
    phase: str
    ready: bool
    unschedulable: str | None = None  # the scheduler's message when PodScheduled=False/Unschedulable
    ip: str | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PodInfo:
        meta = body.get("metadata", {}) or {}
        labels = meta.get("labels", {}) or {}
        st = body.get("status", {}) or {}
        conds = st.get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
        unsched = next(
            (
                c.get("message") or "Unschedulable"
                for c in conds
                if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
            ),
            None,
        )
        return cls(
            name=meta.get("name", ""),
            role=labels.get(LABEL_ROLE, ""),
            revision=labels.get(LABEL_REVISION, ""),
            phase=st.get("phase", "Unknown"),
            ready=ready,
            unschedulable=unsched,
            ip=st.get("podIP"),
        )


@dataclass(frozen=True)
class Observed:
    deployments: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # role -> body
    pods: Sequence[PodInfo] = ()
    service: Mapping[str, Any] | None = None

    def deployment_revision(self, role: str) -> str | None:
        d = self.deployments.get(role)
        if not d:
            return None
        return ((d.get("metadata") or {}).get("labels") or {}).get(LABEL_REVISION)

    def ready_replicas(self, role: str) -> int:
        d = self.deployments.get(role) or {}
        return int((d.get("status") or {}).get("readyReplicas") or 0)

    def updated_ready(self, role: str, revision: str) -> int:
        return sum(1 for p in self.pods if p.role == role and p.revision == revision and p.ready)

    def unschedulable(self, role: str | None = None) -> PodInfo | None:
        """The first unschedulable pod by name: deterministic, so a resync does not rewrite the message."""
        stuck = [p for p in self.pods if p.unschedulable and (role is None or p.role == role)]
        return min(stuck, key=lambda p: p.name) if stuck else None


@dataclass(frozen=True)
class Health:
    """The facts the conditions are made of; also handy for tests."""

    want: int
    ready: int
    invalid: str | None = None  # message when the spec is invalid
    unschedulable: str | None = None
    rolling: bool = False
    rollout_phase: str | None = None
    rollout_message: str | None = None
    ipc_active: bool | None = None
    ipc_reason: str = "Unknown"
    ipc_message: str = ""


def health_conditions(h: Health) -> list[C.Cond]:
    conds: list[C.Cond] = []
    if h.invalid:
        conds.append(C.Cond(C.READY, False, "InvalidSpec", h.invalid))
        conds.append(C.Cond(C.DEGRADED, True, "InvalidSpec", h.invalid))
        conds.append(C.Cond(C.PROGRESSING, False, "InvalidSpec", "fix the spec to continue"))
        return conds
    if h.unschedulable and h.ready < h.want:
        conds.append(C.Cond(C.READY, False, "Unschedulable", h.unschedulable))
    elif h.ready >= h.want:
        conds.append(C.Cond(C.READY, True, "AllReplicasReady", f"{h.ready}/{h.want} replicas ready"))
    else:
        conds.append(C.Cond(C.READY, False, "ReplicasNotReady", f"{h.ready}/{h.want} replicas ready"))
    if h.rollout_phase in ("Progressing", "Analysing", "Paused"):
        conds.append(C.Cond(C.PROGRESSING, True, f"Canary{h.rollout_phase}", h.rollout_message or ""))
    elif h.rolling:
        conds.append(C.Cond(C.PROGRESSING, True, "RollingUpdate", "the Deployment is rolling to a new revision"))
    else:
        conds.append(C.Cond(C.PROGRESSING, False, "Complete", "no rollout in progress"))
    if h.unschedulable:
        conds.append(C.Cond(C.DEGRADED, True, "Unschedulable", h.unschedulable))
    elif h.rollout_phase == "RolledBack":
        conds.append(C.Cond(C.DEGRADED, True, "CanaryRolledBack", h.rollout_message or ""))
    else:
        conds.append(C.Cond(C.DEGRADED, False, "AsExpected", ""))
    if h.ipc_active is not None:
        conds.append(C.Cond(C.IPC_CACHE_ACTIVE, h.ipc_active, h.ipc_reason, h.ipc_message))
    return conds


def summary_phase(h: Health) -> str:
    if h.invalid:
        return "Failed"
    if h.rollout_phase in ("Progressing", "Analysing", "Paused"):
        return "Canary"
    if h.rollout_phase == "RolledBack":
        return "RolledBack"
    if h.ready >= h.want:
        return "Ready"
    return "Pending"


def build_status(
    current: Mapping[str, Any],
    h: Health,
    *,
    generation: int | None,
    now: datetime,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """The full status object (as written through the status subresource)."""
    new_conditions = C.merge(current.get("conditions") or [], health_conditions(h), generation=generation, now=now)
    out: dict[str, Any] = {
        "observedGeneration": generation,
        "phase": summary_phase(h),
        "conditions": new_conditions,
        "replicas": h.want,
        "readyReplicas": h.ready,
    }
    out.update(extra)
    return out


def sglang_status(image: str, version: str | None) -> dict[str, Any]:
    """status.sglang: the image the pods run (the spec's or the operator's default) and its version."""
    return api.SGLangStatus(image=image, version=version).model_dump(by_alias=True, exclude_none=True)


def rolling(observed: Observed, role: str = ROLE_STABLE) -> bool:
    d = observed.deployments.get(role) or {}
    spec, st = d.get("spec") or {}, d.get("status") or {}
    want = int(spec.get("replicas") or 0)
    return bool(d) and (
        int(st.get("updatedReplicas") or 0) < want
        or int(st.get("replicas") or 0) > want
        or (st.get("observedGeneration") or 0) < ((d.get("metadata") or {}).get("generation") or 0)
    )


__all__ = ["ROLE_CANARY", "ROLE_STABLE", "Health", "Observed", "PodInfo", "build_status", "rolling", "sglang_status"]
