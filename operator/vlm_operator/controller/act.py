"""Act: what a reconcile decided, as the writes the one writer (`cluster.writer.Writer`) sends, then the status
and Events.

Nothing here decides: the plan (vlm_operator.rollout.steps), the desired objects (vlm_operator.desired.builders)
and the status (vlm_operator.status.build) arrive made; `intended` only lists and orders the writes (pure), and
the reconcile hands the list to the writer in one call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.names import (
    ANNOTATION_DELETION_COST,
    ANNOTATION_PAIRED_NODE,
    LABEL_ROLE,
    SCHEDULING_GATE,
    VICTIM_COST,
)
from vlm_operator.cluster.observed import BASELINE_KEY, Observed
from vlm_operator.cluster.writer import Apply, Confirm, Delete, PatchPod, Write, Writer
from vlm_operator.desired import alerts, autoscaling, builders
from vlm_operator.rollout import steps as rollout
from vlm_operator.status import build as S
from vlm_operator.status import conditions as C

Emit = Callable[[str, str, str], None]  # (type, reason, message)


def intended(uid: str, status: Mapping[str, Any], generation: int | None, spec: api.VLMServiceSpec,
             plan: rollout.Plan, observed: Observed, owner: builders.Owner, *, service: Mapping[str, Any],
             deployments: Mapping[str, Mapping[str, Any]], baseline: Mapping[str, Any] | None,
             network_policy: Mapping[str, Any] | None, pdb: Mapping[str, Any] | None, monitoring: bool,
             monitoring_labels: Mapping[str, str], alert_overrides: Any, load_job: Mapping[str, Any] | None = None,
             weights_job: Mapping[str, Any] | None = None, keda: bool = False,
             scaled_object: Mapping[str, Any] | None = None) -> list[Write]:
    """Every write the plan wants, in order (pure; `Writer.write` sends them): the weights Job (even while hands
    off: the weights come before anything else can), the budget, the policy and the ScaledObject once per spec
    generation, before
    the Deployments (a pod never runs without its NetworkPolicy), the pods' writes, the Deployments and the
    Service (each only where it differs), the load Job, then the monitoring objects. A new service gets all of
    them in its first pass, in a burst of new services too (docs/benchmarks.md, "All objects of a burst in one
    pass": holding its Service and monitoring objects back to a later resync cost more time than it saved)."""
    out: list[Write] = []
    if weights_job is not None:
        out += _job(owner, weights_job, observed)
    if plan.hands_off:
        return out
    changed = status.get("observedGeneration") != generation
    if changed:
        # These follow the spec alone (and the operator's settings): applied once per generation, like the
        # PodMonitor; deleted when the spec no longer wants them (replicas <= 1, networkPolicy Off, no
        # spec.autoscaling).
        wanted: list[tuple[str, str, Mapping[str, Any] | None]] = [
            ("networking.k8s.io/v1", "NetworkPolicy", network_policy), ("policy/v1", "PodDisruptionBudget", pdb)]
        if keda:  # spec.autoscaling's ScaledObject (desired.autoscaling), only where KEDA's CRD exists
            wanted.append((autoscaling.KEDA_API_VERSION, autoscaling.SCALED_OBJECT, scaled_object))
        for api_version, kind, want in wanted:
            if want is not None:
                out.append(Apply(want))
            elif not (generation == 1 and "observedGeneration" not in status):
                # (Never reconciled, and its spec never changed: every reconcile so far saw this spec and
                # wanted none, so none was made. One DELETE answered 404 less per new service.)
                out.append(Delete(api_version, kind, owner.namespace, owner.name))
    # Pods first: a victim is marked before its Deployment is scaled down (so its ReplicaSet removes that pod),
    # gated pods are released (pinned to their pair's node) and role labels caught up.
    out += pod_writes(owner.namespace, plan, observed)
    out += [Apply(want, observed.deployments.get(rev)) for rev, want in sorted(deployments.items())]
    if baseline is not None:
        out.append(Apply(baseline, observed.deployments.get(BASELINE_KEY)))
    elif BASELINE_KEY in observed.deployments:
        out.append(Delete("apps/v1", "Deployment", owner.namespace, _name(observed.deployments[BASELINE_KEY])))
    out += [Delete("apps/v1", "Deployment", owner.namespace, _name(body))
            for rev, body in sorted(observed.deployments.items()) if rev != BASELINE_KEY and rev not in deployments]
    out.append(Apply(service, observed.service))
    out += load_writes(owner, load_job, observed)
    if monitoring:
        out += _monitoring(changed, spec, observed, owner, extra=monitoring_labels,
                           overrides=alert_overrides)
    return out


def load_writes(owner: builders.Owner, want: Mapping[str, Any] | None, observed: Observed) -> list[Write]:
    """The load hook's Job: created when the index does not show it; every other load Job of the service deleted
    (its pods go with it: the delete propagates in the background). A finished one is left to its TTL."""
    name = _name(want) if want is not None else None
    out: list[Write] = [Delete("batch/v1", "Job", owner.namespace, n) for n, job in sorted(observed.jobs.items())
                        if job.component == builders.LOAD_COMPONENT and n != name]
    return out + (_job(owner, want, observed) if want is not None else [])


def _job(owner: builders.Owner, want: Mapping[str, Any], observed: Observed) -> list[Write]:
    """A Job created when the index does not show it (its template is immutable: a changed one has a new name)."""
    name = _name(want)
    if name in observed.jobs:
        return [Confirm(("batch/v1", "Job", owner.namespace, name))]
    return [Apply(want)]


def _name(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("name"))


def pin_terms(template: Mapping[str, Any] | None, node: str) -> list[dict[str, Any]]:
    """Required node affinity that keeps a pod to `node`: the template's own terms, each narrowed to the node (a
    gated pod's affinity may only be narrowed), or one term of its own."""
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    terms = ((((template or {}).get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms") or []
    if not terms:
        return [{"matchFields": [pin]}]
    return [{**t, "matchFields": [*(t.get("matchFields") or []), pin]} for t in terms]


def pod_writes(namespace: str, plan: rollout.Plan, observed: Observed) -> list[PatchPod]:
    """The plan's pod writes: removal marks, releases from the scheduling gate (with a node pin where the pod
    pairs with one), role labels."""
    role = dict(plan.labels)
    revision = {p.name: p.revision for p in observed.pods}
    out = [PatchPod(namespace, pod, {"metadata": {"annotations": {ANNOTATION_DELETION_COST: VICTIM_COST}}})
           for pod in plan.victims]
    for pod, node in plan.releases:
        patch: dict[str, Any] = {"spec": {"schedulingGates": [{"$patch": "delete", "name": SCHEDULING_GATE}]}}
        if node:
            template = (observed.deployments.get(revision.get(pod, "")) or {}).get("spec", {}).get("template")
            patch["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": pin_terms(template, node)}}}
            patch["metadata"] = {"annotations": {ANNOTATION_PAIRED_NODE: node}}
        if pod in role:
            patch.setdefault("metadata", {})["labels"] = {LABEL_ROLE: role.pop(pod)}
        out.append(PatchPod(namespace, pod, patch))
    out += [PatchPod(namespace, pod, {"metadata": {"labels": {LABEL_ROLE: r}}}) for pod, r in sorted(role.items())]
    return out


def _monitoring(changed: bool, spec: api.VLMServiceSpec, observed: Observed, owner: builders.Owner, *,
                extra: Mapping[str, str], overrides: Any) -> list[Write]:
    """The PodMonitor and the PrometheusRule: re-applied at each spec generation (they follow the spec and the
    operator's settings), and created where the index does not hold them (a new service, or one deleted by
    hand: drift repair)."""
    # shown by the index: one deleted from now on is re-created at once
    out: list[Write] = [Confirm((builders.MONITORING_API_VERSION, kind, owner.namespace, owner.name))
                        for kind in observed.monitoring]
    wanted = [kind for kind in builders.MONITORING_KINDS
              if changed or kind not in observed.monitoring]
    if "PodMonitor" in wanted:
        out.append(Apply(builders.build_pod_monitor(owner, extra, spec.telemetry.interval)))
    if "PrometheusRule" in wanted:
        out.append(Apply(alerts.build_prometheus_rule(
            owner.name, owner.namespace, owner.reference(), builders.common_labels(owner), extra_labels=extra,
            overrides=overrides)))
    return out


def write_status(w: Writer, uid: str, namespace: str, name: str, current: Mapping[str, Any],
                 resource_version: str | None, new: api.VLMServiceStatus, emit: Emit) -> bool:
    """One status patch (none when nothing changed); Events for the conditions that flipped."""
    body = S.status_body(new)
    before = current.get("conditions") or []
    if w.patch_status(uid, namespace, name, current, body, resource_version) is None:
        return False
    for ev in C.events_for(C.transitions(before, body["conditions"])):
        emit(*ev)
    return True


def post_events(plan: rollout.Plan, emit: Emit) -> None:
    """The rollout's Events, after its status: an operator stopped in between loses the Event rather than
    posting it twice (a restart recomputes the plan from the status it finds and posts what that plan says)."""
    for ev in plan.events:
        emit(ev.type, ev.reason, ev.message)
