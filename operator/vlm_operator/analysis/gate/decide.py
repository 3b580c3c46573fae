"""The decision: one verdict for one look at a canary step, with its reason and message.

`decide` is the gate's only entry point. Pure: the caller gathers windows (vlm_operator.analysis.handoff), passes the
clock in as `now`, and acts on the returned Decision. The same inputs give the same Decision, so an operator
restarted mid-analysis reaches the same verdict from status. The rule in short (docs/canary-analysis.md has
the long form and the measured error rates):
- unit of analysis: one profiler window of one pod; TP ranks of a pod that cover the same time are
  averaged first (gate.samples);
- per signal, Yuen's trimmed Welch test on time-paired differences with the between-pod variance added
  (gate.compare);
- Rollback when a signal is worse than half its margin with confidence (Bonferroni over steps, looks and
  signals) AND its estimate exceeds the margin, naming the stage and function that grew (gate.attribution);
- Promote when, after the step's analysis time, every signal's one-sided upper bound is inside its margin;
- Inconclusive on stale data, no traffic, too few windows or unreachable sources; at maxDuration this module
  alone applies onInconclusive, and missing data never promotes. The rollout only maps the verdict to an
  action.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from statistics import NormalDist

from vlm_operator.analysis import stats
from vlm_operator.analysis.gate import paired
from vlm_operator.analysis.gate.attribution import (
    regressed_function,
    regressed_role_function,
    regressed_stage,
)
from vlm_operator.analysis.gate.compare import Instance, evaluate, has_values, instances, plan_instance
from vlm_operator.analysis.gate.policy import SIGNALS, GatePolicy, bound_factor, family_of
from vlm_operator.analysis.gate.samples import Side, Unit, make_units, side
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
    analysed_before_s: float | None = None,
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
    `step`: the step's index in the schedule (None: the last); it places this look on the rollout's
    spending clock (`GatePolicy.look_alpha`) and only the last step's promotion needs the bound.
    `evidence_since`: windows from here on count (the rollout's first analysis: canary pods of earlier steps
    keep adding evidence); None: the step's start. `layout`: where the pods run, the pairs and the
    pre-period (gate.paired); `calibration`: what the service's finished rollouts measured.
    `analysed_before_s`: seconds of analysis the rollout's earlier steps took (None: their planned times).
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
    look_alpha = policy.look_alpha(elapsed, analysed_before_s if analysed_before_s is not None
                                   else policy.horizon()[k])
    alpha = (1.0 - policy.confidence)
    promote_looks = 1 + max(
        0, math.ceil((policy.max_duration_s - step_duration_s) / policy.interval_s - 1e-9)
    )
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
    # Weighted Bonferroni: each gated family that has data gets an equal part of the rollback budget
    # per look, split evenly over its members (stages, functions), so loop latency keeps its power
    # however many functions are watched, and request signals nobody scrapes cost nothing (which
    # families have data depends on the sources, not on the values, so the bound still holds).
    # Promotion needs every signal to pass (an intersection-union test), so only the repeated
    # promotion looks divide its budget.
    families = max(1, sum(any(has_values(i) for i in insts) for insts in by_family.values()))
    alpha_promote = alpha if policy.inference == "anytime" else stats.bonferroni(alpha, promote_looks)
    final = elapsed >= policy.max_duration_s
    signals = tuple(
        result
        for family, insts in by_family.items()
        for result in evaluate(
            family,
            insts,
            policy,
            max(stats.bonferroni(look_alpha, families, len(insts)), 1e-12),
            alpha_promote,
            enough,
            final=final,
            proof=last_step,
        )
    )

    def attribution(signal: str | None = None) -> tuple[str | None, str | None]:
        """(function, stage) that grew most; for a front-end signal the role's function and no stage."""
        if not (b.units and c.units):
            return None, None
        if signal is not None and family_of(signal) == "frontend_busy":
            return regressed_role_function(b.units, c.units, signal.split(":", 1)[1]), None
        return regressed_function(b.units, c.units), regressed_stage(b.units, c.units)

    decision = _judge(policy, b, c, signals, elapsed, step_duration_s, attribution)
    loop = by_family.get("loop_latency") or []
    kinds = tuple(sorted({p.kind for i in loop for p in i.plans.values()}))
    resolvable = resolvable_margin(policy, loop_v) if loop_v is not None else None
    return replace(
        decision, warning=_resolution(policy, resolvable), clock_started_at=clock, evidence=evidence,
        resolvable_margin=resolvable, pairing=kinds, warmup_shift=_warmup_shift(warm, c.units, policy),
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
    5%): 2 z SE, where SE is the pod-level standard error of the difference with the last step's canary pods
    each paired on its node (restart spread; the stable mean's spread where that is smaller) and z the
    one-sided quantile of the last step's share of the budget, split over its planned looks. A regression the
    size of a margin below this is rolled back less than half the time (a rollback needs the bound above half
    the margin and the estimate above all of it). The windows' own noise comes on top."""
    m = max(1, pods or (policy.step_pods[-1] if policy.step_pods else 1))
    se = math.sqrt(min(2 * v.restart, v.pod) / m)
    marks = policy.horizon()
    alpha = 1.0 - policy.confidence
    last = stats.spent(alpha, 1.0, policy.spending_rho) - stats.spent(alpha, marks[-2] / marks[-1], policy.spending_rho)
    looks = stats.planned_looks(policy.max_duration_s, policy.interval_s)
    z = NormalDist().inv_cdf(1 - max(last / looks, 1e-12))
    return math.expm1(2 * z * se)


def _judge(
    policy: GatePolicy,
    b: Side,
    c: Side,
    signals: tuple[SignalResult, ...],
    elapsed: float,
    step_duration_s: float,
    attribution: Callable[..., tuple[str | None, str | None]],
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
        return Decision("Rollback", SIGNALS[family_of(worst.name)].reason, msg, signals, fn, stage)

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
    if all(s.verdict == "pass" for s in blocking):
        if elapsed >= step_duration_s:
            worst = max(blocking, key=_severity)
            if at_max and not all(_proven(policy, s) for s in blocking):
                # The last look decides on the estimates: none is beyond its margin, none confidently
                # worse beyond it; holding a canary back for noise is what this look exists to avoid.
                return Decision(
                    "Promote",
                    "WithinMarginAtMaxDuration",
                    f"at maxDuration every estimate is within its margin (not all proven); "
                    f"closest: {_describe(worst)}",
                    signals,
                )
            return Decision(
                "Promote", "NoRegression", f"all signals within margin; closest: {_describe(worst)}", signals
            )
        msg = f"no regression so far; step analysis time {elapsed:.0f}s of {step_duration_s:.0f}s"
        return Decision("Continue", "StepInProgress", msg, signals)
    undecided = [s for s in blocking if s.verdict != "pass"] or list(signals)
    msg = "undecided: " + "; ".join(_describe(s) for s in undecided[:3])
    if not at_max:
        return Decision("Continue", "AwaitingEvidence", msg, signals)
    return _at_max_duration(policy, signals, msg, data_missing=False, attribution=attribution)


def _proven(policy: GatePolicy, s: SignalResult) -> bool:
    """What a promotion before the last look needs beyond the estimate holds (`policy.bound_factor`)."""
    fam = family_of(s.name)
    spec = SIGNALS[fam]
    factor = bound_factor(policy, fam)
    if not factor:
        return True
    bound = s.ci_high if spec.higher_is_worse else (None if s.ci_low is None else -s.ci_low)
    if bound is None:
        return False
    return bound < factor * s.margin


def _optional_absent(s: SignalResult) -> bool:
    return not SIGNALS[family_of(s.name)].required and s.n_baseline == 0 and s.n_canary == 0


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
                        signals)
    if action == "Rollback":
        fn, stage = attribution()
        return Decision("Rollback", reason, f"{prefix}; onInconclusive Rollback", signals, fn, stage)
    if action == "Promote" and not data_missing:
        return Decision("Promote", reason, f"{prefix}; onInconclusive Promote", signals)
    if action == "Promote":
        return Decision("Pause", reason, f"{prefix}; onInconclusive Promote refused without data, pausing", signals)
    return Decision("Pause", reason, f"{prefix}; onInconclusive Pause", signals)


def _resolution(policy: GatePolicy, resolvable: float | None) -> str | None:
    """A warning when the pods' own spread keeps the loop-latency margin from being resolved (resolvable_margin)."""
    margin = policy.max_regression.get("loop_latency")
    if resolvable is None or margin is None or resolvable <= margin:
        return None
    return (
        f"with this schedule and the pods' measured spread the gate can resolve loop-latency margins of about "
        f"{resolvable:.1%} or more, against a margin of {margin:.0%}: a regression of the margin's size is rolled "
        f"back less than half the time; add steps or pods, or widen maxRegression.loopLatency"
    )


def _severity(s: SignalResult) -> float:
    spec = SIGNALS[family_of(s.name)]
    worse = (s.delta or 0.0) * (1 if spec.higher_is_worse else -1)
    if s.margin > 0:
        return worse / s.margin
    return math.inf if worse > 0 else worse


def _fmt_delta(s: SignalResult) -> str:
    if s.delta is None:
        return "n/a"
    if SIGNALS[family_of(s.name)].scale == "linear":
        return f"{s.delta * 100:+.1f}pp (bounds {s.ci_low * 100:+.1f}..{s.ci_high * 100:+.1f}pp, allowed {s.margin * 100:.1f}pp)"
    return f"{s.delta:+.1%} (bounds {s.ci_low:+.1%}..{s.ci_high:+.1%}, allowed {s.margin:.1%})"


def _describe(s: SignalResult) -> str:
    what = SIGNALS[family_of(s.name)].label
    if ":" in s.name:
        what = f"{what} of {s.name.split(':', 1)[1]}"
    return f"{what} {_fmt_delta(s)} over {s.n_canary} canary / {s.n_baseline} baseline windows"


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
    means = [b.mean_log for b in pre.values()]
    cur: tuple[float, float] = (0.0, 0.0)
    if len(means) >= 2:
        m = sum(means) / len(means)
        cur = (sum((x - m) ** 2 for x in means), float(len(means) - 1))
    pod, pod_df = paired.pooled(paired.PRIOR_POD_SD_LOG**2, paired.PRIOR_DF, (calibration.pod_ss, calibration.pod_df), cur)
    restart, r_df = paired.pooled(pod, paired.RESTART_PRIOR_DF, (calibration.restart_ss, calibration.restart_df))
    return resolvable_margin(policy, paired.Variances(pod, restart, pod_df, r_df))
