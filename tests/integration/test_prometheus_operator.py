"""The real Prometheus Operator (hack/build-binaries.sh builds it from the Go module proxy) on the testbed.

Its CRDs (from its module, example/prometheus-operator-crd) are installed, it runs outside the cluster with
the admin kubeconfig, and a `Prometheus` object selects monitors and rules the way kube-prometheus-stack
does by default (`release: <release>` on ServiceMonitors, PodMonitors and PrometheusRules, any namespace).
The objects are the ones the project ships: the chart's ServiceMonitor and PrometheusRule (helm template)
and the PodMonitor and PrometheusRule the operator builds for a VLMService, labelled through the
`monitoring.extraLabels` value / VLM_MONITORING_LABELS. The assertions are on what the Prometheus Operator
generates: the scrape configuration (the secret `prometheus-<name>`, prometheus.yaml.gz) and the rule files
(ConfigMap `prometheus-<name>-rulefiles-0`).

Debian's Prometheus (the one hack/install-system-deps.sh installs) is built without kubernetes_sd, so the
generated configuration is checked and run with one change: each `kubernetes_sd_configs` becomes a
`file_sd_configs` whose file lists what kubernetes_sd would discover (testing/vlm_testing/standin/kube_sd.py, shared with
the e2e tier: from the API server's Pods, Services and Endpoints, with the same __meta_kubernetes_* labels).
Everything else (relabelings, honor_labels, the rule files) is the generated text, with the
config-reloader's $(SHARD) and $(POD_NAME) substituted as it does.
"""

from __future__ import annotations

import base64
import copy
import gzip
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from prometheus_client import CollectorRegistry, generate_latest

from vlm_operator.api import metrics
from vlm_operator.api.settings import Settings
from vlm_operator.desired import alerts, builders
from vlm_testing import binaries
from vlm_testing.cluster import wait_for
from vlm_testing.integration import EXAMPLES, create
from vlm_testing.operator_proc import free_port, install_crd
from vlm_testing.standin import kube_sd, prom_operator

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("VLM_CACHE", Path.home() / ".cache" / "vlm-operator"))
CRDS = CACHE / "prometheus-operator-crds"
RELEASE = "kube-prometheus-stack"  # the release label kube-prometheus-stack's default selectors ask for
CHART_RELEASE = "vlm"
MON = ("monitoring.coreos.com", "v1")


def _need(path: Path, what: str) -> Path:
    if not path.exists():
        pytest.fail(f"{what} missing at {path}: run hack/build-binaries.sh", pytrace=False)
    return path


@pytest.fixture(scope="module")
def prometheus_operator(cluster, tmp_path_factory):
    binaries.require("monitoring", "the Prometheus Operator")  # built behind the cluster stage
    binary = _need(cluster.bin_dir / "prometheus-operator", "the Prometheus Operator binary")
    _need(CRDS, "the Prometheus Operator CRDs")
    install_crd(cluster.kubectl)
    prom_operator.install_crds(cluster.kubectl, CRDS)
    log = tmp_path_factory.mktemp("prometheus-operator") / "prometheus-operator.log"
    # Outside a cluster it reads KUBECONFIG (the admin's bearer token and CA); --apiserver with --ca-file
    # alone would send no credentials.
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(binary), f"--web.listen-address=127.0.0.1:{free_port()}", "--log-level=info",
             *prom_operator.instance_selector_args()],
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: proc.poll() is not None or "successfully synced all caches" in log.read_text(), 60,
                 "the Prometheus Operator's informers")
        assert proc.poll() is None, f"prometheus-operator exited: {log.read_text()[-3000:]}"
        yield proc, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _helm(cluster, namespace: str, *sets: str) -> list[dict]:
    helm = _need(cluster.bin_dir / "helm", "helm")
    out = subprocess.run(
        [str(helm), "template", CHART_RELEASE, str(REPO / "charts" / "vlm-operator"), "--namespace", namespace,
         "--kube-version", "1.34.4", "-s", "templates/servicemonitor.yaml", "-s", "templates/service.yaml",
         "-s", "templates/prometheusrule.yaml", *[a for s in sets for a in ("--set", s)]],
        capture_output=True, text=True, check=True, timeout=60,
        env={**os.environ, "HELM_CACHE_HOME": "/tmp/vlm-helm-cache", "HELM_CONFIG_HOME": "/tmp/vlm-helm-config",
             "HELM_DATA_HOME": "/tmp/vlm-helm-data"})
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _apply(cluster, namespace: str, objs: list[dict]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                            "items": objs}))


def _prometheus_version() -> str:
    out = subprocess.run(["prometheus", "--version"], capture_output=True, text=True, check=True).stdout
    return "v" + re.search(r"version (\d+\.\d+\.\d+)", out).group(1)


