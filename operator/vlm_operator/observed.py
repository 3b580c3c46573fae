"""The cluster as one reconcile sees it: the service's Deployments, pods, Service and monitoring objects.

Built once per reconcile from kopf's indexes (vlm_operator.handlers), read by the analysis, the rollout and
the status; nothing here reads the API server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .names import LABEL_REVISION, LABEL_ROLE, ROLE_STABLE


@dataclass(frozen=True, slots=True)
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
    monitoring: frozenset[str] = frozenset()  # kinds of the service's monitoring objects that exist (PodMonitor, ...)

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

    def rolling(self, role: str = ROLE_STABLE) -> bool:
        """The role's Deployment is still rolling its pods to its current template."""
        d = self.deployments.get(role) or {}
        spec, st = d.get("spec") or {}, d.get("status") or {}
        want = int(spec.get("replicas") or 0)
        return bool(d) and (
            int(st.get("updatedReplicas") or 0) < want
            or int(st.get("replicas") or 0) > want
            or (st.get("observedGeneration") or 0) < ((d.get("metadata") or {}).get("generation") or 0)
        )
