"""The shipped cadence, and the monitoring proof on the configuration the real Prometheus Operator generates.

Three services side by side at the shipped cadence (SHIPPED: the PodMonitor's 15 s scrape, the default
5 s window every 15 s; FAST and TTFT sample at 250 Hz instead of 1000), under one operator:
- NAME: the IPC cache is turned off on a canary, which runs process_input_requests slower and is rolled back;
- FAST: the change the operator exists to ship, the cache turned on over a cache-off stable revision: the loop
  is faster and every other stage's share grows with its time unchanged (a share-based gate held such
  canaries back or rolled them back); promoted;
- TTFT: a front-end delay before the first token (the stand-in's --standin-ttft-delay-ms) multiplies TTFT and
  leaves the scheduler loop alone: only the request signal, read per window from SGLang's own histogram,
  catches it; rolled back with TTFTRegressed.
Prometheus runs on what the Prometheus Operator generated from the operator's PodMonitor and
PrometheusRule and the chart's ServiceMonitor and PrometheusRule (tests/e2e/conftest.py), as generated: it is
the Prometheus built with kubernetes_sd (marker native_sd), which finds the pods, the operator and
Alertmanager through the testbed's API server. Then:

(a) every Grafana dashboard panel's PromQL (dashboards/vlm-operator.json, variables substituted as Grafana
    does, testing/vlm_testing/dashboard.py) returns data from that Prometheus, for NAME (sampling errors: for STALE);
    the front-end targets, which need pods running SGLang's front end, are test_frontend.py's;
(b) the shipped alerts the scenario produces fire and reach Alertmanager (found through the generated
    alerting config) with the labels their routing needs: VLMCanaryRolledBack (namespace, vlmservice,
    revision, signal, function; its shipped `for: 0m`, severity warning), VLMSchedulerLoopLatencyRegression (the cache-off
    canary), VLMIPCCacheInactive (FAST's cache-off stable revision), VLMOperatorReconcileErrors (a
    ValidatingAdmissionPolicy refusing every Deployment of a fourth service, BLOCKED, so about a fifth of all
    reconciles fail; the service itself says Degraded=True/ApplyRefused), VLMProfilerStale (a fifth service,
    STALE, whose server titles its scheduler as a release renaming it would: its sidecar is up and finds
    nothing to sample), VLMSchedulerHotFunctionShareHigh (a sixth service, HOT, whose scheduler spends half its
    loop in hash_feature, asleep: the stand-in's "sleep" cost model) and VLMOperatorDown (the operator stopped
    at the end). Their shipped `for` (2-15 min) is shortened to 30 s the way a user tunes it (the chart's
    monitoring.customRules and the operator's VLM_ALERT_OVERRIDES, marker alert_for), and the loaded rules
    are checked to carry it; that each fires after its shipped `for` and not on a near miss is promtool's
    proof on the shipped rule files (tests/unit/operator/desired/test_alert_rules.py). None is active where it must
    not be. The others are in ALERTS_NOT_PRODUCED with the reason, and are loaded and evaluated without error
    here;
(c) the gate's Prometheus source reads the same windows, and the same verdict, as its sidecar source.
"""

from __future__ import annotations

import copy
import math
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from vlm_operator.analysis import gate, sources
from vlm_operator.api import units
from vlm_operator.api import v1alpha1 as api
from vlm_operator.desired import alerts
from vlm_operator.desired import builders as B
from vlm_testing import dashboard
from vlm_testing.cluster import wait_for
from vlm_testing.e2e import (
    ALERTMANAGER,
    NAME,
    PROMETHEUS,
    SHIPPED,
    create,
    dump,
    operator_env,
    patch,
    ready,
    start_services,
    verdicts,
)
from vlm_testing.operator_proc import condition, get_vlms

