"""The decision: one verdict for one look at a canary step, with its reason and message.

`decide` is the gate's only entry point. Pure: the caller gathers windows (vlm_operator.analysis.handoff), passes the
clock in as `now`, and acts on the returned Decision. The same inputs give the same Decision, so an operator
restarted mid-analysis reaches the same verdict from status. The rule in short (docs/canary-analysis.md has
the long form and the measured error rates):
- unit of analysis: one profiler window of one pod; TP ranks of a pod that cover the same time are
  averaged first (gate.samples);
- per signal, the canary pods' time-paired differences pooled pod by pod with the pod spread in every bound
  (gate.compare), read by three tests whose bounds hold over every look (gate.sequential):
- Rollback when a signal is worse than half its margin with confidence (the rollout's budget split over the
  gated signals) AND its estimate exceeds the margin, naming the stage and function that grew
  (gate.attribution); decided by evidence, at any look;
- before the last step, Promote (the rollout expands to the next step) once the step's analysis time has passed
  and every signal's expand bound is under its harm ceiling, or inside its promotion margin already;
- at the last step, Promote once its analysis time has passed and every signal's promotion bound is inside its
  margin (one-sided non-inferiority; a faster canary passes);
- no step advances on an estimate alone; undecided at maxDuration: onInconclusive (decided by the clock);
- Inconclusive on stale data, no traffic, too few windows or unreachable sources; at maxDuration this module
  alone applies onInconclusive, and missing data never promotes. The rollout only maps the verdict to an
  action.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from vlm_operator.analysis import stats
from vlm_operator.analysis.gate import paired, sequential
from vlm_operator.analysis.gate.attribution import (
    regressed_function,
    regressed_role_function,
    regressed_stage,
)
from vlm_operator.analysis.gate.compare import (
    Instance,
    evaluate,
    has_values,
    instances,
    plan_instance,
    resolvable,
)
from vlm_operator.analysis.gate.policy import SIGNALS, GatePolicy, family_of
from vlm_operator.analysis.gate.samples import Side, Unit, make_units, sglang_disagreement, side
from vlm_operator.analysis.gate.verdict import Decision, SignalResult
from vlm_operator.analysis.window import Window


def decide(
    baseline: Sequence[Window],
    canary: Sequence[Window],
    policy: GatePolicy,
    *,
    started_at: float,
    now: float,
    step_duration_s: float,
    unavailable: str | None = None,
    spread_reference: Sequence[Window] = (),
    data_started_at: float | None = None,
    step: int | None = None,
    evidence_since: float | None = None,
    layout: paired.Layout | None = None,
    calibration: paired.Calibration | None = None,
) -> Decision:
    """Judge the canary step whose canary pods were all Ready at `started_at`, as of `now` (unix seconds).

    The step's clock (analysisTime, maxDuration, the planned looks) starts at the end of the canary's
    first fresh profiler window at or after `started_at` (`data_started_at` once a previous look found
    it; the decision returns it as `clock_started_at`), so neither start-up nor a sidecar that takes a
    while to find the scheduler eats the analysis time. While no such window exists the clock runs from
    `started_at`: a canary whose profiler never delivers reaches maxDuration as ProfilerStale, which is
    decided as missing data (never a promotion). `unavailable`: the signal sources could not be read this
    time (the message says why); that is a data problem like a stale profiler, decided here too.
    `spread_reference`: windows of other pods of the baseline's revision (the stable pods, when the
    baseline is fresh), used only to estimate the between-pod variance.
    `step`: the step's index in the schedule (None: the last): before the last step a pass expands the
    canary, at the last it promotes it.
    `evidence_since`: windows from here on count (the rollout's first analysis: canary pods of earlier steps
    keep adding evidence); None: the step's start. `layout`: where the pods run, the pairs and the
    pre-period (gate.paired); `calibration`: what the service's finished rollouts measured.
    """
    clock = data_started_at
    if clock is None and unavailable is None:
        clock = min((w.end for w in canary if not w.stale and w.end >= started_at), default=None)
    started_at = clock if clock is not None else started_at
    elapsed = now - started_at
    since = min(started_at, evidence_since) if evidence_since is not None else started_at
    warm: list[Window] = []
    if unavailable is not None:
        b = c = Side((), ("SignalsUnavailable", unavailable))
    else:
        layout_ = layout or paired.Layout()
        warm = [w for w in canary if w.end < layout_.started.get(w.pod, -math.inf) + policy.warmup_s]
        canary = [w for w in canary if w.end >= layout_.started.get(w.pod, -math.inf) + policy.warmup_s]
        b = side("baseline", baseline, policy, since, now)
        c = side("canary", canary, policy, since, now)
    enough = len(b.units) >= policy.min_samples and len(c.units) >= policy.min_samples

    k = policy.steps - 1 if step is None else min(step, policy.steps - 1)
    last_step = k == policy.steps - 1
    by_family: dict[str, list[Instance]] = defaultdict(list)
    ref = side("reference", spread_reference, policy, since, now).units if spread_reference else ()
    layout = layout or paired.Layout()
    calibration = calibration or paired.Calibration()
    loop_v: paired.Variances | None = None
    evidence = paired.Evidence()
    # Loop latency first: the other signals borrow its restart share.
    for inst in sorted(instances(policy, b.units, c.units, ref), key=lambda i: i.family != "loop_latency"):
        planned, v, ev = plan_instance(inst, layout, calibration, policy.pair_s, loop_v)
        if inst.family == "loop_latency":
            loop_v, evidence = v, ev
        by_family[inst.family].append(planned)
    # Weighted Bonferroni: each gated family that has data gets an equal part of the rollout's rollback
    # budget, split evenly over its members (stages, functions), so loop latency keeps its power however
    # many functions are watched, and request signals nobody scrapes cost nothing (which families have data
    # depends on the sources, not on the values, so the bound still holds). The looks need no share: each
    # test's boundary holds over all of them (gate.sequential). Expanding and promoting need every signal
    # to pass (intersection-union tests), so their levels are not split.
    families = max(1, sum(any(has_values(i) for i in insts) for insts in by_family.values()))
    alpha = 1.0 - policy.confidence
    signals = tuple(
        result
        for family, insts in by_family.items()
        for result in evaluate(
            family, insts, policy, max(stats.bonferroni(alpha, families, len(insts)), 1e-12), enough,
            remaining_s=max(0.0, policy.max_duration_s - elapsed))
    )

    def attribution(signal: str | None = None) -> tuple[str | None, str | None]:
        """(function, stage) that grew most; for a front-end signal the role's function and no stage. A verdict
        on one stage's time (the profiler's or SGLang's counters) names that stage: the evidence is on it, where
        the stage that grew most by point estimate can be a noisier one (a node pair's run_batch on a loaded
        host, 2026-12-08)."""
        if not (b.units and c.units):
            return None, None
        if signal is not None and family_of(signal) == "frontend_busy":
            return regressed_role_function(b.units, c.units, signal.split(":", 1)[1]), None
        if signal is not None and family_of(signal) in ("stage_time", "sglang_stage_time"):
            return regressed_function(b.units, c.units), signal.split(":", 1)[1]
        return regressed_function(b.units, c.units), regressed_stage(b.units, c.units)

    decision = _judge(policy, b, c, signals, elapsed, step_duration_s, attribution, last_step)
    loop = by_family.get("loop_latency") or []
    kinds = tuple(sorted({p.kind for i in loop for p in i.plans.values()}))
    resolvable = resolvable_margin(policy, loop_v) if loop_v is not None else None
    return replace(
        decision, warning=_resolution(policy, resolvable), ceiling_warning=_ceiling_warning(signals),
        clock_started_at=clock, evidence=evidence,
        resolvable_margin=resolvable, pairing=kinds, warmup_shift=_warmup_shift(warm, c.units, policy),
        sglang_disagreement={side: v for side, units in (("baseline", b.units), ("canary", c.units))
                             if (v := sglang_disagreement(units)) is not None},
    )


def _warmup_shift(warm: Sequence[Window], units: Sequence[Unit], policy: GatePolicy) -> float | None:
    """How much slower (relative) the canary pods ran in their warm-up than after it: per pod with both, the
    difference of mean log loop latency, averaged over pods. None where no pod has both."""
    early = make_units([w for w in warm if not w.stale and w.loop_mean_seconds], policy.rank_merge_s)
    diffs = []
    for pod in sorted({u.pod for u in early}):
        a = [math.log(v) for u in early if u.pod == pod and (v := u.values["loop_latency"])]
        b = [math.log(v) for u in units if u.pod == pod and (v := u.values["loop_latency"])]
        if a and b:
            diffs.append(sum(a) / len(a) - sum(b) / len(b))
    return math.expm1(sum(diffs) / len(diffs)) if diffs else None


def resolvable_margin(policy: GatePolicy, v: paired.Variances, pods: int | None = None) -> float:
    """The smallest loop-latency margin the rollout can resolve from the pods' spread alone (relative, 0.05 =
    5%): the margin within which a harmless canary is promoted 95% of the time at the last step
    (`compare.resolvable`), with its canary pods each paired on its node (restart spread; the stable mean's spread
    where that is smaller). Where the margin is narrower, the promotion bound is held to this one instead
    (`SignalResult.promote_margin`) and the decision warns. The windows' own noise comes on top."""
    m = max(1, pods or (policy.step_pods[-1] if policy.step_pods else 1))
    return math.expm1(resolvable(1.0 - policy.confidence, min(2 * v.restart, v.pod), m))


