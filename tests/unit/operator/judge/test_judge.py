"""vlm_operator.judge and judge_server: parsing and its errors, auth (a fake TokenReview and SubjectAccessReview),
the Flagger webhook contract, the HTTP framing, and the agreement with a VLMService's look on the same windows."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlm_operator.analysis import handoff as analysis
from vlm_operator.analysis import sources
from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.names import ROLE_CANARY, ROLE_STABLE
from vlm_operator.api.units import format_time
from vlm_operator.cluster.connection import ApiError
from vlm_operator.cluster.observed import Observed, PodInfo
from vlm_operator.judge import evaluate as judge
from vlm_operator.judge import server as judge_server
from vlm_testing.signals import EVERY, T0, sidecar_windows

GOOD = "good-token"


# ---------------------------------------------------------------- fixtures: pods, sidecars, API server


class Fleet:
    """Pods of two revisions with a sidecar each (answers by pod IP), and the API server's pod list."""

    def __init__(self, stable: int = 3, canary: int = 3, effect: float = 0.0, n: int = 30, dead: tuple = ()):
        self.pods: list[dict] = []
        self.answers: dict[str, Any] = {}
        for rev, count, eff in (("stable", stable, 0.0), ("canary", canary, effect)):
            for i in range(count):
                name, ip = f"svc-{rev}-{i}", f"10.0.{1 if rev == 'stable' else 2}.{i + 1}"
                self.pods.append({
                    "metadata": {"name": name, "labels": {"app": "svc", "rev": rev}},
                    "spec": {"nodeName": f"node-{i}"},
                    "status": {"podIP": ip, "phase": "Running",
                               "conditions": [{"type": "Ready", "status": "True"}]},
                })
                level = 0.02 * (1 + 0.003 * (i - 1))
                self.answers[f"http://{ip}:9400/windows.json"] = (
                    OSError("connection refused") if name in dead
                    else sidecar_windows(level, eff, n, seed=hash((rev, i)) & 0xFFFF))
        self.reads = 0

    def fetch(self, url: str, timeout: float) -> Any:
        self.reads += 1
        a = self.answers[url]
        if isinstance(a, BaseException):
            raise a
        return a


class FakeConn:
    """The API server as the judge uses it: the pod list by label selector (equality terms)."""

    def __init__(self, fleet: Fleet, fail: ApiError | None = None):
        self.fleet = fleet
        self.fail = fail
        self.calls: list[tuple[str, str, Any]] = []
        self.events: list[dict] = []

    def request(self, method: str, path: str, *, query=None, headers=None, body=None) -> bytes:
        self.calls.append((method, path, query))
        if self.fail is not None:
            raise self.fail
        if path.endswith("/events"):  # the Warning Event a Flagger Rollback writes on its Canary
            self.events.append(json.loads(body))
            return body
        if "/canaries/" in path:
            return json.dumps({"metadata": {"name": path.rsplit("/", 1)[1], "uid": "canary-uid"}}).encode()
        sel = dict(query or [])["labelSelector"]
        want = dict(t.split("=", 1) for t in sel.split(","))
        items = [p for p in self.fleet.pods if all(p["metadata"]["labels"].get(k) == v for k, v in want.items())]
        return json.dumps({"items": items}).encode()


class FakeAuth:
    """TokenReview: GOOD is user `argo` (may judge in `serving`), `other` is a user with no grant."""

    def __init__(self, down: bool = False):
        self.down = down
        self.reviews: list[str] = []

    def authenticate(self, token: str) -> judge_server.Caller | None:
        if self.down:
            raise judge_server.AuthUnavailable("API server unreachable")
        self.reviews.append(token)
        return {GOOD: judge_server.Caller("system:serviceaccount:serving:argo"),
                "other": judge_server.Caller("system:serviceaccount:elsewhere:x")}.get(token)

    def authorize(self, caller: judge_server.Caller, namespace: str) -> bool:
        return caller.username.startswith(f"system:serviceaccount:{namespace}:")


def body(**over: Any) -> dict[str, Any]:
    b = {"namespace": "serving", "baseline": "app=svc,rev=stable", "canary": {"app": "svc", "rev": "canary"},
         "startedAt": format_time(T0), "analysis": {"maxDuration": "10m"}}
    b.update(over)
    return {k: v for k, v in b.items() if v is not None}


