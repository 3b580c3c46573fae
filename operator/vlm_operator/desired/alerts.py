"""Alerting rules, one source for both shapes: a PrometheusRule per VLMService (when the Prometheus
Operator CRDs exist) and a plain rules file for any Prometheus (`alerts/vlm-operator.rules.yaml`).

The file has two groups: `vlm-operator` (the per-VLMService alerts, the ones the operator's PrometheusRules
carry scoped to their service) and `vlm-operator-self` (the operator itself: down, reconcile errors; these
belong once per cluster, so no per-service PrometheusRule carries them; the chart ships them with its
ServiceMonitor). The self alerts select the operator's scrape job by `job="vlm-operator"` (OPERATOR_JOB):
the chart's ServiceMonitor takes the job name from the Service's app.kubernetes.io/name label; a plain
Prometheus scraping the operator must name its job so.

    python -m vlm_operator.desired.alerts           # write the plain rules file
    python -m vlm_operator.desired.alerts --check   # fail when it is stale

Runbooks: docs/alerts.md (one paragraph per alert, anchored by alert name).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vlm_operator.api.generated import write_or_check
from vlm_operator.api.names import DEFAULT_WATCH_FUNCTIONS, OPERATOR

RULES_FILE = Path("alerts") / "vlm-operator.rules.yaml"
OUTPUTS = (RULES_FILE, Path("charts") / "vlm-operator" / "files" / "vlm-operator.rules.yaml")
RUNBOOK = "https://github.com/vlmops/vlm-operator/blob/main/docs/alerts.md#"
WATCHED = "|".join(DEFAULT_WATCH_FUNCTIONS)
OPERATOR_JOB = OPERATOR
GROUP = OPERATOR
SELF_GROUP = f"{OPERATOR}-self"


def _sel(extra: str, scope: str) -> str:
    parts = [p for p in (scope, extra) if p]
    return "{" + ",".join(parts) + "}" if parts else ""


def _alert(name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity, "component": OPERATOR},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": RUNBOOK + name.lower(),
        },
    }


def self_rules(job: str = OPERATOR_JOB) -> list[dict[str, Any]]:
    """Alerts on the operator itself (once per cluster, not per VLMService)."""
    up = f'up{{job="{job}"}}'
    count = f'vlm_operator_reconcile_duration_seconds_count{{job="{job}"'
    return [
        _alert(
            "VLMOperatorDown",
            f"absent({up} == 1)",
            "5m",
            "critical",
            "No vlm-operator is up: VLMServices are not reconciled and canary rollouts are not gated",
            f"Prometheus has had no successful scrape of job {job} for 5 minutes (the operator pod is down, "
            "not ready, or its ServiceMonitor selects nothing). Running pods keep serving; rollouts in "
            "progress stay where they are.",
        ),
        _alert(
            "VLMOperatorReconcileErrors",
            f'sum by (job) (rate({count},result="error"}}[10m])) / sum by (job) (rate({count}}}[10m])) > 0.1',
            "15m",
            "warning",
            "{{ $value | humanizePercentage }} of vlm-operator reconciles fail",
            "More than 10% of the operator's reconciles failed (raised, or had an apply refused) for 15 minutes; "
            "vlm_operator_errors_total{reason}, the services' ApplyRefused condition and the operator's log name "
            "the cause (API errors by HTTP status, invalid specs).",
        ),
    ]


def rules(scope: str = "") -> list[dict[str, Any]]:
    """Alert rules; `scope` is a label matcher list (e.g. namespace="a",vlmservice="b") or empty."""
    alert = _alert

    loop_sel = _sel('signal="loop_latency"', scope)
    fn_sel = _sel(f'kind="inclusive",function=~"{WATCHED}"', scope)
    return [
        alert(
            "VLMSchedulerLoopLatencyRegression",
            f"max by (namespace, vlmservice) (vlm_operator_signal_delta{loop_sel}) > 0.05",
            "2m",
            "warning",
            "Canary of {{ $labels.namespace }}/{{ $labels.vlmservice }} runs the SGLang scheduler loop slower",
            "The canary's scheduler loop is {{ $value | humanizePercentage }} slower than the stable "
            "revision's. The canary gate will roll it back if the regression is significant.",
        ),
        alert(
            "VLMSchedulerHotFunctionShareHigh",
            f"max by (namespace, vlmservice, pod, function) (vlm_scheduler_function_share_ratio{fn_sel}) > 0.25",
            "10m",
            "warning",
            "{{ $labels.function }} takes {{ $value | humanizePercentage }} of the scheduler on {{ $labels.pod }}",
            "A watched input-processing function holds more than 25% of SGLang scheduler samples; the GPU is "
            "probably waiting for the Python scheduler. Check the flamegraph at the sidecar's /profile/latest.svg.",
        ),
        alert(
            "VLMIPCCacheInactive",
            f"max by (namespace, vlmservice) (vlm_operator_ipc_cache_active{_sel('', scope)}) == 0",
            "15m",
            "info",
            "{{ $labels.namespace }}/{{ $labels.vlmservice }} runs without the CUDA IPC pool-handle cache",
            "Multimodal features re-open a CUDA IPC handle each; SGLang measured 16% less throughput without "
            "the cache. Use SGLang >= 0.5.10 and spec.sglang.ipcCache.mode Auto or On.",
        ),
        alert(
            "VLMIPCCacheNotObserved",
            f"min by (namespace, vlmservice) (vlm_operator_ipc_cache_verified{_sel('', scope)}) == 0",
            "10m",
            "warning",
            "Pods of {{ $labels.namespace }}/{{ $labels.vlmservice }} re-open CUDA IPC handles although told to cache them",
            "The operator switched the IPC pool-handle cache on, but the profiler sidecars see the schedulers "
            "re-open a CUDA IPC handle per image feature (IPCCacheActive=False/NotObserved): the throughput the "
            "cache buys is lost. Check the SGLang version and the image's env against the flags.",
        ),
        alert(
            "VLMFrontendSaturated",
            f"max by (namespace, vlmservice, pod) (vlm_frontend_saturated{_sel('', scope)}) == 1",
            "10m",
            "warning",
            "The SGLang front end of {{ $labels.pod }} is saturated while its scheduler idles",
            "For 10 minutes the busiest front-end role (the tokenizer loop, the image processor pool or the "
            "detokenizer) was busy at least 90% of each profiling window while the scheduler idled at least half "
            "of it: requests wait before they reach the GPU. vlm_frontend_busy_share_ratio{busiest} names the "
            "role, the sidecar's /profile/latest.svg?role=ROLE shows where its time goes.",
        ),
        alert(
            "VLMServiceAutoscalerAtMax",
            f"max by (namespace, vlmservice) (vlm_operator_autoscaling_at_max{_sel('', scope)}) == 1",
            "15m",
            "warning",
            "{{ $labels.namespace }}/{{ $labels.vlmservice }} is at autoscaling.maxReplicas and still saturated",
            "For 15 minutes spec.autoscaling's HPA has wanted maxReplicas while the signal that drives it "
            "(status.autoscaling.signal) stayed above its target: requests queue and the service cannot grow. "
            "vlm_operator_autoscaling_signal_ratio{signal} says how far above; raise maxReplicas or add GPUs.",
        ),
        alert(
            "VLMProfilerStale",
            f"max by (namespace, vlmservice, pod) (vlm_profiler_stale{_sel('', scope)}) == 1",
            "5m",
            "warning",
            "The profiler sidecar of {{ $labels.pod }} has no fresh scheduler samples",
            "py-spy could not sample the SGLang scheduler (process not found, permission denied, py-spy "
            "crashing or timing out). Canary analysis treats stale data as inconclusive.",
        ),
        alert(
            "VLMProfilerDisagreesWithSGLang",
            # SGLang (0.5.20+) counts its scheduler's time by stage itself; the sidecar estimates the same shares
            # from py-spy samples. Measured within 0.6 points of the truth on real recordings: 2 points for 15
            # minutes means one of the two no longer measures the scheduler the other sees.
            f"max by (namespace, vlmservice, pod) (vlm_profiler_sglang_agreement_max_abs_diff_ratio"
            f"{_sel('', scope)}) > 0.02",
            "15m",
            "warning",
            "The profiler of {{ $labels.pod }} and SGLang's own stage counters disagree by "
            "{{ $value | humanizePercentage }}",
            "For 15 minutes a scheduler stage's share of time as the sidecar's py-spy samples estimate it and as "
            "SGLang's sglang:scheduler_stage_seconds_total counts it differed by more than 2 points. The gate reads "
            "both (stage_time from the sidecar, sglang_stage_time from SGLang's counters; the rollout's status "
            "shows their distance as sglangAgreement): check the sampling rate "
            "(vlm_profiler_effective_rate_hz), the stage mapping for this SGLang version, and "
            "vlm_profiler_sglang_stage_share_abs_diff_ratio{stage} for which stage differs.",
        ),
        alert(
            "VLMCanaryRolledBack",
            f"max by (namespace, vlmservice, revision, signal, function) "
            f"(vlm_operator_canary_rollback_info{_sel('', scope)}) == 1",
            "0m",
            # The gate did its job: nobody needs waking. VLMCanaryRollbackFailed pages when the rollback did not
            # leave a serving service.
            "warning",
            "Canary {{ $labels.revision }} of {{ $labels.namespace }}/{{ $labels.vlmservice }} was rolled back "
            "({{ $labels.signal }}, function {{ $labels.function }})",
            "The canary made SGLang slower: signal {{ $labels.signal }} regressed and "
            "{{ $labels.function }} grew most. The stable revision keeps serving; see status.rollout.",
        ),
        alert(
            "VLMServiceNotServing",
            # The operator's Ready condition (vlm_operator_service_failure_info): replicas missing and a pod that
            # cannot serve for a reason no retry fixes. 10 minutes: an image pull that a registry hiccup broke, or
            # one OOM of a pod that then starts, clears before; a crash loop or a refused pod does not.
            f"max by (namespace, vlmservice, reason) (vlm_operator_service_failure_info{_sel('', scope)} == 1)",
            "10m",
            "warning",
            "{{ $labels.namespace }}/{{ $labels.vlmservice }} is missing replicas: {{ $labels.reason }}",
            "For 10 minutes the service has had fewer ready replicas than it wants and its pods fail for a reason "
            "that needs a person ({{ $labels.reason }}); the GPUs they hold serve nothing. The Ready condition's "
            "message (kubectl describe vlms) names the pod and its last error.",
        ),
        alert(
            "VLMCanaryRollbackFailed",
            # The operator's own view of the pods (vlm_operator_service_failure_info: replicas missing for a reason
            # that needs a person) while it holds a rolled-back canary, when the canary's pods are gone: the
            # stable revision the rollback fell back to cannot serve. One failure reason per service, one held
            # revision: group_left is one-to-one per service.
            f"max by (namespace, vlmservice, reason) (vlm_operator_service_failure_info{_sel('', scope)} == 1) "
            f"* on (namespace, vlmservice) group_left (revision) "
            f"max by (namespace, vlmservice, revision) (vlm_operator_canary_rollback_info{_sel('', scope)} == 1)",
            "5m",
            "critical",
            "Canary {{ $labels.revision }} of {{ $labels.namespace }}/{{ $labels.vlmservice }} was rolled back, and "
            "the stable revision cannot serve ({{ $labels.reason }})",
            "The gate rolled the canary back, but for 5 minutes the service has had fewer ready replicas than it "
            "wants and its pods fail for a reason that needs a person ({{ $labels.reason }}: an image that cannot "
            "be pulled, a crash loop, OOMKilled, the startup budget exhausted, pods the API server refuses): the "
            "rollback did not leave a serving service. kubectl describe vlms names the pod and its last error.",
        ),
    ]


def names() -> list[str]:
    """Every shipped alert's name (the per-service group's, then the operator's own)."""
    return [r["alert"] for r in (*rules(), *self_rules())]