@pytest.fixture
def generated(cluster, kube, namespace, prometheus_operator, tmp_path):
    """The shipped objects in `namespace`, a kube-prometheus-stack-like Prometheus selecting them, and what
    the Prometheus Operator generated for it: (scrape config dict, {rule file name: text}, objects)."""
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: run hack/install-system-deps.sh (Debian package prometheus)")
    chart = _helm(cluster, namespace, "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.interval=5s",
                  "metrics.serviceMonitor.scrapeTimeout=5s",  # the Prometheus Operator skips timeout > interval

                  f"monitoring.extraLabels.release={RELEASE}")
    vlms = create(kube, namespace, copy.deepcopy(EXAMPLES["qwen2.5-vl-3b"]))  # no operator: only an owner
    name = vlms["metadata"]["name"]
    owner = builders.Owner(name, namespace, vlms["metadata"]["uid"])
    settings = Settings(monitoring_labels={"release": RELEASE})
    pm = builders.build_pod_monitor(owner, settings.monitoring_labels)
    pr = alerts.build_prometheus_rule(name, namespace, owner.reference(), builders.common_labels(owner),
                                      extra_labels=settings.monitoring_labels)
    # Without the extra labels (what the operator wrote before VLM_MONITORING_LABELS): not selected.
    other = builders.Owner("unlabelled", namespace, vlms["metadata"]["uid"])
    decoys = [builders.build_pod_monitor(other),
              alerts.build_prometheus_rule("unlabelled", namespace, owner.reference(), builders.common_labels(other))]
    selector = {"matchLabels": {"release": RELEASE}}
    # kube-prometheus-stack looks in every namespace ({}); here only this test's, as other tests' may linger.
    here = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    prom = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
        "metadata": {"name": "kps", "namespace": namespace,
                     "labels": {prom_operator.INSTANCE_LABEL: prom_operator.INSTANCE}},
        "spec": {"replicas": 1, "version": _prometheus_version(),
                 "serviceMonitorSelector": selector, "podMonitorSelector": selector, "ruleSelector": selector,
                 "serviceMonitorNamespaceSelector": here, "podMonitorNamespaceSelector": here,
                 "ruleNamespaceSelector": here, "evaluationInterval": "5s"},
    }
    _apply(cluster, namespace, [*chart, pm, pr, *decoys, prom])
    core = client.CoreV1Api(kube)
    rules_cm = "prometheus-kps-rulefiles-0"

    def ready():
        secret = core.read_namespaced_secret("prometheus-kps", namespace)
        cfg = yaml.safe_load(gzip.decompress(base64.b64decode(secret.data["prometheus.yaml.gz"])))
        jobs = {j["job_name"] for j in cfg.get("scrape_configs") or []}
        rules = core.read_namespaced_config_map(rules_cm, namespace).data or {}
        return (cfg, rules) if len(jobs) >= 3 and len(rules) >= 2 else None

    cfg, rules = wait_for(ready, 60, "the generated scrape config and rule files", interval=1,
                          ignore=(client.ApiException, KeyError, TypeError))
    return cfg, rules, {"vlms": name, "chart": chart, "podmonitor": pm, "rule": pr}


def test_generated_config_honours_labels_and_selects_by_release(generated, namespace, tmp_path):
    cfg, rules, objs = generated
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    sm_job = f"serviceMonitor/{namespace}/{CHART_RELEASE}-vlm-operator/0"
    pm_jobs = {f"podMonitor/{namespace}/{objs['vlms']}/{i}" for i in (0, 1)}  # SGLang's port and the sidecar's
    assert set(jobs) == {sm_job, *pm_jobs}, sorted(jobs)  # the unlabelled PodMonitor is not selected
    for job in jobs.values():
        assert job["honor_labels"] is True, job["job_name"]
    # SGLang's port every 15 s, the sidecar's twice per telemetry interval (the default 15 s).
    assert [jobs[f"podMonitor/{namespace}/{objs['vlms']}/{i}"]["scrape_interval"] for i in (0, 1)] in (
        ["15s", "7500ms"], ["15s", "7s500ms"]), [jobs[j]["scrape_interval"] for j in sorted(pm_jobs)]
    # jobLabel app.kubernetes.io/name: the job is "vlm-operator" whatever the release is called.
    relabel = jobs[sm_job]["relabel_configs"]
    assert any(r.get("source_labels") == ["__meta_kubernetes_service_label_app_kubernetes_io_name"]
               and r.get("target_label") == "job" for r in relabel), relabel
    for j in pm_jobs:
        targets = {r.get("target_label") for r in jobs[j]["relabel_configs"]}
        assert {"serving_vlmops_dev_vlmservice", "serving_vlmops_dev_revision", "serving_vlmops_dev_role"} <= targets

    # The rule files: the operator's scoped PrometheusRule and the chart's (operator alerts), not the decoy.
    assert len(rules) == 2 and not any("unlabelled" in f for f in rules), sorted(rules)
    groups = {g["name"]: g for text in rules.values() for g in yaml.safe_load(text)["groups"]}
    assert set(groups) == {f"vlm-operator-{objs['vlms']}", alerts.SELF_GROUP}
    assert {r["alert"] for r in groups[alerts.SELF_GROUP]["rules"]} == {"VLMOperatorDown",
                                                                      "VLMOperatorReconcileErrors"}
    scoped = groups[f"vlm-operator-{objs['vlms']}"]["rules"]
    assert {r["alert"] for r in scoped} == {r["alert"] for r in alerts.rules()}

    path = kube_sd.runnable(cfg, rules, tmp_path)
    out = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "is valid prometheus config file syntax" in out.stdout, out.stdout + out.stderr
    # promtool checks the rule files the config names too: the scoped group and the operator's own (2).
    assert "SUCCESS: 2 rule files found" in out.stdout, out.stdout
    assert f"SUCCESS: {len(alerts.rules())} rules found" in out.stdout and "SUCCESS: 2 rules found" in out.stdout, out.stdout


