"""The SGLang front end and the IPC cache through the operator, end to end: the real control plane, operator,
Prometheus on the configuration the Prometheus Operator generated, real sidecars with py-spy sampling the
scheduler *and* the front end (`telemetry.frontendRoles`), and stand-ins that run SGLang's front end
(testing/vlm_testing/standin/frontend.py: an asyncio HTTP loop that tokenizes, an IO thread pool, a process pool that
resizes and normalizes images, a load generator).

One service, three revisions, each pod's pool with one worker at 5 requests/s of 2 images:
1. stable: image preprocessing of 120 ms per image (the pool needs 1.2 workers: saturated, requests wait
   before they reach the scheduler, which idles) and a pool-handle cache that the operator switched on but that
   never works (`--standin-ipc-cache-broken`: every feature re-opens its CUDA IPC handle, as SGLang's uncached
   retry does). Proven from what the pods do: IPCCacheActive False/NotObserved, one Warning Event, the
   VLMIPCCacheNotObserved and VLMFrontendSaturated alerts firing for this pod and in Alertmanager (their
   shipped `for: 10m` shortened to 30 s as a user tunes it: marker alert_for; that they fire after the shipped
   `for` and not on a near miss is promtool's proof, tests/promtool/*.yaml);
2. canary: preprocessing back at 25 ms per image, the front end 4x less busy, the scheduler loop unchanged:
   promoted (a faster front end never fails the gate);
3. canary: a further 20 ms colour conversion per image (`--standin-image-convert-ms`): the pool 25% -> 45% busy
   while the scheduler loop is unchanged: rolled back for FrontendBusyRegressed, naming `convert_color`, a
   function only the canary's sidecar exports, with VLMCanaryRolledBack in Alertmanager naming it too.

The revisions compare against the stable pods (`rollout.baseline: Stable`), so no second saturated pool
spins beside the first on a two-core machine. The scheduler margins are wide (the scheduler's sensitivity is
test_canary.py's and test_monitoring.py's subject) and so is TTFT's: preprocessing time is in every request's
time to first token, and this test is about the front-end signal that names where it went.
"""

from __future__ import annotations

import copy
import time
import urllib.request

import pytest
from kubernetes import client

from vlm_operator.desired import builders as B
from vlm_operator.status import conditions as C
from vlm_testing import dashboard
from vlm_testing.cluster import wait_for
from vlm_testing.e2e import (
    SPEC,
    dump,
    get_vlms,
    patch,
    rollout,
    start_services,
    verdicts,
    warnings,
)
from vlm_testing.signals import SCHED

FRONT = "qwen-front"
# SCHED: 5 requests/s, 2 images each, 1 pool worker, 25 ms per image. Prefills of 20 ms keep each scheduler
# about 80% idle: the gate counts a window idler than 90% as carrying no traffic.
FRONTEND = ["--standin-frontend", *SCHED, "--standin-prefill-ms", "20"]
SATURATED = ["--standin-image-cost-ms", "120"]
BROKEN_CACHE = ["--standin-ipc-cache-broken"]
SPEC_FRONT = copy.deepcopy(SPEC)
SPEC_FRONT["sglang"]["args"] = [*FRONTEND, *BROKEN_CACHE, *SATURATED]
SPEC_FRONT["telemetry"]["frontendRoles"] = ["mm_processor", "tokenizer_manager"]
SPEC_FRONT["rollout"]["baseline"] = "Stable"
# stageTime 10: the faster front end of step 2 lets 25% more requests through to the scheduler, whose prefills
# then take ~3 points more of each iteration (per request the same; its margin of 4 is then hard to prove).
SPEC_FRONT["rollout"]["analysis"]["maxRegression"].update({"ttft": 100, "throughput": 60, "stageTime": 10})


def _pods(kube, namespace: str, role: str) -> list[str]:
    pods = client.CoreV1Api(kube).list_namespaced_pod(
        namespace, label_selector=f"{B.LABEL_SERVICE}={FRONT},{B.LABEL_ROLE}={role}").items
    return sorted(p.metadata.name for p in pods if p.status.phase == "Running")


def _active(mon, rule_name: str) -> list[dict]:
    """The rule's alerts that are pending or firing, from the rule group the operator's PrometheusRule made."""
    groups = {g["name"]: g for g in mon.api("rules")["groups"]}
    group = groups.get(f"vlm-operator-{FRONT}")
    if group is None:
        return []
    rule = next(x for x in group["rules"] if x["name"] == rule_name)
    return [a for a in rule.get("alerts", []) if a["state"] in ("pending", "firing")]


