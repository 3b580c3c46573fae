"""The judge endpoint's pure half: a request in, the gate's decision out, as JSON (docs/judge.md).

Argo Rollouts (a `web` metric) and Flagger (a `rollout` webhook) ask the operator's gate about pods they roll
out themselves. This module parses and validates a request (`parse`, `parse_flagger`: a `BadRequest` names the
field at fault), builds the gate's policy from the VLMService API's own models (`api.AnalysisSpec`,
`api.RolloutStep`, through `GatePolicy.from_rollout`, the mapping `from_spec` uses), calls `gate.decide` with the
windows the server read, and builds the answer (`response`, `flagger_status`). No I/O and no clock: the server
(`vlm_operator.judge.server`) lists the pods, reads the windows and passes `now`.

Stateless: every call judges the windows from the analysis' start to `now` afresh, as a VLMService's look does from
its status. The start is the request's `startedAt`, else read from the cluster as a VLMService step's is: the
canary pods' Ready times (the step's clock from when the newest of them became Ready, its evidence from the oldest),
so neither the caller nor the judge keeps anything between calls, and an operator restart changes no verdict. The
analysis clock then starts at the canary's first profiler window after that (`gate.decide`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from vlm_operator.analysis import gate
from vlm_operator.analysis.gate.attribution import CALLER_ARROW
from vlm_operator.analysis.window import Window
from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.names import SIDECAR_PORT
from vlm_operator.api.units import parse_duration, parse_time

BASELINE, CANARY = "baseline", "canary"  # the sides, as the windows' `revision`
# How far ahead of the judge's clock a `startedAt` may be (clock skew between the caller and the operator).
FUTURE_SLACK_S = 60.0
# The number an Argo successCondition or a Flagger metric reads: 1 pass, 0 not yet, -1 fail.
PASS = {"Promote": 1, "Continue": 0, "Inconclusive": 0, "Pause": 0, "Rollback": -1}
# HTTP status of the Flagger webhook per verdict: Flagger counts a non-2xx answer as a failed check, and rolls
# back after `threshold` of them; a 2xx lets it go on to its next step. Inconclusive (no data, too few windows,
# a stale profiler) and Pause hold the canary back as failed checks: missing evidence never advances a canary.
FLAGGER_STATUS = {"Promote": 200, "Continue": 200, "Inconclusive": 425, "Pause": 409, "Rollback": 412}

_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
# A label selector string as the API server takes it: terms of key, an operator and values, or [!]key.
_TERM = re.compile(
    r"^\s*(!?\s*[A-Za-z0-9./_-]+|[A-Za-z0-9./_-]+\s*(==?|!=)\s*[A-Za-z0-9._-]*"
    r"|[A-Za-z0-9./_-]+\s+(in|notin)\s*\(\s*[A-Za-z0-9._-]*(\s*,\s*[A-Za-z0-9._-]*)*\s*\))\s*$")


class BadRequest(Exception):
    """A request the judge cannot run: HTTP 400 with `{"error": message, "field": field}`."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.message = message
        self.field = field


def selector_string(value: str | Mapping[str, str], where: str) -> str:
    """A label selector as the API server's `labelSelector` takes it: a string (`app=x,hash=abc`) or a
    `matchLabels` map. An empty selector would select every pod of the namespace: refused."""
    if isinstance(value, str):
        terms = _split_terms(value)
        if not terms or any(not t.strip() for t in terms):
            raise ValueError(f"{where}: an empty label selector (or term) would select every pod")
        for t in terms:
            if not _TERM.match(t):
                raise ValueError(f"{where}: not a label selector term: {t.strip()!r}")
        return ",".join(t.strip() for t in terms)
    if not value:
        raise ValueError(f"{where}: an empty matchLabels would select every pod")
    for k, v in value.items():
        if not _LABEL_KEY.match(k) or not isinstance(v, str) or not _LABEL_VALUE.match(v):
            raise ValueError(f"{where}: not a label: {k}={v!r}")
    return ",".join(f"{k}={v}" for k, v in sorted(value.items()))


def _split_terms(s: str) -> list[str]:
    """Commas outside parentheses separate terms (`a in (x,y),b=z`)."""
    out, depth, cur = [], 0, ""
    for ch in s:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


