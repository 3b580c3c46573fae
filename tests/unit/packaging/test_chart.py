"""The Helm chart, rendered by the real helm binary: lint, golden `helm template` output, schema
rejections, and the properties the issue asks for (least-privilege RBAC, hardened Deployment, the CRD
and alert rules identical to their generators' output, naming overrides, aggregated user ClusterRoles,
the `helm test` hook, a component label on every object, the README's values table up to date).

Regenerate the golden files with UPDATE_GOLDEN=1 pytest tests/unit/packaging/test_chart.py.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from vlm_operator.api import crdgen
from vlm_operator.desired import alerts
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
CASES = sorted(p.name.removesuffix(".values.yaml") for p in GOLDEN.glob("*.values.yaml"))
FORBIDDEN_RESOURCES = {"secrets", "pods/exec", "pods/attach", "pods/portforward", "*", "configmaps",
                       "serviceaccounts/token", "clusterroles", "roles", "rolebindings", "clusterrolebindings"}
ALLOWED_VERBS = {"get", "list", "watch", "create", "patch", "delete"}


COMPONENTS = {"operator", "metrics", "rbac", "crds", "alerts", "dashboard", "peering", "test", "injection", "judge"}
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def test_golden_cases_exist():
    assert {"default", "namespaced-peering", "monitoring", "overrides"} <= set(CASES), CASES


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
    (["--set", "nameOverride=Not_A_Name"], "nameOverride"),
    (["--set", "namespaceOverride=Bad.Namespace"], "namespaceOverride"),
    (["--set", "crds.install=true"], "install"),
    (["--set", "monitoring.customRules.VLMNoSuchAlert.for=1m"], "VLMNoSuchAlert"),
    (["--set", "monitoring.customRules.VLMOperatorDown.for=5 minutes"], "customRules"),
    (["--set", "monitoring.customRules.VLMOperatorDown.expr=vector(1)"], "expr"),
])
def test_bad_values_are_refused(values, message):
    proc = helm("template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, *values, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_values_schema_is_a_valid_schema_and_accepts_the_defaults():
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)


def test_custom_rules_name_exactly_the_shipped_alerts():
    """monitoring.customRules refuses a name it does not know: every shipped alert must be one it knows (a new
    alert missing here made `--set monitoring.customRules.<it>.for=30s` fail at helm template)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    names = schema["properties"]["monitoring"]["properties"]["customRules"]["propertyNames"]["enum"]
    assert sorted(names) == sorted(alerts.names())


def _vlm_crd(objs: list[dict]) -> list[dict]:
    return [o for o in objs if o["kind"] == "CustomResourceDefinition"
            and o["metadata"]["name"] == f"{crdgen.api.PLURAL}.{crdgen.api.GROUP}"]


def test_chart_crd_is_the_generated_one_rendered_as_a_template():
    """The CRD is a template (helm upgrade applies it), not in crds/ (never upgraded); its file is crdgen's
    output, and the template only adds the chart's labels and, with crds.keep, the keep policy."""
    assert not (CHART / "crds").exists(), "Helm never upgrades crds/: the CRD belongs in files/crds/"
    assert (CHART / "files" / "crds" / crdgen.CRD_FILE).read_text() == crdgen.render(), "run python -m vlm_operator.api.crdgen"
    expected = crdgen.build_crd()
    (crd,) = _vlm_crd(docs(template(crd=True)))
    meta = crd.pop("metadata")
    assert crd == {k: v for k, v in expected.items() if k != "metadata"}
    assert meta["name"] == expected["metadata"]["name"]
    assert expected["metadata"]["labels"].items() <= meta["labels"].items()
    assert meta["labels"]["app.kubernetes.io/component"] == "crds"
    assert meta["annotations"] == {**expected["metadata"]["annotations"], "helm.sh/resource-policy": "keep"}

    (not_kept,) = _vlm_crd(docs(template(None, "--set", "crds.keep=false", crd=True)))
    assert "helm.sh/resource-policy" not in not_kept["metadata"]["annotations"]
    assert _vlm_crd(docs(template(None, "--set", "crds.enabled=false", crd=True))) == []
    # Installed before the objects that may need it (Helm's install order puts CRDs before RBAC and workloads).
    kinds = [o["kind"] for o in docs(template(crd=True))]
    assert kinds.index("CustomResourceDefinition") < min(kinds.index("ClusterRole"), kinds.index("Deployment"))


