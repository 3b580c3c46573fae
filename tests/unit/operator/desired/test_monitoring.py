"""Monitoring objects and the operator's metrics (issue 13): honorLabels and extra labels on the PodMonitor,
VLM_MONITORING_LABELS, and the per-service metrics as a scrape-time collector over the operator's state."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vlm_operator.api import metrics
from vlm_operator.api.settings import Settings, SettingsError
from vlm_operator.desired import builders

OWNER = builders.Owner("qwen", "ml", "uid-1")


def test_pod_monitor_honours_the_sidecars_labels_on_both_endpoints():
    pm = builders.build_pod_monitor(OWNER)
    eps = pm["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in eps] == ["http", "profiler"]
    assert all(e["honorLabels"] is True and e["path"] == "/metrics" for e in eps)
    assert [e["interval"] for e in eps] == ["15s", "7500ms"]  # the defaults: the telemetry interval's 15 s
    assert pm["metadata"]["labels"] == builders.common_labels(OWNER)


def test_pod_monitor_extra_labels_never_replace_the_operators():
    pm = builders.build_pod_monitor(OWNER, {"release": "kube-prometheus-stack", "app.kubernetes.io/name": "x"})
    labels = pm["metadata"]["labels"]
    assert labels["release"] == "kube-prometheus-stack"
    assert {k: labels[k] for k in builders.common_labels(OWNER)} == builders.common_labels(OWNER)
    assert pm["metadata"]["ownerReferences"] == [OWNER.reference()]


def test_monitoring_labels_setting():
    assert Settings().monitoring_labels == {}
    s = Settings.from_env({"VLM_MONITORING_LABELS": '{"release": "kube-prometheus-stack", "team": "ml"}'})
    assert s.monitoring_labels == {"release": "kube-prometheus-stack", "team": "ml"}


@pytest.mark.parametrize("value, message", [
    ("[1]", "must be a JSON object"),
    ('{"release": 1}', "must be a JSON object"),
    ("{", "not JSON"),
    ('{"bad key": "x"}', "not a valid label"),
    ('{"ok": "not ok!"}', "not a valid label"),
    ('{"app.kubernetes.io/managed-by": "me"}', "reserved"),
    ('{"serving.vlmops.dev/vlmservice": "x"}', "reserved"),
])
def test_bad_monitoring_labels_name_the_variable(value, message):
    with pytest.raises(SettingsError, match=rf"VLM_MONITORING_LABELS: .*{message}"):
        Settings.from_env({"VLM_MONITORING_LABELS": value})


def _scrape(state: metrics.State) -> dict[str, list]:
    reg = CollectorRegistry()
    reg.register(metrics.StateCollector(state))
    return {f.name: f.samples for f in text_string_to_metric_families(generate_latest(reg).decode())}


def test_state_collector_yields_the_services_facts_at_scrape_time():
    state = metrics.State()
    fams = _scrape(state)
    assert [s.value for s in fams["vlm_operator_managed_services"]] == [0.0]
    assert not fams["vlm_operator_rollout_phase"] and not fams["vlm_operator_signal_delta"]

    state.managed = 2
    state.update("ml", "qwen", phase="Analysing", ipc_cache_active=1.0, rollback=("r2", "loop_latency", "hash_feature"))
    state.set_signal_delta("ml", "qwen", "loop_latency", 0.07)
    fams = _scrape(state)
    assert [s.value for s in fams["vlm_operator_managed_services"]] == [2.0]
    phases = {s.labels["phase"]: s.value for s in fams["vlm_operator_rollout_phase"]}
    assert phases == {p: (1.0 if p == "Analysing" else 0.0) for p in metrics.PHASES}
    assert [(s.labels, s.value) for s in fams["vlm_operator_signal_delta"]] == [
        ({"namespace": "ml", "vlmservice": "qwen", "signal": "loop_latency"}, 0.07)]
    (info,) = fams["vlm_operator_canary_rollback_info"]
    assert info.labels == {"namespace": "ml", "vlmservice": "qwen", "revision": "r2", "signal": "loop_latency",
                           "function": "hash_feature"}

    state.forget("ml", "qwen")
    fams = _scrape(state)
    assert not any(fams[n] for n in ("vlm_operator_rollout_phase", "vlm_operator_signal_delta",
                                     "vlm_operator_ipc_cache_active", "vlm_operator_canary_rollback_info"))


def test_the_reconcile_loops_api_writes_into_the_state():
    """reconcile.py and handlers.py keep calling the shapes of the gauges the collector replaced."""
    metrics.SIGNAL_DELTA.labels("t-ns", "svc", "ttft").set(0.5)
    metrics.IPC_ACTIVE.labels("t-ns", "svc").set(0.0)
    metrics.set_phase("t-ns", "svc", "RolledBack")
    metrics.set_rollback("t-ns", "svc", "r9", None, None)
    metrics.MANAGED.set(3)
    managed, services = metrics.STATE.snapshot()
    f = services[("t-ns", "svc")]
    assert (managed, f.phase, f.signal_delta, f.ipc_cache_active, f.rollback) == (
        3.0, "RolledBack", {"ttft": 0.5}, 0.0, ("r9", "unknown", "unknown"))
    metrics.set_rollback("t-ns", "svc", None, None, None)
    assert metrics.STATE.snapshot()[1][("t-ns", "svc")].rollback is None
    text = generate_latest().decode()  # the default registry the operator serves
    assert 'vlm_operator_signal_delta{namespace="t-ns",signal="ttft",vlmservice="svc"} 0.5' in text
    metrics.forget("t-ns", "svc")
    assert 'namespace="t-ns"' not in generate_latest().decode()  # other tests' services may remain


def test_pod_monitor_scrapes_the_sidecar_twice_per_window():
    """SGLang every 15 s (or every telemetry interval when shorter); the sidecar, whose per-window gauges each
    hold one window for one interval, twice as often, so no window falls between two scrapes."""
    assert builders.pod_monitor_intervals("4s") == ("4s", "2s")
    assert builders.pod_monitor_intervals("15s") == ("15s", "7500ms")
    assert builders.pod_monitor_intervals("1m") == ("15s", "7500ms")
    assert builders.pod_monitor_intervals("1s") == ("1s", "1s")
    pm = builders.build_pod_monitor(OWNER, None, "4s")
    assert {e["port"]: e["interval"] for e in pm["spec"]["podMetricsEndpoints"]} == {"http": "4s", "profiler": "2s"}


def test_alert_overrides_setting():
    assert Settings().alert_overrides == {}
    s = Settings.from_env({"VLM_ALERT_OVERRIDES": '{"VLMOperatorDown": {"for": "10m", "severity": "page"}}'})
    assert s.alert_overrides == {"VLMOperatorDown": {"for": "10m", "severity": "page"}}


@pytest.mark.parametrize("value, message", [
    ("[1]", "must be a JSON object of alert names"),
    ('{"VLMOperatorDown": "10m"}', "must be a JSON object of alert names"),
    ('{"VLMOperatorDown": {"for": 10}}', "must be a JSON object of alert names"),
    ("{", "not JSON"),
])
def test_bad_alert_overrides_name_the_variable(value, message):
    with pytest.raises(SettingsError, match=rf"VLM_ALERT_OVERRIDES: .*{message}"):
        Settings.from_env({"VLM_ALERT_OVERRIDES": value})
