"""The statistics of one look: time-paired differences per signal, the between-pod variance, the
rollback budget's split, and each signal's pass / fail / insufficient (vlm_operator.stats does the tests)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from vlm_operator import stats

from ..names import FRONTEND_ROLES, STAGES
from .policy import NOT_A_REGRESSION_STAGE, SIGNALS, GatePolicy, SignalVerdict, bound_factor
from .samples import SCALAR_FIELDS, Unit
from .verdict import SignalResult


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

    def pairs(self, log: bool, pair_s: float) -> list[float]:
        """One difference per canary unit: its value minus the mean of the baseline units that ended at
        about the same time (within pair_s / 2, else pair_s), on the test scale. Load shared by both
        revisions cancels; canary units without a concurrent baseline are left out."""

        def f(v: float | None) -> float | None:
            if v is None or not math.isfinite(v) or (log and v <= 0):
                return None
            return math.log(v) if log else v

        base = [(e, x) for e, v in zip(self.baseline_ends, self.baseline, strict=True) if (x := f(v)) is not None]
        out = []
        for e, v in zip(self.canary_ends, self.canary, strict=True):
            x = f(v)
            if x is None:
                continue
            for width in (pair_s / 2, pair_s):
                near = [b for t, b in base if abs(t - e) <= width]
                if near:
                    out.append(x - sum(near) / len(near))
                    break
        return out

    def tau2(self, log: bool) -> float:
        """Between-pod variance: from the reference pods where there are enough, else the baseline's."""
        if len(set(self.reference_pods)) >= 2:
            return _between_pod_var(self.reference, self.reference_pods, log)
        return _between_pod_var(self.baseline, self.baseline_pods, log)

    def extra_var(self, log: bool) -> float:
        """Between-pod variance of the difference of the two sides' means: tau^2 (1/k_b + 1/k_c)."""
        tau2 = self.tau2(log)
        if tau2 <= 0:
            return 0.0
        k_b = max(1, len(set(self.baseline_pods)))
        k_c = max(1, len(set(self.canary_pods)))
        return tau2 * (1 / k_b + 1 / k_c)


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


def _between_pod_var(values: Sequence[float | None], pods: Sequence[str], log: bool) -> float:
    """Method-of-moments estimate of the between-pod variance (random effects) of one side's values.

    Windows of one pod share its offset (node CPU, its own traffic mix). With at least two pods of
    at least two windows each: variance of the pod means minus the part the window noise explains.
    0 when it cannot be estimated (one pod) or is swamped by the window noise.
    """
    by_pod: dict[str, list[float]] = defaultdict(list)
    for v, p in zip(values, pods, strict=True):
        if v is None or not math.isfinite(v) or (log and v <= 0):
            continue
        by_pod[p].append(math.log(v) if log else v)
    groups = [g for g in by_pod.values() if len(g) >= 2]
    if len(groups) < 2:
        return 0.0
    means = [sum(g) / len(g) for g in groups]
    grand = sum(means) / len(means)
    var_means = sum((m - grand) ** 2 for m in means) / (len(means) - 1)
    within = [sum((x - sum(g) / len(g)) ** 2 for x in g) / (len(g) - 1) / len(g) for g in groups]
    return max(0.0, var_means - sum(within) / len(within))


def has_values(inst: Instance) -> bool:
    return any(v is not None for v in inst.baseline) and any(v is not None for v in inst.canary)


def rollback_alpha(policy: GatePolicy, alpha: float, looks: int, final: bool, families: int, members: int) -> float:
    """The per-look rollback level of one member: the step's budget split over the planned looks (or a
    `final_alpha_share` of it kept for the last look, the rest over the looks before it), the families
    and the family's members."""
    share = policy.final_alpha_share if policy.inference == "bonferroni" and looks > 1 else 0.0
    if share <= 0:
        return stats.bonferroni(alpha, looks, families, members)
    if final:
        return stats.bonferroni(alpha * share, families, members)
    return stats.bonferroni(alpha * (1 - share), looks, families, members)


def evaluate(
    family: str,
    insts: Sequence[Instance],
    policy: GatePolicy,
    alpha_rollback: float,
    alpha_promote: float,
    enough: bool,
    final: bool = False,
) -> list[SignalResult]:
    """Judge every member of one signal family on its time-paired differences.

    `final`: this is the step's last look (maxDuration reached). The gate then decides on the data
    instead of waiting: a member fails when it is confidently worse at all (bound above 0, at the same
    per-look level, so the false-rollback budget still holds) and its estimate exceeds the margin;
    it passes when its estimate is within the margin. Only a member beyond its margin but not
    confidently worse stays undecided, for onInconclusive.

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
    tau = [i.extra_var(log) for i in insts]
    zero = [0.0] * len(insts)
    cmps = stats.paired_many(
        [i.pairs(log, policy.pair_s) for i in insts],
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
        if enough and worse_lcb > (0.0 if final else margin / 2) and worse_est > margin:
            verdict = "fail"
        # Pass: the estimate within the margin, and before the last look the promotion bound below `bound`
        # margins where the signal has one (the loop signals' proof at 1, request signals at 2).
        elif enough and worse_est <= margin and (final or not bound or worse_ucb < bound * margin):
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