pytestmark = pytest.mark.native_sd  # Prometheus with kubernetes_sd on the generated configuration (conftest)
SCRAPE_S = dashboard.SCRAPE_S
ALERT_FOR = "30s"  # every shipped alert's `for` longer than this, here (see (b))
FAST, TTFT, BLOCKED, STALE, HOT = "qwen-fast", "qwen-ttft", "qwen-blocked", "qwen-stale", "qwen-hot"
# (panel title, refId) -> the service whose data the panel is read for (the dashboard's $vlmservice), where not
# NAME: sampling errors come from STALE's sidecar (no scheduler to sample: kind no_target), none from NAME's.
PANEL_SERVICE = {("Stale profilers / sampling errors", "B"): STALE}
# Alerts this scenario does not produce, and why. Each is still checked here as loaded from the generated rule
# files and evaluated without error; that it fires on its condition (and not on a near miss) with its labels is
# proven by `promtool test rules` on the shipped rule files (tests/unit/operator/desired/test_alert_rules.py, cases in
# tests/promtool/<topic>.yaml).
ALERTS_NOT_PRODUCED = {
    "VLMServiceNotServing": "needs pods that cannot serve for 10 minutes (image pull, crash loop, refused by "
                            "admission; the failure reasons themselves: tests/integration/test_failures.py); "
                            "promtool: failures",
    "VLMCanaryRollbackFailed": "needs a rolled-back service whose stable pods then fail (crash loop, image pull) "
                               "for 5 minutes; promtool: canary",
    "VLMIPCCacheNotObserved": "needs pods told to cache that re-open CUDA IPC handles (the stand-in's front end: "
                              "fires and reaches Alertmanager in test_frontend.py; promtool: ipc-cache)",
    "VLMFrontendSaturated": "needs a front end busy >= 90% while the scheduler idles (fires and reaches "
                            "Alertmanager for such a pod in test_frontend.py; promtool: frontend)",
    "VLMProfilerDisagreesWithSGLang": "needs the sidecar and SGLang's stage counters 2 points apart for 15 minutes "
                                      "(the stand-in's counters agree with its profile); promtool: agreement",
    "VLMServiceAutoscalerAtMax": "needs spec.autoscaling with KEDA's HPA at maxReplicas and still saturated for 15 "
                                 "minutes (KEDA runs in tests/e2e/test_autoscaling.py); promtool: autoscaling",
}


def _key(w: gate.Window) -> tuple[str, int, float]:
    return w.pod, w.tp_rank, round(w.end, 3)


def kube_get(kube, namespace):
    return get_vlms(kube, namespace, NAME)


def _split(windows, stable_rev: str, canary_rev: str, fresh: set[str], mode: str):
    stable = [w for w in windows if w.revision == stable_rev and w.pod not in fresh]
    can = [w for w in windows if w.revision == canary_rev]
    if mode == "Fresh":
        return [w for w in windows if w.pod in fresh and w.revision == stable_rev], can, stable
    return stable, can, []


@pytest.fixture
def shipped(make_operator, monitoring, podmap):
    return make_operator(**operator_env(monitoring)), monitoring, podmap




def _check_fast_and_ttft(kube, namespace, got: dict[str, dict]) -> None:
    r = got[FAST]
    assert r["phase"] == "Promoted", dump(r)
    # the shipped default: compared with the stable pods, the canary pod on its stable pod's node (a free GPU
    # there: a surge, the stable pod kept through the step)
    assert r.get("baseline") == "Stable" and r["pairs"][0]["kind"] == "Surge" and r["pairs"][0]["replaced"], dump(r)
    loop = next(s for s in r["signals"] if s["name"] == "loop_latency")
    assert loop["delta"] < 0, dump(r)  # it really was faster
    r = got[TTFT]
    assert (r["phase"], r["reason"]) == ("RolledBack", "TTFTRegressed"), dump(r)
    loop = next(s for s in r["signals"] if s["name"] == "loop_latency")
    assert abs(loop["delta"]) < 0.25, dump(r)  # the loop did not regress beyond its margin