def _judge(
    policy: GatePolicy,
    b: Side,
    c: Side,
    signals: tuple[SignalResult, ...],
    elapsed: float,
    step_duration_s: float,
    attribution: Callable[..., tuple[str | None, str | None]],
    last_step: bool,
) -> Decision:
    failed = [s for s in signals if s.verdict == "fail"]
    if failed:
        # Evidence gathered while the canary ran stays evidence even if its profiler went stale since.
        worst = max(failed, key=_severity)
        fn, stage = attribution(worst.name)
        msg = f"{_describe(worst)}"
        if family_of(worst.name) == "frontend_busy":
            msg += f"; grew most: {worst.name.split(':', 1)[1]} function {fn or 'n/a'}"
        elif stage or fn:
            msg += f"; grew most: stage {stage or 'n/a'}, function {fn or 'n/a'}"
        return Decision("Rollback", SIGNALS[family_of(worst.name)].reason, msg, signals, fn, stage,
                        decided_by="evidence")

    at_max = elapsed >= policy.max_duration_s
    problem = c.problem or b.problem
    if problem is not None:
        reason, msg = problem
        if not at_max:
            return Decision("Inconclusive", reason, msg, signals)
        return _at_max_duration(
            policy, signals, f"{reason}: {msg}", data_missing=True, attribution=attribution
        )

    blocking = [s for s in signals if not (s.verdict == "insufficient" and _optional_absent(s))]
    if not blocking:
        msg = "none of the gated signals has values on either revision"
        if not at_max:
            return Decision("Inconclusive", "TooFewSamples", msg, signals)
        return _at_max_duration(policy, signals, msg, data_missing=True, attribution=attribution)
    # Before the last step a canary expands once every signal is under its ceiling (or already inside its
    # margin); at the last step it is promoted only inside its promotion margin.
    ok = ("pass",) if last_step else ("pass", "expand")
    if all(s.verdict in ok for s in blocking):
        if elapsed >= step_duration_s:
            worst = max(blocking, key=_severity)
            if last_step:
                return Decision("Promote", "NoRegression", f"every signal within its margin; closest: "
                                f"{_describe(worst)}", signals, decided_by="evidence")
            by_ceiling = any(s.verdict == "expand" for s in blocking)
            return Decision(
                "Promote", "BelowCeiling" if by_ceiling else "NoRegression",
                f"expanding: every signal under its harm ceiling; closest: {_describe(worst, ceiling=True)}",
                signals, decided_by="ceiling" if by_ceiling else "evidence")
        msg = f"no regression so far; step analysis time {elapsed:.0f}s of {step_duration_s:.0f}s"
        return Decision("Continue", "StepInProgress", msg, signals)
    undecided = [s for s in blocking if s.verdict not in ok] or list(signals)
    msg = "undecided: " + "; ".join(_describe(s, ceiling=not last_step) for s in undecided[:3])
    if not at_max:
        return Decision("Continue", "AwaitingEvidence", msg, signals)
    return _at_max_duration(policy, signals, msg, data_missing=False, attribution=attribution)