def _in_alertmanager(mon, namespace: str, name: str) -> list[dict]:
    """The alerts `name` of this service in Alertmanager."""
    return [a for a in mon.alerts() if a["labels"].get("alertname") == name
            and a["labels"].get("namespace") == namespace and a["labels"].get("vlmservice") == FRONT]


def _alert_path(op, mon, namespace: str) -> str:
    """Each hop of VLMCanaryRolledBack's way, for a failure's message: the operator's own series, the scrape
    of it, the series in Prometheus, the rules' alert states, what Prometheus sent and what Alertmanager holds."""
    out = []

    def hop(name, f):
        try:
            out.append(f"{name}: {f()}")
        except Exception as x:  # a diagnostic: every hop is reported, whatever fails
            out.append(f"{name}: failed: {x!r}")
    hop("operator /metrics", lambda: [line for line in op.metrics().splitlines()
                                      if line.startswith("vlm_operator_canary_rollback_info")])
    hop("operator scrape targets", lambda: [
        {k: t.get(k) for k in ("scrapeUrl", "health", "lastError", "lastScrape", "lastScrapeDuration")}
        for t in mon.api("targets")["activeTargets"] if "serviceMonitor" in t.get("scrapePool", "")])
    hop("in Prometheus", lambda: mon.query(f'vlm_operator_canary_rollback_info{{namespace="{namespace}"}}'))
    hop("rules", lambda: [(g["name"], r["name"], r.get("health"), r.get("lastError"), r.get("lastEvaluation"),
                           [a["state"] for a in r.get("alerts", [])])
                          for g in mon.api("rules")["groups"] for r in g["rules"]
                          if r["name"] == "VLMCanaryRolledBack"])
    hop("sent", lambda: [line for line in urllib.request.urlopen(f"{mon.prometheus_url}/metrics", timeout=5)
                         .read().decode().splitlines() if line.startswith("prometheus_notifications_")])
    hop("alertmanagers", lambda: mon.api("alertmanagers"))
    hop("in Alertmanager", lambda: [(a["labels"].get("alertname"), a["labels"].get("vlmservice")) for a in mon.alerts()])
    hop("operator log", lambda: op.log_tail(20))
    return "\n".join(out)