@pytest.mark.timeout(1200)  # ~6-8 min on a quiet host; NAME's verdict alone can take its maxDuration (6 min)
@pytest.mark.alert_for(ALERT_FOR)
def test_shipped_cadence_verdicts_dashboard_alerts_and_gate_sources(kube, namespace, shipped):
    op, mon, pm = shipped
    t_begin = time.time()
    ext = {"prometheus": f"{namespace}/{PROMETHEUS}"}  # the generated config's external label

    def firing(name: str, service: str | None = NAME, **labels: str) -> list[dict]:
        """The alerts `name` in Alertmanager: of `service` in this namespace (None: the operator's own, which carry
        neither label), with `labels`."""
        scope = {"namespace": namespace, "vlmservice": service} if service else {}
        return [a for a in mon.alerts() if a["labels"].get("alertname") == name
                and all(a["labels"].get(k) == v for k, v in {**scope, **labels}.items())]

    def reaches_alertmanager(name: str, service: str | None, **labels: str) -> list[dict]:
        """Wait for `name` to fire and reach Alertmanager (its `for` of ALERT_FOR, one or two rule evaluations)."""
        return wait_for(lambda: firing(name, service, **labels), 180, f"{name} of {service} in Alertmanager",
                        interval=3.0, ignore=(OSError,))
    # FAST and TTFT keep the shipped window cadence (5 s every 15 s) and scrape, at a quarter of the default
    # sampling rate: nine sampled pods at 1000 Hz would starve this 2-core machine. NAME runs at the defaults.
    quarter = {**copy.deepcopy(SHIPPED), "telemetry": {"rate": 250}}
    fast = copy.deepcopy(quarter)
    fast["sglang"]["ipcCache"] = {"mode": "Off"}
    # An admission policy (as Kyverno or Gatekeeper would) refuses every Deployment of BLOCKED, a service
    # without replicas: each of its reconciles fails (403 on the apply, every resync), about a fifth of all.
    _forbid_deployments(kube, namespace, BLOCKED)
    create(kube, namespace, {**{k: v for k, v in copy.deepcopy(SHIPPED).items() if k != "rollout"}, "replicas": 0},
           name=BLOCKED)
    # STALE's server titles its scheduler as a (hypothetical) release renaming it would: its sidecar, matching
    # SGLang's titles, is up but finds nothing to sample. No requests, no rollout, and its idle loop naps 50 ms an
    # iteration, not 1: it costs this host little (at 1 ms, a fifth of a core for the whole test, 2026-12-08).
    stale = {**{k: v for k, v in copy.deepcopy(SHIPPED).items() if k != "rollout"},
             "sglang": {**SHIPPED["sglang"], "args": ["--standin-scheduler-title", "sglang::sched_v2",
                                                      "--standin-request-rate", "0", "--standin-idle-ms", "50"]}}
    # HOT's scheduler spends about half its loop in hash_feature, asleep (the stand-in's "sleep" cost model: the
    # stack a sampler sees is the same, the host pays no busy wait). No rollout.
    hot = {**{k: v for k, v in copy.deepcopy(quarter).items() if k != "rollout"},
           "sglang": {**SHIPPED["sglang"], "args": ["--standin-cost-model", "sleep", "--standin-hash-feature-ms", "6",
                                                    "--standin-request-rate", "10"]}}
    start_services(kube, namespace, op, pm, {NAME: SHIPPED, FAST: fast, TTFT: quarter, STALE: stale, HOT: hot},
                   settle_s=0)
    # The PodMonitor's jobs (SGLang's port and the sidecar's) are in the generated config and scraped.
    # (job is "<namespace>/<PodMonitor>", the Operator's relabeling; the scrape pool is the job_name)
    wait_for(lambda: len(mon.query(f'up{{job="{namespace}/{NAME}",serving_vlmops_dev_vlmservice="{NAME}"}} == 1'))
             >= 2, 120, "the PodMonitor's targets scraped on the generated config", interval=2.0, ignore=(OSError,))
    wait_for(lambda: mon.query('up{job="vlm-operator"} == 1'), 120,
             "the operator scraped through the chart's ServiceMonitor", interval=2.0, ignore=(OSError,))
    # The generated rule files carry the overrides: the chart's (the operator's own alerts) and the operator's.
    want_groups = {f"vlm-operator-{n}" for n in (NAME, FAST, TTFT, STALE, HOT)} | {"vlm-operator-self"}
    groups_now = wait_for(lambda: (g := mon.api("rules")["groups"]) and want_groups <= {x["name"] for x in g} and g,
                          120, "every service's rule group loaded", interval=3.0, ignore=(OSError,))
    durations = {name: {r["duration"] for g in groups_now for r in g["rules"] if r["name"] == name}
                 for name in mon.alert_overrides}
    assert durations == {name: {30} for name in mon.alert_overrides} and len(durations) >= 8, durations
    # FAST's stable revision runs without the IPC cache: VLMIPCCacheInactive fires for it and reaches
    # Alertmanager with the labels its routing needs, on the generated config.
    inactive = reaches_alertmanager("VLMIPCCacheInactive", FAST)
    assert {k: inactive[0]["labels"].get(k) for k in ("severity", *ext)} == {"severity": "info", **ext}, inactive
    assert not _rule_alerts(mon, "VLMIPCCacheInactive", NAME)
    # STALE's sidecar exports vlm_profiler_stale 1 from its first window: VLMProfilerStale fires for that pod and
    # reaches Alertmanager with its routing labels; it is active for no sampled pod once that pod samples.
    stale_pod = _pods(kube, namespace, STALE)[0]
    stale_alerts = reaches_alertmanager("VLMProfilerStale", STALE)
    assert [{k: a["labels"].get(k) for k in ("pod", "severity")} for a in stale_alerts] \
        == [{"pod": stale_pod, "severity": "warning"}], stale_alerts
    # A sidecar is stale until its first window too: NAME's pods' condition clears once they sample; STALE's stays.
    wait_for(lambda: not _rule_alerts(mon, "VLMProfilerStale", NAME), 120,
             "no VLMProfilerStale for the pods whose scheduler is sampled", interval=3.0, ignore=(OSError,))
    assert _rule_alerts(mon, "VLMProfilerStale", STALE)
    # HOT's watched hash_feature holds > 25% of its scheduler's samples: VLMSchedulerHotFunctionShareHigh fires
    # for that pod and function and reaches Alertmanager (so may its caller process_input_requests, also
    # watched, whose inclusive share holds it); it is active for no other service.
    hot_pod = _pods(kube, namespace, HOT)[0]
    reaches_alertmanager("VLMSchedulerHotFunctionShareHigh", HOT, function="hash_feature")
    labels = sorted(({k: a["labels"].get(k) for k in ("pod", "function", "severity")}
                     for a in firing("VLMSchedulerHotFunctionShareHigh", HOT)), key=lambda d: d["function"])
    assert labels[0] == {"pod": hot_pod, "function": "hash_feature", "severity": "warning"}, labels
    assert labels[1:] in ([], [{**labels[0], "function": "process_input_requests"}]), labels
    assert not _rule_alerts(mon, "VLMSchedulerHotFunctionShareHigh", NAME)
    time.sleep(10)
    patch(kube, namespace, {"sglang": {"ipcCache": {"mode": "Off"}}})
    patch(kube, namespace, {"sglang": {"ipcCache": {"mode": "Auto"}}}, name=FAST)
    # 1.5 s more to the first token: several times TTFT even when a loaded CI host stretches the queueing (a
    # 400 ms delay, +86% over a 1 s TTFT there, stayed inside noisy bounds until maxDuration).
    patch(kube, namespace, {"sglang": {"args": ["--standin-ttft-delay-ms", "1500"]}}, name=TTFT)

    # Until the verdict: read the sidecars as the gate's sidecar source does, keeping every window seen.
    reader = sources.SidecarReader()
    seen: dict[tuple, gate.Window] = {}
    roles: dict[str, str] = {}
    r: dict = {}
    deadline = time.time() + 420
    while time.time() < deadline:
        r = (kube_get(kube, namespace).get("status") or {}).get("rollout") or {}
        if r.get("phase") in ("RolledBack", "Promoted"):
            break
        started = units.parse_time(r.get("analysisStartedAt"))
        with pm._lock:
            mine = [m for m in pm.mapped.values() if m.pod.startswith(f"{NAME}-")]
            mapped = [(m.pod, m.revision, m.ip) for m in mine]
            roles.update({m.pod: m.role for m in mine})
        if started and mapped:
            try:
                for w in reader.read(mapped, started, interval=15.0):
                    seen[_key(w)] = w
            except sources.SignalsUnavailable:
                pass
        time.sleep(3)
    t_verdict = time.time()
    assert r.get("phase") == "RolledBack", dump(r) + "\n" + op.log_tail(40)
    _check_fast_and_ttft(kube, namespace, verdicts(kube, namespace, [FAST, TTFT], 480, op))
    vlms_status = kube_get(kube, namespace)["status"]
    stable_rev, canary_rev = vlms_status["stableRevision"], r["revision"]
    started = units.parse_time(r["analysisStartedAt"])
    # The step's clock as the operator recorded it (the canary's first window after Ready), so both sources are
    # judged on the operator's clock, not each on the first canary window it happens to hold.
    # Rolled back on evidence, so a canary window was seen: the clock is set, a window or a few after Ready.
    assert r.get("dataStartedAt"), dump(r)
    clock = units.parse_time(r["dataStartedAt"])
    assert started <= clock <= started + 90, (r["analysisStartedAt"], r["dataStartedAt"])
    function = r.get("regressedFunction")

    # (c) The Prometheus source on the same span: the same windows, the same numbers, the same verdict.
    from_prom = sources.from_prometheus(mon.prometheus_url, namespace, NAME, [stable_rev, canary_rev],
                                        since=started, now=t_verdict, step=5.0)
    prom = {_key(w): w for w in from_prom}
    side = {k: w for k, w in seen.items() if w.end >= started and w.revision in (stable_rev, canary_rev)}
    both = sorted(set(prom) & set(side))
    # Windows Prometheus must have scraped: usable ones (stale windows are not exported) ended at least
    # two scrapes before the verdict.
    due = {k for k, w in side.items() if not w.stale and w.end <= t_verdict - 2 * SCRAPE_S}
    print(f"windows: sidecars {len(side)} (due {len(due)}), prometheus {len(prom)}, both {len(both)}")
    # The sidecar is scraped twice per window (the PodMonitor's 7.5 s against 15 s windows): Prometheus misses
    # none, where a scrape at the windows' own cadence missed up to a quarter (0.75 was this test's bound then).
    assert len(due & set(prom)) >= 0.95 * len(due) and len(both) >= 2 * SHIPPED["rollout"]["analysis"]["minSamples"], (
        f"Prometheus saw {len(due & set(prom))} of the sidecars' {len(due)} due windows; only in Prometheus: "
        f"{sorted(set(prom) - set(side))[:5]}, only in the sidecars: {sorted(due - set(prom))[:5]}")
    for k in both:
        p, s = prom[k], side[k]
        assert p.revision == s.revision, k
        assert math.isclose(p.loop_mean_seconds or 0, s.loop_mean_seconds or 0, rel_tol=1e-6), (k, p, s)
        # SGLang's request rate (the front-end gate's scale) reaches Prometheus under the name the source reads.
        assert (p.request_rate is None) == (s.request_rate is None), (k, p.request_rate, s.request_rate)
        assert math.isclose(p.request_rate or 0, s.request_rate or 0, rel_tol=1e-6), (k, p, s)
        for stage, v in s.stage_shares.items():
            assert math.isclose(p.stage_shares.get(stage, -1), v, rel_tol=1e-6, abs_tol=1e-9), (k, stage)
    assert any((side[k].request_rate or 0) > 0 for k in both), "no shared window carried SGLang's request rate"
    policy = gate.GatePolicy.from_spec(api.parse_spec(kube_get(kube, namespace)["spec"]))
    step_s = 90.0
    fresh = {p for p, role in roles.items() if role == B.ROLE_BASELINE}

    def decide(ws):
        base, can, ref = _split(ws, stable_rev, canary_rev, fresh, r.get("baseline", ""))
        return gate.decide(base, can, policy, started_at=started, now=t_verdict, step_duration_s=step_s,
                           spread_reference=ref, data_started_at=clock)

    # On the windows both read: the same decision, signal by signal.
    vp, vs = decide([prom[k] for k in both]), decide([side[k] for k in both])
    print(f"verdicts on {len(both)} shared windows: prometheus {vp.verdict}/{vp.reason}/{vp.regressed_function}, "
          f"sidecars {vs.verdict}/{vs.reason}/{vs.regressed_function}; operator {r.get('reason')}/{function}")
    assert (vp.verdict, vp.reason) == (vs.verdict, vs.reason), (vp, vs)
    assert [(s.name, s.verdict) for s in vp.signals] == [(s.name, s.verdict) for s in vs.signals], (vp, vs)
    # Each source on its own (what the gate would read with analysis.source Prometheus or Sidecars).
    # Only windows that had ended at the verdict: the sidecars are read on after it, and windows of the stable
    # revision from after the rollback are not what the gate had (one CI run decided Continue on them).
    full_p, full_s = (decide([w for w in src.values() if w.end <= t_verdict]) for src in (prom, side))
    print(f"verdicts on each source's own windows: prometheus {full_p.verdict}/{full_p.reason}, "
          f"sidecars {full_s.verdict}/{full_s.reason}")
    # The two sources agree on their own windows as on the shared ones. Re-deciding here is not the operator's
    # look: it sees every window that had ended by the verdict, more than the operator had read by then (the
    # sidecars are read on after it), and one more window can move a borderline look from Rollback to Continue
    # (a CI run on a loaded host: the operator rolled back for StageTimeRegressed, the re-decision on 61
    # windows said Continue, loop +24%). Nor do the two sources' own window sets match (Prometheus may miss a
    # quarter of them, asserted above): one CI run read Rollback/TTFTRegressed on Prometheus' and Continue on
    # the sidecars'. Their agreement is asserted on the shared windows above, and what the operator did; here:
    # never a promotion from either, and both sources see the canary's loop slower.
    assert {full_p.verdict, full_s.verdict} <= {"Rollback", "Continue"}, (full_p, full_s, vp, dump(r))
    for d in (full_p, full_s, vp):
        loop = next(x for x in d.signals if x.name == "loop_latency")
        assert loop.delta is not None and loop.delta > 0, (d, dump(r))

    # (b) The alerts, from the generated rule files, in Alertmanager with their labels.
    rb = wait_for(lambda: firing("VLMCanaryRolledBack"), 120, "VLMCanaryRolledBack in Alertmanager", interval=3.0)
    labels = rb[0]["labels"]
    assert {k: labels.get(k) for k in ("vlmservice", "revision", "severity", *ext)} == {
        "vlmservice": NAME, "revision": canary_rev, "severity": "warning", **ext}, labels
    assert labels["function"] not in ("", "unknown") and labels["function"] == (function or labels["function"]), labels
    assert labels["signal"] not in ("", "unknown"), labels
    # The loop-latency regression alert: the gate's delta stays exported after the verdict; the alert fires and
    # reaches Alertmanager with the labels its routing needs.
    loop = next(s for s in r["signals"] if s["name"] == "loop_latency")
    assert loop["delta"] > 0.05, dump(r)

    def active(rule_name: str, service: str) -> list[dict]:
        return _rule_alerts(mon, rule_name, service)

    ll = reaches_alertmanager("VLMSchedulerLoopLatencyRegression", NAME)
    assert {k: ll[0]["labels"].get(k) for k in ("severity", *ext)} == {"severity": "warning", **ext}, ll

    # Every shipped rule is loaded from the generated rule files and evaluates without error.
    groups = {g["name"]: g for g in mon.api("rules")["groups"]}
    # (BLOCKED's rule group is never made: its reconcile stops at the refused Deployment.)
    assert set(groups) == {f"vlm-operator-{n}" for n in (NAME, FAST, TTFT, STALE, HOT)} | {"vlm-operator-self"}, \
        sorted(groups)
    loaded = {rule["name"]: rule for g in groups.values() for rule in g["rules"]}
    # TTFT's rollback raises its own VLMCanaryRolledBack; the faster canary raises no regression alert.
    wait_for(lambda: firing("VLMCanaryRolledBack", TTFT), 120, "TTFT's VLMCanaryRolledBack", interval=3.0)
    assert not active("VLMSchedulerLoopLatencyRegression", FAST) and not active("VLMCanaryRolledBack", FAST)
    # Both rollbacks left a serving stable revision: no page.
    assert not active("VLMCanaryRollbackFailed", NAME) and not active("VLMCanaryRollbackFailed", TTFT)
    shipped_alerts = {a["alert"] for a in (*alerts.rules(), *alerts.self_rules())}
    produced = {"VLMCanaryRolledBack", "VLMSchedulerLoopLatencyRegression", "VLMIPCCacheInactive", "VLMOperatorDown",
                "VLMOperatorReconcileErrors", "VLMProfilerStale", "VLMSchedulerHotFunctionShareHigh"}
    assert set(loaded) == shipped_alerts, sorted(loaded)
    assert shipped_alerts - produced <= set(ALERTS_NOT_PRODUCED), "say why these are not produced: " + str(
        sorted(shipped_alerts - produced - set(ALERTS_NOT_PRODUCED)))
    every = [rule for g in groups.values() for rule in g["rules"]]
    assert all(rule["health"] == "ok" for rule in every), [
        (rule["name"], rule.get("lastError")) for rule in every if rule["health"] != "ok"]
    assert loaded["VLMOperatorDown"]["state"] == "inactive"

    # (a) Every dashboard panel's query returns data over the scenario (as Grafana would draw it).
    # vlm_operator_rollouts_total{result} exists at 0 from the operator's start, so increase() counts
    # this process's first verdict too (a counter born at 1 would be invisible to it).
    wait_for(lambda: mon.query('increase(vlm_operator_rollouts_total{result="rolled_back"}[5m]) > 0'), 90,
             "the rollback counted by increase(vlm_operator_rollouts_total)", interval=3.0, ignore=(OSError,))
    now = time.time()
    dash = dashboard.load()
    for var in dash["templating"]["list"]:
        if var["type"] == "query":  # label_values(metric{...}, label): the metric must have the label here
            q = var["query"]["query"]
            metric_sel, label = q[len("label_values("):-1].rsplit(",", 1)
            got = mon.query(dashboard.expr(metric_sel, namespace, NAME, 0))
            assert any(s["metric"].get(label.strip()) for s in got), (var["name"], q)
    # Every target but the front end's (test_frontend.py: these pods run none) and autoscaling's (no KEDA here:
    # tests/e2e/test_autoscaling.py) returns data, none excepted.
    elsewhere = dashboard.FRONTEND_TARGETS | dashboard.AUTOSCALING_TARGETS
    mine = [(title, t) for title, t in dashboard.targets(dash) if (title, t["refId"]) not in elsewhere]
    assert len(mine) >= 17 and {(title, t["refId"]) for title, t in dashboard.targets(dash)} >= elsewhere
    empty = [(title, t["refId"], t["expr"]) for title, t in mine
             if not dashboard.has_data(mon, t, namespace, PANEL_SERVICE.get((title, t["refId"]), NAME), t_begin, now)]
    assert not empty, "dashboard queries without data on the generated config:\n" + "\n".join(map(str, empty))

    # BLOCKED's refused reconciles, all along: VLMOperatorReconcileErrors fires and reaches Alertmanager (the
    # operator's own alert: the job, no service), the refusals counted by reason. Then the policy goes.
    try:
        errs = reaches_alertmanager("VLMOperatorReconcileErrors", None, job="vlm-operator")
        assert {k: errs[0]["labels"].get(k) for k in ("severity", *ext)} == {"severity": "warning", **ext}, errs
        assert mon.query('vlm_operator_errors_total{reason="Http403"} > 0'), "the refusals counted by reason"
        # and the service itself says so (replicas 0, so Ready stays True; Degraded names the refusal)
        degraded = condition(get_vlms(kube, namespace, BLOCKED), "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "ApplyRefused"), degraded
        assert "403" in degraded["message"], degraded
    finally:
        _forbid_deployments(kube, namespace, None)

    # Last: the operator stops. Its ServiceMonitor target goes down at the next scrape and VLMOperatorDown fires
    # and reaches Alertmanager, from the chart's generated rule file. (absent() of a comparison carries no label
    # of the selector: the alert has the rule's own labels and the external one.)
    assert not firing("VLMOperatorDown", None)
    op.stop()
    try:
        down = reaches_alertmanager("VLMOperatorDown", None)
    except AssertionError as e:
        # Once seen late in a cold CI run (not reproduced): say what Prometheus saw of the stopped operator, so a
        # recurrence names its cause (a target still up, the rule pending, or the alert not sent).
        seen = {}
        for what, q in (("up", 'up{job="vlm-operator"}'), ("rule", 'ALERTS{alertname="VLMOperatorDown"}')):
            try:
                seen[what] = [(r["metric"], r["value"]) for r in mon.query(q)]
            except OSError as err:
                seen[what] = repr(err)
        try:
            seen["targets"] = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in mon.api("targets")["activeTargets"]
                               if t["labels"].get("job") == "vlm-operator"]
        except (OSError, KeyError) as err:
            seen["targets"] = repr(err)
        try:  # the Alertmanager Prometheus sends to, found through its Service's Endpoints (a kwok pod's IP)
            seen["alertmanagers"] = mon.api("alertmanagers")
        except (OSError, KeyError) as err:
            seen["alertmanagers"] = repr(err)
        try:  # and that pod and Endpoints as the API server has them (a pod gone with its node empties them)
            core = client.CoreV1Api(kube)
            pods = core.list_namespaced_pod(namespace, label_selector=f"alertmanager={ALERTMANAGER}").items
            seen["alertmanager pods"] = [(p.metadata.name, p.spec.node_name, p.status.phase, p.status.pod_ip,
                                          p.metadata.deletion_timestamp) for p in pods]
            seen["alertmanager endpoints"] = core.read_namespaced_endpoints(ALERTMANAGER, namespace).to_dict()["subsets"]
        except ApiException as err:
            seen["alertmanager pods"] = repr(err)
        raise AssertionError(f"{e}; Prometheus saw: {seen}") from e
    assert [{k: a["labels"].get(k) for k in ("severity", "component", *ext)} for a in down] == [
        {"severity": "critical", "component": "vlm-operator", **ext}], down