def _optional_absent(s: SignalResult) -> bool:
    """An optional signal (request metrics, SGLang's stage counters, the front end) with no estimate yet: too few
    paired windows on either side, or none at all (throughput where neither revision's pods were saturated in
    the same windows). It is reported and holds nothing; with an estimate it is held to its bounds."""
    return not SIGNALS[family_of(s.name)].required and s.delta is None


def _at_max_duration(
    policy: GatePolicy,
    signals: tuple[SignalResult, ...],
    why: str,
    *,
    data_missing: bool,
    attribution: Callable[..., tuple[str | None, str | None]],
) -> Decision:
    reason = "MaxDurationReached"
    action = policy.on_inconclusive
    prefix = f"no verdict within maxDuration {policy.max_duration_s:.0f}s ({why})"
    if why.startswith("NoTraffic:"):
        # Nothing was measured because nothing was served: a rollback would throw the change away for want of
        # traffic, not for a regression. The rollout pauses for a person (or the load hook) instead.
        return Decision("Pause", "NoTraffic", f"{prefix}; pausing: a step without traffic is never rolled back",
                        signals, decided_by="timeout")
    if action == "Rollback":
        fn, stage = attribution()
        return Decision("Rollback", reason, f"{prefix}; onInconclusive Rollback", signals, fn, stage, decided_by="timeout")
    if action == "Promote" and not data_missing:
        return Decision("Promote", reason, f"{prefix}; onInconclusive Promote", signals, decided_by="timeout")
    if action == "Promote":
        return Decision("Pause", reason, f"{prefix}; onInconclusive Promote refused without data, pausing", signals, decided_by="timeout")
    return Decision("Pause", reason, f"{prefix}; onInconclusive Pause", signals, decided_by="timeout")


