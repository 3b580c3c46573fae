"""The Grafana dashboard: valid JSON, generated (dashboards/build.py), the chart carries the same copy,
and every metric its panels query is one that something we run exports.

Exported names come from the real collectors, not a list kept by hand: the operator's prometheus_client
metrics and state collector, the sidecar's `build_families`, and for SGLang the names the SGLang stand-in (which mirrors
SGLang's /metrics for the e2e tier) emits.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase

REPO = Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "dashboards" / "vlm-operator.json"
CHART_COPY = REPO / "charts" / "vlm-operator" / "files" / "vlm-operator-dashboard.json"
PROMQL_WORDS = {
    "sum", "avg", "max", "min", "by", "without", "rate", "increase", "irate", "histogram_quantile", "topk",
    "bottomk", "le", "count", "label_values", "and", "or", "unless", "on", "ignoring", "group_left",
}


def _build_module():
    spec = importlib.util.spec_from_file_location("dashboard_build", REPO / "dashboards" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _expose(name: str, kind: str) -> set[str]:
    """The sample names a metric family of this type shows in the text format."""
    if kind == "counter":
        return {name if name.endswith("_total") else f"{name}_total"}
    if kind == "histogram":
        return {name, f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return {name}


def exported_names() -> set[str]:
    import vlm_operator.api.metrics as om
    from vlm_sidecar.collector import StoreSnapshot, build_families

    names: set[str] = set()
    for obj in vars(om).values():
        if isinstance(obj, MetricWrapperBase | om.StateCollector):
            for fam in obj.describe():
                names |= _expose(fam.name, fam.type)
    labels = {"namespace": "n", "vlmservice": "v", "pod": "p", "revision": "r"}
    for fam in build_families(StoreSnapshot({}, {}, {}, []), labels, now=0.0, stale_after_s=60.0):
        names |= _expose(fam.name, fam.type)
    standin = (REPO / "testing" / "vlm_testing" / "standin" / "sglang_standin.py").read_text()
    for name in set(re.findall(r'"(sglang:[a-z_]+)"', standin)):
        kind = "histogram" if re.search(rf'hist\("{re.escape(name)}"', standin) else "gauge"
        names |= _expose(name, kind)
    return names


def _panels(d: dict) -> list[dict]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def _exprs(d: dict) -> list[str]:
    exprs = [t["expr"] for p in _panels(d) for t in p.get("targets", [])]
    for v in d["templating"]["list"]:
        if v["type"] == "query":  # label_values(SELECTOR, LABEL): only the selector is PromQL
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", v["query"]["query"])
            assert m, v["query"]["query"]
            exprs.append(m.group(1))
    return exprs


def metric_names(expr: str) -> set[str]:
    """Identifiers in a PromQL expression that are metric names (not functions, labels or keywords)."""
    no_strings = re.sub(r'"[^"]*"', '""', expr)
    no_labels = re.sub(r"\{[^}]*\}", "", no_strings)
    no_ranges = re.sub(r"\[[^\]]*\]", "", no_labels)
    no_grouping = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", no_ranges)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", no_grouping):
        word = m.group(0)
        following = no_grouping[m.end():].lstrip()
        if word in PROMQL_WORDS or following.startswith("(") or word.startswith("$"):
            continue
        names.add(word)
    return names


def test_dashboard_is_valid_json_and_up_to_date():
    d = json.loads(DASHBOARD.read_text())
    assert DASHBOARD.read_text() == _build_module().render(), "run `python dashboards/build.py`"
    assert CHART_COPY.read_text() == DASHBOARD.read_text(), "the chart's copy differs: run dashboards/build.py"
    assert d["uid"] and d["schemaVersion"] >= 36


def test_panels_have_unique_ids_and_fit_the_grid():
    d = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in _panels(d)]
    assert len(ids) == len(set(ids))
    for p in _panels(d):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for t in p.get("targets", []):
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
            assert t["expr"].count("{") == t["expr"].count("}"), t["expr"]


def test_every_queried_metric_is_exported():
    exported = exported_names()
    queried = set().union(*(metric_names(e) for e in _exprs(json.loads(DASHBOARD.read_text()))))
    assert queried, "no metric found in the dashboard's queries"
    assert queried <= exported, f"queried but nobody exports: {sorted(queried - exported)}"


@pytest.mark.parametrize("needed", [
    "vlm_scheduler_loop_seconds_bucket", "vlm_scheduler_stage_share_ratio", "vlm_scheduler_function_share_ratio",
    "sglang:time_to_first_token_seconds_bucket", "sglang:inter_token_latency_seconds_bucket",
    "vlm_operator_rollout_phase", "vlm_operator_rollouts_total", "vlm_operator_signal_delta",
])
def test_dashboard_covers_the_issue(needed):
    queried = set().union(*(metric_names(e) for e in _exprs(json.loads(DASHBOARD.read_text()))))
    assert needed in queried


def test_loop_latency_is_split_by_revision():
    """Baseline vs canary: the loop latency panels group by revision, so the two lines are apart."""
    d = json.loads(DASHBOARD.read_text())
    loop = [t["expr"] for p in _panels(d) for t in p.get("targets", []) if "vlm_scheduler_loop_seconds" in t["expr"]]
    assert loop and all(re.search(r"by \([^)]*\brevision\b", e) for e in loop), loop


def test_the_name_extractor_can_fail():
    assert metric_names('histogram_quantile(0.95, sum by (le) (rate(foo_bucket{a="b"}[5m])))') == {"foo_bucket"}
    assert metric_names("sum(sglang:gen_throughput) / count(up)") == {"sglang:gen_throughput", "up"}
