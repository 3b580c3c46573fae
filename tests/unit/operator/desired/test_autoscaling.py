"""spec.autoscaling (issue: autoscaling through a real KEDA): the ScaledObject the operator writes, the condition that
says what is missing, the reconcile's writes with and without KEDA's CRD, and the triggers' PromQL parsed by the real
promtool. What a live KEDA and the HPA loop do with it is not proved here (docs/autoscaling.md says what is open)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.settings import Settings
from vlm_operator.desired import autoscaling as A
from vlm_operator.desired.builders import Owner
from vlm_testing.fakekube import SPEC, T0, FakeCluster
from vlm_testing.specs import MINIMAL

OWNER = Owner("qwen", "ml", "uid-1")
PROM = "http://prometheus.monitoring:9090"


FRONTEND = {"telemetry": {"frontendRoles": ["tokenizer_manager", "mm_processor"]}}


def _spec(front: bool = True, **autoscaling) -> api.VLMServiceSpec:
    return api.parse_spec({**MINIMAL, **(FRONTEND if front else {}), "autoscaling": {"maxReplicas": 6, **autoscaling}})


def test_the_default_targets_are_the_busy_shares_the_sidecars_export():
    plain = _spec(front=False)
    assert A.signals(plain.autoscaling, frontend=False) == ["schedulerBusy"]  # no front end sampled: no trigger on it
    assert A.signals(_spec().autoscaling, frontend=True) == ["schedulerBusy", "frontendBusy"]
    only = _spec(targets={"queuePerReplica": 4})
    assert A.signals(only.autoscaling, frontend=True) == ["queuePerReplica"]  # a target set: only those set


def test_the_defaults_scale_on_the_scheduler_and_the_front_end_per_replica():
    obj = A.build_scaled_object(OWNER, _spec().autoscaling, PROM, frontend=True)
    s = obj["spec"]
    assert obj["apiVersion"] == "keda.sh/v1alpha1" and obj["kind"] == "ScaledObject"
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-1"  # goes with the VLMService
    assert s["scaleTargetRef"] == {"apiVersion": "serving.vlmops.dev/v1alpha1", "kind": "VLMService", "name": "qwen"}
    assert (s["minReplicaCount"], s["maxReplicaCount"], s["pollingInterval"]) == (1, 6, 30)
    assert [(t["name"], t["metricType"], t["metadata"]["threshold"]) for t in s["triggers"]] == [
        ("schedulerBusy", "AverageValue", "0.85"), ("frontendBusy", "AverageValue", "0.85")]
    for t in s["triggers"]:
        assert t["type"] == "prometheus" and t["metadata"]["serverAddress"] == PROM
        assert 'namespace="ml"' in t["metadata"]["query"] and 'vlmservice="qwen"' in t["metadata"]["query"]
        assert t["metadata"]["query"].startswith("sum(")  # a sum over pods: the HPA divides by the replicas
        assert "authenticationRef" not in t
    behavior = s["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    # scale-down slower than scale-up: a removed replica costs a model load to get back
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 60
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 600
    assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]


def test_every_target_becomes_a_trigger_in_its_units():
    spec = _spec(minReplicas=2, targets={"schedulerBusyPercent": 90, "frontendBusyPercent": None,
                                         "queuePerReplica": 4, "kvCacheUsagePercent": 80, "ttftP95": "1500ms"},
                 scaleUpStabilization="2m", scaleDownStabilization="15m", pollingInterval="15s")
    obj = A.build_scaled_object(OWNER, spec.autoscaling, PROM, trigger_auth="prom-auth")
    trig = {t["name"]: t for t in obj["spec"]["triggers"]}
    assert list(trig) == ["schedulerBusy", "queuePerReplica", "kvCacheUsage", "ttftP95"]
    assert trig["schedulerBusy"]["metadata"]["threshold"] == "0.9"
    assert trig["queuePerReplica"]["metadata"]["threshold"] == "4"
    assert "sglang:num_queue_reqs" in trig["queuePerReplica"]["metadata"]["query"]
    assert trig["kvCacheUsage"]["metadata"]["threshold"] == "0.8"
    assert trig["ttftP95"]["metricType"] == "Value" and trig["ttftP95"]["metadata"]["threshold"] == "1.5"
    assert all(t["authenticationRef"] == {"name": "prom-auth", "kind": "ClusterTriggerAuthentication"}
               for t in trig.values())
    s = obj["spec"]
    assert s["minReplicaCount"] == 2 and s["pollingInterval"] == 15
    behavior = s["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 120
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 900


def test_the_triggers_queries_are_promql_the_real_promtool_accepts(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: hack/install-system-deps.sh installs Debian's prometheus"
    spec = _spec(targets={"schedulerBusyPercent": 85, "frontendBusyPercent": 85, "queuePerReplica": 4,
                          "kvCacheUsagePercent": 80, "ttftP95": "2s"})
    queries = A.queries(OWNER, spec.autoscaling, frontend=True)
    assert len(queries) == 5
    rules = {"groups": [{"name": "keda", "rules": [{"record": f"vlm:autoscaling_{name}", "expr": q}
                                                   for name, q, _, _ in queries]}]}
    f = tmp_path / "rules.yaml"
    f.write_text(yaml.safe_dump(rules))
    out = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_condition_says_what_is_missing_and_no_home_made_autoscaler_runs():
    spec = _spec()
    assert A.autoscaler(OWNER, api.parse_spec(MINIMAL), Settings(prometheus_url=PROM), keda=True) == A.Autoscaler()
    none = A.autoscaler(OWNER, spec, Settings(prometheus_url=PROM), keda=False)
    assert none.want is None and none.condition[:2] == (False, "KEDANotInstalled")
    assert "scaledobjects.keda.sh" in none.condition[2]
    no_prom = A.autoscaler(OWNER, spec, Settings(), keda=True)
    assert no_prom.want is None and no_prom.condition[:2] == (False, "NoPrometheus")
    off = spec.model_copy(update={"telemetry": spec.telemetry.model_copy(update={"enabled": False})})
    no_sidecar = A.autoscaler(OWNER, off, Settings(prometheus_url=PROM), keda=True)
    assert no_sidecar.want is None and no_sidecar.condition[:2] == (False, "NoTelemetry")
    ok = A.autoscaler(OWNER, spec, Settings(prometheus_url="http://a:9090", autoscaling_prometheus_url=PROM),
                      keda=True)
    assert ok.condition[:2] == (True, "ScaledObjectApplied")
    assert ok.want["spec"]["triggers"][0]["metadata"]["serverAddress"] == PROM  # the autoscaling URL wins


def _autoscaled(keda: bool, settings: Settings | None = None) -> FakeCluster:
    c = FakeCluster({**SPEC, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}},
                    settings=settings or Settings(prometheus_url=PROM))
    c.rt.keda = keda
    return c


def test_with_keda_the_scaled_object_is_written_once_per_generation_and_deleted_with_the_spec():
    c = _autoscaled(keda=True)
    c.run()
    [so] = c.kube.written("apply", "ScaledObject")
    assert so.body["spec"]["maxReplicaCount"] == 4
    assert c.condition("Autoscaling")["status"] == "True"
    assert ("Normal", "ScaledObjectApplied") in [e[:2] for e in c.events]
    c.kube.reset_writes()
    c.run(T0 + 15)
    assert c.kube.written("apply", "ScaledObject") == []  # same generation: not sent again
    c.kube.update_spec("svc", SPEC)  # spec.autoscaling removed
    c.kube.reset_writes()
    c.run(T0 + 30)
    assert [w.kind for w in c.kube.written("delete")] == ["ScaledObject"]
    assert all(cond["type"] != "Autoscaling" for cond in c.status["conditions"])  # its condition goes too


def test_without_keda_nothing_is_written_and_the_condition_warns():
    c = _autoscaled(keda=False)
    c.run()
    assert c.kube.written("apply", "ScaledObject") == [] and c.kube.written("delete") == []
    cond = c.condition("Autoscaling")
    assert (cond["status"], cond["reason"]) == ("False", "KEDANotInstalled")
    assert ("Warning", "KEDANotInstalled") in [e[:2] for e in c.events]
    assert c.status["replicas"] == 2  # spec.replicas as set: the operator scales nothing itself


@pytest.mark.parametrize("bad", [{"minReplicas": 3, "maxReplicas": 2}, {"maxReplicas": 0},
                                 {"maxReplicas": 2, "targets": {"frontendBusyPercent": 80}}])
def test_bad_bounds_are_refused_by_the_model(bad):
    with pytest.raises(ValueError):
        api.parse_spec({**MINIMAL, "autoscaling": bad})  # (the last: no telemetry.frontendRoles)


def test_the_default_steps_are_planned_for_min_replicas_not_the_moving_count():
    rollout = {"analysis": {"maxDuration": "30m"}}
    plain = api.parse_spec({**MINIMAL, "replicas": 8, "rollout": rollout})
    auto = api.parse_spec({**MINIMAL, "replicas": 8, "rollout": rollout,
                           "autoscaling": {"minReplicas": 4, "maxReplicas": 16}})
    assert [s.replicas for s in plain.steps()] == [1, 2, 4]
    assert [s.replicas for s in auto.steps()] == [1, 2]  # the same at 8 replicas or at 16
    assert [s.replicas for s in auto.model_copy(update={"replicas": 16}).steps()] == [1, 2]
    assert api.parse_spec(MINIMAL).steps() == []


def _hpa(desired: int, current: int, *metrics: tuple[float, float]):
    """An HPA as KEDA makes it: metric s<i>-prometheus per trigger, AverageValue targets."""
    from vlm_operator.cluster.observed import HPAInfo

    return HPAInfo.from_body({
        "spec": {"metrics": [{"type": "External", "external": {"metric": {"name": f"s{i}-prometheus"},
                                                               "target": {"type": "AverageValue",
                                                                          "averageValue": f"{int(t * 1000)}m"}}}
                             for i, (_, t) in enumerate(metrics)]},
        "status": {"currentReplicas": current, "desiredReplicas": desired, "lastScaleTime": "2027-01-15T08:00:00Z",
                   "currentMetrics": [{"type": "External", "external": {"metric": {"name": f"s{i}-prometheus"},
                                                                        "current": {"averageValue": f"{int(v * 1000)}m"}}}
                                      for i, (v, _) in enumerate(metrics)]}})


def test_the_status_names_the_signal_that_drives_the_count_and_says_when_it_is_stuck_at_max():
    spec = _spec(maxReplicas=4)  # schedulerBusy (s0), frontendBusy (s1), both at 0.85
    st = A.status_of(spec, _hpa(3, 2, (0.6, 0.85), (1.2, 0.85)))
    assert (st.signal, st.value, st.target) == ("frontendBusy", 1.2, 0.85)
    assert (st.current_replicas, st.desired_replicas, st.at_max_replicas) == (2, 3, False)
    assert A.status_of(spec, _hpa(4, 4, (0.6, 0.85), (1.2, 0.85))).at_max_replicas is True
    assert A.status_of(spec, _hpa(4, 4, (0.6, 0.85), (0.8, 0.85))).at_max_replicas is False  # at max, not above
    assert A.status_of(spec, None).desired_replicas is None
    assert A.status_of(api.parse_spec(MINIMAL), _hpa(1, 1, (0.1, 0.85))) is None
    assert A.ratios(spec, _hpa(3, 2, (0.6, 0.85), (1.2, 0.85))) == pytest.approx(
        {"schedulerBusy": 0.6 / 0.85, "frontendBusy": 1.2 / 0.85})


def test_each_scale_decision_is_one_event_and_the_status_and_metrics_follow_the_hpa():
    from vlm_operator.api import metrics

    c = _autoscaled(keda=True)
    c.run()
    assert c.status["autoscaling"] == {"minReplicas": 2, "maxReplicas": 4}  # no HPA yet
    c.kube.hpas[("ns", "svc")] = _hpa(2, 2, (0.5, 0.85), (0.2, 0.85))
    c.run(T0 + 15)
    assert c.status["autoscaling"]["desiredReplicas"] == 2 and c.status["autoscaling"]["signal"] == "schedulerBusy"
    assert not [e for e in c.events if e[1] == "Autoscaled"]  # it has what it wants: no decision
    c.kube.hpas[("ns", "svc")] = _hpa(4, 2, (1.5, 0.85), (0.2, 0.85))
    c.run(T0 + 30)
    c.run(T0 + 45)  # the same reading again: no second Event
    assert c.status["autoscaling"]["atMaxReplicas"] is True
    scaled = [e for e in c.events if e[1] == "Autoscaled"]
    assert len(scaled) == 1 and "wants 4 replicas (has 2): schedulerBusy at 1.5" in scaled[0][2], scaled
    c.kube.hpas[("ns", "svc")] = _hpa(4, 4, (0.9, 0.85), (0.2, 0.85))  # it got them: no new decision
    c.run(T0 + 60)
    assert len([e for e in c.events if e[1] == "Autoscaled"]) == 1
    _, facts = metrics.STATE.snapshot()
    f = facts[("ns", "svc")]
    assert f.autoscaling == (4.0, 4.0, 1.0) and f.autoscaling_ratio["schedulerBusy"] == pytest.approx(0.9 / 0.85)