def _resolution(policy: GatePolicy, resolvable: float | None) -> str | None:
    """A warning when the pods' own spread keeps the loop-latency margin from being resolved (resolvable_margin)."""
    margin = policy.max_regression.get("loop_latency")
    if resolvable is None or margin is None or resolvable <= margin:
        return None
    return (
        f"with this schedule and the pods' measured spread the gate can resolve loop-latency margins of about "
        f"{resolvable:.1%} or more, against a margin of {margin:.0%}: a canary is promoted only within that wider "
        f"margin; add pods to the last step, or widen maxRegression.loopLatency"
    )


def _ceiling_warning(signals: Sequence[SignalResult]) -> str | None:
    """A warning when a fixed expandCeiling is below the default one canary pod's noise calls for: a harmless
    canary then rarely expands, and its steps wait for maxDuration (onInconclusive). One line per signal, each
    starting with the setting's name, which is what says whether it was already told (rollout.steps)."""
    out = []
    for s in signals:
        if s.default_ceiling is None or s.harmless_expand_rate is None or s.ceiling is None:
            continue
        family, _, member = s.name.partition(":")
        key = "".join(w if i == 0 else w.title() for i, w in enumerate(family.split("_")))
        out.append(
            f"expandCeiling.{key}{f' ({member})' if member else ''} {s.ceiling:.1%} is below the {s.default_ceiling:.1%} "
            f"one canary pod's measured noise calls for: a harmless canary passes the expand test at a look about "
            f"{s.harmless_expand_rate:.0%} of the time (99% at the default), so steps may wait for maxDuration and "
            f"onInconclusive: raise the ceiling or remove it")
    return "\n".join(dict.fromkeys(out)) or None


def _severity(s: SignalResult) -> float:
    spec = SIGNALS[family_of(s.name)]
    worse = (s.delta or 0.0) * (1 if spec.higher_is_worse else -1)
    if s.margin > 0:
        return worse / s.margin
    return math.inf if worse > 0 else worse


