"""The chart's Prometheus Operator objects (issue 13): honorLabels, one set of extra labels for every
monitoring object (the chart's and, through VLM_MONITORING_LABELS, the operator's), relabelings,
namespaces, and the operator's own alerts next to its ServiceMonitor."""

from __future__ import annotations

import json

from vlm_operator.desired import alerts
from vlm_testing.chart import CHART, by_kind, docs, template

ON = ("--set", "metrics.serviceMonitor.enabled=true")


def _env(objs: list[dict]) -> dict[str, str]:
    (dep,) = by_kind(objs, "Deployment")
    return {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_defaults_ship_no_monitoring_objects_and_no_extra_labels():
    objs = docs(template())
    assert not by_kind(objs, "ServiceMonitor") and not by_kind(objs, "PrometheusRule")
    assert "VLM_MONITORING_LABELS" not in _env(objs)


def test_service_monitor_honours_labels_and_names_the_job():
    (sm,) = by_kind(docs(template(None, *ON)), "ServiceMonitor")
    (ep,) = sm["spec"]["endpoints"]
    assert ep["honorLabels"] is True and "relabelings" not in ep
    assert sm["spec"]["jobLabel"] == "app.kubernetes.io/name"  # job="vlm-operator", as the self alerts select
    assert f'job="{alerts.OPERATOR_JOB}"' in alerts.self_rules()[0]["expr"]


def test_extra_labels_reach_every_monitoring_object_and_the_operator():
    objs = docs(template(None, *ON, "--set", "prometheusRule.enabled=true",
                         "--set", "monitoring.extraLabels.release=kube-prometheus-stack",
                         "--set", "metrics.serviceMonitor.labels.team=ml"))
    (sm,), (pr,) = by_kind(objs, "ServiceMonitor"), by_kind(objs, "PrometheusRule")
    assert sm["metadata"]["labels"]["release"] == pr["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["metadata"]["labels"]["team"] == "ml" and "team" not in pr["metadata"]["labels"]
    assert json.loads(_env(objs)["VLM_MONITORING_LABELS"]) == {"release": "kube-prometheus-stack"}


def test_object_labels_win_over_extra_labels():
    objs = docs(template(None, *ON, "--set", "monitoring.extraLabels.release=a",
                         "--set", "metrics.serviceMonitor.labels.release=b"))
    (sm,) = by_kind(objs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "b"


def test_relabelings_and_namespaces():
    objs = docs(template(None, *ON, "--set", "prometheusRule.enabled=true",
                         "--set", "metrics.serviceMonitor.namespace=monitoring",
                         "--set", "prometheusRule.namespace=monitoring",
                         "--set-json", 'metrics.serviceMonitor.relabelings=[{"targetLabel":"cluster","replacement":"c1"}]',
                         "--set-json", 'metrics.serviceMonitor.metricRelabelings=[{"action":"drop","regex":"go_.*",'
                                       '"sourceLabels":["__name__"]}]'))
    (sm,), (pr,) = by_kind(objs, "ServiceMonitor"), by_kind(objs, "PrometheusRule")
    assert sm["metadata"]["namespace"] == pr["metadata"]["namespace"] == "monitoring"
    (svc,) = [s for s in by_kind(objs, "Service") if s["metadata"]["name"].endswith("-metrics")]
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [svc["metadata"]["namespace"]]}
    (ep,) = sm["spec"]["endpoints"]
    assert ep["relabelings"] == [{"targetLabel": "cluster", "replacement": "c1"}]
    assert ep["metricRelabelings"][0]["action"] == "drop"


def test_operator_alerts_ship_with_the_service_monitor_alone():
    (pr,) = by_kind(docs(template(None, *ON)), "PrometheusRule")
    assert pr["spec"] == {"groups": [g for g in alerts.rules_file()["groups"] if g["name"] == alerts.SELF_GROUP]}
    off = docs(template(None, *ON, "--set", "prometheusRule.operatorAlerts=false"))
    assert not by_kind(off, "PrometheusRule")
    (full,) = by_kind(docs(template(None, "--set", "prometheusRule.enabled=true")), "PrometheusRule")
    assert full["spec"] == alerts.rules_file()


def test_custom_rules_tune_the_charts_rules_and_reach_the_operator():
    objs = docs(template(None, *ON, "--set", "prometheusRule.enabled=true",
                         "--set", "monitoring.customRules.VLMOperatorDown.for=10m",
                         "--set", "monitoring.customRules.VLMOperatorDown.severity=page",
                         "--set", "monitoring.customRules.VLMSchedulerLoopLatencyRegression.for=30s"))
    (pr,) = by_kind(objs, "PrometheusRule")
    overrides = {"VLMOperatorDown": {"for": "10m", "severity": "page"},
                 "VLMSchedulerLoopLatencyRegression": {"for": "30s"}}
    assert pr["spec"] == {"groups": [{**g, "rules": alerts.overridden(g["rules"], overrides)}
                                     for g in alerts.rules_file()["groups"]]}
    got = {r["alert"]: r for g in pr["spec"]["groups"] for r in g["rules"]}
    assert (got["VLMOperatorDown"]["for"], got["VLMOperatorDown"]["labels"]["severity"]) == ("10m", "page")
    assert got["VLMSchedulerLoopLatencyRegression"]["for"] == "30s"
    # The operator gets the same overrides for the PrometheusRule it writes per VLMService, and accepts them.
    assert json.loads(_env(objs)["VLM_ALERT_OVERRIDES"]) == overrides
    assert not alerts.override_errors(json.loads(_env(objs)["VLM_ALERT_OVERRIDES"]))
    # Without customRules: the shipped rules, and no variable.
    plain = docs(template(None, *ON, "--set", "prometheusRule.enabled=true"))
    assert by_kind(plain, "PrometheusRule")[0]["spec"] == alerts.rules_file()
    assert "VLM_ALERT_OVERRIDES" not in _env(plain)


def test_the_schema_admits_exactly_the_shipped_alert_names():
    schema = json.loads((CHART / "values.schema.json").read_text())
    custom = schema["properties"]["monitoring"]["properties"]["customRules"]
    assert custom["propertyNames"]["enum"] == alerts.names()
    assert custom["additionalProperties"]["properties"]["for"]["pattern"] == alerts._DURATION.pattern
