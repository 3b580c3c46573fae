"""The Helm chart, rendered by the real helm binary: lint, golden `helm template` output, schema
rejections, and the properties the issue asks for (least-privilege RBAC, hardened Deployment, the CRD
and alert rules identical to their generators' output).

Regenerate the golden files with UPDATE_GOLDEN=1 pytest tests/unit/packaging/test_chart.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml
from vlm_operator import alerts, crdgen

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "vlm-operator"
GOLDEN = REPO / "tests" / "golden" / "chart"
CASES = sorted(p.name.removesuffix(".values.yaml") for p in GOLDEN.glob("*.values.yaml"))
RELEASE, NAMESPACE = "vlm", "vlm-system"
KUBE_VERSION = "1.34.4"  # the testbed's; helm template otherwise assumes an old default
FORBIDDEN_RESOURCES = {"secrets", "pods/exec", "pods/attach", "pods/portforward", "*", "configmaps",
                       "serviceaccounts/token", "clusterroles", "roles", "rolebindings", "clusterrolebindings"}
ALLOWED_VERBS = {"get", "list", "watch", "create", "patch", "delete"}


def test_golden_cases_exist():
    assert {"default", "namespaced-peering", "monitoring"} <= set(CASES), CASES


def helm_bin() -> str:
    cache = Path(os.environ.get("VLM_CACHE") or Path.home() / ".cache" / "vlm-operator")
    for cand in (os.environ.get("VLM_HELM"), str(cache / "bin" / "helm"), shutil.which("helm")):
        if cand and Path(cand).exists():
            return cand
    pytest.fail("helm not found: run hack/build-binaries.sh (it installs helm into ~/.cache/vlm-operator/bin)")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm_bin(), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HELM_CACHE_HOME": "/tmp/vlm-helm-cache",
                               "HELM_CONFIG_HOME": "/tmp/vlm-helm-config", "HELM_DATA_HOME": "/tmp/vlm-helm-data"})
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stderr}"
    return proc


def template(values: Path | None = None, *extra: str) -> str:
    """`helm template` without crds/ (the VLMService CRD is compared with crdgen's output instead, so an
    API change does not churn these golden files); pass --include-crds in `extra` to get them."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    if values:
        args += ["-f", str(values)]
    return helm(*args, *extra).stdout


def docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


@pytest.mark.parametrize("case", CASES)
def test_helm_lint(case):
    out = helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION, "-f", str(GOLDEN / f"{case}.values.yaml")).stdout
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("case", CASES)
def test_helm_template_matches_golden(case):
    text = template(GOLDEN / f"{case}.values.yaml")
    golden = GOLDEN / f"{case}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"missing {golden}: run with UPDATE_GOLDEN=1"
    assert text == golden.read_text(), f"helm template differs from {golden.name}: rerun with UPDATE_GOLDEN=1 and review"


@pytest.mark.parametrize(("values", "message"), [
    (["--set", "replicaCount=2"], "peering"),
    (["--set", "operator.logFormat=xml"], "logFormat"),
    (["--set", "watchNamespaces[0]=Not_A_Namespace"], "watchNamespaces"),
    (["--set", "unknownKey=1"], "unknownKey"),
])
def test_bad_values_are_refused(values, message):
    proc = helm("template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, *values, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_values_schema_is_a_valid_schema_and_accepts_the_defaults():
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)


def test_chart_crd_is_the_generated_one_and_installed_first():
    assert (CHART / "crds" / crdgen.CRD_FILE).read_text() == crdgen.render(), "run python -m vlm_operator.crdgen"
    objs = docs(template(None, "--include-crds"))
    assert objs[0]["kind"] == "CustomResourceDefinition" and objs[0] == crdgen.build_crd()


def test_chart_alert_rules_are_the_generated_ones():
    assert (CHART / "files" / "vlm-operator.rules.yaml").read_text() == alerts.render(), (
        "cp alerts/vlm-operator.rules.yaml charts/vlm-operator/files/ after python -m vlm_operator.alerts")
    rule = by_kind(docs(template(GOLDEN / "monitoring.values.yaml")), "PrometheusRule")
    assert len(rule) == 1 and rule[0]["spec"] == alerts.rules_group()


def test_dashboard_configmap_carries_the_dashboard():
    cm = [o for o in docs(template()) if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    assert len(cm) == 1 and cm[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm[0]["data"]["vlm-operator.json"]) == json.loads((REPO / "dashboards" / "vlm-operator.json").read_text())


def _rules(objs: list[dict]) -> list[tuple[str, dict]]:
    return [(f"{o['kind']} {o['metadata'].get('namespace', '')}/{o['metadata']['name']}", r)
            for o in objs if o["kind"] in ("ClusterRole", "Role") for r in o["rules"]]


@pytest.mark.parametrize("case", CASES)
def test_rbac_is_least_privilege(case):
    for where, rule in _rules(docs(template(GOLDEN / f"{case}.values.yaml"))):
        assert not FORBIDDEN_RESOURCES & set(rule["resources"]), (where, rule)
        assert "*" not in rule["apiGroups"] and set(rule["verbs"]) <= ALLOWED_VERBS, (where, rule)
        assert "resourceNames" not in rule or rule["resourceNames"], (where, rule)


def test_namespaced_mode_grants_namespaced_writes_only_in_watched_namespaces():
    objs = docs(template(GOLDEN / "namespaced-peering.values.yaml"))
    (cluster_role,) = by_kind(objs, "ClusterRole")
    cluster_writes = [r for r in cluster_role["rules"] if set(r["verbs"]) - {"get", "list", "watch"}]
    assert cluster_writes == [], cluster_writes
    roles = by_kind(objs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = by_kind(objs, "RoleBinding")
    assert all(b["subjects"][0]["namespace"] == NAMESPACE for b in bindings)
    assert any("kopfpeerings" in r["resources"] for r in roles[0]["rules"])
    peerings = by_kind(objs, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]


def test_deployment_is_hardened_and_probes_kopf_liveness():
    for case in CASES:
        objs = docs(template(GOLDEN / f"{case}.values.yaml"))
        (dep,) = by_kind(objs, "Deployment")
        pod = dep["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
        liveness = next(a for a in c["args"] if a.startswith("--liveness="))
        port = {p["name"]: p["containerPort"] for p in c["ports"]}[c["livenessProbe"]["httpGet"]["port"]]
        assert liveness.endswith(f":{port}{c['livenessProbe']['httpGet']['path']}"), (liveness, port)
        replicas = dep["spec"]["replicas"]
        peering = [a for a in c["args"] if a.startswith("--peering=")]
        assert replicas == 1 or peering, f"{case}: {replicas} replicas without peering"
        if not peering:
            assert dep["spec"]["strategy"]["type"] == "Recreate", "standalone must never run two pods at once"


def test_peering_installs_kopf_crds_and_the_peering_object_as_a_hook():
    objs = docs(template(GOLDEN / "monitoring.values.yaml"))
    crds = {o["metadata"]["name"]: o for o in by_kind(objs, "CustomResourceDefinition")}
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} <= set(crds)
    assert crds["kopfpeerings.kopf.dev"]["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    (peering,) = by_kind(objs, "ClusterKopfPeering")
    assert "post-install" in peering["metadata"]["annotations"]["helm.sh/hook"]
    (role,) = by_kind(objs, "ClusterRole")
    assert any("clusterkopfpeerings" in r["resources"] for r in role["rules"])
    no_peering = docs(template())
    assert not [o for o in no_peering if "kopf.dev" in json.dumps(o)]
