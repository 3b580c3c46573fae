"""Alert rules: the committed file is current, promtool accepts it, every alert has its runbook."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vlm_operator.desired import alerts

ROOT = Path(__file__).resolve().parents[4]


def test_rules_file_is_current():
    assert alerts.main(["--check", "--root", str(ROOT)]) == 0


def test_promtool_accepts_the_rules(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: run hack/install-system-deps.sh (Debian package prometheus)")
    path = tmp_path / "rules.yaml"
    path.write_text(alerts.render())
    scoped = tmp_path / "scoped.yaml"
    scoped.write_text(yaml.safe_dump(alerts.build_prometheus_rule("svc", "ns", {}, {})["spec"]))
    for p, n in ((path, 13), (scoped, 11)):
        out = subprocess.run([promtool, "check", "rules", str(p)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"SUCCESS: {n} rules found" in out.stdout


def test_each_alert_has_summary_description_and_a_runbook_paragraph():
    doc = (ROOT / "docs" / "alerts.md").read_text()
    names = {r["alert"] for r in alerts.rules()}
    assert names == {
        "VLMSchedulerLoopLatencyRegression",
        "VLMSchedulerHotFunctionShareHigh",
        "VLMIPCCacheInactive",
        "VLMIPCCacheNotObserved",
        "VLMProfilerStale",
        "VLMProfilerDisagreesWithSGLang",
        "VLMCanaryRolledBack",
        "VLMCanaryRollbackFailed",
        "VLMServiceNotServing",
        "VLMFrontendSaturated",
        "VLMServiceAutoscalerAtMax",
    }
    assert {r["alert"] for r in alerts.self_rules()} == {"VLMOperatorDown", "VLMOperatorReconcileErrors"}
    for r in alerts.rules() + alerts.self_rules():
        assert r["annotations"]["summary"] and r["annotations"]["description"]
        assert f"## {r['alert']}" in doc


def test_scoped_rules_select_one_service():
    rule = alerts.build_prometheus_rule("svc", "ns", {"kind": "VLMService"}, {})
    for r in rule["spec"]["groups"][0]["rules"]:
        assert 'vlmservice="svc"' in r["expr"] and 'namespace="ns"' in r["expr"]


def test_operator_alerts_are_in_the_file_once_and_in_no_service_rule():
    groups = alerts.rules_file()["groups"]
    assert [g["name"] for g in groups] == [alerts.GROUP, alerts.SELF_GROUP]
    scoped = alerts.build_prometheus_rule("svc", "ns", {}, {})["spec"]["groups"]
    assert not {r["alert"] for g in scoped for r in g["rules"]} & {r["alert"] for r in alerts.self_rules()}
    assert all('job="vlm-operator"' in r["expr"] for r in alerts.self_rules())


def test_extra_labels_go_under_the_operators_own():
    own = {"app.kubernetes.io/managed-by": "vlm-operator"}
    rule = alerts.build_prometheus_rule("svc", "ns", {}, own, extra_labels={"release": "kps",
                                                                           "app.kubernetes.io/managed-by": "x"})
    assert rule["metadata"]["labels"] == {"release": "kps", "app.kubernetes.io/managed-by": "vlm-operator"}


def test_overrides_change_for_and_severity_of_the_named_rules_only():
    o = {"VLMSchedulerLoopLatencyRegression": {"for": "5m"}, "VLMProfilerStale": {"severity": "critical"}}
    got = {r["alert"]: r for g in alerts.build_prometheus_rule("svc", "ns", {}, {}, overrides=o)["spec"]["groups"]
           for r in g["rules"]}
    shipped = {r["alert"]: r for r in alerts.rules('namespace="ns",vlmservice="svc"')}
    assert got["VLMSchedulerLoopLatencyRegression"] == {**shipped["VLMSchedulerLoopLatencyRegression"], "for": "5m"}
    assert got["VLMProfilerStale"]["labels"] == {**shipped["VLMProfilerStale"]["labels"], "severity": "critical"}
    assert got["VLMProfilerStale"]["for"] == shipped["VLMProfilerStale"]["for"]
    rest = set(shipped) - set(o)
    assert {n: got[n] for n in rest} == {n: shipped[n] for n in rest}
    assert alerts.rules() == alerts.overridden(alerts.rules(), None)  # the shipped ones are never mutated
    assert alerts.rules()[0]["for"] == "2m"


@pytest.mark.parametrize(("overrides", "error"), [
    ({"VLMNoSuchAlert": {"for": "1m"}}, "VLMNoSuchAlert: not a shipped alert (one of VLMSchedulerLoopLatency"),
    ({"VLMProfilerStale": {"for": "5 minutes"}}, "VLMProfilerStale.for: not a Prometheus duration"),
    ({"VLMProfilerStale": {"for": ""}}, "VLMProfilerStale.for: not a Prometheus duration"),
    ({"VLMProfilerStale": {"severity": "very bad"}}, "VLMProfilerStale.severity: not a label value"),
    ({"VLMProfilerStale": {"expr": "vector(1)"}}, "VLMProfilerStale.expr: only for and severity can be overridden"),
    ({"VLMProfilerStale": {}}, 'VLMProfilerStale: must be an object with "for" and/or "severity"'),
])
def test_override_errors_name_the_alert_and_the_key(overrides, error):
    (line,) = alerts.override_errors(overrides)
    assert line.startswith(error), line


def test_valid_overrides_for_every_shipped_alert_and_the_operators_own():
    assert not alerts.override_errors({n: {"for": "1h30m", "severity": "page"} for n in alerts.names()})
    assert set(alerts.names()) == {r["alert"] for g in alerts.rules_file()["groups"] for r in g["rules"]}


def test_a_rollback_is_a_warning_and_only_a_failed_one_pages():
    """A rolled-back canary is the gate working (warning, at once); the page is for a rollback after which the
    service's pods cannot serve (the operator's failure reasons), scoped to the service like every per-service
    rule."""
    by_name = {r["alert"]: r for r in alerts.rules('namespace="ns",vlmservice="svc"')}
    assert (by_name["VLMCanaryRolledBack"]["labels"]["severity"], by_name["VLMCanaryRolledBack"]["for"]) == ("warning", "0m")
    failed = by_name["VLMCanaryRollbackFailed"]
    assert (failed["labels"]["severity"], failed["for"]) == ("critical", "5m")
    assert failed["expr"].count('{namespace="ns",vlmservice="svc"}') == 2
    assert "vlm_operator_service_failure_info" in failed["expr"] and "vlm_operator_canary_rollback_info" in failed["expr"]
    pages = {r["alert"] for r in alerts.rules() + alerts.self_rules() if r["labels"]["severity"] == "critical"}
    assert pages == {"VLMCanaryRollbackFailed", "VLMOperatorDown"}