# An override may change these of a shipped rule (as kube-prometheus-stack's customRules do).
OVERRIDABLE = ("for", "severity")
_DURATION = re.compile(r"^((\d+)y)?((\d+)w)?((\d+)d)?((\d+)h)?((\d+)m)?((\d+)s)?((\d+)ms)?$")
_SEVERITY = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def override_errors(overrides: Mapping[str, Any]) -> list[str]:
    """What is wrong with `overrides` ({alert: {"for": "1m", "severity": "critical"}}), one line each."""
    known, errors = names(), []
    for name, o in overrides.items():
        if name not in known:
            errors.append(f"{name}: not a shipped alert (one of {', '.join(known)})")
            continue
        if not isinstance(o, Mapping) or not o:
            errors.append(f'{name}: must be an object with "for" and/or "severity"')
            continue
        for key, v in o.items():
            if key not in OVERRIDABLE:
                errors.append(f"{name}.{key}: only {' and '.join(OVERRIDABLE)} can be overridden")
            elif key == "for" and not (isinstance(v, str) and v and _DURATION.match(v)):
                errors.append(f"{name}.for: not a Prometheus duration such as 30s, 5m or 1h30m (got {v!r})")
            elif key == "severity" and not (isinstance(v, str) and _SEVERITY.match(v)):
                errors.append(f"{name}.severity: not a label value (got {v!r})")
    return errors