class JudgeRequest(api.KubeModel):
    """POST /v1/judge. `analysis` and `steps` are the VLMService API's own models (`spec.rollout.analysis`,
    `spec.rollout.steps`), with the same defaults and checks."""

    namespace: str = Field(pattern=api.DNS_LABEL_PATTERN, max_length=63)
    baseline: str | dict[str, str] = Field(description="Label selector of the baseline (stable) pods.")
    canary: str | dict[str, str] = Field(description="Label selector of the canary pods.")
    started_at: str | float | None = Field(
        None, description="When the canary's analysis began: RFC 3339 or unix seconds; default: from the canary "
                          "pods' Ready times.")
    analysis: api.AnalysisSpec = Field(default_factory=api.AnalysisSpec)
    steps: list[api.RolloutStep] | None = Field(None, min_length=1, max_length=10)
    step: int | None = Field(None, ge=0, le=9, description="Index of this step in `steps` (default: the last).")
    analysed_before: api.Duration | None = Field(
        None, description="Accepted and ignored: the gate's bounds hold at every look of every step, so it no "
                          "longer needs the time the earlier steps took.")
    telemetry_interval: api.Duration = Field("15s", description="The sidecars' telemetry interval.")
    id: str | None = Field(None, max_length=253, description="The caller's analysis id, echoed.")

    @field_validator("baseline", "canary")
    @classmethod
    def _selector(cls, v: str | dict[str, str], info: ValidationInfo) -> str:
        return selector_string(v, info.field_name or "selector")

    @field_validator("started_at", mode="before")
    @classmethod
    def _time(cls, v: Any) -> float | None:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise ValueError("startedAt: not a time")
        if isinstance(v, str):
            try:
                t = parse_time(v) if not re.fullmatch(r"\d{1,11}(\.\d+)?", v) else float(v)
            except (ValueError, OverflowError) as e:
                raise ValueError(f"startedAt: not an RFC 3339 time: {v[:40]!r}") from e
            if t <= 0:
                raise ValueError(f"startedAt: not a time: {v[:40]!r}")
            return t
        if not math.isfinite(v) or v <= 0 or v > 1e11:
            raise ValueError(f"startedAt: not a time: {v!r}")
        return float(v)

    @field_validator("telemetry_interval")
    @classmethod
    def _positive(cls, v: str) -> str:
        if parse_duration(v) <= 0:
            raise ValueError("telemetryInterval must be positive")
        return v

    @model_validator(mode="after")
    def _rollout(self) -> JudgeRequest:
        # The VLMService API's own cross-checks (a step's analysis within maxDuration).
        api.RolloutSpec(steps=self.steps, analysis=self.analysis)
        if self.step is not None and self.step >= len(self.schedule()):
            raise ValueError(f"step: {self.step} is beyond the {len(self.schedule())} steps")
        if self.baseline == self.canary:
            raise ValueError("canary: the same selector as the baseline")
        return self

    def rollout(self) -> api.RolloutSpec:
        return api.RolloutSpec(steps=self.steps, analysis=self.analysis)

    def schedule(self) -> list[api.RolloutStep]:
        """The steps as given, else one step: the VLMService default schedule of a 1-replica service."""
        return self.rollout().schedule(1)

    def policy(self) -> gate.GatePolicy:
        return gate.GatePolicy.from_rollout(self.rollout(), self.schedule(), self.telemetry_interval)

    def window(self, pods: Sequence[PodRef], now: float) -> tuple[float, float]:
        """(the step's start, evidence since): `startedAt` for both, else the newest and the oldest Ready time of
        the Ready canary pods (now when none is known: no evidence yet)."""
        if self.started_at is not None:
            return float(self.started_at), float(self.started_at)
        times = [p.ready_at for p in pods if p.side == CANARY and p.ready and p.ready_at is not None]
        return (max(times), min(times)) if times else (now, now)


_HEAD = re.compile(r"([a-z][A-Za-z0-9]*(?:\[\d+\])?(?:\.[A-Za-z0-9]+(?:\[\d+\])?)*)[ :]")
_FIELDS = {"namespace", "baseline", "canary", "startedAt", "analysis", "steps", "step", "analysedBefore",
           "telemetryInterval", "id"}


