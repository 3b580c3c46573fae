"""A third-party scanner on what the project ships: Checkov on the rendered chart (default values, and with
monitoring on) and on the objects the operator generates for every example. Each finding must be accepted,
with its reason, in hack/checkov-accepted.yaml, and each accepted entry must still fire, so that file stays
the list of what the scanner reports. Also here: the fixes the scan asked for in the chart (the NetworkPolicies
of the operator's and the `helm test` pods) agree with what the operator reaches and is reached by.

Checkov's dependencies conflict with the project's pins (pydantic among them), so it never enters the project's
environment: the setup step (`make fetch`: hack/fetch-checkov.sh) makes a venv of its own, once, under
~/.cache/vlm-operator/checkov-venv/<version> (or $VLM_CACHE/checkov-venv/<version>), and the test runs checkov
from it. Without that venv the test fails, naming the command; it is never skipped and never installs anything.
A scan takes a few seconds.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from vlm_operator.api import names
from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.settings import DEFAULT_PROFILER_PEERS, Settings
from vlm_operator.desired import builders
from vlm_testing.chart import (
    CHART,
    GOLDEN,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    by_kind,
    docs,
    helm,
    template,
)

REPO = Path(__file__).resolve().parents[3]
FETCH = REPO / "hack" / "fetch-checkov.sh"
_pin = re.search(r"^CHECKOV_VERSION=(\S+)$", FETCH.read_text(), re.M)
assert _pin, f"no CHECKOV_VERSION= in {FETCH}"
CHECKOV_VERSION = _pin.group(1)
ACCEPTED = REPO / "hack" / "checkov-accepted.yaml"
CHART_CASES = ("default", "monitoring", "injection", "judge")
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
SERVING_NAMESPACE = "ml"


def _venv_dir() -> Path:
    cache = Path(os.environ.get("VLM_CACHE") or Path.home() / ".cache" / "vlm-operator")
    return cache / "checkov-venv" / CHECKOV_VERSION


def _clean_env() -> dict[str, str]:
    """The environment for checkov: none of the project's Python paths or pip constraints."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_CONSTRAINT", "PIP_REQUIRE_HASHES", "VIRTUAL_ENV")}
    return {**env, "PYTHONNOUSERSITE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def checkov_bin() -> Path:
    """The venv's checkov, which the setup step made (hack/fetch-checkov.sh, run by `make fetch`); the test never
    installs it (no registry at test time) and fails, naming the command, when it is missing."""
    venv = _venv_dir()
    marker = venv / ".complete"
    if not (marker.exists() and marker.read_text().strip() == CHECKOV_VERSION and (venv / "bin" / "checkov").exists()):
        pytest.fail(f"checkov {CHECKOV_VERSION} is not in {venv}: run `make fetch` (hack/fetch-checkov.sh) before the "
                    "tests; they do not download it", pytrace=False)
    return venv / "bin" / "checkov"


def write_inputs(out: Path) -> list[str]:
    """The scanned manifests, one file per input (its stem is the input's name in the accepted list)."""
    for case in CHART_CASES:
        (out / f"chart-{case}.yaml").write_text(template(GOLDEN / f"{case}.values.yaml", crd=True))
    settings = Settings()
    for path in EXAMPLES:
        doc = yaml.safe_load(path.read_text())
        owner = builders.Owner(doc["metadata"]["name"], SERVING_NAMESPACE, "00000000-0000-0000-0000-000000000001")
        spec = api.parse_spec(doc["spec"])
        d = builders.build_desired(owner, spec, settings)
        objs = [builders.build_deployment(owner, d.template, d.revision, spec.replicas),
                d.service, d.pdb, d.network_policy]
        (out / f"vlmservice-{path.stem}.yaml").write_text(yaml.safe_dump_all([o for o in objs if o], sort_keys=False))
    return sorted(p.stem for p in out.glob("*.yaml"))


def run_checkov(inputs: Path) -> dict:
    proc = subprocess.run(
        [str(checkov_bin()), "--directory", str(inputs), "--framework", "kubernetes", "--output", "json",
         "--soft-fail", "--skip-download"],
        capture_output=True, text=True, timeout=300, env=_clean_env(), cwd=inputs)
    assert proc.returncode == 0, f"checkov exited {proc.returncode}: {proc.stderr[-3000:]}"
    report = json.loads(proc.stdout)
    (report,) = report if isinstance(report, list) else [report]  # one framework, one report
    assert report["check_type"] == "kubernetes" and report["summary"]["checkov_version"] == CHECKOV_VERSION
    return report


def _finding(check: dict) -> tuple[str, str, str]:
    return check["check_id"], Path(check["file_path"]).stem, check["resource"]


def _accepts(entry: dict, finding: tuple[str, str, str]) -> bool:
    check_id, source, resource = finding
    return (entry["id"] == check_id and fnmatch.fnmatchcase(source, entry["inputs"])
            and fnmatch.fnmatchcase(resource, entry["resource"]))


def load_accepted() -> list[dict]:
    doc = yaml.safe_load(ACCEPTED.read_text())
    assert doc["checkov"] == CHECKOV_VERSION, (
        f"{ACCEPTED.name} was written for checkov {doc['checkov']}, the test runs {CHECKOV_VERSION}: review it")
    entries = doc["accepted"]
    for e in entries:
        assert set(e) == {"id", "inputs", "resource", "status", "why"}, e
        assert e["status"] in ("by-design", "open") and len(e["why"].split()) >= 8, e
    keys = [(e["id"], e["inputs"], e["resource"]) for e in entries]
    assert len(keys) == len(set(keys)), "an entry is listed twice"
    return entries


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_checkov_findings_are_the_accepted_ones(tmp_path):
    accepted = load_accepted()
    sources = write_inputs(tmp_path)
    report = run_checkov(tmp_path)
    summary, results = report["summary"], report["results"]
    assert summary["parsing_errors"] == 0, results.get("parsing_errors")
    scanned = {Path(c["file_path"]).stem for c in results["passed_checks"] + results["failed_checks"]}
    assert scanned == set(sources), f"inputs without a single check: {set(sources) - scanned}"

    findings = sorted({_finding(c): c for c in results["failed_checks"]}.items())
    unaccepted = [f"{cid} {name!r} on {resource} ({source})"
                  for (cid, source, resource), c in findings
                  for name in [c["check_name"]]
                  if not any(_accepts(e, (cid, source, resource)) for e in accepted)]
    stale = [f"{e['id']} on {e['resource']} ({e['inputs']})" for e in accepted
             if not any(_accepts(e, f) for f, _ in findings)]
    print(f"checkov {CHECKOV_VERSION}: {summary['passed']} passed, {summary['failed']} failed "
          f"({len(findings)} findings, {len(accepted)} accepted entries) over {', '.join(sources)}")
    problems = []
    if unaccepted:
        problems.append("findings not in hack/checkov-accepted.yaml (fix them, or accept them there with a reason):"
                        + "".join(f"\n  {u}" for u in unaccepted))
    if stale:
        problems.append("accepted entries that no longer fire (remove them from hack/checkov-accepted.yaml):"
                        + "".join(f"\n  {s}" for s in stale))
    assert not problems, "\n".join(problems)


# ---- the chart's NetworkPolicies (the fix for CKV2_K8S_6, "pods without a NetworkPolicy")

def _policies(*values: str, golden: str | None = None) -> dict[str, dict]:
    objs = docs(template(GOLDEN / f"{golden}.values.yaml" if golden else None, *values))
    return {p["metadata"]["name"]: p for p in by_kind(objs, "NetworkPolicy")}


def _ports(rule: dict) -> set[tuple[str, int]]:
    return {(p.get("protocol", "TCP"), p["port"]) for p in rule["ports"]}


def _matches(selector: dict, labels: dict) -> bool:
    return selector.get("matchLabels", {}).items() <= labels.items() and not selector.get("matchExpressions")


def test_operator_network_policy_admits_what_the_operator_needs():
    objs = docs(template(GOLDEN / "default.values.yaml"))
    (dep,) = by_kind(objs, "Deployment")
    (test_pod,) = by_kind(objs, "Pod")
    pols = {p["metadata"]["name"]: p for p in by_kind(objs, "NetworkPolicy")}
    op, test = pols[f"{RELEASE}-vlm-operator"], pols[f"{RELEASE}-vlm-operator-test-metrics"]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert _matches(op["spec"]["podSelector"], pod_labels) and not _matches(op["spec"]["podSelector"],
                                                                              test_pod["metadata"]["labels"])
    assert _matches(test["spec"]["podSelector"], test_pod["metadata"]["labels"])
    assert not _matches(test["spec"]["podSelector"], pod_labels)
    assert op["spec"]["policyTypes"] == test["spec"]["policyTypes"] == ["Ingress", "Egress"]

    (c,) = dep["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    ingress = op["spec"]["ingress"]
    assert [_ports(r) for r in ingress] == [{("TCP", ports["metrics"])}, {("TCP", ports["health"])}]
    assert all("from" not in r for r in ingress), "defaults: metrics and probes from anywhere"

    egress = op["spec"]["egress"]
    assert _ports(egress[0]) == {("UDP", 53), ("TCP", 53)}
    assert _ports(egress[1]) == {("TCP", 443), ("TCP", 6443)} and "to" not in egress[1]
    (sidecars,) = [r for r in egress if ("TCP", names.SIDECAR_PORT) in _ports(r)]
    (peer,) = sidecars["to"]
    serving = builders.common_labels(builders.Owner("svc", "ml", "u"))
    assert _matches(peer["podSelector"], serving) and peer["namespaceSelector"] == {}
    assert len(egress) == 3, "no Prometheus URL, no Prometheus rule"
    # Each service's own NetworkPolicy admits the chart's operator pod to the sidecar's port.
    assert any(_matches(p["podSelector"], pod_labels) for p in DEFAULT_PROFILER_PEERS)

    # The test pod: nothing in, DNS and the operator's metrics port out.
    assert "ingress" not in test["spec"]
    dns, metrics = test["spec"]["egress"]
    assert _ports(dns) == {("UDP", 53), ("TCP", 53)} and _ports(metrics) == {("TCP", ports["metrics"])}
    assert _matches(metrics["to"][0]["podSelector"], pod_labels)


@pytest.mark.parametrize(("url", "port"), [
    ("http://prometheus.monitoring:9090", 9090), ("https://mimir.example.com/prometheus", 443),
    ("http://prometheus-operated.monitoring.svc", 80), ("https://[fd00::1]:9443/", 9443),
])
def test_prometheus_port_follows_the_url(url, port):
    (op,) = [p for n, p in _policies("--set", f"operator.prometheusURL={url}").items() if not n.endswith("-metrics")]
    assert _ports(op["spec"]["egress"][-1]) == {("TCP", port)}


def test_network_policy_values():
    pols = _policies("--set", "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=obs",
                     "--set", "networkPolicy.apiServerCIDRs={10.0.0.10/32}",
                     "--set", "networkPolicy.prometheusPorts={9090,9091}",
                     "--set", "networkPolicy.extraEgress[0].ports[0].port=5432",
                     golden="namespaced-peering")
    op = pols[f"{RELEASE}-vlm-operator"]
    metrics_from = op["spec"]["ingress"][0]["from"]
    assert metrics_from[0] == {"namespaceSelector": {"matchLabels": {"team": "obs"}}}
    assert metrics_from[1]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "test"
    egress = op["spec"]["egress"]
    assert egress[1]["to"] == [{"ipBlock": {"cidr": "10.0.0.10/32"}}]
    (sidecars,) = [r for r in egress if ("TCP", names.SIDECAR_PORT) in _ports(r)]
    assert sidecars["to"][0]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]
    assert _ports(egress[-2]) == {("TCP", 9090), ("TCP", 9091)}  # the golden case's URL is on 9090: once
    assert egress[-1] == {"ports": [{"port": 5432}]}
    assert _policies("--set", "networkPolicy.enabled=false") == {}
    assert list(_policies("--set", "metrics.service.enabled=false")) == [f"{RELEASE}-vlm-operator"]
    # An empty port list would make the rule admit every port: refused.
    for empty in ("--set", "networkPolicy.apiServerPorts=null"), ("--set-json", "networkPolicy.apiServerPorts=[]"):
        proc = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, *empty,
                    check=False)
        assert proc.returncode != 0 and "apiServerPorts" in proc.stderr, proc.stderr


def test_name_override_keeps_the_operator_admitted_to_the_sidecars():
    """Each service's NetworkPolicy admits pods named vlm-operator (VLM_PROFILER_PEERS' default): under another
    nameOverride the chart adds its operator's pods, in its namespace, as a scraper."""
    objs = docs(template(GOLDEN / "overrides.values.yaml"))
    (dep,) = by_kind(objs, "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    s = Settings.from_env({e["name"]: e["value"] for e in c["env"] if "value" in e})
    labels = {**dep["spec"]["template"]["metadata"]["labels"], "kubernetes.io/metadata.name": "platform"}
    peers = s.network_policy_peers
    assert any(_matches(p["podSelector"], labels) and _matches(p.get("namespaceSelector", {}), labels) for p in peers)
    assert not any(_matches(p["podSelector"], labels) for p in DEFAULT_PROFILER_PEERS)
