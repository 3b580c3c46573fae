"""Build the Grafana dashboard for vlm-operator (one source, two copies).

    python dashboards/build.py           # write dashboards/vlm-operator.json and the chart's copy
    python dashboards/build.py --check   # exit 1 when either copy is stale

Panels: canary rollout (phase, signal deltas, verdicts, rollbacks), scheduler loop latency baseline vs
canary (by revision), stage and function shares, SGLang TTFT / inter-token latency / throughput, the
profiler's own health, the front end, and spec.autoscaling (desired vs running replicas, the signals). Every metric a panel queries is one the operator, the sidecar or SGLang exports
(tests/unit/packaging/test_dashboard.py checks it against the real collectors).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from vlm_operator.api.names import LABEL_ROLE, PHASES

ROOT = Path(__file__).resolve().parents[1]
OUTPUTS = (ROOT / "dashboards" / "vlm-operator.json", ROOT / "charts" / "vlm-operator" / "files" / "vlm-operator-dashboard.json")
UID = "vlm-operator"
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'namespace=~"$namespace",vlmservice=~"$vlmservice"'
# Prometheus turns the pod label serving.vlmops.dev/role (PodMonitor podTargetLabels) into
# serving_vlmops_dev_role: every character a label name cannot hold becomes _.
ROLE = re.sub(r"[^A-Za-z0-9_]", "_", LABEL_ROLE)


def _target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "time_series") -> dict:
    t = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "format": fmt}
    if instant:
        t["instant"] = True
        t["range"] = False
    return t


def _panel(pid: int, title: str, kind: str, grid: tuple[int, int, int, int], targets: list[dict], *,
           unit: str = "short", description: str = "", stack: bool = False, extra: dict | None = None) -> dict:
    x, y, w, h = grid
    custom: dict[str, Any] = {}
    if kind == "timeseries":
        custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 30 if stack else 0, "showPoints": "never",
                  "stacking": {"mode": "normal" if stack else "none", "group": "A"}}
    p = {
        "id": pid, "type": kind, "title": title, "description": description, "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit, "custom": custom}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}} if kind == "timeseries" else {},
    }
    p.update(extra or {})
    return p


def _row(pid: int, title: str, y: int) -> dict:
    return {"id": pid, "type": "row", "title": title, "collapsed": False, "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
            "panels": []}


def _quantile(q: float, metric: str, by: str) -> str:
    return (f"histogram_quantile({q}, sum by ({by}, le) "
            f"(rate({metric}_bucket{{{SEL}}}[$__rate_interval])))")


def panels() -> list[dict]:
    out: list[dict] = [_row(1, "Canary rollout", 0)]
    out.append(_panel(2, "Rollout phase", "state-timeline", (0, 1, 12, 7), [
        _target(f"max by (namespace, vlmservice, phase) (vlm_operator_rollout_phase{{{SEL}}}) == 1",
                "{{vlmservice}}: {{phase}}")],
        description=f"Current phase of each VLMService's canary rollout ({', '.join(PHASES)}).",
        extra={"options": {"showValue": "never", "mergeValues": True, "rowHeight": 0.8}}))
    out.append(_panel(3, "Canary vs baseline, relative change per signal", "timeseries", (12, 1, 12, 7), [
        _target(f"vlm_operator_signal_delta{{{SEL}}}", "{{vlmservice}} {{signal}}")],
        unit="percentunit",
        description="Last relative delta the canary gate measured (positive: the canary is worse for latency "
                    "signals). The gate rolls back when a signal is confidently worse than half its maxRegression "
                    "and estimated beyond it."))
    out.append(_panel(4, "Rollout verdicts", "bargauge", (0, 8, 8, 6), [
        _target("sum by (result) (increase(vlm_operator_rollouts_total[$__range]))", "{{result}}", instant=True),
        _target("sum by (decided_by) (increase(vlm_operator_step_decisions_total[$__range]))",
                "step decided by {{decided_by}}", instant=True)],
        description="Finished rollouts in the selected time range (promoted, rolled_back, aborted), and what decided "
                    "their steps: the evidence, the harm ceiling, or the clock (timeout: maxDuration and "
                    "onInconclusive). Many timeouts: the gate cannot resolve the margins with this schedule.",
        extra={"options": {"orientation": "horizontal", "displayMode": "basic",
                           "reduceOptions": {"calcs": ["lastNotNull"], "values": False}}}))
    out.append(_panel(5, "Rolled-back canaries (signal and function that regressed)", "table", (8, 8, 16, 6), [
        _target(f"max by (namespace, vlmservice, revision, signal, function) "
                f"(vlm_operator_canary_rollback_info{{{SEL}}}) == 1", instant=True, fmt="table")],
        extra={"transformations": [{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}}]}))

    out.append(_row(6, "SGLang scheduler loop: baseline vs canary (by revision)", 14))
    by = f"namespace, vlmservice, revision, {ROLE}"
    out.append(_panel(7, "Scheduler loop latency p50 / p95", "timeseries", (0, 15, 12, 8), [
        _target(_quantile(0.95, "vlm_scheduler_loop_seconds", by), f"p95 {{{{vlmservice}}}} {{{{{ROLE}}}}} {{{{revision}}}}"),
        _target(_quantile(0.5, "vlm_scheduler_loop_seconds", by), f"p50 {{{{vlmservice}}}} {{{{{ROLE}}}}} {{{{revision}}}}",
                ref="B")],
        unit="s", description="Estimated SGLang scheduler loop iteration time from the py-spy sidecar. A canary "
                              "revision above its baseline is what the canary gate rolls back."))
    out.append(_panel(8, "Scheduler loop latency mean", "timeseries", (12, 15, 12, 8), [
        _target(f"sum by ({by}) (rate(vlm_scheduler_loop_seconds_sum{{{SEL}}}[$__rate_interval])) / "
                f"sum by ({by}) (rate(vlm_scheduler_loop_seconds_count{{{SEL}}}[$__rate_interval]))",
                f"{{{{vlmservice}}}} {{{{{ROLE}}}}} {{{{revision}}}}")],
        unit="s", description="The signal the canary gate compares (mean loop time per window)."))

    out.append(_row(9, "Where the scheduler spends its time", 23))
    out.append(_panel(10, "Loop stage shares", "timeseries", (0, 24, 12, 9), [
        _target(f"avg by (revision, stage) (vlm_scheduler_stage_share_ratio{{{SEL}}})", "{{revision}} {{stage}}")],
        unit="percentunit", stack=False,
        description="recv_requests, process_input_requests, get_next_batch_to_run, run_batch, "
                    "process_batch_result, idle, other; last profiling window."))
    out.append(_panel(11, "Watched and hot functions (inclusive share)", "timeseries", (12, 24, 12, 9), [
        _target(f'avg by (revision, function) (vlm_scheduler_function_share_ratio{{{SEL},kind="inclusive"}})',
                "{{revision}} {{function}}")],
        unit="percentunit",
        description="Share of scheduler samples with the function on the stack (watch list plus top N). "
                    "hash_feature or reconstruct_on_target_device growing means per-image work in the scheduler."))
    out.append(_panel(12, "Top self-time functions", "table", (0, 33, 24, 7), [
        _target(f'topk(15, avg by (revision, function) (vlm_scheduler_function_share_ratio{{{SEL},kind="self"}}))',
                instant=True, fmt="table")],
        unit="percentunit",
        extra={"transformations": [{"id": "organize", "options": {"excludeByName": {"Time": True}}}]}))

    out.append(_row(13, "SGLang serving latency", 40))
    pod_sel = 'namespace=~"$namespace",serving_vlmops_dev_vlmservice=~"$vlmservice"'
    sg_by = "serving_vlmops_dev_vlmservice, serving_vlmops_dev_revision"
    for pid, x, title, metric in ((14, 0, "Time to first token p95", "sglang:time_to_first_token_seconds"),
                                  (15, 8, "Inter-token latency p95", "sglang:inter_token_latency_seconds")):
        out.append(_panel(pid, title, "timeseries", (x, 41, 8, 8), [
            _target(f"histogram_quantile(0.95, sum by ({sg_by}, le) (rate({metric}_bucket{{{pod_sel}}}[$__rate_interval])))",
                    "{{serving_vlmops_dev_vlmservice}} {{serving_vlmops_dev_revision}}")],
            unit="s", description=f"{metric} from SGLang's /metrics (--enable-metrics), scraped by the "
                                  "operator's PodMonitor; revision from the pod label."))
    out.append(_panel(16, "Generation throughput", "timeseries", (16, 41, 8, 8), [
        _target(f"sum by ({sg_by}) (sglang:gen_throughput{{{pod_sel}}})",
                "{{serving_vlmops_dev_vlmservice}} {{serving_vlmops_dev_revision}}")], unit="short",
        description="Tokens per second (sglang:gen_throughput)."))

    out.append(_row(17, "Profiler and operator health", 49))
    out.append(_panel(18, "Profiler windows by result", "timeseries", (0, 50, 8, 7), [
        _target(f"sum by (result) (rate(vlm_profiler_windows_total{{{SEL}}}[$__rate_interval]))", "{{result}}")],
        unit="ops"))
    out.append(_panel(19, "Stale profilers / sampling errors", "timeseries", (8, 50, 8, 7), [
        _target(f"sum by (vlmservice) (vlm_profiler_stale{{{SEL}}})", "stale {{vlmservice}}"),
        _target(f"sum by (kind) (rate(vlm_profiler_errors_total{{{SEL}}}[$__rate_interval]))", "errors {{kind}}",
                ref="B")]))
    out.append(_panel(20, "Operator reconciles and errors", "timeseries", (16, 50, 8, 7), [
        _target("sum by (result) (rate(vlm_operator_reconcile_duration_seconds_count[$__rate_interval]))",
                "reconciles {{result}}"),
        _target("sum by (reason) (rate(vlm_operator_errors_total[$__rate_interval]))", "errors {{reason}}", ref="B"),
        _target("sum(vlm_operator_managed_services)", "managed VLMServices", ref="C")], unit="short"))

    out.append(_row(21, "SGLang front end: tokenizer loop, image processor pool, detokenizer", 57))
    out.append(_panel(22, "Busy share per role", "timeseries", (0, 58, 12, 8), [
        _target(f"avg by (revision, role) (vlm_process_busy_share_ratio{{{SEL}}})", "{{revision}} {{role}}")],
        unit="percentunit", stack=False,
        description="Share of each profiling window a role was busy (not waiting for work): tokenizer_manager / "
                    "tokenizer_worker the asyncio loop, mm_processor the fraction of the processor pool busy, "
                    "detokenizer its loop, scheduler 1 - its idle share. A front-end role near 100% while the "
                    "scheduler's share is low: the front end is the bottleneck (VLMFrontendSaturated)."))
    out.append(_panel(23, "Front-end saturation and processes", "timeseries", (12, 58, 12, 8), [
        _target(f"sum by (role) (vlm_processes{{{SEL}}})", "processes {{role}}"),
        _target(f"max by (pod, busiest) (vlm_frontend_busy_share_ratio{{{SEL}}})", "busiest {{pod}} {{busiest}}",
                ref="B"),
        _target(f"max by (pod) (vlm_frontend_saturated{{{SEL}}})", "saturated {{pod}}", ref="C")],
        unit="short",
        description="SGLang processes found per role; the busiest front-end role's busy share and the saturation "
                    "signal (1: busiest role >= 90% busy while the scheduler idles >= 50%), per pod. Flamegraph "
                    "per role: the sidecar's /profile/latest.svg?role=ROLE."))

    out.append(_row(24, "Autoscaling (spec.autoscaling, through KEDA)", 66))
    out.append(_panel(25, "Replicas: desired vs running", "timeseries", (0, 67, 12, 8), [
        _target(f"max by (vlmservice) (vlm_operator_autoscaling_desired_replicas{{{SEL}}})", "desired {{vlmservice}}"),
        _target(f"max by (vlmservice) (vlm_operator_autoscaling_max_replicas{{{SEL}}})", "max {{vlmservice}}",
                ref="B"),
        _target(f'count by (vlmservice) (max by (vlmservice, pod) (vlm_scheduler_stage_share_ratio{{{SEL},stage="idle"}}))',
                "running {{vlmservice}}", ref="C")],
        unit="short",
        description="What spec.autoscaling's HPA (made by KEDA from the operator's ScaledObject) wants, its "
                    "maxReplicas, and the pods whose sidecars report. Desired at max for long: "
                    "VLMServiceAutoscalerAtMax."))
    out.append(_panel(26, "Autoscaling signals: value / target", "timeseries", (12, 67, 12, 8), [
        _target(f"max by (vlmservice, signal) (vlm_operator_autoscaling_signal_ratio{{{SEL}}})",
                "{{vlmservice}} {{signal}}")],
        unit="short",
        description="Each target's current value over its target as the HPA last read it: above 1 it wants more "
                    "replicas; the highest line drives the count (status.autoscaling.signal)."))
    return out


def _variable(name: str, label: str, query: str) -> dict:
    return {"name": name, "label": label, "type": "query", "datasource": DS, "query": {"query": query, "refId": name},
            "definition": query, "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "sort": 1}


def dashboard() -> dict:
    return {
        "uid": UID,
        "title": "vlm-operator: SGLang scheduler and canary rollouts",
        "description": "Scheduler-loop latency baseline vs canary, stage and function shares, SGLang TTFT/ITL, "
                       "rollout phase and verdicts.",
        "tags": ["vlm-operator", "sglang", "canary"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0},
            _variable("namespace", "Namespace", "label_values(vlm_scheduler_loop_seconds_count, namespace)"),
            _variable("vlmservice", "VLMService",
                      'label_values(vlm_scheduler_loop_seconds_count{namespace=~"$namespace"}, vlmservice)'),
        ]},
        "annotations": {"list": []},
        "panels": panels(),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    text = render()
    stale = [o for o in OUTPUTS if not o.exists() or o.read_text() != text]
    if args.check:
        for o in stale:
            print(f"{o} is stale: run `python dashboards/build.py`", file=sys.stderr)
        return 1 if stale else 0
    for o in OUTPUTS:
        o.parent.mkdir(parents=True, exist_ok=True)
        o.write_text(text)
        print(f"wrote {o}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
