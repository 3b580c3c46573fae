"""The cluster as one reconcile sees it: the service's Deployments, pods, Service and monitoring objects.

Built once per reconcile from kopf's indexes (vlm_operator.handlers), read by the analysis, the rollout and
the status; nothing here reads the API server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .names import LABEL_REVISION, LABEL_ROLE, ROLE_STABLE
from .units import parse_time_or_none


@dataclass(frozen=True, slots=True)
class PodInfo:
    name: str
    role: str
    revision: str
    phase: str
    ready: bool
    unschedulable: str | None = None  # the scheduler's message when PodScheduled=False/Unschedulable
    ip: str | None = None
    # Why a container of the pod cannot serve (`container_problem`): (reason, message), None when nothing is
    # known to be wrong; and how long its last run lasted before it ended (seconds; None: never ended).
    problem: tuple[str, str] | None = None
    last_run_s: float | None = None

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
            problem=container_problem(st),
            last_run_s=_last_run_s(st),
        )


# Container states that keep a pod from ever serving, by the reason the service reports for each (the kubelet's
# waiting reasons; a crash loop is told apart by its last termination).
_WAITING = {
    "ErrImagePull": "ImagePullFailed",
    "ImagePullBackOff": "ImagePullFailed",
    "InvalidImageName": "ImagePullFailed",
    "ErrImageNeverPull": "ImagePullFailed",
    "CreateContainerConfigError": "ContainerConfigError",
    "CreateContainerError": "ContainerConfigError",
    "CrashLoopBackOff": "CrashLoopBackOff",
}
MAX_PROBLEM_MESSAGE = 1024


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def container_problem(st: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of the first container (init containers first) that waits for a reason it will not
    get out of by itself: an image that cannot be pulled, a configuration the kubelet refuses, a crash loop
    (with the last termination: OOMKilled, the exit code, and the last line of the termination message,
    which carries the container's last log line where its terminationMessagePolicy says so)."""
    statuses = [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]
    for cs in statuses:
        if not isinstance(cs, Mapping):
            continue
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = _WAITING.get(waiting.get("reason") or "")
        if reason is None:
            continue
        name = cs.get("name") or "?"
        msg = f"container {name}: {waiting.get('reason')}" + (f": {waiting['message']}" if waiting.get("message") else "")
        last = (cs.get("lastState") or {}).get("terminated") or {}
        if reason == "CrashLoopBackOff" and last:
            why = last.get("reason") or "Error"
            msg = (f"container {name} restarted {cs.get('restartCount', 0)} times; last exit: {why} "
                   f"(exit code {last.get('exitCode')})")
            line = _last_line(str(last.get("message") or ""))
            if line:
                msg += f": {line}"
            if why == "OOMKilled":
                reason = "OOMKilled"
        return reason, msg[:MAX_PROBLEM_MESSAGE]
    return None


def _last_run_s(st: Mapping[str, Any]) -> float | None:
    """How long the last ended run of the pod's longest-lived restarting container lasted (seconds)."""
    longest = None
    for cs in st.get("containerStatuses") or []:
        last = ((cs or {}).get("lastState") or {}).get("terminated") or {}
        a, b = parse_time_or_none(last.get("startedAt")), parse_time_or_none(last.get("finishedAt"))
        if a is not None and b is not None and b >= a:
            longest = max(longest or 0.0, b - a)
    return longest


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

    def failing(self) -> PodInfo | None:
        """The first pod by name that is not Ready and has a container problem (deterministic, as `unschedulable`)."""
        bad = [p for p in self.pods if p.problem and not p.ready]
        return min(bad, key=lambda p: p.name) if bad else None

    def create_failure(self) -> str | None:
        """The message of a Deployment whose ReplicaSet cannot create pods (ReplicaFailure/FailedCreate: Pod
        Security admission, a ResourceQuota, a webhook), first by role name; None when all can."""
        for role in sorted(self.deployments):
            for c in ((self.deployments[role].get("status") or {}).get("conditions") or []):
                if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
                    return f"Deployment of the {role} pods: {c.get('reason') or 'FailedCreate'}: {c.get('message') or ''}".rstrip(": ")
        return None

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