def make_judge(fleet: Fleet, now: float, auth: Any = None, conn: Any = None) -> judge_server.Judge:
    reader = sources.SidecarReader(fetch=fleet.fetch)
    return judge_server.Judge(conn or FakeConn(fleet), reader, auth=auth or FakeAuth(), clock=lambda: now)


def call(j: judge_server.Judge, payload: Any, token: str | None = GOOD, path: str = "/v1/judge",
         method: str = "POST") -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    status, answer = j.handle(method, path, headers, raw)
    json.dumps(answer)  # always JSON-serialisable
    return status, answer


# ---------------------------------------------------------------- parsing


def test_parse_takes_the_vlmservice_analysis_model_and_both_selector_forms():
    r = judge.parse(body(analysis={"maxRegression": {"loopLatency": 5, "loopP95": 20}, "confidence": 0.9},
                         steps=[{"replicas": 1, "analysis": "2m"}, {"replicas": 2}], step=1, startedAt=T0))
    assert (r.baseline, r.canary, r.window([], 0)) == ("app=svc,rev=stable", "app=svc,rev=canary", (T0, T0))
    p = r.policy()
    assert p.max_regression["loop_latency"] == 0.05 and p.max_regression["loop_p95"] == 0.2
    assert (p.confidence, p.steps, p.step_durations_s, p.pair_s) == (0.9, 2, (120.0, 300.0), 15.0)
    # The same mapping as a VLMService with the same rollout block (GatePolicy.from_spec).
    spec = api.VLMServiceSpec.model_validate({
        "model": {"path": "m"}, "replicas": 2,
        "rollout": {"steps": [{"replicas": 1, "analysis": "2m"}, {"replicas": 2}],
                    "analysis": {"maxRegression": {"loopLatency": 5, "loopP95": 20}, "confidence": 0.9}}})
    assert analysis.policy_for(spec) == p
    # No steps: one step, the default schedule of a 1-replica service.
    assert judge.parse(body()).policy().steps == 1
    assert judge.parse(body(baseline="app in (a,b),tier!=x,!legacy")).baseline == "app in (a,b),tier!=x,!legacy"


@pytest.mark.parametrize("change, field", [
    ({"namespace": None}, "namespace"),
    ({"namespace": "Not_A_Namespace"}, "namespace"),
    ({"baseline": ""}, "baseline"),
    ({"baseline": {}}, "baseline"),
    ({"canary": "app=svc,"}, "canary"),
    ({"canary": "app=svc;drop"}, "canary"),
    ({"canary": {"app": "bad value!"}}, "canary"),
    ({"canary": "app=svc,rev=stable"}, "canary"),
    ({"startedAt": "yesterday"}, "startedAt"),
    ({"startedAt": -5}, "startedAt"),
    ({"startedAt": True}, "startedAt"),
    ({"analysis": {"confidence": 2}}, "analysis.confidence"),
    ({"analysis": {"maxRegression": {"loopLatency": "lots"}}}, "analysis.maxRegression.loopLatency"),
    ({"analysis": {"onInconclusive": "Shrug"}}, "analysis.onInconclusive"),
    ({"analysis": {"interval": "10m", "maxDuration": "5m"}}, "analysis"),
    ({"analysis": {"source": "Prometheus"}}, "analysis"),
    ({"steps": [{"replicas": 1, "analysis": "40m"}], "analysis": None}, "steps[0].analysis"),
    ({"steps": []}, "steps"),
    ({"step": 2}, "step"),
    ({"telemetryInterval": "0s"}, "telemetryInterval"),
    ({"surprise": 1}, "surprise"),
])
def test_bad_requests_name_their_field(change, field):
    b = body()
    for k, v in change.items():
        if v is None:
            b.pop(k, None)
        else:
            b[k] = v
    with pytest.raises(judge.BadRequest) as e:
        judge.parse(b)
    assert e.value.field == field, e.value.message


# ---------------------------------------------------------------- the HTTP contract (handle), auth


