"""Every shipped alert fires when its condition is produced, at the right time with the right labels, and
its near-misses do not: the real `promtool test rules` over the rule files exactly as shipped.

The rule files are rendered here the way they reach a Prometheus, in two shipped sets:

- `operator` (a kube-prometheus-stack install): the PrometheusRule the operator builds for the VLMService
  ml/qwen (`alerts.build_prometheus_rule`, the scoped expressions; the Prometheus Operator writes its `spec`
  as the rule file) and the chart's PrometheusRule as `helm template` renders it next to the ServiceMonitor
  (the `vlm-operator-self` group: `alerts.self_rules()`);
- `plain`: the chart's PrometheusRule with `prometheusRule.enabled=true` (both groups, unscoped: the
  groups of alerts/vlm-operator.rules.yaml, for any Prometheus).

The cases are tests/promtool/*.yaml, one file per topic (format: tests/promtool/README.md). For each case
file and rule set a promtool test file is generated that names the rendered rule files, and one promtool run
checks them all; a failure shows promtool's output. Coverage is asserted too: every alert of every rule set
needs a case where it fires and one where it does not, run on that set, so a new alert without cases fails
here. Input series must use the names and labels the sidecar and the operator really export (read from their
collectors), so a typo cannot make a "does not fire" case pass by itself.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from vlm_operator.api import metrics as om
from vlm_operator.desired import alerts, builders
from vlm_testing.standin.prom_operator import chart_objects

REPO = Path(__file__).resolve().parents[4]
CASES = REPO / "tests" / "promtool"
NAMESPACE, SERVICE = "ml", "qwen"  # the VLMService the cases' series belong to
EVALUATION_INTERVAL = "30s"  # the Prometheus Operator's default (kube-prometheus-stack leaves it)
RULE_SETS = ("operator", "plain")
# Labels the scrape adds (the PodMonitor's and the ServiceMonitor's generated relabelings), next to the
# exporters' own: honorLabels keeps the exporter's namespace/pod where both have one.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint", "service",
                 "serving_vlmops_dev_vlmservice", "serving_vlmops_dev_revision", "serving_vlmops_dev_role"}
CASE_KEYS = {"evaluation_interval", "tests"}  # top level of a case file
GROUP_KEYS = {"name", "rule_sets", "interval", "input_series", "alert_rule_test", "promql_expr_test",
              "external_labels", "external_url"}


def _promtool() -> str:
    path = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if path is None:
        pytest.fail("promtool not found: run hack/install-system-deps.sh (Debian package prometheus)", pytrace=False)
    return path


def _helm() -> str:
    cache = Path(os.environ.get("VLM_CACHE") or Path.home() / ".cache" / "vlm-operator")
    for cand in (os.environ.get("VLM_HELM"), str(cache / "bin" / "helm"), shutil.which("helm")):
        if cand and Path(cand).exists():
            return cand
    pytest.fail("helm not found: run hack/build-binaries.sh (it installs helm into ~/.cache/vlm-operator/bin)",
                pytrace=False)


# --- the shipped rule files ----------------------------------------------------------------------------------


def _chart_rule(*sets: str) -> dict[str, Any]:
    objs = chart_objects(Path(_helm()), "vlm-system", *sets)
    (rule,) = [o for o in objs if o["kind"] == "PrometheusRule"]
    return rule


def render_rule_sets(out: Path) -> dict[str, list[Path]]:
    """The rule files of each set, written under `out`, as the Prometheus that loads them reads them."""
    owner = builders.Owner(SERVICE, NAMESPACE, "00000000-0000-0000-0000-000000000001")
    operator_rule = alerts.build_prometheus_rule(SERVICE, NAMESPACE, owner.reference(), builders.common_labels(owner),
                                                 extra_labels={"release": "kube-prometheus-stack"})
    files = {
        "operator": {f"{NAMESPACE}-{SERVICE}.yaml": operator_rule["spec"],
                     "vlm-system-vlm-vlm-operator.yaml": _chart_rule("metrics.serviceMonitor.enabled=true")["spec"]},
        # (chart_objects renders the ServiceMonitor template too, which is empty without it)
        "plain": {"vlm-system-vlm-vlm-operator.yaml": _chart_rule("prometheusRule.enabled=true",
                                                                  "metrics.serviceMonitor.enabled=true")["spec"]},
    }
    paths: dict[str, list[Path]] = {}
    for name, texts in files.items():
        (out / name).mkdir(parents=True, exist_ok=True)
        paths[name] = []
        for fname, spec in texts.items():
            p = out / name / fname
            p.write_text(yaml.safe_dump(spec, sort_keys=False, width=200))
            paths[name].append(p)
    return paths


def rules_of(paths: list[Path]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for p in paths:
        for g in yaml.safe_load(p.read_text())["groups"]:
            for r in g["rules"]:
                if "alert" in r:
                    assert r["alert"] not in out, f"alert {r['alert']} twice in one rule set"
                    out[r["alert"]] = r
    return out


# --- the cases -----------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One case file: its promtool test groups, each with the rule sets it runs on."""

    path: Path
    evaluation_interval: str
    groups: list[tuple[tuple[str, ...], dict[str, Any]]]


