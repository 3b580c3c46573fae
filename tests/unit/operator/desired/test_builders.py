"""Pure builders: golden manifests per example, and the pod-shape rules docs/objects.md states.

Regenerate the golden files with UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import yaml

from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.errors import InvalidSpec
from vlm_operator.api.settings import Settings
from vlm_operator.desired import builders, sglang

ROOT = Path(__file__).resolve().parents[4]
GOLDEN = ROOT / "tests" / "golden" / "builders"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
# Golden inputs that are not examples (they name objects a bare cluster lacks); same output format.
INPUTS = sorted((GOLDEN / "inputs").glob("*.yaml"))
OWNER = builders.Owner("svc", "ns", "00000000-0000-0000-0000-000000000001")
SETTINGS = Settings(sidecar_image="vlmops/vlm-sidecar:test")


def _desired(spec: dict) -> builders.Desired:
    return builders.build_desired(OWNER, api.parse_spec(spec), SETTINGS)


@pytest.mark.parametrize("path", EXAMPLES + INPUTS, ids=lambda p: p.stem)
def test_golden(path):
    spec = api.parse_spec(yaml.safe_load(path.read_text())["spec"])
    d = builders.build_desired(OWNER, spec, SETTINGS)
    out = {
        "deployment": builders.build_deployment(OWNER, d.template, d.revision, spec.replicas),
        "service": d.service,
        "podDisruptionBudget": d.pdb,
        "networkPolicy": d.network_policy,
    }
    text = yaml.safe_dump(out, sort_keys=True)
    golden = GOLDEN / f"{path.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.read_text() == text


def _containers(d: builders.Desired) -> dict:
    return {c["name"]: c for c in d.template["spec"]["containers"]}


def test_pod_shape():
    d = _desired({"model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"}, "sglang": {"tensorParallel": 2}})
    pod = d.template["spec"]
    c = _containers(d)
    args = c["sglang"]["args"]
    for flag, value in (("--host", "0.0.0.0"), ("--port", "30000"), ("--tp", "2")):
        assert args[args.index(flag) + 1] == value
    assert "--enable-metrics" in args
    assert c["sglang"]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == api.DEFAULT_GPU_PRODUCT
    assert pod["shareProcessNamespace"] is True
    startup = c["sglang"]["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    sc = c["profiler"]["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    env = {e["name"]: e for e in c["profiler"]["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "revision" in env["VLM_REVISION"]["valueFrom"]["fieldRef"]["fieldPath"]


def test_ipc_cache_flags_follow_the_version():
    new = _containers(_desired({"model": {"path": "m"}, "sglang": {"image": "lmsysorg/sglang:v0.5.23"}}))["sglang"]
    assert "--mm-feature-transport" in new["args"]
    old = _desired({"model": {"path": "m"}, "sglang": {"image": "lmsysorg/sglang:v0.5.10"}})
    env = {e["name"]: e["value"] for e in _containers(old)["sglang"]["env"]}
    assert env["SGLANG_USE_IPC_POOL_HANDLE_CACHE"] == "1"
    assert env["SGLANG_USE_CUDA_IPC_TRANSPORT"] == "1"
    assert old.plan.active


def test_on_with_a_version_without_the_cache_is_invalid():
    with pytest.raises(InvalidSpec) as e:
        _desired({"model": {"path": "m"}, "sglang": {"image": "lmsysorg/sglang:v0.5.9", "ipcCache": {"mode": "On"}}})
    assert "ipcCache" in str(e.value)


def test_auto_on_an_old_version_is_inactive_not_an_error():
    d = _desired({"model": {"path": "m"}, "sglang": {"image": "lmsysorg/sglang:v0.5.9"}})
    assert not d.plan.active and d.plan.reason == "SGLangTooOld"


def test_revision_is_stable_and_sensitive():
    a = _desired({"model": {"path": "m"}})
    b = _desired({"model": {"path": "m"}})
    c = _desired({"model": {"path": "m"}, "sglang": {"ipcCache": {"mode": "Off"}}})
    assert a.revision == b.revision != c.revision
    # One Deployment per revision, named by it; the role is not in its pod template (the operator labels each
    # pod as it places it), so a promoted canary keeps its pods: the template is the same whatever the role.
    s = builders.build_deployment(OWNER, a.template, a.revision, 1)
    k = builders.build_deployment(OWNER, c.template, c.revision, 1)
    assert s["metadata"]["name"] == f"svc-{a.revision}" and k["metadata"]["name"] == f"svc-{c.revision}"
    assert s["metadata"]["name"] == builders.deployment_name(OWNER, a.revision)
    labels = s["spec"]["template"]["metadata"]["labels"]
    assert labels[builders.LABEL_REVISION] == a.revision and builders.LABEL_ROLE not in labels
    assert builders.LABEL_ROLE not in s["metadata"]["labels"]
    assert s["spec"]["selector"] == {
        "matchLabels": {builders.LABEL_SERVICE: "svc", builders.LABEL_REVISION: a.revision},
        "matchExpressions": [{"key": builders.LABEL_ROLE, "operator": "NotIn", "values": [builders.ROLE_BASELINE]}],
    }
    # Every pod starts behind the operator's scheduling gate, which is not part of the revision either.
    assert s["spec"]["template"]["spec"]["schedulingGates"] == [{"name": builders.SCHEDULING_GATE}]
    assert "schedulingGates" not in a.template["spec"]
    # The fresh baseline: the stable revision's pods, labelled baseline from their template, which the revision
    # Deployment's selector leaves out.
    base = builders.build_baseline(OWNER, s["spec"]["template"], a.revision, 2)
    assert base["metadata"]["name"] == "svc-baseline" and base["spec"]["replicas"] == 2
    blabels = base["spec"]["template"]["metadata"]["labels"]
    assert blabels[builders.LABEL_ROLE] == builders.ROLE_BASELINE and blabels[builders.LABEL_REVISION] == a.revision
    assert base["spec"]["selector"] == {"matchLabels": {builders.LABEL_SERVICE: "svc",
                                                        builders.LABEL_ROLE: builders.ROLE_BASELINE}}
    assert base["spec"]["template"]["spec"]["schedulingGates"] == [{"name": builders.SCHEDULING_GATE}]


def test_deployment_never_surges_gpus():
    d = _desired({"model": {"path": "m"}})
    dep = builders.build_deployment(OWNER, d.template, d.revision, 3)
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert dep["metadata"]["ownerReferences"][0]["controller"] is True


def test_user_env_that_contradicts_the_plan_is_invalid():
    with pytest.raises(InvalidSpec) as e:
        _desired(
            {"model": {"path": "m"}, "sglang": {"image": "lmsysorg/sglang:v0.5.10", "env": [{"name": "SGLANG_USE_IPC_POOL_HANDLE_CACHE", "value": "0"}]}}
        )
    assert e.value.field == "spec.sglang.env"
    d = _desired({"model": {"path": "m"}, "sglang": {"env": [{"name": "HF_HOME", "value": "/x"}]}})
    env = {e["name"]: e["value"] for e in _containers(d)["sglang"]["env"]}
    assert env["HF_HOME"] == "/x"


def test_template_is_json_serialisable():
    json.dumps(_desired({"model": {"path": "m", "cache": {"claimName": "weights"}}}).template)


# ---------------------------------------------------------------- issue 15: pod template, image, security

def test_no_image_and_the_old_crd_default_give_the_same_revision():
    """Objects stored with the old CRD default (image: lmsysorg/sglang:v0.5.23) keep their revision."""
    old = _desired({"model": {"path": "m"}, "sglang": {"image": api.DEFAULT_SGLANG_IMAGE}})
    new = _desired({"model": {"path": "m"}})
    assert old.template == new.template and old.revision == new.revision
    assert new.image == api.DEFAULT_SGLANG_IMAGE and new.version == "0.5.23"


def test_the_operator_setting_fills_the_image_and_its_version():
    s = Settings(sidecar_image="vlmops/vlm-sidecar:test", sglang_image="registry.example.com/sglang:v0.5.10")
    d = builders.build_desired(OWNER, api.parse_spec({"model": {"path": "m"}}), s)
    assert _containers(d)["sglang"]["image"] == "registry.example.com/sglang:v0.5.10"
    assert (d.image, d.version) == ("registry.example.com/sglang:v0.5.10", "0.5.10")
    pinned = builders.build_desired(
        OWNER, api.parse_spec({"model": {"path": "m"}, "sglang": {"image": "lmsysorg/sglang:v0.5.22"}}), s
    )
    assert (pinned.image, pinned.version) == ("lmsysorg/sglang:v0.5.22", "0.5.22")


def test_env_from_a_secret_is_a_reference_never_a_value():
    d = _desired(
        {
            "model": {"path": "m"},
            "sglang": {
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
                "envFrom": [{"configMapRef": {"name": "cm"}}],
            },
        }
    )
    c = _containers(d)["sglang"]
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert c["envFrom"] == [{"configMapRef": {"name": "cm"}}]
    # The plan's env stays first, as before: older specs keep their revision.
    assert list(env)[-1] == "HF_TOKEN" and all(n.startswith("SGLANG_") for n in list(env)[:-1])


def test_value_from_on_an_env_the_operator_sets_is_invalid():
    with pytest.raises(InvalidSpec) as e:
        _desired(
            {
                "model": {"path": "m"},
                "sglang": {
                    "env": [
                        {
                            "name": "SGLANG_USE_IPC_POOL_HANDLE_CACHE",
                            "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}},
                        }
                    ]
                },
            }
        )
    assert e.value.field == "spec.sglang.env"


def test_pod_fields_reach_the_pod_and_only_when_set():
    bare = _desired({"model": {"path": "m"}}).template
    for k in ("serviceAccountName", "imagePullSecrets", "priorityClassName", "affinity", "topologySpreadConstraints"):
        assert k not in bare["spec"]
    d = _desired(
        {
            "model": {"path": "m"},
            "pod": {
                "labels": {"team": "vision"},
                "annotations": {"example.com/a": "b"},
                "serviceAccountName": "runner",
                "imagePullSecrets": [{"name": "pull"}],
                "priorityClassName": "high",
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname", "namespaceSelector": {}}]}},
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
                ],
            },
        }
    )
    t = d.template
    assert t["metadata"]["labels"]["team"] == "vision"
    assert t["metadata"]["labels"][builders.LABEL_SERVICE] == "svc"
    assert t["metadata"]["annotations"] == {"example.com/a": "b", builders.ANNOTATION_IPC: "active"}
    pod = t["spec"]
    assert pod["serviceAccountName"] == "runner" and pod["priorityClassName"] == "high"
    assert pod["imagePullSecrets"] == [{"name": "pull"}]  # one list for both containers' images
    # An empty namespaceSelector means "all namespaces" and must survive the pruning of empty fields.
    term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term == {"topologyKey": "kubernetes.io/hostname", "namespaceSelector": {}}
    # Without a labelSelector a spread constraint counts the service's own pods.
    assert pod["topologySpreadConstraints"][0]["labelSelector"] == {"matchLabels": {builders.LABEL_SERVICE: "svc"}}
    assert d.revision != _desired({"model": {"path": "m"}}).revision


def test_operator_labels_cover_what_the_schema_refuses():
    """Every pod label the operator sets is one the spec may not set (so a user label never shadows it)."""
    d = _desired({"model": {"path": "m"}})
    s = builders.build_deployment(OWNER, d.template, d.revision, 1)
    base = builders.build_baseline(OWNER, s["spec"]["template"], d.revision, 1)
    for k in [*s["spec"]["template"]["metadata"]["labels"], *base["spec"]["template"]["metadata"]["labels"]]:
        assert k in api.OPERATOR_LABELS or k.startswith(api.OPERATOR_PREFIX), k
    for k in s["spec"]["template"]["metadata"]["annotations"]:
        assert k.startswith(api.OPERATOR_PREFIX), k


def test_pdb_only_with_more_than_one_replica_and_over_all_the_services_pods():
    assert _desired({"model": {"path": "m"}, "replicas": 1}).pdb is None
    assert _desired({"model": {"path": "m"}, "replicas": 0}).pdb is None
    pdb = _desired({"model": {"path": "m"}, "replicas": 2}).pdb
    assert pdb["apiVersion"] == "policy/v1" and pdb["metadata"]["name"] == "svc"
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        # every pod of the service, whatever its revision or role (a canary pod serves traffic too)
        "selector": {"matchLabels": {builders.LABEL_SERVICE: "svc"}},
    }
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid


@pytest.mark.parametrize(
    "mode,setting,telemetry,want",
    [
        ("Auto", True, True, True),
        ("Auto", False, True, False),
        ("On", False, True, True),
        ("Off", True, True, False),
        ("On", True, False, False),  # no sidecar, no port to guard
    ],
)
def test_network_policy_follows_the_mode_and_the_setting(mode, setting, telemetry, want):
    s = Settings(sidecar_image="x/y:1", network_policy=setting)
    spec = api.parse_spec({"model": {"path": "m"}, "telemetry": {"networkPolicy": mode, "enabled": telemetry}})
    assert (builders.build_desired(OWNER, spec, s).network_policy is not None) is want


def test_network_policy_guards_only_the_sidecar_port():
    np = _desired({"model": {"path": "m"}}).network_policy
    assert np["spec"]["podSelector"] == {"matchLabels": {builders.LABEL_SERVICE: "svc"}}
    assert np["spec"]["policyTypes"] == ["Ingress"]
    open_rule, sidecar_rule = np["spec"]["ingress"]
    assert open_rule == {"ports": [{"protocol": "TCP", "port": builders.SGLANG_PORT}]}  # no `from`: anyone
    assert sidecar_rule["ports"] == [{"protocol": "TCP", "port": builders.SIDECAR_PORT}]
    assert sidecar_rule["from"] == list(SETTINGS.profiler_peers)
    names = [p["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for p in sidecar_rule["from"]]
    assert names == ["vlm-operator", "prometheus"]


def test_sidecar_uid_follows_telemetry_run_as_user():
    root = _containers(_desired({"model": {"path": "m"}}))["profiler"]["securityContext"]
    assert root["runAsUser"] == 0 and "runAsNonRoot" not in root
    sc = _containers(_desired({"model": {"path": "m"}, "telemetry": {"runAsUser": 1000}}))["profiler"]["securityContext"]
    assert sc["runAsUser"] == 1000 and sc["runAsNonRoot"] is True
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}


def test_front_end_sampling_reaches_the_sidecar_only_when_asked_for():
    def env(spec):
        d = _desired(spec)
        return d.revision, {e["name"]: e.get("value") for e in _containers(d)["profiler"]["env"]}

    rev, plain = env({"model": {"path": "m"}})
    assert "VLM_FRONTEND_ROLES" not in plain  # the default pod template, and so its revision, is unchanged
    assert rev == env({"model": {"path": "m"}, "telemetry": {"frontendRoles": []}})[0]
    rev2, on = env({"model": {"path": "m"}, "telemetry": {"frontendRoles": ["mm_processor", "tokenizer_manager"]}})
    assert on["VLM_FRONTEND_ROLES"] == "mm_processor,tokenizer_manager" and rev2 != rev
    with pytest.raises(ValueError, match="frontendRoles"):  # the CRD's enum refuses it first
        _desired({"model": {"path": "m"}, "telemetry": {"frontendRoles": ["scheduler"]}})
    with pytest.raises(ValueError, match="a role may appear once"):  # the CRD's list-type set refuses it too
        _desired({"model": {"path": "m"}, "telemetry": {"frontendRoles": ["mm_processor", "mm_processor"]}})


# ---------------------------------------------------------------- day two on a real GPU cluster

def _qos_class(pod_spec: dict) -> str:
    """The pod's QoS class as the kubelet computes it (k8s.io/kubernetes/pkg/apis/core/helper/qos): Guaranteed
    when every container (init containers too) has cpu and memory limits and its requests, where given, equal
    them; BestEffort with no requests or limits at all; else Burstable."""
    containers = pod_spec.get("initContainers", []) + pod_spec["containers"]
    requests_any = limits_any = False
    guaranteed = True
    for c in containers:
        res = c.get("resources", {})
        req, lim = res.get("requests", {}), res.get("limits", {})
        requests_any |= bool(req)
        limits_any |= bool(lim)
        for name in ("cpu", "memory"):
            if name not in lim or req.get(name, lim[name]) != lim[name]:
                guaranteed = False
        if any(req[k] != lim.get(k) for k in req):
            guaranteed = False
    if guaranteed:
        return "Guaranteed"
    return "Burstable" if requests_any or limits_any else "BestEffort"


GUARANTEED_SPECS = [
    {"model": {"path": "m"}},
    {"model": {"path": "m"}, "sglang": {"tensorParallel": 2}, "resources": {"cpu": "16", "memory": "128Gi"}},
    {"model": {"path": "m"}, "telemetry": {"enabled": False}},
    {"model": {"path": "m"}, "telemetry": {"frontendRoles": ["mm_processor"]}},
]


@pytest.mark.parametrize("path", EXAMPLES + INPUTS, ids=lambda p: p.stem)
def test_every_example_pod_is_guaranteed(path):
    spec = api.parse_spec(yaml.safe_load(path.read_text())["spec"])
    pod = builders.build_desired(OWNER, spec, SETTINGS).template["spec"]
    assert _qos_class(pod) == "Guaranteed"
    for c in pod["containers"]:
        assert c["resources"]["requests"] == c["resources"]["limits"], c["name"]
        assert {"cpu", "memory"} <= set(c["resources"]["limits"]), c["name"]


@pytest.mark.parametrize("spec", GUARANTEED_SPECS, ids=lambda s: json.dumps(s, sort_keys=True))
def test_every_pod_is_guaranteed(spec):
    assert _qos_class(_desired(spec).template["spec"]) == "Guaranteed"


def test_the_qos_classifier_tells_burstable_pods():
    """The classifier the test above trusts: the old sidecar budget (requests below limits) made the pod Burstable."""
    pod = copy.deepcopy(_desired({"model": {"path": "m"}}).template["spec"])
    assert _qos_class(pod) == "Guaranteed"
    pod["containers"][1]["resources"] = {"requests": {"cpu": "100m", "memory": "128Mi"},
                                         "limits": {"cpu": "1", "memory": "512Mi"}}
    assert _qos_class(pod) == "Burstable"
    del pod["containers"][1]["resources"]["limits"]["memory"]
    assert _qos_class(pod) == "Burstable"
    assert _qos_class({"containers": [{"name": "a"}]}) == "BestEffort"


def test_startup_timeout_sizes_the_startup_probe_and_the_progress_deadline():
    def probe(spec):
        d = _desired(spec)
        dep = builders.build_deployment(OWNER, d.template, d.revision, 1)
        return _containers(d)["sglang"]["startupProbe"], dep["spec"]["progressDeadlineSeconds"]

    default, deadline = probe({"model": {"path": "m"}})
    assert default["periodSeconds"] * default["failureThreshold"] == 20 * 60 and deadline == 20 * 60 + 600
    long, deadline = probe({"model": {"path": "m"}, "sglang": {"startupTimeout": "1h30m"}})
    assert long["periodSeconds"] * long["failureThreshold"] == 90 * 60 and deadline == 90 * 60 + 600
    odd, _ = probe({"model": {"path": "m"}, "sglang": {"startupTimeout": "95s"}})
    assert odd["failureThreshold"] == 10  # rounded up: never less than asked for


@pytest.mark.parametrize("version", ["0.5.9", "0.5.10", "0.5.15", "0.5.17", "0.5.20", "0.5.23", "0.6.1"])
def test_liveness_never_waits_on_a_generation(version):
    c = _containers(_desired({"model": {"path": "m"}, "sglang": {"version": version}}))["sglang"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env[sglang.ENV_HEALTH_GENERATION] == "0"
    live = c["livenessProbe"]
    assert live["httpGet"] == {"path": "/health", "port": "http"}
    # Patient as well: two minutes of no answer, 10 s per try.
    assert live["timeoutSeconds"] >= 10 and live["periodSeconds"] * live["failureThreshold"] >= 120
    assert c["readinessProbe"]["httpGet"]["path"] == "/health_generate"  # readiness may generate: it only routes


@pytest.mark.parametrize("sglang_spec", [
    {"version": "0.4.10"},  # older than any wheel checked: not known to have the switch
    {"image": "lmsysorg/sglang:latest"},  # unknown version
    {"env": [{"name": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "value": "true"}]},
    {"env": [{"name": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION",
              "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]},
])
def test_liveness_falls_back_to_tcp_where_health_may_generate(sglang_spec):
    c = _containers(_desired({"model": {"path": "m"}, "sglang": sglang_spec}))["sglang"]
    assert c["livenessProbe"]["tcpSocket"] == {"port": "http"} and "httpGet" not in c["livenessProbe"]
    names = [e["name"] for e in c["env"]]
    assert names.count(sglang.ENV_HEALTH_GENERATION) == int("env" in sglang_spec)  # the spec's own, once


def test_a_spec_that_switches_generation_off_itself_keeps_the_http_check():
    c = _containers(_desired({"model": {"path": "m"}, "sglang": {"env": [
        {"name": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "value": "false"}]}}))["sglang"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert [e for e in c["env"] if e["name"] == sglang.ENV_HEALTH_GENERATION] == [
        {"name": sglang.ENV_HEALTH_GENERATION, "value": "false"}]


@pytest.mark.parametrize(("grace", "drain"), [(None, 105), (300, 285), (16, 1), (15, None), (1, None)])
def test_pre_stop_drain_is_bounded_by_the_grace_period(grace, drain):
    pod = {} if grace is None else {"pod": {"terminationGracePeriodSeconds": grace}}
    d = _desired({"model": {"path": "m"}, **pod})
    assert d.template["spec"]["terminationGracePeriodSeconds"] == (grace or api.DEFAULT_GRACE_SECONDS)
    c = _containers(d)["sglang"]
    if drain is None:
        assert "lifecycle" not in c
        return
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:3] == ["python3", "-c", builders.DRAIN_SCRIPT]
    assert command[3:] == [str(drain), f"http://127.0.0.1:{builders.SGLANG_PORT}/metrics"]
    assert "--enable-metrics" in c["args"]  # the gauges it reads
    for metric in (sglang.METRIC_RUNNING, sglang.METRIC_QUEUED):
        assert metric in builders.DRAIN_SCRIPT


class _Metrics:
    """A stand-in for SGLang's /metrics: the load gauges as a sequence of (running, queued), one per read."""

    def __init__(self, loads):
        import http.server
        import threading

        self.loads, self.reads = list(loads), 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                running, queued = outer.loads[min(outer.reads, len(outer.loads) - 1)]
                outer.reads += 1
                body = (
                    "# HELP sglang:num_running_reqs The number of running requests.\n"
                    "# TYPE sglang:num_running_reqs gauge\n"
                    f'sglang:num_running_reqs{{engine_type="unified",model_name="m",tp_rank="0"}} {running}\n'
                    'sglang:num_running_reqs{engine_type="unified",model_name="m",tp_rank="1"} 0.0\n'
                    f'sglang:num_queue_reqs{{engine_type="unified",model_name="m",tp_rank="0"}} {queued}\n'
                    'sglang:num_running_reqs_offline_batch{model_name="m"} 7.0\n'  # another metric: not counted
                    "sglang:gen_throughput 12.5\n"
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _drain(budget: float, url: str) -> float:
    import subprocess
    import sys
    import time

    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", builders.DRAIN_SCRIPT, str(budget), url],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return time.monotonic() - start


def test_the_drain_waits_while_requests_run_or_queue_then_returns():
    m = _Metrics([(2, 1), (1, 0), (0, 3), (0, 0)])
    try:
        took = _drain(20, m.url)
    finally:
        m.close()
    assert m.reads == 4 and took < 12  # the initial 5 s settle, one read a second until idle


def test_the_drain_stops_at_its_budget_and_when_sglang_does_not_answer():
    m = _Metrics([(5, 0)])
    try:
        took = _drain(7, m.url)
    finally:
        m.close()
    assert 6.9 < took < 11 and m.reads >= 1  # still busy at the end: it gives up, SIGTERM follows
    assert _drain(1, "http://127.0.0.1:9/metrics") < 5  # nothing listens: nothing to drain


def test_sglang_security_context_defaults_and_overrides():
    sc = _containers(_desired({"model": {"path": "m"}}))["sglang"]["securityContext"]
    assert sc == {"allowPrivilegeEscalation": False, "seccompProfile": {"type": "RuntimeDefault"},
                  "capabilities": {"drop": ["NET_RAW"]}}
    assert _desired({"model": {"path": "m"}}).template["spec"]["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"}}
    user = {"runAsUser": 1000, "runAsNonRoot": True, "seccompProfile": {"type": "Unconfined"}}
    sc = _containers(_desired({"model": {"path": "m"}, "sglang": {"securityContext": user}}))["sglang"]["securityContext"]
    assert sc == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["NET_RAW"]}, **user}  # each field set replaces the default's
    # The pod API refuses allowPrivilegeEscalation false with privileged or CAP_SYS_ADMIN: the default gives way.
    for esc in ({"privileged": True}, {"capabilities": {"add": ["SYS_ADMIN"]}}):
        sc = _containers(_desired({"model": {"path": "m"}, "sglang": {"securityContext": esc}}))["sglang"]["securityContext"]
        assert "allowPrivilegeEscalation" not in sc and sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_serving_pods_mount_no_api_token_unless_asked():
    assert _desired({"model": {"path": "m"}}).template["spec"]["automountServiceAccountToken"] is False
    on = _desired({"model": {"path": "m"}, "pod": {"automountServiceAccountToken": True}})
    assert on.template["spec"]["automountServiceAccountToken"] is True