def _fmt_delta(s: SignalResult, ceiling: bool = False) -> str:
    if s.delta is None:
        return "n/a"
    linear = SIGNALS[family_of(s.name)].scale == "linear"

    def f(x: float | None) -> str:
        return "n/a" if x is None else (f"{x * 100:+.1f}pp" if linear else f"{x:+.1%}")

    def a(x: float | None) -> str:
        return "n/a" if x is None else (f"{x * 100:.1f}pp" if linear else f"{x:.1%}")

    out = f"{f(s.delta)} (bounds {f(s.ci_low)}..{f(s.ci_high)}, allowed {a(s.margin)}"
    if s.promote_margin is not None and s.promote_margin > s.margin + 1e-9:
        out += f", resolvable {a(s.promote_margin)}"
    if ceiling and s.ceiling is not None:
        out += f"; expand bound {f(s.expand_bound)}, ceiling {a(s.ceiling)}"
    return out + f", {s.pods} canary pod{'s' if s.pods != 1 else ''})"


def _describe(s: SignalResult, ceiling: bool = False) -> str:
    what = SIGNALS[family_of(s.name)].label
    if ":" in s.name:
        what = f"{what} of {s.name.split(':', 1)[1]}"
    return f"{what} {_fmt_delta(s, ceiling)} over {s.n_canary} canary / {s.n_baseline} baseline windows"


def pre_period(windows: Sequence[Window], policy: GatePolicy, nodes: Mapping[str, str], now: float
               ) -> dict[str, paired.Before]:
    """The stable pods' loop latency before the rollout replaces any (the pre-period of same-node pairs): per
    pod, the mean log loop time over its fresh windows with traffic (TP ranks merged)."""
    units = side("pre-period", windows, policy, -math.inf, now).units
    by_pod: dict[str, list[float]] = defaultdict(list)
    for u in units:
        v = u.values["loop_latency"]
        if v is not None and v > 0:
            by_pod[u.pod].append(math.log(v))
    return {p: paired.Before(p, nodes.get(p), sum(xs) / len(xs), len(xs)) for p, xs in by_pod.items() if xs}


def resolvable_before_start(policy: GatePolicy, calibration: paired.Calibration, pre: Mapping[str, paired.Before]
                            ) -> float:
    """resolvable_margin before the first look: the pod spread from the history, the prior and the stable pods'
    pre-period means (their spread includes their windows' noise: an upper reading)."""
    return resolvable_margin(policy, _variances_before_start(calibration, pre))


def ceiling_before_start(policy: GatePolicy, calibration: paired.Calibration, pre: Mapping[str, paired.Before]
                         ) -> float:
    """Loop latency's harm ceiling (relative) before the first look: the fixed one where expandCeiling sets it,
    else the default (gate.sequential.ceiling) at one canary pod's spread as resolvable_margin reads it (paired on
    its node; the stable mean's spread where that is smaller). Each look's own, with its windows' noise on top,
    replaces it (SignalResult.ceiling)."""
    fixed = policy.expand_ceiling.get("loop_latency")
    if fixed is not None:
        return fixed
    v = _variances_before_start(calibration, pre)
    margin = math.log1p(policy.max_regression.get("loop_latency", 0.0))
    last = max(1, policy.step_pods[-1] if policy.step_pods else 1)
    return math.expm1(sequential.ceiling(sequential.EXPAND_ALPHA, math.sqrt(min(2 * v.restart, v.pod)), last, margin))


def _variances_before_start(calibration: paired.Calibration, pre: Mapping[str, paired.Before]) -> paired.Variances:
    means = [b.mean_log for b in pre.values()]
    cur: tuple[float, float] = (0.0, 0.0)
    if len(means) >= 2:
        m = sum(means) / len(means)
        cur = (sum((x - m) ** 2 for x in means), float(len(means) - 1))
    pod, pod_df = paired.pooled(paired.PRIOR_POD_SD_LOG**2, paired.PRIOR_DF, (calibration.pod_ss, calibration.pod_df), cur,
                                 yields=True)
    restart, r_df = paired.pooled(pod, paired.RESTART_PRIOR_DF, (calibration.restart_ss, calibration.restart_df))
    return paired.Variances(pod, restart, pod_df, r_df)
