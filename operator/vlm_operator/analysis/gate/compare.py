"""The statistics of one look: time-paired differences per signal, the between-pod variance, the
rollback budget's split, and each signal's pass / fail / insufficient (vlm_operator.analysis.stats does the tests)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from vlm_operator.analysis import stats
from vlm_operator.analysis.gate import paired
from vlm_operator.analysis.gate.paired import PodPlan
from vlm_operator.analysis.gate.policy import (
    NOT_A_REGRESSION_STAGE,
    SIGNALS,
    GatePolicy,
    SignalVerdict,
    bound_factor,
)
from vlm_operator.analysis.gate.samples import SCALAR_FIELDS, Unit
from vlm_operator.analysis.gate.verdict import SignalResult
from vlm_operator.api.names import FRONTEND_ROLES, STAGES


@dataclass(frozen=True)
class Instance:
    family: str
    name: str  # e.g. "loop_latency", "stage_time:run_batch"
    baseline: tuple[float | None, ...]
    canary: tuple[float | None, ...]
    baseline_pods: tuple[str, ...] = ()
    canary_pods: tuple[str, ...] = ()
    reference: tuple[float | None, ...] = ()
    reference_pods: tuple[str, ...] = ()
    baseline_ends: tuple[float, ...] = ()
    canary_ends: tuple[float, ...] = ()
    # Each canary pod's comparison (gate.paired); empty: every canary pod against all baseline pods.
    plans: Mapping[str, PodPlan] = field(default_factory=dict)
    # Degrees of freedom behind the pod-level variance (the t quantile combines them with the windows').
    df_cap: float = math.inf

    def by_pod(self, log: bool, pair_s: float) -> dict[str, list[float]]:
        """Per canary pod, in time order, one difference per window: its value minus the mean of its reference
        pods' windows that ended at about the same time (within pair_s / 2, else pair_s), minus its plan's
        offset, on the test scale. Load shared by both revisions cancels (and, with a same-node reference, the
        node's own noise of that moment); windows without a concurrent reference are left out."""
        base = [(p, e, x) for p, e, v in zip(self.baseline_pods, self.baseline_ends, self.baseline, strict=True)
                if (x := _scaled(v, log)) is not None]
        out: dict[str, list[float]] = defaultdict(list)
        order = sorted(range(len(self.canary)), key=lambda i: self.canary_ends[i])
        for i in order:
            x = _scaled(self.canary[i], log)
            if x is None:
                continue
            pod, e = self.canary_pods[i], self.canary_ends[i]
            plan = self.plans.get(pod)
            refs = base if plan is None else [r for r in base if r[0] in plan.refs]
            for width in (pair_s / 2, pair_s):
                near = [b for _, t, b in refs if abs(t - e) <= width]
                if near:
                    out[pod].append(x - sum(near) / len(near) - (plan.offset if plan else 0.0))
                    break
        return dict(out)

    def spread_values(self, log: bool) -> dict[str, list[float]]:
        """The stable pods' values by pod (the reference pods where there are at least two, else the
        baseline's): what the between-pod variance is measured on."""
        if len(set(self.reference_pods)) >= 2:
            values, pods = self.reference, self.reference_pods
        else:
            values, pods = self.baseline, self.baseline_pods
        out: dict[str, list[float]] = defaultdict(list)
        for v, p in zip(values, pods, strict=True):
            if (x := _scaled(v, log)) is not None:
                out[p].append(x)
        return dict(out)

    def extra_var(self, d: Mapping[str, Sequence[float]]) -> float:
        """Pod-level variance of the pooled mean of the differences `d` (by canary pod): each canary pod's own
        pod effect weighted by its share of the differences, squared, plus the stable mean's variance shared by
        the Unpaired pods."""
        if not self.plans:
            return 0.0
        n = sum(len(v) for v in d.values())
        if n == 0:
            return 0.0
        own = shared_w = shared = 0.0
        for pod, ds in d.items():
            plan = self.plans.get(pod)
            if plan is None:
                continue
            w = len(ds) / n
            own += w * w * plan.tau2
            if plan.shared_var:
                shared_w += w
                shared = max(shared, plan.shared_var)
        return own + shared_w * shared_w * shared


def _scaled(v: float | None, log: bool) -> float | None:
    if v is None or not math.isfinite(v) or (log and v <= 0):
        return None
    return math.log(v) if log else v


def instances(
    policy: GatePolicy, b: Sequence[Unit], c: Sequence[Unit], ref: Sequence[Unit] = ()
) -> list[Instance]:
    """One test per signal (and per stage). `ref`: units of other pods of the baseline's revision (the
    long-running stable pods next to a fresh baseline), used only to estimate how much pods differ."""
    out: list[Instance] = []
    for family in policy.max_regression:
        if family in SCALAR_FIELDS:
            out.append(
                Instance(
                    family, family, tuple(u.values[family] for u in b), tuple(u.values[family] for u in c),
                    _pods(b), _pods(c), tuple(u.values[family] for u in ref), _pods(ref), _ends(b), _ends(c),
                )
            )
        elif family == "stage_time":
            loop_ref = _reference_loop(b)
            if loop_ref is None:
                continue
            keys = set().union(*(u.stage_seconds for u in (*b, *c))) - {NOT_A_REGRESSION_STAGE}
            order = {s: i for i, s in enumerate(STAGES)}
            for k in sorted(keys, key=lambda s: (order.get(s, len(order)), s)):
                out.append(
                    Instance(
                        family, f"{family}:{k}",
                        tuple(_per_loop(u.stage_seconds, k, loop_ref) for u in b),
                        tuple(_per_loop(u.stage_seconds, k, loop_ref) for u in c),
                        _pods(b), _pods(c),
                        tuple(_per_loop(u.stage_seconds, k, loop_ref) for u in ref), _pods(ref),
                        _ends(b), _ends(c),
                    )
                )
        elif family == "frontend_busy":
            for role in FRONTEND_ROLES:
                busy = _busy_at_reference_rate(role, b, c, ref)
                vb, vc = tuple(busy(u) for u in b), tuple(busy(u) for u in c)
                if not any(v is not None for v in vb) or not any(v is not None for v in vc):
                    continue  # compared only where both revisions sampled the role
                out.append(
                    Instance(
                        family, f"{family}:{role}", vb, vc, _pods(b), _pods(c),
                        tuple(busy(u) for u in ref), _pods(ref), _ends(b), _ends(c),
                    )
                )
    return out


def _busy_at_reference_rate(
    role: str, b: Sequence[Unit], c: Sequence[Unit], ref: Sequence[Unit]
) -> Callable[[Unit], float | None]:
    """A front-end role's busy share per unit, at the baseline's request rate.

    A front end's busy share is its work per request times the requests it gets: a pod that happens to get
    more traffic (uneven balancing, a client pinned to it) is busier without being slower. So each unit's
    share is scaled to the baseline's median request rate: busy x rate_ref / rate, "how busy this pod
    would be at the baseline's traffic", still in points of busy share (the margin's unit). A unit with no
    request in its window has no per-request cost and is left out. Where a unit that sampled the role has
    no request rate at all (no SGLang metrics, an older sidecar), no unit is scaled: the raw shares are
    compared, as both revisions then share one Service's traffic only on average."""
    units = [u for u in (*b, *c, *ref) if role in u.frontend_busy]
    rates = sorted(r for u in b if role in u.frontend_busy and (r := u.request_rate) is not None and r > 0)
    if not rates or any(u.request_rate is None for u in units):
        return lambda u: u.frontend_busy.get(role)
    rate_ref = rates[len(rates) // 2]

    def busy(u: Unit) -> float | None:
        v, r = u.frontend_busy.get(role), u.request_rate
        return None if v is None or not r else v * rate_ref / r

    return busy


def _pods(units: Sequence[Unit]) -> tuple[str, ...]:
    return tuple(u.pod for u in units)


def _ends(units: Sequence[Unit]) -> tuple[float, ...]:
    return tuple(u.end for u in units)


def _reference_loop(units: Sequence[Unit]) -> float | None:
    """The baseline's typical loop time, the unit in which per-stage time differences are stated."""
    loops = sorted(v for u in units if (v := u.values["loop_latency"]) is not None)
    return loops[len(loops) // 2] if loops else None


def _per_loop(seconds: Mapping[str, float], key: str, ref: float) -> float | None:
    if not seconds:
        return None
    return seconds.get(key, 0.0) / ref


def plan_instance(
    inst: Instance, layout: paired.Layout, calibration: paired.Calibration, pair_s: float,
    loop: paired.Variances | None = None,
) -> tuple[Instance, paired.Variances, paired.Evidence]:
    """This signal's comparison planned pod by pod (gate.paired), with the variances it used and what this look
    measured about the pods. `loop`: loop latency's variances, whose restart share other signals borrow."""
    spec = SIGNALS[inst.family]
    log = spec.scale == "log"
    is_loop = inst.family == "loop_latency"
    cur_ss, cur_df = paired.between_pods(inst.spread_values(log))
    # The prior and the history are a pod's relative speed (measured on loop latency); it shows in the pod's other
    # latencies and its throughput alike. A share of the loop (stage time, a front-end role's busy share) moves
    # by that relative spread times its level: a pod 2% slower has a 13% stage 0.26 points longer, not 2 points.
    scale = 1.0 if log else _level(inst) ** 2
    prior = max(paired.PRIOR_POD_SD_LOG**2 * scale, 0.0 if log else paired.PRIOR_POD_SD_LINEAR_MIN**2)
    history = (calibration.pod_ss * scale, calibration.pod_df)
    pod, pod_df = paired.pooled(prior, paired.PRIOR_DF, history, (cur_ss, cur_df))
    if is_loop or (log and loop is None):
        # f = 0 until measured: the restart spread starts as the whole pod spread, an assumption worth little
        # (RESTART_PRIOR_DF) against what history and this rollout's pairs measure.
        restart, r_df = paired.pooled(pod, paired.RESTART_PRIOR_DF, (calibration.restart_ss, calibration.restart_df))
    else:
        share = 1.0 if loop is None or loop.pod <= 0 else min(1.0, loop.restart / loop.pod)
        restart, r_df = pod * share, pod_df if loop is None else min(pod_df, loop.restart_df)
    v = paired.Variances(pod, restart, pod_df, r_df)
    canary_pods = sorted(set(inst.canary_pods))
    base_pods = sorted(set(inst.baseline_pods))
    did = is_loop and bool(layout.before)
    placebo = _placebo(inst, layout) if did else None
    plans = paired.plan_pods(canary_pods, base_pods, layout, v, placebo=placebo, did=did)
    ev = paired.Evidence(cur_ss, cur_df) if is_loop else paired.Evidence()
    if is_loop:
        # The same-node pairs' own spread: the revision's effect is common to them, so how much their mean
        # differences disagree (beyond their windows' noise) is the restart variance.
        planned = replace(inst, plans=plans)
        d = planned.by_pod(log, pair_s)
        same = [(p, ds) for p, ds in d.items() if plans[p].kind != "Unpaired" and len(ds) >= 2]
        if len(same) >= 2:
            means = [sum(ds) / len(ds) for _, ds in same]
            grand = sum(means) / len(means)
            s2 = sum((m - grand) ** 2 for m in means) / (len(means) - 1)
            noise = sum(_var(ds) / len(ds) for _, ds in same) / len(same)
            # Each pod's difference holds two restarts (Concurrent with one neighbour, Replace) and, for Replace,
            # the drift against the fleet: dividing by 2 is the conservative reading (the larger restart share).
            est = max(0.0, s2 - noise) / 2
            df = len(same) - 1
            ev = replace(ev, restart_ss=est * df, restart_df=float(df))
            restart, r_df = paired.pooled(
                pod, paired.RESTART_PRIOR_DF, (calibration.restart_ss, calibration.restart_df), (est * df, float(df)))
            v = paired.Variances(pod, restart, pod_df, r_df)
            plans = paired.plan_pods(canary_pods, base_pods, layout, v, placebo=placebo, did=did)
    # A pod paired with a reference that has no window near its own (a neighbour whose sidecar is down) is
    # compared with the stable mean instead of dropping out.
    d = replace(inst, plans=plans).by_pod(log, pair_s)
    for pod, plan in list(plans.items()):
        if plan.kind != "Unpaired" and not d.get(pod):
            plans[pod] = paired.PodPlan("Unpaired", frozenset(base_pods), 0.0, v.pod, v.pod / max(1, len(base_pods)))
    paired_kinds = any(p.kind != "Unpaired" for p in plans.values())
    return replace(inst, plans=plans, df_cap=v.restart_df if paired_kinds else v.pod_df), v, ev


def _level(inst: Instance) -> float:
    """A share signal's typical level on the baseline (the mean of its values; 0 without any)."""
    vals = [v for v in inst.baseline if v is not None and math.isfinite(v)]
    return abs(sum(vals) / len(vals)) if vals else 0.0


def _var(xs: Sequence[float]) -> float:
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def _placebo(inst: Instance, layout: paired.Layout) -> float | None:
    """How much one stable pod's loop latency drifts against the others' between the pre-period and now: the
    variance over the untouched stable pods of (now - before), a Replace pair's comparison run on pods that did
    not change. None with fewer than two such pods."""
    now: dict[str, list[float]] = defaultdict(list)
    for v, p in zip(inst.baseline, inst.baseline_pods, strict=True):
        if p in layout.before and (x := _scaled(v, True)) is not None:
            now[p].append(x)
    deltas = [sum(xs) / len(xs) - layout.before[p].mean_log for p, xs in now.items() if xs]
    return _var(deltas) if len(deltas) >= 2 else None


def has_values(inst: Instance) -> bool:
    return any(v is not None for v in inst.baseline) and any(v is not None for v in inst.canary)


def evaluate(
    family: str,
    insts: Sequence[Instance],
    policy: GatePolicy,
    alpha_rollback: float,
    alpha_promote: float,
    enough: bool,
    final: bool = False,
    proof: bool = True,
) -> list[SignalResult]:
    """Judge every member of one signal family on its time-paired differences.

    Rollback, at every look the last included: confidently worse than half the margin (at this look's share
    of the rollout's budget) and an estimate beyond the margin. `final`: the last look (maxDuration): a member
    whose estimate is within its margin passes without the promotion bound; one beyond it but not confidently
    worse stays undecided, for onInconclusive. `proof`: before the last look a pass needs the promotion bound
    inside the margin (the last step); False (an earlier step) passes on the estimate, as the evidence keeps
    growing with the pods of the next step and is judged again there.

    The rollback bound carries the between-pod variance (a canary on a slow node is not a regression);
    the promotion bound does not (it proves the canary pods within the margin of the baseline pods they
    ran beside; with tau added, one canary pod could never be proven within a margin of ~3 tau).
    """
    spec = SIGNALS[family]
    log = spec.scale == "log"
    margin = float(policy.max_regression[family])
    bound = bound_factor(policy, family)
    # The rollback bound sits on the "worse" side of the estimate, the promotion bound on the other.
    worse_low = spec.higher_is_worse
    a_low, a_high = (alpha_rollback, alpha_promote) if worse_low else (alpha_promote, alpha_rollback)
    diffs = [i.by_pod(log, policy.pair_s) for i in insts]
    tau = [i.extra_var(d) for i, d in zip(insts, diffs, strict=True)]
    zero = [0.0] * len(insts)
    cmps = stats.paired_many(
        [[x for ds in d.values() for x in ds] for d in diffs],
        var_factor=[stats.autocorrelation_factor(list(d.values())) for d in diffs],
        extra_df=[i.df_cap for i in insts],
        scale=spec.scale,
        alpha_low=a_low,
        alpha_high=a_high,
        trim=policy.trim,
        extra_var_low=tau if worse_low else zero,
        extra_var_high=zero if worse_low else tau,
        anytime_r=(
            max(float(stats.MIN_PER_SIDE), policy.max_duration_s / 2 / policy.pair_s)
            if policy.inference == "anytime"
            else None
        ),
    )
    out: list[SignalResult] = []
    for inst, cmp in zip(insts, cmps, strict=True):
        n_b = len(stats.finite(inst.baseline, positive=log))
        n_c = len(stats.finite(inst.canary, positive=log))
        if cmp is None:
            out.append(
                SignalResult(inst.name, None, None, None, None, None, None, n_b, n_c, "insufficient", margin)
            )
            continue
        sign = 1.0 if spec.higher_is_worse else -1.0
        worse_est = sign * cmp.delta
        worse_lcb = cmp.low if spec.higher_is_worse else -cmp.high
        worse_ucb = cmp.high if spec.higher_is_worse else -cmp.low
        verdict: SignalVerdict = "insufficient"
        # Rollback: confidently worse than half the allowance, and most likely worse than all of it.
        # The bound alone controls false rollbacks of canaries within half the margin; the estimate
        # condition keeps small-but-certain differences (a slower node) inside the allowance.
        if enough and worse_lcb > margin / 2 and worse_est > margin:
            verdict = "fail"
        # Pass: the estimate within the margin, and before the last look the promotion bound below `bound`
        # margins where the signal has one (the loop signals' proof at 1, request signals at 2).
        elif enough and worse_est <= margin and (final or not proof or not bound or worse_ucb < bound * margin):
            verdict = "pass"
        out.append(
            SignalResult(
                name=inst.name,
                baseline=stats.center(inst.baseline, scale=spec.scale, trim=policy.trim),
                canary=stats.center(inst.canary, scale=spec.scale, trim=policy.trim),
                delta=cmp.delta,
                ci_low=cmp.low,
                ci_high=cmp.high,
                p_value=cmp.p_greater if spec.higher_is_worse else cmp.p_less,
                n_baseline=n_b,
                n_canary=n_c,
                verdict=verdict,
                margin=margin,
            )
        )
    return out