def _forbid_deployments(kube, namespace: str, service: str | None) -> None:
    """A ValidatingAdmissionPolicy refusing (403) every write of `service`'s Deployments in `namespace`;
    service None deletes it."""
    adm = client.AdmissionregistrationV1Api(kube)
    policy = f"vlm-e2e-{namespace}"  # cluster-scoped: one per test namespace, bound to that namespace only
    for delete in (adm.delete_validating_admission_policy_binding, adm.delete_validating_admission_policy):
        try:
            delete(policy)
        except client.exceptions.ApiException as e:
            if e.status != 404:
                raise
    if service is None:
        return
    adm.create_validating_admission_policy({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                                                         "operations": ["CREATE", "UPDATE"],
                                                         "resources": ["deployments"]}]},
                 "validations": [{"expression": f"!has(object.metadata.labels) || !('{B.LABEL_SERVICE}' in "
                                                f"object.metadata.labels) || object.metadata.labels['{B.LABEL_SERVICE}']"
                                                f" != '{service}'",
                                  "reason": "Forbidden", "message": f"{service}'s Deployments are frozen"}]}})
    adm.create_validating_admission_policy_binding({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy},
        "spec": {"policyName": policy, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}}})
    # The API server takes a policy up a moment after it is made: wait until a dry-run create is refused.
    apps = client.AppsV1Api(kube)
    labels = {B.LABEL_SERVICE: service}
    probe = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"{service}-probe", "labels": labels},
             "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
                 "containers": [{"name": "probe", "image": "probe"}]}}}}

    def refused() -> bool:
        try:
            apps.create_namespaced_deployment(namespace, probe, dry_run="All")
        except client.exceptions.ApiException as e:
            return e.status == 403
        return False

    wait_for(refused, 30, f"the admission policy refusing {service}'s Deployments", interval=0.5)


