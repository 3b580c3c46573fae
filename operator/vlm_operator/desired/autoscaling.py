"""spec.autoscaling as a KEDA ScaledObject (pure): Prometheus triggers over the signals the sidecar and SGLang
export, targeting the VLMService's own scale subresource, so the HPA that KEDA makes moves `spec.replicas` and the
operator's reconcile does the rest (a rollout included).

Per-replica targets are written as `AverageValue` triggers over the service's **sum** (of busy shares, queued
requests, KV-cache usage): the HPA divides by the replica count, so the replicas wanted are ceil(sum / target), which
stays put while new replicas load their model (the sum does not move until they take traffic): no runaway scale-up
during a model load of minutes. TTFT p95 is not additive: a `Value` trigger, replicas in proportion to how far it is
above its target.

The owner reference makes the ScaledObject go with the VLMService; KEDA removes the HPA it made with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vlm_operator.api.names import API_VERSION, KIND
from vlm_operator.api.settings import Settings
from vlm_operator.api.units import parse_duration
from vlm_operator.api.v1alpha1 import AutoscalingSpec, AutoscalingStatus, VLMServiceSpec
from vlm_operator.cluster.observed import HPAInfo
from vlm_operator.desired.builders import Owner, owned_metadata

KEDA_GROUP = "keda.sh"
KEDA_VERSION = "v1alpha1"
KEDA_API_VERSION = f"{KEDA_GROUP}/{KEDA_VERSION}"
SCALED_OBJECT = "ScaledObject"
SCALED_OBJECTS_CRD = f"scaledobjects.{KEDA_GROUP}"
SIDECAR_SIGNALS = frozenset({"schedulerBusy", "frontendBusy"})  # read from the profiler sidecar, not SGLang
HPA_LABEL = "scaledobject.keda.sh/name"  # on the HPA KEDA makes: its ScaledObject's (and so the service's) name
# The HPA's pace: at most 2 replicas added a minute, one removed every 5 minutes (a removed replica costs a model
# load of minutes to get back).
SCALE_UP_PODS, SCALE_UP_PERIOD_S = 2, 60
SCALE_DOWN_PODS, SCALE_DOWN_PERIOD_S = 1, 300
RATE_WINDOW = "2m"  # TTFT's histogram rate: at least four scrapes at the sidecar's default cadence


def _sidecar_sel(owner: Owner, extra: str = "") -> str:
    """The sidecar labels its series with the VLMService's namespace and name itself (honorLabels)."""
    return "{" + ",".join(p for p in (f'namespace="{owner.namespace}"', f'vlmservice="{owner.name}"', extra) if p) + "}"


def _sglang_sel(owner: Owner) -> str:
    """SGLang's own series carry the pod's service label (the PodMonitor's podTargetLabels)."""
    return f'{{namespace="{owner.namespace}",serving_vlmops_dev_vlmservice="{owner.name}"}}'


def queries(owner: Owner, spec: AutoscalingSpec, frontend: bool = False) -> list[tuple[str, str, str, float]]:
    """(signal, PromQL, metricType, threshold) per effective target (`frontend`: the front end is sampled), in
    `signals`' order. Shares are summed over the pods (one series per pod: `max by (pod)` first, so a pod's several
    roles or ranks count once)."""
    t = spec.targets.effective(frontend)
    out: list[tuple[str, str, str, float]] = []
    if t.scheduler_busy_percent is not None:
        # 1 - the idle stage's share of the busiest TP rank (the stage gauge is exported with or without the front
        # end sampled).
        sel = _sidecar_sel(owner, 'stage="idle"')
        out.append(("schedulerBusy", f"sum(1 - min by (pod) (vlm_scheduler_stage_share_ratio{sel}))", "AverageValue",
                    t.scheduler_busy_percent / 100))
    if t.frontend_busy_percent is not None:
        out.append(("frontendBusy", f"sum(max by (pod) (vlm_frontend_busy_share_ratio{_sidecar_sel(owner)}))",
                    "AverageValue", t.frontend_busy_percent / 100))
    if t.queue_per_replica is not None:
        out.append(("queuePerReplica", f"sum(max by (pod) (sglang:num_queue_reqs{_sglang_sel(owner)}))",
                    "AverageValue", t.queue_per_replica))
    if t.kv_cache_usage_percent is not None:
        out.append(("kvCacheUsage", f"sum(max by (pod) (sglang:token_usage{_sglang_sel(owner)}))", "AverageValue",
                    t.kv_cache_usage_percent / 100))
    if t.ttft_p95 is not None:
        out.append(("ttftP95", "histogram_quantile(0.95, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket"
                    f"{_sglang_sel(owner)}[{RATE_WINDOW}])))", "Value", parse_duration(t.ttft_p95)))
    return out