def _bad(e: ValidationError, prefix: str = "") -> BadRequest:
    err = e.errors()[0]
    loc = [x for x in err.get("loc", ()) if not (isinstance(x, str) and x in ("str", "float", "dict[str,str]"))]
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    field = prefix + ".".join(str(x) for x in loc)
    if not loc:  # a model-level check: its message starts with the field it is about
        head = _HEAD.match(msg)
        field = prefix + (head.group(1) if head and head.group(1).split("[")[0].split(".")[0] in _FIELDS else "body")
    return BadRequest(msg, field or "body")


def parse(body: Any) -> JudgeRequest:
    """The request of POST /v1/judge (a decoded JSON body); BadRequest names the field at fault."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object", "body")
    try:
        return JudgeRequest.model_validate(body)
    except ValidationError as e:
        raise _bad(e) from None


@dataclass(frozen=True)
class FlaggerCall:
    """What Flagger's webhook sends (`CanaryWebhookPayload`): the canary, its phase and revision checksum, and the
    webhook's `metadata` (strings), which carry the judge's request fields."""

    name: str
    namespace: str
    phase: str
    checksum: str
    request: JudgeRequest | None  # None outside the phases the judge judges


# Flagger phases in which the judge judges; in others (Initializing, Promoting, Finalising, Succeeded, Failed)
# the webhook is answered 200 without reading anything.
FLAGGER_PHASES = ("Progressing", "Waiting", "WaitingPromotion")


def parse_flagger(body: Any) -> FlaggerCall:
    """Flagger's payload: `metadata` holds the request's fields as strings (`baseline`, `canary` label selectors;
    `analysis` a JSON object of the VLMService's `rollout.analysis`; optional `startedAt`, `steps` JSON, `step`,
    `telemetryInterval`). Without `startedAt` the analysis starts with the canary pods (`JudgeRequest.window`):
    Flagger scales the canary Deployment up for each new revision."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object", "body")
    for key in ("name", "namespace", "phase"):
        if not isinstance(body.get(key), str) or not body.get(key):
            raise BadRequest(f"{key}: a non-empty string is required", key)
    checksum = body.get("checksum") if isinstance(body.get("checksum"), str) else ""
    meta = body.get("metadata") or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise BadRequest("metadata: a map of strings", "metadata")
    if body["phase"] not in FLAGGER_PHASES:
        return FlaggerCall(body["name"], body["namespace"], body["phase"], checksum, None)
    req: dict[str, Any] = {"namespace": body["namespace"], "id": f"{body['namespace']}/{body['name']}/{checksum}"}
    for key in ("baseline", "canary", "telemetryInterval", "analysedBefore"):
        if key in meta:
            req[key] = meta[key]
    for key in ("analysis", "steps"):
        if key in meta:
            try:
                req[key] = json.loads(meta[key])
            except ValueError as e:
                raise BadRequest(f"{key}: not JSON: {e}", f"metadata.{key}") from None
    if "step" in meta:
        if not meta["step"].isdigit():
            raise BadRequest("step: an integer", "metadata.step")
        req["step"] = int(meta["step"])
    if meta.get("startedAt"):
        req["startedAt"] = meta["startedAt"]
    for key in ("baseline", "canary"):
        if not req.get(key):
            raise BadRequest(f"{key}: required in the webhook's metadata", f"metadata.{key}")
    unknown = sorted(set(meta) - {"baseline", "canary", "analysis", "steps", "step", "startedAt",
                                  "telemetryInterval", "analysedBefore"})
    if unknown:
        raise BadRequest(f"unknown metadata key(s) {unknown}", f"metadata.{unknown[0]}")
    try:
        request = JudgeRequest.model_validate(req)
    except ValidationError as e:
        raise _bad(e, "metadata.") from None
    return FlaggerCall(body["name"], body["namespace"], body["phase"], checksum, request)


@dataclass(frozen=True)
class PodRef:
    """A pod a selector picked, as the judge reads it: where it runs and when it became Ready."""

    name: str
    side: str
    ip: str | None
    node: str | None
    ready: bool
    ready_at: float | None