def _pods(kube, namespace: str, service: str) -> list[str]:
    """The names of a service's pods."""
    return [p.metadata.name for p in client.CoreV1Api(kube).list_namespaced_pod(
        namespace, label_selector=f"{B.LABEL_SERVICE}={service}").items]


def _rule_alerts(mon, rule_name: str, service: str | None) -> list[dict]:
    """The pending or firing alerts of one loaded rule: of the service's generated group, or with service None
    of the operator's own group."""
    groups = {g["name"]: g for g in mon.api("rules")["groups"]}
    group = groups[f"vlm-operator-{service}" if service else "vlm-operator-self"]
    rule = next(x for x in group["rules"] if x["name"] == rule_name)
    return [a for a in rule.get("alerts", []) if a["state"] in ("pending", "firing")]


def test_pods_are_discovered_as_they_come_and_go(kube, namespace, shipped):
    """The emulated kubernetes_sd follows pods: a scaled-up replica becomes a target, and a deleted one
    leaves; the labels are what the generated relabelings make of the pod's meta labels."""
    op, mon, _ = shipped
    create(kube, namespace, copy.deepcopy(SHIPPED))
    ready(kube, namespace, op)

    def targets():
        active = mon.api("targets?state=active")["activeTargets"]
        return {(t["labels"].get("pod"), t["labels"].get("container")) for t in active
                if t["scrapePool"].startswith("podMonitor/")}

    pods = lambda: _pods(kube, namespace, NAME)  # noqa: E731
    wait_for(lambda: len(targets()) == 2 * len(pods()) == 2, 60, "one pod's two targets", interval=1.0)
    patch(kube, namespace, {"replicas": 2})
    wait_for(lambda: len(pods()) == 2 and len(targets()) == 4, 60, "two pods' four targets", interval=1.0)
    patch(kube, namespace, {"replicas": 1})
    wait_for(lambda: len(pods()) == 1 and {p for p, _ in targets()} == set(pods()), 90, "back to one pod",
             interval=1.0)
    active = mon.api("targets?state=active")["activeTargets"]
    t = next(t for t in active if t["scrapePool"].startswith("podMonitor/"))
    assert t["labels"]["namespace"] == namespace and t["labels"]["serving_vlmops_dev_vlmservice"] == NAME, t
    assert t["labels"]["serving_vlmops_dev_role"] == B.ROLE_STABLE, t