def load_cases(directory: Path = CASES) -> list[Case]:
    cases = []
    for path in sorted(directory.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text()) or {}
        unknown = set(doc) - CASE_KEYS
        assert not unknown, f"{path.name}: unknown top-level keys {sorted(unknown)} (allowed: {sorted(CASE_KEYS)})"
        assert doc.get("tests"), f"{path.name}: no tests"
        groups = []
        for g in doc["tests"]:
            unknown = set(g) - GROUP_KEYS
            assert not unknown, f"{path.name}: {g.get('name')}: unknown keys {sorted(unknown)}"
            sets = tuple(g.get("rule_sets") or RULE_SETS)
            assert set(sets) <= set(RULE_SETS), f"{path.name}: {g.get('name')}: rule_sets {sets} not in {RULE_SETS}"
            groups.append((sets, {k: v for k, v in g.items() if k != "rule_sets"}))
        cases.append(Case(path, doc.get("evaluation_interval", EVALUATION_INTERVAL), groups))
    return cases


def _expected_annotations(rule: dict[str, Any], given: dict[str, str] | None, where: str) -> dict[str, str]:
    """promtool compares an alert's annotations in full. A case writes the templated ones (what the template
    makes of the labels and the value is the point); the static ones are the rule's own text."""
    given = dict(given or {})
    for key, text in rule.get("annotations", {}).items():
        if key not in given:
            assert "{{" not in text, f"{where}: write the expected `{key}` annotation (it is a template: {text!r})"
            given[key] = text
    return given


def promtool_files(cases: list[Case], rule_sets: dict[str, list[Path]], out: Path) -> list[Path]:
    """One promtool test file per case file and rule set, naming that set's rule files."""
    written = []
    for case in cases:
        for set_name, paths in rule_sets.items():
            rules = rules_of(paths)
            tests = []
            for sets, group in case.groups:
                if set_name not in sets:
                    continue
                group = yaml.safe_load(yaml.safe_dump(group))  # a copy
                group["name"] = f"[{set_name}] {group.get('name', '')}"
                for t in group.get("alert_rule_test") or []:
                    where = f"{case.path.name}: {group['name']}: {t['alertname']} at {t['eval_time']}"
                    assert t["alertname"] in rules, f"{where}: no such alert in the {set_name} rules"
                    for a in t.get("exp_alerts") or []:
                        a["exp_annotations"] = _expected_annotations(rules[t["alertname"]], a.get("exp_annotations"),
                                                                     where)
                tests.append(group)
            if not tests:
                continue
            path = out / f"{case.path.stem}.{set_name}.test.yaml"
            path.write_text(yaml.safe_dump({"rule_files": [str(p) for p in paths],
                                            "evaluation_interval": case.evaluation_interval, "tests": tests},
                                           sort_keys=False, width=200))
            written.append(path)
    return written


def run_promtool(files: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_promtool(), "test", "rules", *map(str, files)], capture_output=True, text=True,
                          timeout=300)