def test_auth_first_then_the_body_then_the_namespace_grant():
    fleet = Fleet()
    auth = FakeAuth()
    j = make_judge(fleet, T0 + 120, auth)
    assert call(j, body(), token=None)[0] == 401
    status, a = call(j, body(), token="forged")
    assert (status, a["field"]) == (401, "Authorization")
    assert call(j, b"{not json", token=None)[0] == 401  # nothing is parsed for an anonymous caller
    status, a = call(j, b"{not json")
    assert (status, a["field"]) == (400, "body")
    status, a = call(j, body(startedAt="soon"))
    assert (status, a["field"]) == (400, "startedAt")
    status, a = call(j, body(), token="other")
    assert (status, a["field"]) == (403, "namespace")
    assert fleet.reads == 0  # nothing was read for a refused call
    assert call(j, body(), token="other", path="/v1/judge/")[0] == 403
    assert call(make_judge(fleet, T0, FakeAuth(down=True)), body())[0] == 503
    assert call(j, body(), path="/v2/judge")[0] == 404
    assert call(j, body(), method="GET")[0] == 405
    assert j.handle("GET", "/healthz", {}, b"") == (200, {"status": "ok"})


def test_a_header_without_bearer_is_no_token():
    j = make_judge(Fleet(), T0)
    for h in ({"Authorization": "Basic Zm9vOmJhcg=="}, {"Authorization": "Bearer "}, {"authorization": "bearer"}):
        assert j.handle("POST", "/v1/judge", h, b"{}")[0] == 401
    assert j.handle("POST", "/v1/judge", {"authorization": f"bearer {GOOD}"}, b"{}")[0] == 400


@settings(max_examples=150, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=6),
                    max_leaves=20),
       st.sampled_from(["/v1/judge", "/v1/flagger"]))
def test_garbage_is_answered_never_raised(payload, path):
    j = make_judge(Fleet(stable=1, canary=1, n=6), T0 + 300)
    status, answer = call(j, payload, path=path)
    assert status in (200, 400, 403, 409, 412, 425)
    if status == 400:
        assert set(answer) == {"error", "field"} and answer["field"]


def test_garbage_inside_a_valid_shape():
    j = make_judge(Fleet(stable=1, canary=1, n=6), T0 + 300)
    for b in (body(analysis=[]), body(steps={"a": 1}), body(step="1"), body(baseline=["a=b"]),
              body(canary={"app": 3}), body(startedAt=float("inf")), body(startedAt="9" * 400)):
        status, answer = call(j, b)
        assert status == 400, (b, answer)


# ---------------------------------------------------------------- verdicts


def test_a_regressed_canary_is_rolled_back_with_its_stage_function_and_flamegraph():
    fleet = Fleet(effect=0.10)
    j = make_judge(fleet, T0 + 30 * EVERY)
    status, a = call(j, body(id="rollout-abc/3"))
    assert status == 200
    assert (a["verdict"], a["pass"], a["reason"]) == ("Rollback", -1, "LoopLatencyRegressed")
    assert a["id"] == "rollout-abc/3"
    assert a["regressedStage"] == "process_input_requests"
    assert a["regressedFunction"] == "reconstruct_on_target_device" and a["regressedCaller"] is None
    loop = next(s for s in a["signals"] if s["name"] == "loop_latency")
    assert loop["verdict"] == "fail" and 0.08 < loop["delta"] < 0.12 and loop["ciLow"] > 0.015
    assert loop["margin"] == 0.03 and loop["nCanary"] > 0
    fg = a["flamegraphDiff"]
    assert fg["canaryPod"].startswith("svc-canary-") and fg["baselinePod"] == "svc-stable-0"
    assert fg["kubectl"].startswith(f"kubectl vlm profile {fg['canaryPod']} -n serving --view diff --against pod/")
    assert fg["diff"] == f"/api/v1/namespaces/serving/pods/{fg['canaryPod']}:9400/proxy/profile/diff.svg"
    assert a["analysis"]["source"] == "Sidecars" and a["analysis"]["canaryPods"] == [
        "svc-canary-0", "svc-canary-1", "svc-canary-2"]


def test_an_unchanged_canary_continues_then_is_promoted():
    fleet = Fleet(effect=0.0, n=40)
    status, a = call(make_judge(fleet, T0 + 8 * EVERY), body())
    assert (status, a["verdict"], a["pass"]) == (200, "Continue", 0)
    assert a["flamegraphDiff"] is None
    status, a = call(make_judge(fleet, T0 + 40 * EVERY), body())
    assert (a["verdict"], a["pass"]) == ("Promote", 1), a["message"]