@pytest.mark.alert_for("30s")
def test_front_end_saturation_ipc_cache_not_observed_faster_front_end_promoted_slower_rolled_back(
        kube, namespace, stack):
    op, mon, pm = stack
    t_begin = time.time()
    start_services(kube, namespace, op, pm, {FRONT: SPEC_FRONT})
    [stable_pod] = _pods(kube, namespace, B.ROLE_STABLE)

    # 1. What the pods do, not what they were told: the cache re-opens handles, the front end is saturated.
    def ipc():
        conds = (get_vlms(kube, namespace, FRONT).get("status") or {}).get("conditions", [])
        c = next((x for x in conds if x["type"] == C.IPC_CACHE_ACTIVE), None)
        return c if c and (c["status"], c["reason"]) == ("False", "NotObserved") else None
    cond = wait_for(ipc, 120, "IPCCacheActive False/NotObserved", interval=2.0)
    assert stable_pod in cond["message"], cond
    wait_for(lambda: warnings(kube, namespace, C.IPC_NOT_OBSERVED_EVENT, name=FRONT), 30,
             "the IPCCacheNotObserved Warning Event", interval=1.0)
    pm_sat = wait_for(lambda: mon.query(f'vlm_frontend_saturated{{namespace="{namespace}",pod="{stable_pod}"}} == 1'),
                      120, "vlm_frontend_saturated 1 for the stable pod in Prometheus", interval=3.0,
                      ignore=(OSError,))
    assert pm_sat, pm_sat
    busiest = mon.query(f'vlm_frontend_busy_share_ratio{{namespace="{namespace}",pod="{stable_pod}"}}')
    assert busiest and float(busiest[0]["value"][1]) >= 0.9, busiest
    assert {a["labels"].get("pod") for a in _active(mon, "VLMFrontendSaturated")} <= {stable_pod}
    try:
        sat = wait_for(lambda: _in_alertmanager(mon, namespace, "VLMFrontendSaturated"), 180,
                       "VLMFrontendSaturated in Alertmanager", interval=3.0, ignore=(OSError,))
    except AssertionError as e:
        groups = {g["name"]: g for g in mon.api("rules")["groups"]}
        rule = next(x for x in groups[f"vlm-operator-{FRONT}"]["rules"] if x["name"] == "VLMFrontendSaturated")
        series = mon.query_range(f'vlm_frontend_saturated{{namespace="{namespace}"}}', time.time() - 240,
                                 time.time(), 5)
        raise AssertionError(f"{e}\nrule: {rule}\nseries: {series}\nam: {mon.alerts()}") from None
    assert [(a["labels"].get("pod"), a["labels"].get("severity")) for a in sat] == [(stable_pod, "warning")], sat
    assert {a["labels"].get("pod") for a in _active(mon, "VLMFrontendSaturated")} == {stable_pod}
    ipc_alert = wait_for(lambda: _in_alertmanager(mon, namespace, "VLMIPCCacheNotObserved"), 180,
                         "VLMIPCCacheNotObserved in Alertmanager", interval=3.0, ignore=(OSError,))
    assert [a["labels"].get("severity") for a in ipc_alert] == ["warning"], ipc_alert
    # The dashboard's front-end targets (test_monitoring.py checks the others) return data for this service.
    now = time.time()
    front = [(title, t) for title, t in dashboard.targets(dashboard.load())
             if (title, t["refId"]) in dashboard.FRONTEND_TARGETS]
    assert len(front) == len(dashboard.FRONTEND_TARGETS), front
    empty = [(title, t["refId"]) for title, t in front if not dashboard.has_data(mon, t, namespace, FRONT, t_begin, now)]
    assert not empty, f"front-end dashboard queries without data: {empty}"
    assert len(warnings(kube, namespace, C.IPC_NOT_OBSERVED_EVENT, name=FRONT)) == 1

    # 2. A faster front end: promoted.
    patch(kube, namespace, {"sglang": {"args": [*FRONTEND, *BROKEN_CACHE]}}, name=FRONT)
    wait_for(lambda: rollout(kube, namespace, FRONT).get("phase"), 60, "the canary's rollout",
             interval=1.0)
    r = verdicts(kube, namespace, [FRONT], 480, op)[FRONT]
    assert r["phase"] == "Promoted", dump(r)
    fe = next(s for s in r["signals"] if s["name"] == "frontend_busy:mm_processor")
    assert fe["delta"] < -0.3, dump(r)  # it really was less busy (saturated -> a quarter busy)
    promoted = r["revision"]
    wait_for(lambda: get_vlms(kube, namespace, FRONT)["status"].get("stableRevision") == promoted, 60,
             "the promoted revision stable", interval=1.0)
    wait_for(lambda: len(_pods(kube, namespace, B.ROLE_STABLE)) == 1
             and _pods(kube, namespace, B.ROLE_STABLE) != [stable_pod], 120, "the new stable pod", interval=1.0)
    pm.wait_mapped(1)

    # 3. A slower image step: rolled back, the front-end function named; the scheduler loop unchanged.
    patch(kube, namespace, {"sglang": {"args": [*FRONTEND, *BROKEN_CACHE, "--standin-image-convert-ms", "20"]}},
          name=FRONT)
    wait_for(lambda: rollout(kube, namespace, FRONT).get("revision") not in (None, promoted), 60,
             "the new canary's rollout", interval=1.0)
    r = verdicts(kube, namespace, [FRONT], 480, op)[FRONT]
    assert (r["phase"], r["reason"], r.get("regressedFunction")) == (
        "RolledBack", "FrontendBusyRegressed", "convert_color"), dump(r)
    fe = next(s for s in r["signals"] if s["name"] == "frontend_busy:mm_processor")
    assert 0.1 < fe["delta"] < 0.35, dump(r)  # +20 points of pool busy share
    # The scheduler loop is not what failed, and the evidence does not show it grew by 25%. Its estimate alone is
    # not asserted: it swings with how much of the two cores the slower image step takes from the canary's
    # scheduler (a CI run read +44%, interval -33..+129%, on a loop 80% idle).
    loop = next(s for s in r["signals"] if s["name"] == "loop_latency")
    assert loop["verdict"] != "fail" and loop["ciLow"] < 0.25, dump(r)

    def alerted():
        return [a for a in mon.alerts() if a["labels"].get("alertname") == "VLMCanaryRolledBack"
                and a["labels"].get("vlmservice") == FRONT]
    # Operator scrape (30 s), rule evaluation and Alertmanager's group wait: about 90 s quiet, up to twice that
    # beside two other xdist workers (a CI run timed out at 120 s with the rollback already in status).
    try:
        got = wait_for(alerted, 240, "VLMCanaryRolledBack in Alertmanager", interval=3.0)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{_alert_path(op, mon, namespace)}") from None
    assert got[0]["labels"]["function"] == "convert_color", got[0]["labels"]
