"""The cluster as one reconcile sees it: the service's Deployments, pods, Service and monitoring objects.

Built once per reconcile from kopf's indexes (vlm_operator.controller.handlers), read by the analysis, the rollout and
the status; nothing here reads the API server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vlm_operator.api.names import (
    ANNOTATION_DELETION_COST,
    LABEL_REVISION,
    LABEL_ROLE,
    ROLE_BASELINE,
    ROLE_CANARY,
    ROLE_STABLE,
    SCHEDULING_GATE,
    VICTIM_COST,
)
from vlm_operator.api.units import parse_quantity, parse_time_or_none


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
    node: str | None = None  # spec.nodeName once scheduled
    gated: bool = False  # still behind the operator's scheduling gate
    victim: bool = False  # marked by the operator to be the one its ReplicaSet removes
    terminating: bool = False
    labelled_role: str = ""  # the role label as the pod carries it (role: as this reconcile reads it)
    affinity_nodes: tuple[str, ...] = ()  # nodes a pin restricts it to (matchFields metadata.name In)
    ready_since: float | None = None  # when it last became Ready (its Ready condition's transition), if Ready

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PodInfo:
        meta = body.get("metadata", {}) or {}
        labels = meta.get("labels", {}) or {}
        st = body.get("status", {}) or {}
        conds = st.get("conditions") or []
        ready_cond = next((c for c in conds if c.get("type") == "Ready" and c.get("status") == "True"), None)
        ready = ready_cond is not None
        unsched = next(
            (
                c.get("message") or "Unschedulable"
                for c in conds
                if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
            ),
            None,
        )
        spec = body.get("spec", {}) or {}
        gates = spec.get("schedulingGates") or []
        return cls(
            name=meta.get("name", ""),
            role=labels.get(LABEL_ROLE, ""),
            revision=labels.get(LABEL_REVISION, ""),
            phase=st.get("phase", "Unknown"),
            ready=ready,
            ready_since=parse_time_or_none(ready_cond.get("lastTransitionTime")) if ready_cond else None,
            unschedulable=unsched,
            ip=st.get("podIP"),
            problem=container_problem(st),
            last_run_s=_last_run_s(st),
            node=spec.get("nodeName") or None,
            gated=any(isinstance(g, Mapping) and g.get("name") == SCHEDULING_GATE for g in gates),
            victim=(meta.get("annotations") or {}).get(ANNOTATION_DELETION_COST) == VICTIM_COST,
            terminating=bool(meta.get("deletionTimestamp")),
            labelled_role=labels.get(LABEL_ROLE, ""),
            affinity_nodes=_pinned_nodes(spec),
        )


def _pinned_nodes(spec: Mapping[str, Any]) -> tuple[str, ...]:
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    out: list[str] = []
    for t in terms:
        for f in (t or {}).get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("operator") == "In":
                out += [v for v in f.get("values") or [] if v not in out]
    return tuple(out)


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


BASELINE_KEY = ROLE_BASELINE  # the fresh baseline's Deployment in Observed.deployments (not a revision)


def deployment_revision(body: Mapping[str, Any]) -> str | None:
    return ((body.get("metadata") or {}).get("labels") or {}).get(LABEL_REVISION)


@dataclass(frozen=True)
class JobInfo:
    """What the reconcile needs of one of the service's Jobs."""

    name: str
    component: str
    active: int = 0
    succeeded: int = 0
    failed: int = 0
    finished: str = ""  # "Complete" or "Failed" once the Job is done
    message: str = ""  # the Failed condition's reason and message

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> JobInfo:
        meta = body.get("metadata", {}) or {}
        st = body.get("status", {}) or {}
        done = next((c for c in st.get("conditions") or [] if c.get("type") in ("Complete", "Failed")
                     and c.get("status") == "True"), None)
        return cls(
            name=meta.get("name", ""),
            component=(meta.get("labels") or {}).get("app.kubernetes.io/component", ""),
            active=int(st.get("active") or 0), succeeded=int(st.get("succeeded") or 0),
            failed=int(st.get("failed") or 0),
            finished=str(done.get("type")) if done else "",
            message=f"{done.get('reason', '')}: {done.get('message', '')}".strip(": ") if done else "",
        )


@dataclass(frozen=True)
class ScalerMetric:
    """One of the autoscaler's metrics as its HPA last read it: the trigger's index in the ScaledObject (KEDA names
    the metric `s<index>-<scaler>`), its current value (per replica for AverageValue) and its target."""

    index: int
    value: float
    target: float


@dataclass(frozen=True)
class HPAInfo:
    """The HPA KEDA made for the service's ScaledObject (labelled scaledobject.keda.sh/name): its counts and its
    metrics' last readings."""

    current: int = 0
    desired: int = 0
    metrics: tuple[ScalerMetric, ...] = ()
    last_scale_time: str | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> HPAInfo:
        spec, st = body.get("spec") or {}, body.get("status") or {}
        targets: dict[str, float] = {}
        for m in spec.get("metrics") or []:
            ext = m.get("external") or {}
            t = ext.get("target") or {}
            q = t.get("averageValue") if t.get("type") == "AverageValue" else t.get("value")
            if ext.get("metric", {}).get("name") and q is not None:
                targets[ext["metric"]["name"]] = _quantity(q)
        out = []
        for m in st.get("currentMetrics") or []:
            ext = m.get("external") or {}
            name = (ext.get("metric") or {}).get("name") or ""
            cur = ext.get("current") or {}
            q = cur.get("averageValue", cur.get("value"))
            idx = name[1:].split("-", 1)[0] if name.startswith("s") else ""
            if q is None or not idx.isdigit() or not targets.get(name):
                continue
            out.append(ScalerMetric(int(idx), _quantity(q), targets[name]))
        return cls(current=int(st.get("currentReplicas") or 0), desired=int(st.get("desiredReplicas") or 0),
                   metrics=tuple(sorted(out, key=lambda x: x.index)), last_scale_time=st.get("lastScaleTime"))


