"""The statistics of one look: time-paired differences per signal, the between-pod variance, the
rollback budget's split, and each signal's pass / fail / insufficient (vlm_operator.analysis.stats does the tests)."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from vlm_operator.analysis import stats
from vlm_operator.analysis.gate import covariates, paired, sequential
from vlm_operator.analysis.gate.paired import PodPlan
from vlm_operator.analysis.gate.policy import NOT_A_REGRESSION_STAGE, SIGNALS, GatePolicy, SignalVerdict
from vlm_operator.analysis.gate.samples import SCALAR_FIELDS, Unit
from vlm_operator.analysis.gate.verdict import SignalResult
from vlm_operator.analysis.tdist import t_ppf, t_sf
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
    # The request mix's regression adjustment applied to the values (gate.covariates); None: compared as measured.
    covariate: covariates.Adjustment | None = None

    def by_pod(self, log: bool, pair_s: float) -> dict[str, list[float]]:
        """Per canary pod, in time order, one difference per window: its value minus the mean of its reference
        pods' windows that ended at about the same time (within pair_s / 2, else pair_s), minus its plan's
        offset, on the test scale. Load shared by both revisions cancels (and, with a same-node reference, the
        node's own noise of that moment); windows without a concurrent reference are left out."""
        base = sorted((e, p, x) for p, e, v in zip(self.baseline_pods, self.baseline_ends, self.baseline, strict=True)
                      if (x := _scaled(v, log)) is not None)
        by_refs: dict[frozenset[str] | None, tuple[list[float], list[float]]] = {}

        def refs_of(plan: PodPlan | None) -> tuple[list[float], list[float]]:
            key = None if plan is None else plan.refs
            if key not in by_refs:
                chosen = [(e, x) for e, p, x in base if key is None or p in key]
                by_refs[key] = ([e for e, _ in chosen], [x for _, x in chosen])
            return by_refs[key]

        out: dict[str, list[float]] = defaultdict(list)
        order = sorted(range(len(self.canary)), key=lambda i: self.canary_ends[i])
        for i in order:
            x = _scaled(self.canary[i], log)
            if x is None:
                continue
            pod, e = self.canary_pods[i], self.canary_ends[i]
            plan = self.plans.get(pod)
            ends, xs = refs_of(plan)
            for width in (pair_s / 2, pair_s):
                lo, hi = bisect_left(ends, e - width), bisect_right(ends, e + width)
                if hi > lo:
                    out[pod].append(x - sum(xs[lo:hi]) / (hi - lo) - (plan.offset if plan else 0.0))
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
            adj = covariates.fit(family, b, c) if family in covariates.FAMILIES else None

            def value(u: Unit, family: str = family, adj: covariates.Adjustment | None = adj) -> float | None:
                return u.values[family] if adj is None else adj.apply(u.values[family], u)

            out.append(
                Instance(
                    family, family, tuple(value(u) for u in b), tuple(value(u) for u in c),
                    _pods(b), _pods(c), tuple(value(u) for u in ref), _pods(ref), _ends(b), _ends(c),
                    covariate=adj,
                )
            )
        elif family == "stage_time":
            loop_ref = _reference_loop(b)
            if loop_ref is None:
                continue
            keys = set().union(*(u.stage_seconds for u in (*b, *c))) - {NOT_A_REGRESSION_STAGE}
            for k in _in_loop_order(keys):
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
        elif family == "sglang_stage_time":
            out += _sglang_stage_instances(b, c, ref)
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


def _sglang_stage_instances(b: Sequence[Unit], c: Sequence[Unit], ref: Sequence[Unit]) -> list[Instance]:
    """One test per stage of SGLang's own counters: the stage's share of the scheduler's wall time at the
    baseline's forward-pass rate, share x passes_ref / passes (`_at_reference_rate`), in points of wall time: the
    stage's time per forward pass, in the unit of the baseline's. A share of wall time is the time per pass times
    the passes run, and a canary faster elsewhere runs more passes (smaller batches sooner, or more of them where
    the loop is saturated), so every other stage's share grows with its pass count; per pass it does not. (Scaled
    per request instead, such a canary read +12 points of run_batch on the testbed: a faster loop runs more
    passes per request.) A stage is compared only where both revisions count their stages and every unit that
    does has a pass rate: an SGLang older than 0.5.20 on either side, or its metrics off, leaves the family out."""
    def raw(k: str) -> Callable[[Unit], float | None]:
        return lambda u: u.sglang_stage_shares.get(k, 0.0) if u.sglang_stage_shares else None

    keys = set().union(*(u.sglang_stage_shares for u in (*b, *c))) - {NOT_A_REGRESSION_STAGE}
    if any(u.sglang_stage_shares and u.forward_pass_rate is None for u in (*b, *c, *ref)):
        return []  # a share of wall time alone is not "worse": without the passes nothing is compared
    out = []
    for k in _in_loop_order(keys):
        scaled = _at_reference_rate(raw(k), b, c, ref, rate=lambda u: u.forward_pass_rate)
        vb, vc = tuple(scaled(u) for u in b), tuple(scaled(u) for u in c)
        if any(v is not None for v in vb) and any(v is not None for v in vc):
            out.append(Instance("sglang_stage_time", f"sglang_stage_time:{k}", vb, vc, _pods(b), _pods(c),
                                tuple(scaled(u) for u in ref), _pods(ref), _ends(b), _ends(c)))
    return out


def _in_loop_order(stages: set[str]) -> list[str]:
    """Stage names in the loop's order (STAGES), any others after them by name."""
    order = {s: i for i, s in enumerate(STAGES)}
    return sorted(stages, key=lambda s: (order.get(s, len(order)), s))


def _busy_at_reference_rate(
    role: str, b: Sequence[Unit], c: Sequence[Unit], ref: Sequence[Unit]
) -> Callable[[Unit], float | None]:
    """A front-end role's busy share per unit, at the baseline's request rate (`_at_reference_rate`).

    A front end's busy share is its work per request times the requests it gets: a pod that happens to get
    more traffic (uneven balancing, a client pinned to it) is busier without being slower."""
    return _at_reference_rate(lambda u: u.frontend_busy.get(role), b, c, ref)


def _at_reference_rate(
    raw: Callable[[Unit], float | None], b: Sequence[Unit], c: Sequence[Unit], ref: Sequence[Unit],
    rate: Callable[[Unit], float | None] = lambda u: u.request_rate,
) -> Callable[[Unit], float | None]:
    """A share of time per unit scaled to the baseline's median rate (requests by default): share x rate_ref /
    rate, "this pod's share at the baseline's rate", still in points of share (the margin's unit). A unit with no
    event in its window has no per-event cost and is left out. Where a unit with a share has no rate at all (no
    SGLang metrics, an older sidecar), no unit is scaled: the raw shares are compared, as both revisions then
    share one Service's traffic only on average."""
    units = [u for u in (*b, *c, *ref) if raw(u) is not None]
    rates = sorted(r for u in b if raw(u) is not None and (r := rate(u)) is not None and r > 0)
    if not rates or any(rate(u) is None for u in units):
        return raw
    rate_ref = rates[len(rates) // 2]

    def scaled(u: Unit) -> float | None:
        v, r = raw(u), rate(u)
        return None if v is None or not r else v * rate_ref / r

    return scaled


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
    pod, pod_df = paired.pooled(prior, paired.PRIOR_DF, history, (cur_ss, cur_df), yields=True)
    within = (0.0, 0.0)
    if is_loop or (log and loop is None):
        # f = 0 until measured: the restart spread starts as the whole pod spread, an assumption worth little
        # (RESTART_PRIOR_DF) against what history, the stable pods that share a node, and this rollout's pairs
        # measure. Stable pods on one node differ only by their restarts: where nodes hold two or more, the
        # within-node spread of their means is the restart variance, on a first rollout too.
        # Where the pods of this look no longer share nodes (the rollout replaced one of each pair), the stable
        # pods' pre-period, which covers every pod before the rollout touched any, still does.
        within = paired.within_nodes(inst.spread_values(log), layout.nodes)
        if within[1] <= 0:
            within = paired.within_nodes_before(layout.before)
        restart, r_df = paired.pooled(pod, paired.RESTART_PRIOR_DF, (calibration.restart_ss, calibration.restart_df),
                                      within)
    else:
        share = 1.0 if loop is None or loop.pod <= 0 else min(1.0, loop.restart / loop.pod)
        restart, r_df = pod * share, pod_df if loop is None else min(pod_df, loop.restart_df)
    v = paired.Variances(pod, restart, pod_df, r_df)
    canary_pods = sorted(set(inst.canary_pods))
    base_pods = sorted(set(inst.baseline_pods))
    did = is_loop and bool(layout.before)
    placebo = _placebo(inst, layout) if did else None
    running = _running(inst, 4 * pair_s)
    plans = paired.plan_pods(canary_pods, base_pods, layout, v, placebo=placebo, did=did, running=running)
    ev = paired.Evidence(cur_ss, cur_df, *within) if is_loop else paired.Evidence()
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
            ev = replace(ev, restart_ss=ev.restart_ss + est * df, restart_df=ev.restart_df + float(df))
            restart, r_df = paired.pooled(
                pod, paired.RESTART_PRIOR_DF, (calibration.restart_ss, calibration.restart_df), within,
                (est * df, float(df)))
            v = paired.Variances(pod, restart, pod_df, r_df)
            plans = paired.plan_pods(canary_pods, base_pods, layout, v, placebo=placebo, did=did, running=running)
    # A pod paired with a reference that has no window near its own (a neighbour whose sidecar is down) is
    # compared with the stable mean instead of dropping out.
    d = replace(inst, plans=plans).by_pod(log, pair_s)
    for pod, plan in list(plans.items()):
        if plan.kind != "Unpaired" and not d.get(pod):
            plans[pod] = paired.PodPlan("Unpaired", frozenset(base_pods), 0.0, v.pod, v.pod / max(1, running))
    paired_kinds = any(p.kind != "Unpaired" for p in plans.values())
    return replace(inst, plans=plans, df_cap=v.restart_df if paired_kinds else v.pod_df), v, ev


def _running(inst: Instance, within_s: float) -> int:
    """How many baseline pods run now: those with a window within `within_s` of the newest window of either side
    (a stable pod the canary replaced has none since). At least one."""
    ends = [*inst.baseline_ends, *inst.canary_ends]
    if not ends:
        return 1
    newest = max(ends)
    last: dict[str, float] = {}
    for p, e in zip(inst.baseline_pods, inst.baseline_ends, strict=True):
        last[p] = max(e, last.get(p, -math.inf))
    return max(1, sum(1 for e in last.values() if e >= newest - within_s))


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
    enough: bool,
    remaining_s: float = 0.0,
) -> list[SignalResult]:
    """Judge every member of one signal family at this look: its effect pooled over canary pods, and the three
    tests of gate.sequential on it.

    Pods as pods: each canary pod's differences (gate.paired's comparison, time-paired) are reduced to the pod's
    mean (trimmed where it has enough windows), and the pods' means are averaged with equal weights, so the pod
    that ran longest does not carry the estimate. Its variance is each pod's window noise (pooled within-pod
    variance, widened for the windows' dependence in time) plus each pod's pod-level variance (its plan's tau^2,
    the pod spread, in every bound), plus the stable mean's variance shared by the Unpaired pods.

    Verdicts: "fail" when the rollback bound (level `alpha_rollback` over every look) is above half the margin
    and the estimate beyond the margin; "pass" when the promotion bound is inside the promotion margin (the
    margin, widened to what the schedule can resolve where it cannot resolve the margin: `SignalResult.promote_margin`);
    "expand" when the expand bound is below the harm ceiling; "insufficient" otherwise. Which of them decides is
    `decide`'s (expand before the last step, pass at it).
    """
    spec = SIGNALS[family]
    log = spec.scale == "log"
    margin = float(policy.max_regression[family])
    out: list[SignalResult] = []
    for inst in insts:
        n_b = len(stats.finite(inst.baseline, positive=log))
        n_c = len(stats.finite(inst.canary, positive=log))
        pooled = pool_pods(inst, log, policy, remaining_s)
        if pooled is None:
            out.append(SignalResult(inst.name, None, None, None, None, None, None, n_b, n_c, "insufficient", margin))
            continue
        out.append(_judge_signal(inst, spec, pooled, policy, margin, alpha_rollback, enough, n_b, n_c))
    return out


@dataclass(frozen=True)
class Pooled:
    """One signal's effect at one look, pooled over canary pods (test scale): the estimate, its variance and the
    degrees of freedom behind it, the pods that carry it, one pod's variance (what the ceiling is set from), and
    one pod's variance as it will be at maxDuration: its pod-level part (the floor no wait lowers) plus its window
    noise shrunk by the windows still to come (what the resolvable margin is set from)."""

    estimate: float
    var: float
    df: float
    pods: int
    one_pod_var: float
    one_pod_floor: float


def pool_pods(inst: Instance, log: bool, policy: GatePolicy, remaining_s: float = 0.0) -> Pooled | None:
    """The pods-as-pods estimate (`evaluate`). None with fewer than MIN_PER_SIDE differences in all, or no pod
    with two (no window noise can be measured). `remaining_s`: the step's analysis time left until maxDuration
    (each pod then has that many telemetry intervals' windows more)."""
    d = {p: ds for p, ds in inst.by_pod(log, policy.pair_s).items() if ds}
    if sum(len(ds) for ds in d.values()) < stats.MIN_PER_SIDE:
        return None
    means: list[float] = []
    shrink: list[float] = []  # per pod: 1 / (n (1 - 2 g/n)^2), the factor on the window variance of its mean
    ss = df_w = 0.0
    for ds in d.values():
        x = np.sort(np.asarray(ds, dtype=float))
        n = int(x.size)
        g = math.floor(policy.trim * n) if n >= 5 else 0
        h = n - 2 * g
        means.append(float(x[g:n - g].mean()))
        shrink.append(1.0 / (n * (h / n) ** 2))
        if n >= 2:
            w = np.clip(x, x[g], x[n - 1 - g])
            ss += float(w.var(ddof=1)) * (n - 1)
            df_w += n - 1
    if df_w <= 0:
        return None
    s2 = ss / df_w * stats.autocorrelation_factor(list(d.values()))
    m = len(means)
    window = sum(s2 * k for k in shrink)
    # Windows still to come per pod: one per telemetry interval, times the share of the pod's windows that carried
    # this signal so far (a signal only some windows carry, e.g. throughput only where the pod was saturated,
    # gains only that share of them: it is widened to what it can resolve, not waited for).
    units = Counter(inst.canary_pods)
    more = max(0.0, remaining_s) / policy.pair_s
    window_at_max = sum(s2 * k * len(ds) / (len(ds) + more * min(1.0, len(ds) / max(1, units[p])))
                        for k, (p, ds) in zip(shrink, d.items(), strict=True))
    own = unpaired = shared = 0.0
    for pod in d:
        plan = inst.plans.get(pod)
        if plan is None:
            continue
        own += plan.tau2
        if plan.shared_var:
            unpaired += 1
            shared = max(shared, plan.shared_var)
    pod_part = own / (m * m) + (unpaired / m) ** 2 * shared
    var = window / (m * m) + pod_part
    df = _satterthwaite(window / (m * m), df_w, pod_part, inst.df_cap)
    return Pooled(sum(means) / m, var, df, m, var * m, (pod_part + window_at_max / (m * m)) * m)


def _satterthwaite(a: float, df_a: float, b: float, df_b: float) -> float:
    if b <= 0 or not math.isfinite(df_b):
        return df_a if b <= 0 else max(df_a, 1.0) if a > 0 else math.inf
    if a <= 0:
        return df_b
    return (a + b) ** 2 / (a * a / df_a + b * b / df_b)


def _judge_signal(
    inst: Instance, spec, pooled: Pooled, policy: GatePolicy, margin: float, alpha_rollback: float, enough: bool,
    n_b: int, n_c: int,
) -> SignalResult:
    to_test, natural = _worse_scale(spec)
    sign = 1.0 if spec.higher_is_worse else -1.0
    worse = sign * pooled.estimate  # on the test scale, positive: worse
    se = math.sqrt(max(pooled.var, 0.0))
    last_pods = policy.step_pods[-1] if policy.step_pods else 1
    ratio = (1 / max(pooled.var, 1e-18)) / sequential.target_information(pooled.one_pod_var, last_pods)
    b_rb = sequential.t_boundary(alpha_rollback, ratio, pooled.df)
    b_ex = sequential.t_boundary(sequential.EXPAND_ALPHA, ratio, pooled.df)
    b_pr = sequential.t_boundary(1.0 - policy.confidence, ratio, pooled.df)
    rollback_low = worse - b_rb * se
    expand_high = worse + b_ex * se
    promote_high = worse + b_pr * se
    one_se = math.sqrt(max(pooled.one_pod_var, 0.0))
    m_t = to_test(margin)
    fixed = policy.expand_ceiling.get(inst.family)
    default_t = sequential.ceiling(sequential.EXPAND_ALPHA, one_se, last_pods, m_t)
    ceiling_t = to_test(fixed) if fixed is not None else default_t
    capped = fixed is not None and ceiling_t < default_t
    resolvable_t = resolvable(1.0 - policy.confidence, pooled.one_pod_floor, last_pods, pooled.df)
    promote_t = max(m_t, resolvable_t)
    verdict: SignalVerdict = "insufficient"
    if enough and rollback_low > m_t / 2 and worse > m_t:
        verdict = "fail"
    elif enough and promote_high < promote_t:
        verdict = "pass"
    elif enough and expand_high < ceiling_t:
        verdict = "expand"
    # The bounds on the signal's own scale: the low one is the rollback bound for a latency (higher is worse),
    # the promotion bound for throughput; `expand_bound` is the expand test's bound on the worse side.
    low, high = (rollback_low, promote_high) if spec.higher_is_worse else (promote_high, rollback_low)
    t = pooled.estimate / se if se > 0 else (math.inf if pooled.estimate > 0 else -math.inf)
    p_greater = float(t_sf(t, max(1.0, min(pooled.df, 1e6))))
    return SignalResult(
        name=inst.name,
        baseline=stats.center(inst.baseline, scale=spec.scale, trim=policy.trim),
        canary=stats.center(inst.canary, scale=spec.scale, trim=policy.trim),
        delta=_natural(spec, pooled.estimate),
        ci_low=_natural(spec, sign * low),
        ci_high=_natural(spec, sign * high),
        p_value=p_greater if spec.higher_is_worse else 1.0 - p_greater,
        n_baseline=n_b,
        n_canary=n_c,
        verdict=verdict,
        margin=margin,
        expand_bound=_natural(spec, sign * expand_high),
        ceiling=natural(ceiling_t),
        promote_margin=natural(promote_t),
        resolvable=natural(resolvable_t),
        information=ratio,
        pods=pooled.pods,
        se=se,
        df=pooled.df,
        default_ceiling=natural(default_t) if capped else None,
        harmless_expand_rate=sequential.expand_rate(ceiling_t, 0.0, one_se, last_pods) if capped else None,
        covariate_cut=inst.covariate.variance_cut if inst.covariate else None,
    )


def _natural(spec, x: float) -> float:
    """A change on the test scale (log ratio, or a share difference) on the signal's own scale."""
    return math.expm1(x) if spec.scale == "log" else x


def _worse_scale(spec) -> tuple[Callable[[float], float], Callable[[float], float]]:
    """(to, back): a worsening of the signal's own scale (0.03: 3% slower, or 3% less throughput) on the test
    scale's worse side (positive), and back."""
    if spec.scale == "linear":
        return (lambda x: x), (lambda x: x)
    if spec.higher_is_worse:
        return math.log1p, math.expm1
    return (lambda x: -math.log1p(-min(x, 0.999999))), (lambda x: -math.expm1(-x))


def resolvable(alpha: float, one_pod_var: float, last_step_pods: int, df: float = math.inf) -> float:
    """The smallest margin (test scale) a harmless canary is promoted within, at the last step's planned pods,
    with probability PROMOTE_POWER: the promotion bound's distance at full information plus that quantile, in the
    last step's standard errors (t quantiles with `df` degrees of freedom). `one_pod_var`: one pod's variance as it
    will be at maxDuration (`Pooled.one_pod_floor`): window noise that time will shrink is waited for, not widened
    for; what is left of it at maxDuration, and the pods' spread, are."""
    m = max(1, last_step_pods)
    ratio = math.sqrt(m)  # the last step's information over I* (sequential.target_information)
    power = float(t_ppf(PROMOTE_POWER, max(1.0, min(df, 1e6))))
    return (sequential.t_boundary(alpha, ratio, df) + power) * math.sqrt(max(one_pod_var, 0.0) / m)


# Where the schedule cannot resolve a signal's margin, the promotion bound is held to the margin within which a
# harmless canary passes this often instead (`resolvable`). The two errors trade against each other at a given
# standard error: at 8 replicas and a 2% pod spread on a first rollout (last step 4 unpaired pods, SE 1.4%),
# 99% kept unchanged canaries' clock rollbacks near 1% but promoted +5% canaries 11-20% of the time; 97.5% puts
# both near the same few percent (bench/paired_gate.py, docs/canary-analysis.md).
PROMOTE_POWER = 0.975