def test_missing_data_is_inconclusive_and_never_promotes():
    # Every canary sidecar down: the gate's SignalsUnavailable, Inconclusive; at maxDuration onInconclusive.
    dead = ("svc-canary-0", "svc-canary-1", "svc-canary-2")
    fleet = Fleet(dead=dead, n=60)
    a = call(make_judge(fleet, T0 + 5 * 60), body())[1]
    assert (a["verdict"], a["pass"], a["reason"]) == ("Inconclusive", 0, "SignalsUnavailable")
    a = call(make_judge(fleet, T0 + 11 * 60), body(analysis={"maxDuration": "10m", "onInconclusive": "Promote"}))[1]
    assert (a["verdict"], a["reason"]) == ("Pause", "MaxDurationReached")
    # No pod matches the canary selector; the API server refuses the list: the same.
    a = call(make_judge(fleet, T0 + 60), body(canary="app=svc,rev=nothing"))[1]
    assert a["verdict"] == "Inconclusive" and "no Ready pod matches the canary selector" in a["message"]
    j = make_judge(fleet, T0 + 60, conn=FakeConn(fleet, fail=ApiError(403, "Forbidden")))
    a = call(j, body())[1]
    assert a["verdict"] == "Inconclusive" and "403" in a["message"]


def test_a_pod_in_both_selectors_is_not_judged():
    fleet = Fleet()
    a = call(make_judge(fleet, T0 + 300), body(baseline="app=svc", canary="app=svc,rev=canary"))[1]
    assert a["verdict"] == "Inconclusive" and "matches both selectors" in a["message"]


def test_a_canary_pods_warm_up_is_left_out_as_in_a_vlmservice_look():
    """Windows ending within the policy's warm-up (60 s) of a canary pod's Ready time are not compared: a slow
    first minute (cold caches) does not roll it back."""
    fleet = Fleet(n=40)
    for p in fleet.pods:
        if p["metadata"]["labels"]["rev"] == "canary":
            p["status"]["conditions"][0]["lastTransitionTime"] = format_time(T0)
            url = f"http://{p['status']['podIP']}:9400/windows.json"
            for w in fleet.answers[url][:4]:  # the first minute: 30% slower
                w["loop_mean_seconds"] *= 1.3
    a = call(make_judge(fleet, T0 + 40 * EVERY), body())[1]
    assert a["verdict"] == "Promote", a["message"]
    assert 0.25 < a["analysis"]["warmupShift"] < 0.35  # measured on what was left out
    for p in fleet.pods:
        p["status"]["conditions"][0].pop("lastTransitionTime", None)
    assert call(make_judge(fleet, T0 + 40 * EVERY), body())[1]["analysis"]["warmupShift"] is None


def test_the_baseline_pods_pre_period_comes_from_their_history_and_is_not_evidence():
    """The baseline pods' windows from the 5 minutes before the evidence starts are their pre-period (the gate's
    Layout.before: the restart share learns from pods that shared a node before the canary came); a pod whose
    history does not reach back has none; none of those windows counts as evidence. Two baseline pods share
    node-0 with a canary pod, whose comparison is then with them (Concurrent: their within-node spread measures
    the restart share); the others are compared with the baseline mean (Unpaired: one baseline pod per node says
    nothing of the restart share, and at the conservative f = 0 a same-node pair is no better)."""
    fleet = Fleet(n=40)
    fleet.pods[1]["spec"]["nodeName"] = "node-0"  # svc-stable-1
    for p in fleet.pods:
        if p["metadata"]["labels"]["rev"] == "stable" and p["metadata"]["name"] != "svc-stable-2":
            url = f"http://{p['status']['podIP']}:9400/windows.json"
            i = int(p["metadata"]["name"].rsplit("-", 1)[1])
            fleet.answers[url] = sidecar_windows(0.02, 0.0, 60, seed=i, start=T0 - 20 * EVERY)
    now = T0 + 40 * EVERY
    req = judge.parse(body())
    got = make_judge(fleet, now).read(req, now)
    assert min(w.end for w in got.windows) < T0 - 200  # read from the pre-period's start
    lay = judge.layout(req, got.windows, got.pods, now)
    assert sorted(lay.before) == ["svc-stable-0", "svc-stable-1"]
    assert {b.pod: (b.node, b.windows) for b in lay.before.values()} == {
        "svc-stable-0": ("node-0", 20), "svc-stable-1": ("node-0", 20)}
    a = call(make_judge(fleet, now), body())[1]
    assert a["analysis"]["prePeriodPods"] == ["svc-stable-0", "svc-stable-1"]
    assert a["analysis"]["pairing"] == ["Concurrent", "Unpaired"]
    assert a["analysis"]["windows"] == {"baseline": 3 * 40, "canary": 3 * 40}  # after startedAt only
    loop = next(s for s in a["signals"] if s["name"] == "loop_latency")
    assert loop["nBaseline"] <= 3 * 40