def pod_ref(body: Mapping[str, Any], side: str) -> PodRef:
    """A PodRef from a Pod object of the API."""
    meta = body.get("metadata") or {}
    st = body.get("status") or {}
    ready = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), None)
    is_ready = bool(ready and ready.get("status") == "True") and not meta.get("deletionTimestamp")
    try:
        at = parse_time(ready.get("lastTransitionTime")) if is_ready and ready else None
    except ValueError:
        at = None
    return PodRef(str(meta.get("name", "")), side, st.get("podIP") or None, (body.get("spec") or {}).get("nodeName"),
                  is_ready, at or None)


def decide(req: JudgeRequest, windows: Sequence[Window], pods: Sequence[PodRef], *, now: float,
           unavailable: str | None = None, lay: gate.Layout | None = None) -> gate.Decision:
    """The gate's decision on the request's pods: the same `gate.decide` a VLMService's look calls, with the same
    policy mapping and as much of the layout as the judge can see (`layout`): the pods' nodes (a canary pod on a
    node where a baseline pod runs now is compared with it, Concurrent), each canary pod's Ready time (its warm-up
    is left out), and the baseline pods' pre-period (their windows before the evidence starts, from the sidecars'
    own history or Prometheus). What the judge cannot know: which baseline pod a canary pod replaced (the caller's
    rollout deleted it, and its sidecar with it), so no canary pod is compared as Replace; and the service's
    calibration from finished rollouts (the judge keeps nothing between calls)."""
    policy = req.policy()
    steps = req.schedule()
    k = len(steps) - 1 if req.step is None else req.step
    started, since = req.window(pods, now)
    common: dict[str, Any] = dict(
        started_at=started, now=now, step_duration_s=parse_duration(steps[k].analysis), step=k,
        evidence_since=since, layout=lay if lay is not None else layout(req, windows, pods, now))
    if unavailable is not None:
        return gate.decide([], [], policy, unavailable=unavailable, **common)
    base = [w for w in windows if w.revision == BASELINE and w.end > since]
    can = [w for w in windows if w.revision == CANARY and w.end > since]
    return gate.decide(base, can, policy, **common)


def pre_period_since(req: JudgeRequest, pods: Sequence[PodRef], now: float) -> float:
    """Where the windows the judge reads begin: the baseline pods' pre-period (gate.PRE_PERIOD_S) before the
    evidence starts."""
    return req.window(pods, now)[1] - gate.PRE_PERIOD_S


def layout(req: JudgeRequest, windows: Sequence[Window], pods: Sequence[PodRef], now: float) -> gate.Layout:
    """What the judge knows of where the pods run: every listed pod's node, the canary pods' Ready times, and the
    pre-period of the baseline pods that run now (their windows in the PRE_PERIOD_S before the evidence starts;
    none where the source's history does not reach back that far)."""
    since = req.window(pods, now)[1]
    nodes = {p.name: p.node for p in pods if p.node}
    running = {p.name for p in pods if p.side == BASELINE and p.ready}
    pre = [w for w in windows if w.revision == BASELINE and w.pod in running and since - gate.PRE_PERIOD_S < w.end <= since]
    return gate.Layout(
        nodes=nodes,
        before=gate.pre_period(pre, req.policy(), nodes, since) if pre else {},
        started={p.name: p.ready_at for p in pods if p.side == CANARY and p.ready_at is not None},
    )


def outcome(req: JudgeRequest, d: gate.Decision) -> str:
    """The look's outcome in the three the gate decides between, plus waiting: Rollback; Expand (before the last
    step: every signal under its harm ceiling; Argo Rollouts and Flagger continue to their next step); Promote (at
    the last step, non-inferior within the margin); Wait (Continue, Inconclusive, Pause: no verdict yet)."""
    if d.verdict == "Rollback":
        return "Rollback"
    if d.verdict == "Promote":
        last = req.step is None or req.step >= len(req.schedule()) - 1
        return "Promote" if last else "Expand"
    return "Wait"


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 6)