def test_chart_crd_template_fails_without_its_file(tmp_path):
    chart = tmp_path / "vlm-operator"
    shutil.copytree(CHART, chart)
    (chart / "files" / "crds" / crdgen.CRD_FILE).unlink()
    proc = helm("template", RELEASE, str(chart), "--kube-version", KUBE_VERSION, check=False)
    assert proc.returncode != 0 and "vlm_operator.api.crdgen" in proc.stderr, proc.stderr


def test_chart_alert_rules_are_the_generated_ones():
    assert (CHART / "files" / "vlm-operator.rules.yaml").read_text() == alerts.render(), (
        "cp alerts/vlm-operator.rules.yaml charts/vlm-operator/files/ after python -m vlm_operator.desired.alerts")
    rule = by_kind(docs(template(GOLDEN / "monitoring.values.yaml")), "PrometheusRule")
    assert len(rule) == 1 and rule[0]["spec"] == alerts.rules_file()


def test_dashboard_configmap_carries_the_dashboard():
    cm = [o for o in docs(template()) if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    assert len(cm) == 1 and cm[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm[0]["data"]["vlm-operator.json"]) == json.loads((REPO / "dashboards" / "vlm-operator.json").read_text())


def _aggregated(o: dict) -> bool:
    return any(k.startswith(AGGREGATE) for k in o["metadata"].get("labels", {}))


def _rules(objs: list[dict]) -> list[tuple[str, dict]]:
    """The operator's own rules (the aggregated ClusterRoles for people are checked on their own)."""
    return [(f"{o['kind']} {o['metadata'].get('namespace', '')}/{o['metadata']['name']}", r)
            for o in objs if o["kind"] in ("ClusterRole", "Role") and not _aggregated(o) for r in o["rules"]]


def _webhook_secret_rule(where: str, rule: dict) -> bool:
    """The injection webhook's Secret and the judge's Secret and CA ConfigMap, in the operator's namespace: read and
    renewed by name; created (Kubernetes cannot limit create to a name) only where the operator makes them."""
    webhook = (where == f"Role {NAMESPACE}/{RELEASE}-vlm-operator-webhook" and rule["resources"] == ["secrets"]
               and (rule.get("resourceNames") == [f"{RELEASE}-vlm-operator-webhook-tls"] or rule["verbs"] == ["create"]))
    judge = (where == f"Role {NAMESPACE}/{RELEASE}-vlm-operator-judge"
             and (rule.get("resourceNames") in ([f"{RELEASE}-vlm-operator-judge-tls"], [f"{RELEASE}-vlm-operator-judge-ca"])
                  or rule["verbs"] == ["create"]))
    return webhook or judge


@pytest.mark.parametrize("case", CASES)
def test_rbac_is_least_privilege(case):
    for where, rule in _rules(docs(template(GOLDEN / f"{case}.values.yaml"))):
        if _webhook_secret_rule(where, rule):
            continue
        assert not FORBIDDEN_RESOURCES & set(rule["resources"]), (where, rule)
        assert "*" not in rule["apiGroups"] and set(rule["verbs"]) <= ALLOWED_VERBS, (where, rule)
        assert "resourceNames" not in rule or rule["resourceNames"], (where, rule)


def test_namespaced_mode_grants_namespaced_writes_only_in_watched_namespaces():
    objs = docs(template(GOLDEN / "namespaced-peering.values.yaml"))
    (cluster_role,) = [r for r in by_kind(objs, "ClusterRole") if not _aggregated(r)]
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
    (role,) = [r for r in by_kind(objs, "ClusterRole") if not _aggregated(r)]
    assert any("clusterkopfpeerings" in r["resources"] for r in role["rules"])
    no_peering = docs(template())
    assert not [o for o in no_peering if "kopf.dev" in json.dumps(o)]


def test_aggregated_cluster_roles_for_people():
    """view/edit/admin ClusterRoles folded into the built-in ones: view reads, edit/admin write VLMServices and
    their scale; status (the operator's) is read-only for view, and edit/admin may only `patch` it besides
    (`kubectl vlm retry`'s merge patch), never `update` it whole; nothing but VLMServices."""
    roles = {o["metadata"]["name"].rsplit("-", 1)[1]: o for o in by_kind(docs(template()), "ClusterRole") if _aggregated(o)}
    assert set(roles) == {"view", "edit", "admin"}
    read, write = {"get", "list", "watch"}, {"get", "list", "watch", "create", "update", "patch", "delete"}
    for name, role in roles.items():
        assert role["metadata"]["name"] == f"{RELEASE}-vlm-operator-{name}"
        assert [k for k in role["metadata"]["labels"] if k.startswith(AGGREGATE)] == [AGGREGATE + name]
        assert role["metadata"]["labels"][AGGREGATE + name] == "true"
        granted = {res: set(r["verbs"]) for r in role["rules"] for res in r["resources"]}
        assert all(r["apiGroups"] == ["serving.vlmops.dev"] for r in role["rules"]), role["rules"]
        main = read if name == "view" else write
        status = read if name == "view" else read | {"patch"}
        assert granted == {"vlmservices": main, "vlmservices/scale": main, "vlmservices/status": status}, (name, granted)
    assert not [o for o in by_kind(docs(template(GOLDEN / "overrides.values.yaml")), "ClusterRole") if _aggregated(o)]


@pytest.mark.parametrize("case", CASES)
def test_every_object_has_a_component_label(case):
    objs = docs(template(GOLDEN / f"{case}.values.yaml", crd=True))
    missing = [(o["kind"], o["metadata"]["name"]) for o in objs
               if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") not in COMPONENTS]
    assert missing == []
    for dep in by_kind(objs, "Deployment"):
        assert dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
        # A Deployment's selector is immutable: the component label must not enter it (0.1.0 had none).
        assert set(dep["spec"]["selector"]["matchLabels"]) == {"app.kubernetes.io/name", "app.kubernetes.io/instance"}


def test_component_label_map_refuses_an_unknown_template(tmp_path):
    chart = tmp_path / "vlm-operator"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "extra.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  labels:\n"
        "    {{- include \"vlm-operator.labels\" . | nindent 4 }}\n")
    proc = helm("template", RELEASE, str(chart), "--kube-version", KUBE_VERSION, check=False)
    assert proc.returncode != 0 and "no app.kubernetes.io/component for extra.yaml" in proc.stderr, proc.stderr


def test_name_and_namespace_overrides():
    objs = docs(template(GOLDEN / "overrides.values.yaml", crd=True))
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert {("Deployment", "platform-vlm"), ("ServiceAccount", "platform-vlm"), ("ClusterRole", "platform-vlm"),
            ("ClusterRoleBinding", "platform-vlm"), ("ConfigMap", "platform-vlm-dashboard")} <= names, names
    namespaced = [o for o in objs if o["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding")]
    assert {o["metadata"].get("namespace") for o in namespaced} == {"platform"}
    (binding,) = by_kind(objs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "platform-vlm", "namespace": "platform"}]
    (dep,) = by_kind(objs, "Deployment")
    assert dep["metadata"]["labels"]["app.kubernetes.io/name"] == "vlmop"
    assert dep["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "vlmop"
    # nameOverride alone: <release>-<nameOverride>.
    (dep,) = by_kind(docs(template(None, "--set", "nameOverride=vlmop")), "Deployment")
    assert dep["metadata"]["name"] == f"{RELEASE}-vlmop"
    # Namespaced mode: the Roles stay in the watched namespaces, their subjects point at the override.
    objs = docs(template(GOLDEN / "namespaced-peering.values.yaml", "--set", "namespaceOverride=platform"))
    assert sorted(r["metadata"]["namespace"] for r in by_kind(objs, "Role")) == ["team-a", "team-b"]
    assert {b["subjects"][0]["namespace"] for b in by_kind(objs, "RoleBinding")} == {"platform"}


def test_helm_test_hook_checks_the_metrics_service_with_the_operator_image():
    objs = docs(template())
    (dep,) = by_kind(objs, "Deployment")
    (svc,) = by_kind(objs, "Service")
    (pod,) = by_kind(objs, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    spec = pod["spec"]
    (c,) = spec["containers"]
    (operator,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == operator["image"] and c["securityContext"] == operator["securityContext"]
    assert spec["securityContext"] == dep["spec"]["template"]["spec"]["securityContext"]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    env = {e["name"]: e["value"] for e in c["env"]}
    port = svc["spec"]["ports"][0]["port"]
    assert env["METRICS_URL"] == f"http://{svc['metadata']['name']}.{NAMESPACE}.svc:{port}/metrics"
    assert c["command"][:2] == ["python", "-c"] and "vlm_operator_managed_services" in c["command"][2]
    assert not by_kind(docs(template(GOLDEN / "overrides.values.yaml")), "Pod"), "no Service, nothing to test"


def test_helm_test_script_passes_on_operator_metrics_and_fails_without_them(tmp_path):
    """The hook's own script, run here against a stand-in /metrics: it passes on the operator's series and
    exits non-zero on another exporter's answer (the real operator is covered by the integration tier)."""
    import http.server
    import sys
    import threading

    (pod,) = by_kind(docs(template()), "Pod")
    script = pod["spec"]["containers"][0]["command"][2]
    body = {"text": b"vlm_operator_managed_services 0.0\n"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body["text"])

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {**os.environ, "METRICS_URL": f"http://127.0.0.1:{server.server_port}/metrics"}
        ok = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=30)
        assert ok.returncode == 0 and "the operator answers" in ok.stdout, ok.stderr
        body["text"] = b"some_other_exporter 1\n"
        bad = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=30)
        assert bad.returncode != 0 and "without vlm_operator_managed_services" in bad.stderr, bad.stderr
    finally:
        server.shutdown()


def test_chart_readme_values_table_is_current(tmp_path):
    gen = runpy.run_path(str(REPO / "hack" / "chart-readme.py"))
    assert gen["main"](["--check"]) == 0, "run python hack/chart-readme.py"
    readme = (CHART / "README.md").read_text()
    schema = json.loads((CHART / "values.schema.json").read_text())
    for path, _ in gen["_leaves"](schema):
        assert f"| `{path}` |" in readme, path
    # A value without a description cannot reach the table undocumented.
    chart = tmp_path / "vlm-operator"
    shutil.copytree(CHART, chart)
    schema["properties"]["crds"]["properties"]["keep"].pop("description")
    (chart / "values.schema.json").write_text(json.dumps(schema))
    with pytest.raises(SystemExit, match=r"no description for crds\.keep"):
        gen["main"](["--chart", str(chart)])


def test_injection_is_off_by_default_and_never_refuses_a_pod():
    assert not [o for o in docs(template(GOLDEN / "default.values.yaml"))
                if o["kind"] == "MutatingWebhookConfiguration" or "webhook" in o["metadata"]["name"]]
    for case in ("injection", "injection-cert-manager"):
        objs = docs(template(GOLDEN / f"{case}.values.yaml"))
        (mwc,) = by_kind(objs, "MutatingWebhookConfiguration")
        assert [h["name"] for h in mwc["webhooks"]] == ["pod.profile.serving.vlmops.dev",
                                                         "namespace.profile.serving.vlmops.dev"]
        for h in mwc["webhooks"]:
            assert (h["failurePolicy"], h["sideEffects"], h["timeoutSeconds"]) == ("Ignore", "None", 5)
            assert h["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                   "resources": ["pods"], "scope": "Namespaced"}]
            excluded = next(e for e in h["namespaceSelector"]["matchExpressions"]
                            if e["key"] == "kubernetes.io/metadata.name")
            assert excluded["operator"] == "NotIn"
            assert {"kube-system", "kube-public", "kube-node-lease", NAMESPACE} <= set(excluded["values"])
            assert h["clientConfig"]["service"]["name"] == f"{RELEASE}-vlm-operator-webhook"
        (dep,) = by_kind(objs, "Deployment")
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        assert env["VLM_INJECTION"] == "true" and env["VLM_WEBHOOK_NAMESPACE"] == NAMESPACE
        assert env["VLM_WEBHOOK_CONFIGURATION"] == mwc["metadata"]["name"]
        assert env["VLM_WEBHOOK_TLS"] == ("cert-manager" if "cert-manager" in case else "self-signed")
        # Every VLM_WEBHOOK_* the chart sets is a setting the operator reads.
        from vlm_operator.api.settings import Settings, env_name
        assert {k for k in env if k.startswith("VLM_WEBHOOK_")} <= {env_name(f) for f in Settings.model_fields}
        (svc,) = [s for s in by_kind(objs, "Service") if s["metadata"]["name"].endswith("-webhook")]
        port = next(p for p in container["ports"] if p["name"] == "webhook")
        assert svc["spec"]["ports"][0]["targetPort"] == "webhook" and port["containerPort"] == 9443
        (np,) = [n for n in by_kind(objs, "NetworkPolicy") if n["metadata"]["name"] == f"{RELEASE}-vlm-operator"]
        assert {"ports": [{"protocol": "TCP", "port": 9443}]} in np["spec"]["ingress"]
    cm = docs(template(GOLDEN / "injection-cert-manager.values.yaml"))
    (mwc,) = by_kind(cm, "MutatingWebhookConfiguration")
    (cert,) = by_kind(cm, "Certificate")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{cert['metadata']['name']}"
    assert not [r for r in by_kind(cm, "ClusterRole") if "webhook" in r["metadata"]["name"]]  # nothing to patch


def test_judge_is_off_by_default_and_deploys_what_it_needs_when_on():
    assert not [o for o in docs(template(GOLDEN / "default.values.yaml")) if "judge" in o["metadata"]["name"]]
    from vlm_operator.api.settings import Settings, env_name
    for case in ("judge", "judge-cert-manager"):
        objs = docs(template(GOLDEN / f"{case}.values.yaml"))
        (dep,) = by_kind(objs, "Deployment")
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        # Every VLM_JUDGE_* the chart sets is a setting the operator reads, and together they are valid.
        assert {k for k in env if k.startswith("VLM_JUDGE_")} <= {env_name(f) for f in Settings.model_fields}
        s = Settings.from_env({k: v for k, v in env.items() if k.startswith("VLM_JUDGE_")})
        assert (s.judge_port, s.judge_namespace) == (8090, NAMESPACE)
        assert s.judge_tls == ("cert-manager" if "cert-manager" in case else "self-signed")
        assert (s.judge_service, s.judge_secret, s.judge_ca_configmap) == (
            f"{RELEASE}-vlm-operator-judge", f"{RELEASE}-vlm-operator-judge-tls", f"{RELEASE}-vlm-operator-judge-ca")
        (svc,) = [x for x in by_kind(objs, "Service") if x["metadata"]["name"] == s.judge_service]
        port = next(p for p in container["ports"] if p["name"] == "judge")
        assert svc["spec"]["ports"][0]["targetPort"] == "judge" and port["containerPort"] == 8090
        (reviews,) = [r for r in by_kind(objs, "ClusterRole") if r["metadata"]["name"] == s.judge_service]
        assert {(r["apiGroups"][0], r["resources"][0]) for r in reviews["rules"]} == {
            ("authentication.k8s.io", "tokenreviews"), ("authorization.k8s.io", "subjectaccessreviews"), ("", "pods"),
            ("", "events"), ("flagger.app", "canaries")}
        (np,) = [n for n in by_kind(objs, "NetworkPolicy") if n["metadata"]["name"] == f"{RELEASE}-vlm-operator"]
        judge_in = [r for r in np["spec"]["ingress"] if r["ports"] == [{"protocol": "TCP", "port": 8090}]]
        assert len(judge_in) == 1 and {"ports": [{"protocol": "TCP", "port": 9400}]} in np["spec"]["egress"]
        if case == "judge":
            assert "from" not in judge_in[0]  # anywhere: every call carries a token
            (binding,) = [b for b in by_kind(objs, "RoleBinding") if "-caller-" in b["metadata"]["name"]]
            assert binding["metadata"]["namespace"] == "serving"
            assert binding["roleRef"]["name"] == f"{RELEASE}-vlm-operator-judge-caller"
            assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "argo-rollouts",
                                            "namespace": "argo-rollouts"}]
            assert not by_kind(objs, "Certificate")
        else:
            assert judge_in[0]["from"] == [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": "flagger-system"}}}]
            (cert,) = by_kind(objs, "Certificate")
            assert cert["spec"]["secretName"] == s.judge_secret
            assert f"{s.judge_service}.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
            assert cert["spec"]["issuerRef"]["name"] == "corp-ca" and not by_kind(objs, "Issuer")