def test_the_three_outcomes_expand_before_the_last_step_and_promote_at_it():
    """A pass before the caller's last step is Expand (Argo Rollouts and Flagger go on to their next step: pass 1,
    HTTP 200); at the last step it is Promote; a look with no verdict yet is Wait; a regression is Rollback."""
    fleet = Fleet(n=40)
    steps = [{"replicas": 1}, {"replicas": 3}]
    now = T0 + 40 * EVERY
    a = call(make_judge(fleet, now), body(steps=steps, step=0))[1]
    assert (a["verdict"], a["outcome"], a["pass"]) == ("Promote", "Expand", 1), a["message"]
    a = call(make_judge(fleet, now), body(steps=steps, step=1))[1]
    assert (a["verdict"], a["outcome"]) == ("Promote", "Promote"), a["message"]
    assert call(make_judge(fleet, T0 + 8 * EVERY), body())[1]["outcome"] == "Wait"
    assert call(make_judge(Fleet(effect=0.10), T0 + 30 * EVERY), body())[1]["outcome"] == "Rollback"


# ---------------------------------------------------------------- Flagger


def flagger(phase: str = "Progressing", checksum: str = "7d9f", **meta: str) -> dict:
    """The body Flagger POSTs to a webhook (its CanaryWebhookPayload)."""
    m = {"baseline": "app=svc,rev=stable", "canary": "app=svc,rev=canary", "analysis": '{"maxDuration": "10m"}'}
    m.update(meta)
    return {"name": "svc", "namespace": "serving", "phase": phase, "checksum": checksum, "metadata": m}


def test_flagger_contract_statuses():
    """2xx on Promote and Continue (Flagger goes on), non-2xx on Rollback (a failed check: Flagger rolls back
    after `threshold` of them), and on Inconclusive and Pause (no evidence never advances a canary)."""
    fleet = Fleet(effect=0.10)
    conn = FakeConn(fleet)
    j = make_judge(fleet, T0 + 30 * EVERY, conn=conn)
    status, a = call(j, flagger(startedAt=format_time(T0)), path="/v1/flagger")
    assert (status, a["verdict"]) == (412, "Rollback")
    assert a["id"] == "serving/svc/7d9f"
    # The verdict's reason and function as a Warning Event on the Canary (Flagger's own Event drops the body), once
    # for the repeated checks of the same revision.
    (ev,) = conn.events
    assert (ev["type"], ev["reason"], ev["involvedObject"]) == ("Warning", a["reason"], {
        "apiVersion": "flagger.app/v1beta1", "kind": "Canary", "name": "svc", "namespace": "serving",
        "uid": "canary-uid"})
    assert a["regressedFunction"] and a["regressedFunction"] in ev["message"]
    call(j, flagger(startedAt=format_time(T0)), path="/v1/flagger")
    assert len(conn.events) == 1
    good = Fleet(n=40)
    status, a = call(make_judge(good, T0 + 40 * EVERY), flagger(startedAt=str(T0)), path="/v1/flagger")
    assert (status, a["verdict"]) == (200, "Promote")
    status, a = call(make_judge(good, T0 + 8 * EVERY), flagger(startedAt=str(T0)), path="/v1/flagger")
    assert (status, a["verdict"]) == (200, "Continue")
    down = Fleet(dead=("svc-canary-0", "svc-canary-1", "svc-canary-2"))
    status, a = call(make_judge(down, T0 + 60), flagger(startedAt=str(T0)), path="/v1/flagger")
    assert (status, a["verdict"]) == (425, "Inconclusive")
    assert judge.flagger_status("Pause") == 409