def coverage_gaps(cases: list[Case], rule_sets: dict[str, list[Path]]) -> list[str]:
    """Each alert of each rule set without a case that fires it, or one that does not, on that set."""
    fires: set[tuple[str, str]] = set()
    quiet: set[tuple[str, str]] = set()
    for case in cases:
        for sets, group in case.groups:
            for t in group.get("alert_rule_test") or []:
                for s in sets:
                    (fires if t.get("exp_alerts") else quiet).add((s, t["alertname"]))
    gaps = []
    for set_name, paths in rule_sets.items():
        for name in sorted(rules_of(paths)):
            if (set_name, name) not in fires:
                gaps.append(f"{name} ({set_name} rules): no case where it fires")
            if (set_name, name) not in quiet:
                gaps.append(f"{name} ({set_name} rules): no case where it does not fire")
    return gaps


# --- what the exporters export ------------------------------------------------------------------------------


def exported_series() -> dict[str, set[str]]:
    """Sample name -> label names, from the operator's metrics and state collector and the sidecar's
    collector (their real families, filled with one sample each), plus Prometheus' own `up`."""
    from vlm_sidecar.collector import RankState, StoreSnapshot, build_families
    from vlm_sidecar.config import SidecarConfig
    from vlm_sidecar.model import WindowSummary

    out: dict[str, set[str]] = {"up": set()}

    def add(fams):
        for fam in fams:
            for s in fam.samples:
                out.setdefault(s.name, set()).update(k for k, v in s.labels.items())

    facts = om.ServiceFacts(phase="Analysing", signal_delta={"loop_latency": 0.1}, ipc_cache_active=1.0,
                            rollback=("r", "loop_latency", "f"), ipc_cache_verified=1.0, failure="CrashLoopBackOff",
                            autoscaling=(4.0, 4.0, 1.0), autoscaling_ratio={"schedulerBusy": 1.2})
    add(om.families(1.0, {(NAMESPACE, SERVICE): facts}))
    for obj in vars(om).values():
        if isinstance(obj, MetricWrapperBase):
            # Label names without adding a child to the process-wide metric (which other tests read);
            names = list(obj._labelnames)  # prometheus_client has no public accessor for them
            for fam in obj.describe():
                suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(fam.type, [""])
                for sfx in suffixes:
                    out.setdefault(fam.name + sfx, set()).update(names + (["le"] if sfx == "_bucket" else []))
    w = WindowSummary(id=1, tp_rank=0, pid=1, start=0.0, end=1.0, samples=10, loop_mean_seconds=0.02,
                      loop_p50_seconds=0.02, loop_p95_seconds=0.03, iterations=5, stage_shares={},
                      function_shares={"hash_feature": 0.1}, self_shares={"hash_feature": 0.05},
                      top_function="hash_feature", stale=False, error=None)
    from vlm_sidecar.roles import RoleSummary, frontend_window

    fe = frontend_window(2, 0.0, 1.0, {"mm_processor": RoleSummary("mm_processor", 2, 2, (3, 4), 0.95, 0.97, None,
                                                                   {"resize": 0.5}, {"resize": 0.4})}, [0.7])
    snap = StoreSnapshot({0: RankState(last_ok=w, last=w, agreement={"run_batch": 0.01})}, {("0", "ok"): 1.0}, {("0", "timeout"): 1.0}, [w], fe,
                         {("mm_processor", "timeout"): 1.0})
    add(build_families(snap, SidecarConfig().labels, now=1.0, stale_after_s=60.0))
    return out


_SERIES = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*(?:\{(.*)\})?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_series(text: str) -> tuple[str, dict[str, str]]:
    m = _SERIES.match(text)
    assert m, f"cannot read series {text!r}"
    name, body, labels = m.group(1) or "", m.group(2) or "", {}
    pos = 0
    while pos < len(body):
        lm = _LABEL.match(body, pos)
        assert lm and lm.end() > pos, f"cannot read the labels of {text!r}"
        labels[lm.group(1)] = lm.group(2)
        pos = lm.end()
    return labels.pop("__name__", name), labels


def series_problems(cases: list[Case], exported: dict[str, set[str]]) -> list[str]:
    problems = []
    for case in cases:
        for _, group in case.groups:
            for s in group.get("input_series") or []:
                name, labels = parse_series(s["series"])
                where = f"{case.path.name}: {group.get('name')}: {s['series'][:80]}"
                if name not in exported:
                    problems.append(f"{where}: {name} is not a series the sidecar or the operator exports")
                    continue
                extra = set(labels) - exported[name] - TARGET_LABELS
                if extra:
                    problems.append(f"{where}: labels {sorted(extra)} are neither {name}'s nor the scrape's")
    return problems