# --- Prometheus on the generated configuration, scraping pods by IP ------------------------------------------


class _Exporter(http.server.ThreadingHTTPServer):
    daemon_threads = True


def _serve_operator_metrics(ip: str, port: int, registry: CollectorRegistry) -> _Exporter:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = _Exporter((ip, port), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _query(base: str, q: str) -> list[dict]:
    with urllib.request.urlopen(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': q})}", timeout=10) as r:
        return json.loads(r.read())["data"]["result"]


def test_prometheus_on_the_generated_config_keeps_the_operators_labels(cluster, kube, namespace, generated,
                                                                        tmp_path):
    """The operator's series name another namespace than the operator pod's: with the generated config
    (honor_labels) they keep it, `up{job="vlm-operator"}` is what VLMOperatorDown watches, and the scoped
    alert expressions select them. Pods are reached at their pod IPs (the testbed's pod network)."""
    if not cluster.pod_network:
        pytest.skip("needs the testbed's pod network (network namespace) to reach pod IPs")
    cfg, rules, objs = generated
    port = 8080
    # A pod the chart's metrics Service selects, standing in for the operator's (kwok runs nothing in it).
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "vlm-operator-0", "namespace": namespace,
                        "labels": {"app.kubernetes.io/name": "vlm-operator",
                                   "app.kubernetes.io/instance": CHART_RELEASE,
                                   "app.kubernetes.io/component": "operator"}},
           "spec": {"containers": [{"name": "operator", "image": "vlmops/vlm-operator:test",
                                    "ports": [{"name": "metrics", "containerPort": port}]}]}}
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(namespace, pod)
    ip = wait_for(lambda: core.read_namespaced_pod("vlm-operator-0", namespace).status.pod_ip, 60, "a pod IP")
    wait_for(lambda: (core.read_namespaced_endpoints(f"{CHART_RELEASE}-vlm-operator-metrics", namespace).subsets
                      or [None])[0], 60, "the metrics Service's endpoints", ignore=(client.ApiException,))
    # The operator's real metric families, for a VLMService in another namespace than the operator's.
    state = metrics.State()
    state.set_signal_delta("ml", "qwen", "loop_latency", 0.2)
    state.update("ml", "qwen", ipc_cache_active=0.0, phase="Analysing")
    registry = CollectorRegistry()
    registry.register(metrics.StateCollector(state))
    srv = _serve_operator_metrics(ip, port, registry)
    prom_port = free_port()
    path = kube_sd.runnable(cfg, rules, tmp_path, kube_sd.discover(kube, cfg))
    proc = subprocess.Popen(["prometheus", f"--config.file={path}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{prom_port}"
    try:
        up = wait_for(lambda: proc.poll() is None and _query(base, 'up{job="vlm-operator"} == 1'), 60,
                      "a successful scrape of job vlm-operator", interval=1, ignore=(OSError,))
        assert up[0]["metric"]["namespace"] == namespace  # the target's own labels are still there
        delta = _query(base, "vlm_operator_signal_delta")
        assert [d["metric"]["namespace"] for d in delta] == ["ml"], delta
        assert all("exported_namespace" not in d["metric"] for d in delta)
        for r in alerts.rules('namespace="ml",vlmservice="qwen"'):
            if r["alert"] in ("VLMSchedulerLoopLatencyRegression", "VLMIPCCacheInactive"):
                assert _query(base, r["expr"]), r["alert"]  # would fire after `for`
        assert not _query(base, alerts.self_rules()[0]["expr"])  # VLMOperatorDown: the operator is up
        with urllib.request.urlopen(f"{base}/api/v1/rules", timeout=10) as r:
            loaded = json.loads(r.read())["data"]["groups"]
        assert {g["name"] for g in loaded} == {f"vlm-operator-{objs['vlms']}", alerts.SELF_GROUP}
        assert all(rule["health"] != "err" for g in loaded for rule in g["rules"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        srv.shutdown()
