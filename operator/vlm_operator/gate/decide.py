"""The decision: one verdict for one look at a canary step, with its reason and message.

`decide` is the gate's only entry point. Pure: the caller gathers windows (vlm_operator.analysis), passes the
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

from vlm_operator import stats

from ..window import Window
from .attribution import regressed_function, regressed_role_function, regressed_stage
from .compare import Instance, evaluate, has_values, instances, rollback_alpha
from .policy import SIGNALS, GatePolicy, bound_factor, family_of
from .samples import Side, side
from .verdict import Decision, SignalResult


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
    """
    clock = data_started_at
    if clock is None and unavailable is None:
        clock = min((w.end for w in canary if not w.stale and w.end >= started_at), default=None)
    started_at = clock if clock is not None else started_at
    elapsed = now - started_at
    if unavailable is not None:
        b = c = Side((), ("SignalsUnavailable", unavailable))
    else:
        b = side("baseline", baseline, policy, started_at, now)
        c = side("canary", canary, policy, started_at, now)
    enough = len(b.units) >= policy.min_samples and len(c.units) >= policy.min_samples

    # The false-rollback budget is per rollout: each step spends an equal part of it.
    alpha = (1.0 - policy.confidence) / policy.steps
    looks = stats.planned_looks(policy.max_duration_s, policy.interval_s)
    promote_looks = 1 + max(
        0, math.ceil((policy.max_duration_s - step_duration_s) / policy.interval_s - 1e-9)
    )
    if policy.inference == "anytime":  # the confidence sequences hold at every look: nothing to split
        looks = promote_looks = 1
    by_family: dict[str, list[Instance]] = defaultdict(list)
    ref = side("reference", spread_reference, policy, started_at, now).units if spread_reference else ()
    for inst in instances(policy, b.units, c.units, ref):
        by_family[inst.family].append(inst)
    # Weighted Bonferroni: each gated family that has data gets an equal part of the rollback budget
    # per look, split evenly over its members (stages, functions), so loop latency keeps its power
    # however many functions are watched, and request signals nobody scrapes cost nothing (which
    # families have data depends on the sources, not on the values, so the bound still holds).
    # Promotion needs every signal to pass (an intersection-union test), so only the repeated
    # promotion looks divide its budget.
    families = max(1, sum(any(has_values(i) for i in insts) for insts in by_family.values()))
    alpha_promote = stats.bonferroni(alpha, promote_looks)
    final = elapsed >= policy.max_duration_s
    signals = tuple(
        result
        for family, insts in by_family.items()
        for result in evaluate(
            family,
            insts,
            policy,
            rollback_alpha(policy, alpha, looks, final, families, len(insts)),
            alpha_promote,
            enough,
            final=final,
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
    return replace(decision, warning=_resolution(policy, by_family, alpha), clock_started_at=clock)


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
    if action == "Rollback":
        fn, stage = attribution()
        return Decision("Rollback", reason, f"{prefix}; onInconclusive Rollback", signals, fn, stage)
    if action == "Promote" and not data_missing:
        return Decision("Promote", reason, f"{prefix}; onInconclusive Promote", signals)
    if action == "Promote":
        return Decision("Pause", reason, f"{prefix}; onInconclusive Promote refused without data, pausing", signals)
    return Decision("Pause", reason, f"{prefix}; onInconclusive Pause", signals)


def _resolution(policy: GatePolicy, by_family: Mapping[str, Sequence[Instance]], alpha: float) -> str | None:
    """A warning when the pods' own spread alone keeps the loop-latency margin from being resolved.

    With one canary pod the revision's effect and that pod's offset are one number: the smallest
    regression the gate can confirm is about z * sqrt(between-pod variance of the difference). When
    that exceeds half the margin, a real regression of the margin's size is rarely rolled back and
    a harmless canary on a fast node may be held back until maxDuration.
    """
    insts = by_family.get("loop_latency") or []
    if not insts:
        return None
    extra = insts[0].extra_var(log=True)
    if extra <= 0:
        return None
    looks = stats.planned_looks(policy.max_duration_s, policy.interval_s)
    z = NormalDist().inv_cdf(1 - stats.bonferroni(alpha, looks))
    resolvable = math.expm1(z * math.sqrt(extra))
    margin = policy.max_regression["loop_latency"]
    if resolvable <= margin / 2:
        return None
    spread = math.sqrt(insts[0].tau2(log=True))
    return (
        f"pods of the baseline differ by {spread:.1%} (sd) among themselves: with these pod counts the gate "
        f"can confirm only loop-latency regressions beyond about {resolvable:.1%} against a margin of "
        f"{margin:.0%}; add canary pods, use baseline Fresh, or widen maxRegression.loopLatency"
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