# --- the tests -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[Path]]:
    return render_rule_sets(tmp_path_factory.mktemp("rules"))


def test_the_rule_sets_are_the_shipped_rules(rendered):
    """What the cases run on: the operator's scoped rules plus the chart's self group, and the chart's full
    rules, which are the groups of alerts/vlm-operator.rules.yaml."""
    scoped = {r["alert"]: r for r in alerts.rules(f'namespace="{NAMESPACE}",vlmservice="{SERVICE}"')}
    own = {r["alert"]: r for r in alerts.self_rules()}
    assert rules_of(rendered["operator"]) == {**scoped, **own}
    plain = yaml.safe_load(rendered["plain"][0].read_text())
    assert plain == alerts.rules_file()
    assert plain == yaml.safe_load((REPO / alerts.RULES_FILE).read_text())


def test_every_shipped_alert_fires_on_its_condition_and_not_on_a_near_miss(rendered, tmp_path):
    cases = load_cases()
    assert cases, f"no case files in {CASES}"
    gaps = coverage_gaps(cases, rendered)
    assert not gaps, "alerts without promtool cases (add them to a tests/promtool/*.yaml):\n" + "\n".join(gaps)
    problems = series_problems(cases, exported_series())
    assert not problems, "\n".join(problems)
    files = promtool_files(cases, rendered, tmp_path)
    out = run_promtool(files)
    assert out.returncode == 0, f"promtool test rules failed:\n{out.stdout}\n{out.stderr}"
    # promtool names every file it ran and says SUCCESS for each passing one.
    assert out.stdout.count("SUCCESS") == len(files), out.stdout


def test_a_wrong_expectation_fails_promtool(rendered, tmp_path):
    """The pipeline can fail: VLMOperatorDown expected before its `for` has passed is refused, with the
    alert in promtool's report."""
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "early.yaml").write_text(yaml.safe_dump({"tests": [{
        "name": "too early", "interval": "30s",
        "input_series": [{"series": 'up{job="ml/qwen"}', "values": "1x20"}],
        "alert_rule_test": [{"eval_time": "4m30s", "alertname": "VLMOperatorDown", "exp_alerts": [
            {"exp_labels": {"severity": "critical", "component": "vlm-operator"}}]}]}]}))
    files = promtool_files(load_cases(tmp_path / "cases"), rendered, tmp_path)
    out = run_promtool(files)
    assert out.returncode != 0 and "FAILED" in out.stdout + out.stderr and "VLMOperatorDown" in out.stdout + out.stderr


def test_coverage_names_an_alert_without_cases(rendered):
    cases = [c for c in load_cases() if c.path.name != "operator.yaml"]
    gaps = coverage_gaps(cases, rendered)
    assert "VLMOperatorDown (operator rules): no case where it fires" in gaps, gaps
    assert "VLMOperatorReconcileErrors (plain rules): no case where it does not fire" in gaps, gaps


def test_a_series_the_exporters_do_not_have_is_refused():
    exported = exported_series()
    case = Case(Path("x.yaml"), "30s", [(RULE_SETS, {"name": "typo", "input_series": [
        {"series": 'vlm_scheduler_function_share{namespace="ml",vlmservice="qwen"}', "values": "1"},
        {"series": 'vlm_profiler_stale{namespace="ml",vlmservice="qwen",kind="inclusive"}', "values": "1"},
        {"series": 'vlm_profiler_stale{namespace="ml",vlmservice="qwen",pod="p",tp_rank="0",job="ml/qwen"}',
         "values": "1"}]})])
    problems = series_problems([case], exported)
    assert len(problems) == 2, problems
    assert "is not a series" in problems[0] and "['kind']" in problems[1], problems


def test_a_templated_annotation_must_be_written():
    rule = next(r for r in alerts.rules() if r["alert"] == "VLMCanaryRolledBack")
    with pytest.raises(AssertionError, match="write the expected `summary`"):
        _expected_annotations(rule, {"description": "x"}, "here")
    got = _expected_annotations(next(r for r in alerts.self_rules() if r["alert"] == "VLMOperatorDown"), {}, "here")
    assert got["runbook_url"].endswith("#vlmoperatordown")