def test_sidecar_is_ready_on_readyz_and_keeps_only_sys_ptrace():
    c = _containers(_desired({"model": {"path": "m"}}))["profiler"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "profiler"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "profiler"}
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_sidecar_serves_the_probed_paths():
    """/readyz and /healthz are what vlm_sidecar.server answers (never depending on a scheduler found)."""
    server = (ROOT / "sidecar" / "vlm_sidecar" / "server.py").read_text()
    for path in ("/readyz", "/healthz"):
        assert f'"{path}"' in server


def test_pod_knobs_volumes_and_mounts_reach_the_pod():
    d = _desired({
        "model": {"path": "m", "cache": {"claimName": "weights"}},
        "sglang": {"volumeMounts": [{"name": "compile-cache", "mountPath": "/root/.cache"}]},
        "pod": {"runtimeClassName": "nvidia", "schedulerName": "volcano", "terminationGracePeriodSeconds": 600,
                "volumes": [{"name": "compile-cache", "emptyDir": {"sizeLimit": "20Gi"}},
                            {"name": "w", "csi": {"driver": "d", "fsType": "ext4"}}]},
    })
    pod = d.template["spec"]
    assert pod["runtimeClassName"] == "nvidia" and pod["schedulerName"] == "volcano"
    assert pod["terminationGracePeriodSeconds"] == 600
    assert [v["name"] for v in pod["volumes"]] == ["dshm", "profiler-tmp", "model-cache", "compile-cache", "w"]
    assert pod["volumes"][-1] == {"name": "w", "csi": {"driver": "d", "fsType": "ext4"}}
    mounts = _containers(d)["sglang"]["volumeMounts"]
    assert mounts[-1] == {"name": "compile-cache", "mountPath": "/root/.cache"}
    assert [m["mountPath"] for m in mounts][:2] == ["/dev/shm", "/models"]
    bare = _desired({"model": {"path": "m"}}).template["spec"]
    assert "runtimeClassName" not in bare and "schedulerName" not in bare