def _threshold(v: float) -> str:
    return f"{v:.6g}"


def build_scaled_object(owner: Owner, spec: AutoscalingSpec, server: str, trigger_auth: str = "", *,
                        frontend: bool = False) -> dict[str, Any]:
    """The ScaledObject for `spec` (KEDA keda.sh/v1alpha1), its triggers querying `server`; `frontend`: the
    sidecars sample the front end (telemetry.frontendRoles), which the default targets then include."""
    triggers = []
    for signal, query, metric_type, threshold in queries(owner, spec, frontend):
        trig: dict[str, Any] = {
            "type": "prometheus", "name": signal, "metricType": metric_type,
            # ignoreNullValues false: a query that returns nothing (Prometheus lost the pods' series) is an error
            # KEDA reports on the ScaledObject, and the HPA holds the count instead of reading zero load.
            "metadata": {"serverAddress": server, "query": query, "threshold": _threshold(threshold),
                         "ignoreNullValues": "false"},
        }
        if trigger_auth:
            trig["authenticationRef"] = {"name": trigger_auth, "kind": "ClusterTriggerAuthentication"}
        triggers.append(trig)
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": SCALED_OBJECT,
        "metadata": owned_metadata(owner),
        "spec": {
            "scaleTargetRef": {"apiVersion": API_VERSION, "kind": KIND, "name": owner.name},
            "minReplicaCount": spec.min_replicas,
            "maxReplicaCount": spec.max_replicas,
            "pollingInterval": max(1, round(parse_duration(spec.polling_interval))),
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                "scaleUp": {"stabilizationWindowSeconds": round(parse_duration(spec.scale_up_stabilization)),
                            "selectPolicy": "Max",
                            "policies": [{"type": "Pods", "value": SCALE_UP_PODS, "periodSeconds": SCALE_UP_PERIOD_S}]},
                "scaleDown": {"stabilizationWindowSeconds": round(parse_duration(spec.scale_down_stabilization)),
                              "selectPolicy": "Min",
                              "policies": [{"type": "Pods", "value": SCALE_DOWN_PODS,
                                            "periodSeconds": SCALE_DOWN_PERIOD_S}]},
            }}},
            "triggers": triggers,
        },
    }


@dataclass(frozen=True)
class Autoscaler:
    """What spec.autoscaling asks of this reconcile: the ScaledObject to apply (None: none may exist) and the
    Autoscaling condition (None without spec.autoscaling)."""

    want: dict[str, Any] | None = None
    condition: tuple[bool, str, str] | None = None