def test_without_started_at_the_analysis_starts_with_the_canary_pods():
    """Stateless: no startedAt (Flagger's webhook, or an Argo template without it) means the canary pods' Ready
    times: the step's clock from the newest, the evidence from the oldest, as a VLMService step's."""
    fleet = Fleet(n=60)
    for i, p in enumerate(p for p in fleet.pods if p["metadata"]["labels"]["rev"] == "canary"):
        p["status"]["conditions"][0]["lastTransitionTime"] = format_time(T0 + 60 * i)
    j = make_judge(fleet, T0 + 60 * EVERY)
    a = call(j, flagger(), path="/v1/flagger")[1]
    assert (a["analysis"]["startedAt"], a["analysis"]["evidenceSince"]) == (T0 + 120, T0)
    a = call(j, body(startedAt=None))[1]
    assert (a["analysis"]["startedAt"], a["analysis"]["evidenceSince"]) == (T0 + 120, T0)
    # No Ready canary pod: nothing to judge yet.
    a = call(j, body(startedAt=None, canary="app=svc,rev=none"))[1]
    assert a["verdict"] == "Inconclusive" and a["analysis"]["startedAt"] == T0 + 60 * EVERY


def test_flagger_phases_and_bad_metadata():
    j = make_judge(Fleet(), T0 + 60)
    status, a = call(j, flagger(phase="Promoting"), path="/v1/flagger")
    assert status == 200 and a["verdict"] is None
    for bad, field in ((flagger(analysis="{nope"), "metadata.analysis"),
                       (flagger(analysis='{"confidence": 7}'), "metadata.analysis.confidence"),
                       (flagger(step="one"), "metadata.step"),
                       (flagger(colour="blue"), "metadata.colour"),
                       ({**flagger(), "metadata": {"baseline": 1}}, "metadata"),
                       ({**flagger(), "name": ""}, "name")):
        status, a = call(j, bad, path="/v1/flagger")
        assert (status, a["field"]) == (400, field), a
    b = flagger()
    del b["metadata"]["canary"]
    assert call(j, b, path="/v1/flagger")[1]["field"] == "metadata.canary"
    b = flagger(startedAt="later")
    assert call(j, b, path="/v1/flagger")[1]["field"] == "metadata.startedAt"
    b = flagger()
    del b["metadata"]["canary"]
    assert call(j, b, path="/v1/flagger")[1]["field"] == "metadata.canary"
    # Another namespace's canary: the caller's grant is checked there.
    assert call(j, {**flagger(), "namespace": "elsewhere"}, path="/v1/flagger")[0] == 403


# ---------------------------------------------------------------- agreement with the VLMService path


def _vlmservice_decision(fleet: Fleet, now: float, analysis_block: Mapping[str, Any]):
    spec = api.VLMServiceSpec.model_validate(
        {"model": {"path": "m"}, "replicas": 3, "rollout": {"steps": [{"replicas": 3}], "analysis": analysis_block}})
    pods = []
    for p in fleet.pods:
        rev = p["metadata"]["labels"]["rev"]
        pods.append(PodInfo(name=p["metadata"]["name"], role=ROLE_CANARY if rev == "canary" else ROLE_STABLE,
                            revision=rev, phase="Running", ready=True, ip=p["status"]["podIP"],
                            node=p["spec"]["nodeName"]))
    prev = api.RolloutStatus(phase="Analysing", revision="canary", step=0, baseline="Stable",
                             analysis_started_at=format_time(T0))
    ctx = analysis.Context(reader=sources.SidecarReader(fetch=fleet.fetch), prometheus_url=None,
                           profiler_tolerance=0.05, profiler_refresh_s=1800)
    got = analysis.gather(ctx, spec, analysis.policy_for(spec), Observed(pods=pods), namespace="serving", name="svc",
                          prev=prev, revision="canary", stable_rev="stable", current_profiler=None,
                          profiler_due=lambda _: False, now=now)
    return got.decision