def _quantity(q: Any) -> float:
    try:
        return float(parse_quantity(str(q)))
    except (ValueError, ArithmeticError):
        return float("nan")


@dataclass(frozen=True)
class Observed:
    # revision -> its Deployment's body (`{name}-{revision}`, or `{name}` adopted from a release before revision
    # Deployments); BASELINE_KEY -> the fresh baseline's
    deployments: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    pods: Sequence[PodInfo] = ()
    service: Mapping[str, Any] | None = None
    monitoring: frozenset[str] = frozenset()  # kinds of the service's monitoring objects that exist (PodMonitor, ...)
    jobs: Mapping[str, JobInfo] = field(default_factory=dict)  # the service's Jobs (the load hook's), by name
    hpa: HPAInfo | None = None  # the HPA KEDA made for spec.autoscaling's ScaledObject, when there is one

    def revisions(self) -> list[str]:
        """The revisions that have a Deployment, by name."""
        return sorted(k for k in self.deployments if k != BASELINE_KEY)

    def replicas(self, revision: str) -> int:
        """The replicas the revision's Deployment asks for (0 without one)."""
        d = self.deployments.get(revision) or {}
        return int((d.get("spec") or {}).get("replicas") or 0)

    def pods_of(self, revision: str) -> list[PodInfo]:
        """The revision's pods that are not on their way out (the fresh baseline's excluded)."""
        return [p for p in self.pods if p.revision == revision and not p.terminating and p.role != ROLE_BASELINE]

    def stable_revision(self, recorded: str | None) -> str | None:
        """The stable revision: status.stableRevision while its Deployment exists; otherwise (a service from a
        release before revision Deployments, or a status lost) the revision with the most Ready pods, adopted as it
        runs."""
        revs = self.revisions()
        if recorded in revs:
            return recorded
        if not revs:
            return None
        return max(revs, key=lambda r: (self.ready_of(r), self.replicas(r), r))

    def with_roles(self, stable: str | None, canary: str | None) -> Observed:
        """The same snapshot with each pod's role as the revisions in status say (a pod's label may lag: the
        operator relabels a promoted canary's pods after the promotion): stable, canary, baseline (the fresh
        baseline's own label), or "" for a revision that is neither (one being drained)."""
        def role(p: PodInfo) -> str:
            if p.labelled_role == ROLE_BASELINE:
                return ROLE_BASELINE
            return ROLE_STABLE if p.revision == stable else ROLE_CANARY if canary and p.revision == canary else ""
        pods = tuple(p if p.role == role(p) else replace(p, role=role(p)) for p in self.pods)
        return replace(self, pods=pods)

    def updated_ready(self, role: str, revision: str) -> int:
        return sum(1 for p in self.pods if p.role == role and p.revision == revision and p.ready)

    def ready_of(self, revision: str) -> int:
        return sum(1 for p in self.pods_of(revision) if p.ready)

    def failing(self) -> PodInfo | None:
        """The first pod by name that is not Ready and has a container problem (deterministic, as `unschedulable`)."""
        bad = [p for p in self.pods if p.problem and not p.ready]
        return min(bad, key=lambda p: p.name) if bad else None

    def create_failure(self) -> str | None:
        """The message of a Deployment whose ReplicaSet cannot create pods (ReplicaFailure/FailedCreate: Pod
        Security admission, a ResourceQuota, a webhook), first by revision; None when all can."""
        for key in sorted(self.deployments):
            for c in ((self.deployments[key].get("status") or {}).get("conditions") or []):
                if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
                    what = "fresh baseline" if key == BASELINE_KEY else f"revision {key}"
                    return f"Deployment of the {what} pods: {c.get('reason') or 'FailedCreate'}: {c.get('message') or ''}".rstrip(": ")
        return None

    def unschedulable(self, role: str | None = None) -> PodInfo | None:
        """The first unschedulable pod by name: deterministic, so a resync does not rewrite the message."""
        stuck = [p for p in self.pods if p.unschedulable and (role is None or p.role == role)]
        return min(stuck, key=lambda p: p.name) if stuck else None

    def rolling(self) -> bool:
        """Pods of more than one revision run, or a Deployment has not caught up with its replicas."""
        live = {p.revision for p in self.pods if not p.terminating and p.role != ROLE_BASELINE}
        if len(live) > 1:
            return True
        for d in self.deployments.values():
            spec, st = d.get("spec") or {}, d.get("status") or {}
            if int(st.get("replicas") or 0) > int(spec.get("replicas") or 0) or (
                    (st.get("observedGeneration") or 0) < ((d.get("metadata") or {}).get("generation") or 0)):
                return True
        return False