def autoscaler(owner: Owner, spec: VLMServiceSpec, settings: Settings, *, keda: bool) -> Autoscaler:
    """The ScaledObject and the condition for `spec`; `keda`: KEDA's ScaledObject CRD was found at start-up. No
    home-made autoscaler: without KEDA or a Prometheus to query, the condition says what is missing and spec.replicas
    stays as the user set it."""
    a = spec.autoscaling
    if a is None:
        return Autoscaler()
    if not keda:
        return Autoscaler(condition=(False, "KEDANotInstalled", (
            f"spec.autoscaling needs KEDA: the CRD {SCALED_OBJECTS_CRD} was not found when the operator started "
            "(install KEDA, then restart the operator); spec.replicas stays as set")))
    frontend = bool(spec.telemetry.frontend_roles)
    sidecar = [n for n in signals(a, frontend) if n in SIDECAR_SIGNALS]
    if sidecar and not spec.telemetry.enabled:
        return Autoscaler(condition=(False, "NoTelemetry", (
            f"spec.autoscaling's targets {', '.join(sidecar)} are the profiler sidecar's: set telemetry.enabled, or "
            "scale on SGLang's own metrics (queuePerReplica, kvCacheUsagePercent, ttftP95)")))
    server = settings.autoscaling_prometheus_url or settings.prometheus_url
    if not server:
        return Autoscaler(condition=(False, "NoPrometheus", (
            "spec.autoscaling needs a Prometheus for KEDA to query: set the operator's VLM_AUTOSCALING_PROMETHEUS_URL "
            "or VLM_PROMETHEUS_URL (chart: operator.prometheusURL); spec.replicas stays as set")))
    want = build_scaled_object(owner, a, server, settings.autoscaling_trigger_auth, frontend=frontend)
    names = ", ".join(t["name"] for t in want["spec"]["triggers"])
    return Autoscaler(want=want, condition=(True, "ScaledObjectApplied", (
        f"KEDA ScaledObject {owner.name} scales spec.replicas between {a.min_replicas} and {a.max_replicas} on "
        f"{names} (Prometheus {server})")))


def signals(spec: AutoscalingSpec, frontend: bool = False) -> list[str]:
    """The effective targets' names in the ScaledObject's trigger order (KEDA numbers its HPA's metrics by that
    order)."""
    t = spec.targets.effective(frontend)
    return [name for name, v in (("schedulerBusy", t.scheduler_busy_percent), ("frontendBusy", t.frontend_busy_percent),
                                 ("queuePerReplica", t.queue_per_replica),
                                 ("kvCacheUsage", t.kv_cache_usage_percent), ("ttftP95", t.ttft_p95))
            if v is not None]


def status_of(spec: VLMServiceSpec, hpa: HPAInfo | None) -> AutoscalingStatus | None:
    """status.autoscaling: the HPA's counts and the signal that drives them (the one furthest above its target:
    the HPA wants ceil(replicas x value / target) for each and takes the largest). None without spec.autoscaling."""
    a = spec.autoscaling
    if a is None:
        return None
    if hpa is None or hpa.desired < 1:  # (a new HPA says 0 until its first computation: min is at least 1)
        return AutoscalingStatus(min_replicas=a.min_replicas, max_replicas=a.max_replicas)
    names = signals(a, bool(spec.telemetry.frontend_roles))
    known = [m for m in hpa.metrics if m.index < len(names) and m.target > 0 and m.value == m.value]
    top = max(known, key=lambda m: m.value / m.target, default=None)
    return AutoscalingStatus(
        min_replicas=a.min_replicas, max_replicas=a.max_replicas, current_replicas=hpa.current,
        desired_replicas=hpa.desired, signal=names[top.index] if top else None,
        value=round(top.value, 6) if top else None, target=round(top.target, 6) if top else None,
        at_max_replicas=bool(top and hpa.desired >= a.max_replicas and top.value > top.target),
        last_scale_time=hpa.last_scale_time)


def ratios(spec: VLMServiceSpec, hpa: HPAInfo | None) -> dict[str, float]:
    """Each signal's current value over its target, as the HPA last read them (the operator's metrics)."""
    if spec.autoscaling is None or hpa is None:
        return {}
    names = signals(spec.autoscaling, bool(spec.telemetry.frontend_roles))
    return {names[m.index]: m.value / m.target for m in hpa.metrics
            if m.index < len(names) and m.target > 0 and m.value == m.value}


def scale_event(before: AutoscalingStatus | None, now: AutoscalingStatus | None) -> tuple[str, str, str] | None:
    """One Event per scale decision: the HPA wants a count other than the one it has, and did not want it at the
    last status."""
    if now is None or now.desired_replicas is None or now.desired_replicas == now.current_replicas \
            or (before is not None and before.desired_replicas == now.desired_replicas):
        return None
    why = (f": {now.signal} at {now.value:g} against its target {now.target:g}" if now.signal and now.value is not None
           and now.target is not None else "")
    return ("Normal", "Autoscaled", f"the autoscaler wants {now.desired_replicas} replicas "
            f"(has {now.current_replicas}){why}")