@pytest.mark.parametrize("effect, looks_at, dead", [
    (0.10, 30, ()),  # Rollback
    (0.0, 8, ()),  # Continue
    (0.0, 40, ()),  # Promote
    (0.02, 45, ()),  # near the margin
    (0.0, 20, ("svc-canary-0", "svc-canary-1", "svc-canary-2")),  # Inconclusive (SignalsUnavailable)
    (0.0, 50, ("svc-canary-1",)),  # one canary sidecar down: judged on the others
])
def test_the_judge_and_a_vlmservice_look_agree_on_the_same_windows(effect, looks_at, dead):
    """The same sidecars read through the VLMService path (analysis.gather: policy_for, the source, split,
    gate.decide) and through the judge (parse, pods by selector, the same reader, gate.decide) give the same
    decision: verdict, reason, message, every signal, what grew."""
    block = {"maxDuration": "10m", "maxRegression": {"loopLatency": 3, "stageTime": 5}}
    fleet = Fleet(effect=effect, n=looks_at, dead=dead)
    now = T0 + looks_at * EVERY
    ours = _vlmservice_decision(fleet, now, block)
    req = judge.parse(body(analysis=block, steps=[{"replicas": 3}]))
    got = make_judge(fleet, now).read(req, now)
    theirs = judge.decide(req, got.windows, got.pods, now=now, unavailable=got.unavailable)
    assert ours is not None
    assert (theirs.verdict, theirs.reason, theirs.message) == (ours.verdict, ours.reason, ours.message)
    assert theirs.signals == ours.signals
    assert (theirs.regressed_stage, theirs.regressed_function) == (ours.regressed_stage, ours.regressed_function)
    # And through the whole handler: the same verdict in the answer.
    a = call(make_judge(fleet, now), body(analysis=block, steps=[{"replicas": 3}]))[1]
    assert (a["verdict"], a["reason"], a["message"]) == (ours.verdict, ours.reason, ours.message)


# ---------------------------------------------------------------- the HTTP server


