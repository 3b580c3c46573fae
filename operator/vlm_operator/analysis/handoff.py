"""The one hand-off between reading signals and deciding.

For one reconcile of one service: the policy is built once from the spec, the source is chosen once
(`sources.choose`), the pods are split into baseline and canary once, and the gate decides; the stable pods'
windows of the same read feed the profiler summary and the IPC cache's verdict. Reconcile calls `gather`
once; what it returns is all the rest of the reconcile knows about signals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vlm_operator.analysis import gate, sources
from vlm_operator.analysis.profile import profiler_status
from vlm_operator.analysis.window import Window
from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.names import ACTIVE_PHASES, ROLE_BASELINE, ROLE_CANARY
from vlm_operator.api.units import parse_duration, parse_time
from vlm_operator.cluster.observed import Observed

PROFILER_SPAN_WINDOWS = 4  # status.profiler summarises the windows of the last 4 telemetry intervals


@dataclass(frozen=True)
class Before:
    """A rollout's start, read once before any pod is replaced: the stable pods' pre-period, the loop-latency
    margin the rollout can resolve (relative), the margin the user asked for and loop latency's harm ceiling
    (relative: the fixed one, or the default at one canary pod's spread)."""

    pods: list[api.BeforeStatus]
    resolvable: float
    margin: float | None
    ceiling: float | None = None


@dataclass(frozen=True)
class Gathered:
    """What one reconcile read and judged: the gate's decision (None when no look was due), status.profiler
    (the current one when not recomputed), and the stable pods' windows when they were read (else None)."""

    decision: gate.Decision | None
    profiler: api.ProfilerStatus | None
    stable_windows: list[Window] | None
    before: Before | None = None


@dataclass(frozen=True)
class Context:
    """The operator-wide inputs of the hand-off (from its settings and its runtime)."""

    reader: sources.SidecarReader
    prometheus_url: str | None  # the operator's default, when the spec names none
    profiler_tolerance: float
    profiler_refresh_s: float


def policy_for(spec: api.VLMServiceSpec) -> gate.GatePolicy | None:
    """The gate's policy of a spec with a rollout block (None without one). Raises InvalidSpec for an analysis
    the gate cannot run: called while the spec is validated, so such a spec is reported, never half-applied."""
    return gate.GatePolicy.from_spec(spec) if spec.rollout is not None else None


def due(spec: api.VLMServiceSpec, prev: api.RolloutStatus | None, observed: Observed, revision: str, now: float) -> bool:
    """Is a look of the gate due this round? (Only then does the reconcile pay for reading the canary's signals.)"""
    if spec.rollout is None or prev is None or prev.revision != revision or prev.phase not in ("Analysing", "Promoting"):
        return False
    if prev.analysis_started_at is None or observed.updated_ready(ROLE_CANARY, revision) < 1:
        return False
    if prev.last_analysis_at is None:
        return True
    return now - parse_time(prev.last_analysis_at) >= parse_duration(spec.rollout.analysis.interval)


def source_for(ctx: Context, spec: api.VLMServiceSpec, namespace: str, name: str, observed: Observed) -> sources.Source:
    analysis = spec.rollout.analysis if spec.rollout else None
    url = (analysis.prometheus_url if analysis else None) or ctx.prometheus_url
    return sources.choose(
        analysis.source if analysis else "Auto",
        url,
        namespace=namespace,
        service=name,
        interval_s=parse_duration(spec.telemetry.interval),
        pods=[(p.name, p.revision, p.ip) for p in observed.pods if p.ready],
        reader=ctx.reader,
    )


def gather(
    ctx: Context,
    spec: api.VLMServiceSpec,
    policy: gate.GatePolicy | None,
    observed: Observed,
    *,
    namespace: str,
    name: str,
    prev: api.RolloutStatus | None,
    revision: str,
    stable_rev: str | None,
    current_profiler: api.ProfilerStatus | None,
    profiler_due: Callable[[float], bool],
    now: float,
    calibration: gate.Calibration | None = None,
) -> Gathered:
    """Read the signals this round needs (a look of the gate when `due`, the profiler summary when
    `profiler_due(interval)` says so) from one source, and judge them."""
    calibration = calibration or gate.Calibration()
    look = bool(stable_rev and policy is not None and due(spec, prev, observed, revision, now))
    interval = parse_duration(spec.telemetry.interval)
    summarise = bool(spec.telemetry.enabled and stable_rev and profiler_due(interval))
    before = None
    if stable_rev and policy is not None and starting(spec, prev, revision, stable_rev):
        before = before_start(ctx, spec, policy, observed, namespace=namespace, name=name, stable_rev=stable_rev,
                              calibration=calibration, now=now)
    if not (look or summarise):  # most reconciles: nothing to read, no source to build
        return Gathered(None, current_profiler, None, before)
    source = source_for(ctx, spec, namespace, name, observed)
    decision = (_look(source, spec, policy, observed, prev, stable_rev, now, calibration)  # type: ignore[arg-type]
                if look else None)
    profiler, windows = current_profiler, None
    if summarise:
        try:
            windows = source.read([stable_rev], now - PROFILER_SPAN_WINDOWS * interval, now)  # type: ignore[list-item]
        except sources.SignalsUnavailable:
            windows = None
        else:
            profiler = profiler_status(
                current_profiler, windows, tolerance=ctx.profiler_tolerance, refresh_s=ctx.profiler_refresh_s
            )
    return Gathered(decision, profiler, windows, before)


def split(windows: Sequence[Window], observed: Observed, stable_rev: str, canary_rev: str, baseline: str
          ) -> tuple[list[Window], list[Window], list[Window]]:
    """(baseline, canary, spread reference): with a Fresh baseline the fresh pods are the baseline and the
    long-running stable pods only tell how much pods differ; otherwise the stable pods are the baseline."""
    fresh = {p.name for p in observed.pods if p.role == ROLE_BASELINE}
    stable = [w for w in windows if w.revision == stable_rev and w.pod not in fresh]
    canary = [w for w in windows if w.revision == canary_rev]
    if baseline == "Fresh":
        return [w for w in windows if w.pod in fresh and w.revision == stable_rev], canary, stable
    return stable, canary, []


def _look(
    source: sources.Source, spec: api.VLMServiceSpec, policy: gate.GatePolicy, observed: Observed,
    prev: api.RolloutStatus, stable_rev: str, now: float, calibration: gate.Calibration,
) -> gate.Decision:
    started = parse_time(prev.analysis_started_at)
    data = parse_time(prev.data_started_at) if prev.data_started_at else None
    since = min(started, parse_time(prev.evidence_since)) if prev.evidence_since else started
    steps = spec.steps()
    k = min(prev.step, len(steps) - 1)
    common: Mapping[str, Any] = dict(
        started_at=started, now=now, step_duration_s=parse_duration(steps[k].analysis), data_started_at=data,
        step=k, evidence_since=since, layout=layout(observed, prev), calibration=calibration)
    try:
        windows = source.read([stable_rev, prev.revision or ""], since, now)
    except sources.SignalsUnavailable as e:
        # Still the gate's call: at maxDuration it applies onInconclusive (and never promotes without data).
        return gate.decide([], [], policy, unavailable=str(e), **common)
    base, can, ref = split(windows, observed, stable_rev, prev.revision or "", prev.baseline or "Stable")
    if (prev.baseline or "Stable") == "Stable":
        base = warmed(base, observed, stable_rev, started, {b.pod for b in prev.before})
    return gate.decide(base, can, policy, spread_reference=ref, **common)


def warmed(base: Sequence[Window], observed: Observed, stable_rev: str, started: float, before: set[str]
           ) -> list[Window]:
    """The stable windows the gate compares with: a stable pod that became Ready after the analysis began (an
    autoscaler's scale-up, a restart) and has no pre-period in status counts only once it has run
    gate.PRE_PERIOD_S; its windows before that are its warm-up (a new pod's start is its own speed, not the
    fleet's), so it is no pair and no part of the stable mean until then."""
    joined = {p.name: p.ready_since for p in observed.pods
              if p.revision == stable_rev and p.ready_since is not None and p.ready_since > started
              and p.name not in before}
    return [w for w in base if w.pod not in joined or w.end >= joined[w.pod] + gate.PRE_PERIOD_S]


def layout(observed: Observed, prev: api.RolloutStatus) -> gate.Layout:
    """Where this look's pods run (their nodes), each new pod's pair, and the pre-period, for the gate."""
    return gate.Layout(
        nodes={p.name: p.node for p in observed.pods if p.node},
        replaced={x.pod: x.replaced for x in prev.pairs if x.pod and x.replaced and not x.dropped},
        before={b.pod: gate.Before(b.pod, b.node, math.log(b.loop_seconds), b.windows)
                for b in prev.before if b.loop_seconds > 0},
        started={x.pod: parse_time(x.ready_at) for x in prev.pairs if x.pod and x.ready_at and not x.dropped},
    )


def calibration_of(status: api.CalibrationStatus | None) -> gate.Calibration:
    if status is None:
        return gate.Calibration()
    restart = status.restart_spread if status.restart_spread is not None else 0.0
    return gate.Calibration(
        pod_ss=(status.pod_spread / 100) ** 2 * status.pod_df, pod_df=status.pod_df,
        restart_ss=(restart / 100) ** 2 * status.restart_df, restart_df=status.restart_df)


def calibration_status(c: gate.Calibration, rollouts: int) -> api.CalibrationStatus:
    f = c.node_bound_share
    return api.CalibrationStatus(
        pod_spread=round(100 * math.sqrt(c.pod_ss / c.pod_df), 3) if c.pod_df else 0.0,
        pod_df=round(c.pod_df, 2),
        restart_spread=round(100 * math.sqrt(c.restart_ss / c.restart_df), 3) if c.restart_df else None,
        restart_df=round(c.restart_df, 2),
        node_bound_share=None if f is None else round(f, 3),
        rollouts=rollouts,
    )


def starting(spec: api.VLMServiceSpec, prev: api.RolloutStatus | None, revision: str, stable_rev: str) -> bool:
    """Does this round start a rollout of `revision` (or run one that has no pre-period yet)?"""
    if spec.rollout is None or revision == stable_rev:
        return False
    return prev is None or prev.revision != revision or prev.phase not in ACTIVE_PHASES or prev.before_at is None


def before_start(
    ctx: Context, spec: api.VLMServiceSpec, policy: gate.GatePolicy, observed: Observed, *, namespace: str,
    name: str, stable_rev: str, calibration: gate.Calibration, now: float,
) -> Before:
    """Once per rollout, before any pod is replaced: the stable pods' pre-period (read over the default step's
    analysis time, 5 minutes; empty when the signals cannot be read) and the margin the rollout can resolve."""
    nodes = {p.name: p.node for p in observed.pods if p.node}
    pre: dict[str, gate.Before] = {}
    if spec.telemetry.enabled:
        try:
            windows = source_for(ctx, spec, namespace, name, observed).read([stable_rev], now - gate.PRE_PERIOD_S, now)
        except sources.SignalsUnavailable:
            windows = []
        pre = gate.pre_period([w for w in windows if w.revision == stable_rev], policy, nodes, now)
    out = [api.BeforeStatus(pod=b.pod, node=b.node, loop_seconds=math.exp(b.mean_log), windows=b.windows)
           for b in sorted(pre.values(), key=lambda b: b.pod)]
    return Before(out, gate.resolvable_before_start(policy, calibration, pre), policy.max_regression.get("loop_latency"),
                  gate.ceiling_before_start(policy, calibration, pre))
