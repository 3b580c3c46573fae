"""The chart's Prometheus Operator objects (issue 13): honorLabels, one set of extra labels for every
monitoring object (the chart's and, through VLM_MONITORING_LABELS, the operator's), relabelings,
namespaces, and the operator's own alerts next to its ServiceMonitor."""

from __future__ import annotations

import json

from vlm_operator import alerts

from tests.unit.packaging.test_chart import by_kind, docs, template

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