def test_the_http_server_frames_answers_and_survives_a_bug():
    fleet = Fleet(effect=0.10)
    j = make_judge(fleet, T0 + 30 * EVERY)
    server = judge_server.serve(j, 0, host="127.0.0.1")
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/judge"
    try:
        def post(payload: bytes, token: str | None = GOOD, headers: dict | None = None) -> tuple[int, dict, Any]:
            h = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {}),
                 **(headers or {})}
            req = urllib.request.Request(url, data=payload, headers=h, method="POST")
            try:
                # A guard against a hang, not a latency bound (bench/judge_latency.py measures that): at nice
                # 19 beside the parallel pass the first judgement took over 10 s (CI, 2026-12-07; the whole
                # test took 2 s alone).
                with urllib.request.urlopen(req, timeout=60) as r:
                    return r.status, json.loads(r.read()), r.headers
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read()), e.headers

        status, a, _ = post(json.dumps(body()).encode())
        assert (status, a["verdict"]) == (200, "Rollback")
        status, a, h = post(b"{}", token=None)
        assert status == 401 and h["WWW-Authenticate"].startswith("Bearer")
        status, a, _ = post(b"x" * (judge_server.MAX_BODY + 1))
        assert (status, a["field"]) == (413, "body")
        original = j.judge
        j.judge = lambda *a, **k: 1 / 0  # type: ignore[method-assign]
        status, a, _ = post(json.dumps(body()).encode())
        assert status == 500
        j.judge = original  # type: ignore[method-assign]
        status, a, _ = post(json.dumps(body()).encode())
        assert status == 200
        # Concurrent callers.
        out: list[int] = []
        threads = [threading.Thread(target=lambda: out.append(post(json.dumps(body()).encode())[0]))
                   for _ in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert out == [200] * 8
    finally:
        server.shutdown()
        server.server_close()


def test_kube_auth_sends_token_review_and_access_review_and_caches_tokens():
    sent: list[tuple[str, dict]] = []

    class Conn:
        def request(self, method, path, *, query=None, headers=None, body=None):
            b = json.loads(body)
            sent.append((path, b))
            if path.endswith("tokenreviews"):
                ok = b["spec"]["token"] == "t1"
                user = {"username": "system:serviceaccount:serving:argo", "uid": "u1",
                        "groups": ["system:serviceaccounts"], "extra": {"k": ["v"]}}
                return json.dumps({"status": {"authenticated": ok, **({"user": user} if ok else {})}}).encode()
            return json.dumps({"status": {"allowed": b["spec"]["resourceAttributes"]["namespace"] == "serving"}}
                              ).encode()

    clock = [0.0]
    auth = judge_server.KubeAuth(Conn(), audiences=["vlm-judge"], clock=lambda: clock[0])
    caller = auth.authenticate("t1")
    assert caller is not None and caller.username == "system:serviceaccount:serving:argo"
    assert sent[0][1]["spec"] == {"token": "t1", "audiences": ["vlm-judge"]}
    assert auth.authenticate("t2") is None
    assert auth.authenticate("t1") == caller and len(sent) == 2  # cached
    clock[0] = judge_server.TOKEN_CACHE_S + 1
    auth.authenticate("t1")
    assert len(sent) == 3
    assert auth.authorize(caller, "serving") and not auth.authorize(caller, "kube-system")
    sar = sent[-1][1]["spec"]
    assert sar["user"] == caller.username and sar["uid"] == "u1" and sar["extra"] == {"k": ["v"]}
    assert sar["resourceAttributes"] == {"namespace": "kube-system", "verb": "create",
                                         "group": "serving.vlmops.dev", "resource": "judgements"}

    class Down:
        def request(self, *a, **k):
            raise ApiError(500, "boom")

    with pytest.raises(judge_server.AuthUnavailable):
        judge_server.KubeAuth(Down()).authenticate("t")


def test_the_prometheus_source_reads_the_selected_pods_by_name(monkeypatch):
    """With a Prometheus URL the judge reads the pods its selectors picked, by name (their sidecars' series carry
    the pod label whatever made the pod), and each window gets its pod's side."""
    from vlm_operator.analysis.sources import prometheus as prom

    queries: list[str] = []

    def get_json(url: str, timeout: float = 5.0, **_: Any) -> Any:
        import urllib.parse

        q = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["query"][0]
        queries.append(q)
        series = []
        for pod in ("svc-stable-0", "svc-canary-0"):
            m = {"pod": pod, "revision": "", "tp_rank": "0"}
            if "last_window_timestamp" in q:
                vals = [[T0 + k * EVERY + 6, str(T0 + k * EVERY + 5)] for k in range(20)]
            elif "loop_mean_seconds" in q:
                level = 0.022 if "canary" in pod else 0.02
                vals = [[T0 + k * EVERY + 6, str(level)] for k in range(20)]
            else:
                continue
            series.append({"metric": m, "values": vals})
        return {"status": "success", "data": {"result": series}}

    monkeypatch.setattr(prom, "get_json", get_json)
    fleet = Fleet(stable=1, canary=1)
    j = judge_server.Judge(FakeConn(fleet), sources.SidecarReader(fetch=fleet.fetch), auth=FakeAuth(),
                           prometheus_url="http://prometheus:9090", clock=lambda: T0 + 20 * EVERY)
    got = j.read(judge.parse(body()), T0 + 20 * EVERY)
    assert got.source == "Prometheus" and got.unavailable is None and fleet.reads == 0
    assert 'namespace="serving",pod=~"svc-canary-0|svc-stable-0"' in queries[0]
    assert {w.revision for w in got.windows if w.pod == "svc-canary-0"} == {"canary"}
    assert {w.revision for w in got.windows if w.pod == "svc-stable-0"} == {"baseline"}
    assert len(got.windows) == 40
    # A pod name with a dot is escaped for the regex and for PromQL's string.
    monkeypatch.setattr(prom, "_query_range", lambda base, q, *a, **k: queries.append(q) or [])
    prom.from_prometheus("http://p", "ns", "", [], since=T0, now=T0 + 60, step=5, pods={"a.b-0": "canary"})
    assert 'pod=~"a\\\\.b-0"' in queries[-1]


def test_every_verdict_of_the_gate_has_a_pass_value_and_a_flagger_status():
    """A verdict the gate gains later must be mapped here, not answered 500."""
    from typing import get_args

    from vlm_operator.analysis import gate

    assert set(judge.PASS) == set(judge.FLAGGER_STATUS) == set(get_args(gate.Verdict))
    assert all(200 <= s < 300 for v, s in judge.FLAGGER_STATUS.items() if judge.PASS[v] >= 0 and v in
               ("Promote", "Continue"))
    assert all(s >= 400 for v, s in judge.FLAGGER_STATUS.items() if v not in ("Promote", "Continue"))