def test_sidecar_pull_secrets_follow_the_services_own():
    s = Settings(sidecar_image="r.example.com/vlm-sidecar:1", sidecar_image_pull_secrets=("sidecar-pull", "shared"))
    spec = {"model": {"path": "m"}, "pod": {"imagePullSecrets": [{"name": "shared"}, {"name": "own"}]}}
    pod = builders.build_desired(OWNER, api.parse_spec(spec), s).template["spec"]
    assert pod["imagePullSecrets"] == [{"name": "shared"}, {"name": "own"}, {"name": "sidecar-pull"}]
    bare = builders.build_desired(OWNER, api.parse_spec({"model": {"path": "m"}}), s).template["spec"]
    assert bare["imagePullSecrets"] == [{"name": "sidecar-pull"}, {"name": "shared"}]
    off = builders.build_desired(OWNER, api.parse_spec({"model": {"path": "m"}, "telemetry": {"enabled": False}}), s)
    assert "imagePullSecrets" not in off.template["spec"]  # no sidecar, no sidecar image to pull


def test_network_policy_admits_the_configured_scrapers_and_cidrs():
    s = Settings(sidecar_image="x/y:1", profiler_scrapers=("monitoring/alloy", "vmagent"),
                 profiler_peer_cidrs=("10.0.0.0/28",))
    np = builders.build_desired(OWNER, api.parse_spec({"model": {"path": "m"}}), s).network_policy
    peers = np["spec"]["ingress"][1]["from"]
    assert peers[:2] == list(SETTINGS.profiler_peers)  # the defaults stay
    assert peers[2:] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "alloy"}}},
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "vmagent"}}},
        {"ipBlock": {"cidr": "10.0.0.0/28"}},
    ]
    assert np["spec"]["ingress"][0] == {"ports": [{"protocol": "TCP", "port": builders.SGLANG_PORT}]}
