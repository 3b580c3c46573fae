"""Alert rules: the committed file is current, promtool accepts it, every alert has its runbook."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from vlm_operator import alerts

ROOT = Path(__file__).resolve().parents[3]


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
    for p, n in ((path, 9), (scoped, 7)):
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
        "VLMCanaryRolledBack",
        "VLMFrontendSaturated",
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