def flamegraph(namespace: str, canary: Sequence[Window], pods: Sequence[PodRef]) -> dict[str, str] | None:
    """Where a user opens the flamegraph diff: the slowest canary pod (highest mean loop latency) against a
    baseline pod, through `kubectl vlm profile` or the API server's pod proxy (the sidecar's /profile/diff.svg)."""
    loops: dict[str, list[float]] = {}
    for w in canary:
        if w.loop_mean_seconds and not w.stale:
            loops.setdefault(w.pod, []).append(w.loop_mean_seconds)
    base = sorted(p.name for p in pods if p.side == BASELINE and p.ready)
    if not loops or not base:
        return None
    pod = max(sorted(loops), key=lambda p: sum(loops[p]) / len(loops[p]))
    proxy = f"/api/v1/namespaces/{namespace}/pods/{{pod}}:{SIDECAR_PORT}/proxy/profile/"
    return {
        "canaryPod": pod,
        "baselinePod": base[0],
        "kubectl": f"kubectl vlm profile {pod} -n {namespace} --view diff --against pod/{base[0]} -o diff.svg",
        "canaryFlamegraph": proxy.format(pod=pod) + "latest.svg",
        "baselineCollapsed": proxy.format(pod=base[0]) + "latest.json",
        "diff": proxy.format(pod=pod) + "diff.svg",
    }


def response(req: JudgeRequest, d: gate.Decision, windows: Sequence[Window], pods: Sequence[PodRef], *,
             now: float, source: str, lay: gate.Layout | None = None) -> dict[str, Any]:
    """The answer: the verdict with the gate's names, `pass` (1 Promote, 0 not yet, -1 Rollback), the reason and
    message, every signal's estimate and interval, what grew (stage, function, `caller -> function` when the
    sidecars' call edges attribute it), where the flamegraph diff is, and what was read."""
    fn = d.regressed_function
    caller, _, callee = fn.partition(CALLER_ARROW) if fn else ("", "", "")
    started, since = req.window(pods, now)
    canary = [w for w in windows if w.revision == CANARY and w.end > since]
    lay = lay if lay is not None else layout(req, windows, pods, now)
    clock = d.clock_started_at if d.clock_started_at is not None else started
    return {
        "id": req.id,
        "verdict": d.verdict,
        "outcome": outcome(req, d),
        "pass": PASS[d.verdict],
        "reason": d.reason,
        "decidedBy": d.decided_by,
        "message": d.message,
        "regressedStage": d.regressed_stage,
        "regressedFunction": (callee or fn) if fn else None,
        "regressedCaller": caller if fn and callee else None,
        "warning": "\n".join(w for w in (d.warning, d.ceiling_warning) if w) or None,
        "signals": [
            {"name": s.name, "verdict": s.verdict, "baseline": _num(s.baseline), "canary": _num(s.canary),
             "delta": _num(s.delta), "ciLow": _num(s.ci_low), "ciHigh": _num(s.ci_high),
             "pValue": _num(s.p_value), "margin": _num(s.margin), "promoteMargin": _num(s.promote_margin),
             "ceiling": _num(s.ceiling), "expandBound": _num(s.expand_bound), "information": _num(s.information),
             "nBaseline": s.n_baseline, "nCanary": s.n_canary, "covariateCut": _num(s.covariate_cut)}
            for s in d.signals
        ],
        "flamegraphDiff": flamegraph(req.namespace, canary, pods) if d.verdict == "Rollback" else None,
        "analysis": {
            "source": source,
            "startedAt": started,
            "evidenceSince": since,
            "clockStartedAt": d.clock_started_at,
            "elapsedSeconds": round(max(0.0, now - clock), 3),
            "now": now,
            "baselinePods": sorted(p.name for p in pods if p.side == BASELINE and p.ready),
            "canaryPods": sorted(p.name for p in pods if p.side == CANARY and p.ready),
            "windows": {BASELINE: sum(1 for w in windows if w.revision == BASELINE and w.end > since),
                        CANARY: len(canary)},
            "prePeriodPods": sorted(b for b in lay.before),
            "pairing": list(d.pairing) or None,
            "resolvableMargin": _num(d.resolvable_margin),
            "warmupShift": _num(d.warmup_shift),
            "sglangAgreement": {k: round(100 * v, 2) for k, v in d.sglang_disagreement.items()} or None,
        },
    }


def flagger_status(verdict: str) -> int:
    return FLAGGER_STATUS[verdict]