def overridden(rule_list: list[dict[str, Any]], overrides: Mapping[str, Mapping[str, str]] | None) -> list[dict[str, Any]]:
    """`rule_list` with each override applied: `for` as given, `severity` into the rule's labels."""
    if not overrides:
        return rule_list
    out = []
    for r in rule_list:
        o = overrides.get(r["alert"]) or {}
        r = {**r, "labels": dict(r["labels"])}
        if "for" in o:
            r["for"] = o["for"]
        if "severity" in o:
            r["labels"]["severity"] = o["severity"]
        out.append(r)
    return out


def rules_group(scope: str = "", name: str = GROUP,
                overrides: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, Any]:
    return {"groups": [{"name": name, "rules": overridden(rules(scope), overrides)}]}


def rules_file() -> dict[str, Any]:
    """The plain rules file: the unscoped per-service group and the operator's own."""
    return {"groups": [{"name": GROUP, "rules": rules()}, {"name": SELF_GROUP, "rules": self_rules()}]}


def build_prometheus_rule(name: str, namespace: str, owner_ref: dict[str, Any], labels: dict[str, str],
                          extra_labels: Mapping[str, str] | None = None,
                          overrides: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, Any]:
    """The per-VLMService PrometheusRule; `extra_labels` (VLM_MONITORING_LABELS, e.g. `release: ...` for a
    kube-prometheus-stack ruleSelector) go under the operator's own `labels`; `overrides`
    (VLM_ALERT_OVERRIDES, the chart's monitoring.customRules) change rules' `for` and severity."""
    scope = f'namespace="{namespace}",vlmservice="{name}"'
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": name, "namespace": namespace, "labels": {**dict(extra_labels or {}), **labels},
                     "ownerReferences": [owner_ref]},
        "spec": rules_group(scope, name=f"vlm-operator-{name}", overrides=overrides),
    }


def render() -> str:
    import yaml

    header = "# Generated by `python -m vlm_operator.desired.alerts`. Runbooks: docs/alerts.md\n"
    return header + yaml.safe_dump(rules_file(), sort_keys=False, width=200)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vlm_operator.desired.alerts")
    p.add_argument("--check", action="store_true")
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[3])
    a = p.parse_args(argv)
    return write_or_check(a.root, OUTPUTS, render(), check=a.check, command="python -m vlm_operator.desired.alerts")

if __name__ == "__main__":
    sys.exit(main())
