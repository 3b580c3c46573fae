"""Like with like: what each canary pod is compared with, and the pod-level variance each comparison carries.

A pod's speed is partly its node's (CPU model, memory channels, the GPU's clocks, thermal limits: the same for
any pod there) and partly its own start (where its threads landed, what its caches warmed on: new at every
restart). With a per-pod effect variance s^2 split into a node-bound share f and a restart share 1 - f:

- Concurrent: a canary pod and a stable pod on the same node at the same time (the surge pair, or another
  stable pod there). The node part and the node's host noise at that moment cancel; the two restart parts do
  not: (1 - f) s^2 (1 + 1/k) with k stable pods on the node.
- Replace: the canary took the stable pod's GPU, so the stable pod is gone. Its windows from before the rollout
  (the pre-period, kept in status) stand in for it, and the change of the untouched stable pods over the same
  time corrects for what moved the whole fleet (load, temperature): a difference in differences, the
  pre-period weighted as a regression covariate (`pre_period_coefficient`: f s^2 + s^2/k over that plus
  (1 - f) s^2, 1 only where the node holds all the spread). Left over: (1 - f) s^2 of the new pod's restart, the
  part of the old pod's restart and of the node the weight lets through, and how much one pod drifts against
  the fleet between the two periods, which the untouched pods measure on themselves (placebo differences).
- Unpaired: compared with the mean of all stable pods at the same time: s^2 (its own pod) plus s^2 / N (the
  stable pods' mean), the last term shared by every unpaired canary pod.

Which kind a pod gets depends only on where the pods run and on the variances (never on the differences),
and it takes the kind with the smallest variance: with f unknown (0) a same-node pair is no better than the
fleet mean, and the gate says so rather than pretend.

The variances come from the fleet, not the step (empirical Bayes): the stable pods' spread now, the
service's history (`Calibration`, in status) and a prior of 2% (so one pod never means "no spread"), each
weighted by its degrees of freedom; the restart share starts at the conservative f = 0 and learns from the
stable pods that share a node (their within-node spread is the restart variance, on a first rollout too:
`within_nodes`), this rollout's pairs and finished rollouts' pairs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

Kind = Literal["Concurrent", "Replace", "Unpaired"]

# The pod spread assumed before anything is measured: 2% (sd of per-pod loop means on the log scale), the
# spread measured between stand-in pods on one host and within the range published for same-SKU GPU nodes.
# It counts as PRIOR_DF degrees of freedom: enough that one pod never means "no spread", little enough that the
# fleet in front of the gate overrides it within a rollout. At 20 (until 2026-12-06, when the per-look levels
# were tiny and few degrees of freedom ran the t quantile to ten standard errors) a fleet 8% apart was read as
# about 4% by its seven stable pods, and faster canaries were rolled back on evidence (bench/paired_gate.py);
# the bounds of gate.sequential need no tiny levels.
# A service's own history (HISTORY_DF_CAP) and a dozen stable pods weigh more.
PRIOR_DF = 4.0
PRIOR_POD_SD_LOG = 0.02
# The prior yields to a fleet that refutes it: where the measured pod spread reads above what a 2% fleet would
# show nine times in ten with as many degrees of freedom, the prior is left out of the pool (`pooled`). Pooled
# regardless (earlier on 2026-12-06), a fleet 8% apart was read as about 6.3% on a first rollout and the gate's 95%
# interval held the truth 84-91% of the time (bench/paired_gate.py --worlds coverage).
PRIOR_YIELD_P = 0.10
# Share signals (stage time per loop, a front-end role's busy share) take it relative to their level, never
# below a tenth of a point.
PRIOR_POD_SD_LINEAR_MIN = 0.001
# The restart spread starts as the whole pod spread (f = 0): a conservative assumption, not a measurement, so it
# weighs as little as two degrees of freedom against what history and this rollout's pairs measure.
RESTART_PRIOR_DF = 2.0
# History is kept to this many degrees of freedom (older evidence is scaled down), so a service whose hardware
# changed forgets the old fleet within a few rollouts.
HISTORY_DF_CAP = 40.0
# The stable pods' pre-period, read once before a rollout touches any pod: the default step's analysis time.
PRE_PERIOD_S = 300.0


@dataclass(frozen=True)
class Before:
    """One stable pod's loop latency before the rollout replaced any pod (status.rollout.before)."""

    pod: str
    node: str | None
    mean_log: float  # mean of log loop seconds over its windows
    windows: int


@dataclass(frozen=True)
class Layout:
    """Where the pods of one look run: every pod's node, each canary pod's pair (the stable pod it replaced or
    joined), the stable pods' pre-period, and when each canary pod became Ready (its warm-up is left out).
    Empty: nothing known (every canary pod is Unpaired, none has a warm-up)."""

    nodes: Mapping[str, str] = None  # type: ignore[assignment]
    replaced: Mapping[str, str] = None  # type: ignore[assignment]
    before: Mapping[str, Before] = None  # type: ignore[assignment]
    started: Mapping[str, float] = None  # type: ignore[assignment]  # canary pod -> when it became Ready

    def __post_init__(self) -> None:
        for name in ("nodes", "replaced", "before", "started"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, {})


@dataclass(frozen=True)
class Calibration:
    """What the service's finished rollouts measured (status.calibration), as sums of squares and degrees of
    freedom so that new evidence adds: pod spread (log loop latency, between pods of one revision) and restart
    spread (between the pods of same-node pairs, revision effect removed)."""

    pod_ss: float = 0.0
    pod_df: float = 0.0
    restart_ss: float = 0.0
    restart_df: float = 0.0

    def add(self, ev: Evidence) -> Calibration:
        """This history with one more rollout's evidence, capped at HISTORY_DF_CAP degrees of freedom each."""

        def cap(ss: float, df: float) -> tuple[float, float]:
            if df <= HISTORY_DF_CAP:
                return ss, df
            return ss * HISTORY_DF_CAP / df, HISTORY_DF_CAP

        p = cap(self.pod_ss + ev.pod_ss, self.pod_df + ev.pod_df)
        r = cap(self.restart_ss + ev.restart_ss, self.restart_df + ev.restart_df)
        return Calibration(p[0], p[1], r[0], r[1])

    @property
    def node_bound_share(self) -> float | None:
        """f = 1 - restart variance / pod variance, where both were measured."""
        if self.pod_df <= 0 or self.restart_df <= 0 or self.pod_ss <= 0:
            return None
        return min(1.0, max(0.0, 1 - (self.restart_ss / self.restart_df) / (self.pod_ss / self.pod_df)))


@dataclass(frozen=True)
class Evidence:
    """What one look measured about the pods (loop latency, log scale): the stable pods' between-pod variance
    and the same-node pairs' restart variance, as sums of squares with their degrees of freedom."""

    pod_ss: float = 0.0
    pod_df: float = 0.0
    restart_ss: float = 0.0
    restart_df: float = 0.0


@dataclass(frozen=True)
class Variances:
    """The pod-level variances one signal's comparison uses (test scale), with the degrees of freedom behind
    them (for the t quantile)."""

    pod: float  # s^2
    restart: float  # (1 - f) s^2
    pod_df: float
    restart_df: float

    @property
    def f(self) -> float:
        return 0.0 if self.pod <= 0 else min(1.0, max(0.0, 1 - self.restart / self.pod))


def pooled(prior: float, prior_df: float, *parts: tuple[float, float], yields: bool = False) -> tuple[float, float]:
    """(variance, df): the prior and each (sum of squares, df) part weighted by their degrees of freedom.

    `yields`: the prior is left out where the measured parts contradict it from above (their variance beyond the
    upper PRIOR_YIELD_P quantile of what the prior's own spread would read with their degrees of freedom): a fleet
    8% apart is then read as 8% on its own degrees of freedom, not pulled toward 2% by a prior it refutes."""
    ss, df = 0.0, 0.0
    for s, d in parts:
        if d > 0 and math.isfinite(s) and s >= 0:
            ss, df = ss + s, df + d
    if yields and df > 0 and prior > 0 and ss / df > prior * chi2_ppf(1 - PRIOR_YIELD_P, df) / df:
        return ss / df, df
    return (ss + prior * prior_df) / (df + prior_df), df + prior_df


def chi2_ppf(p: float, df: float) -> float:
    """The chi-square quantile (Wilson-Hilferty): within 3.5% of the exact value at df 1 and 1.5% from df 2, for p in
    0.5..0.99 (tests/unit/operator/analysis/test_paired.py checks it against scipy)."""
    z = NormalDist().inv_cdf(p)
    h = 2.0 / (9.0 * df)
    return df * max(0.0, 1.0 - h + z * math.sqrt(h)) ** 3


def between_pods(by_pod: Mapping[str, Sequence[float]]) -> tuple[float, float]:
    """(sum of squares, df) of the between-pod variance of pod means, the part the windows' own noise explains
    removed (method of moments); pods with fewer than two values are left out. (0, 0) with fewer than two pods."""
    groups = [list(g) for g in by_pod.values() if len(g) >= 2]
    if len(groups) < 2:
        return 0.0, 0.0
    means = [sum(g) / len(g) for g in groups]
    grand = sum(means) / len(means)
    var_means = sum((m - grand) ** 2 for m in means) / (len(means) - 1)
    within = [sum((x - m) ** 2 for x in g) / (len(g) - 1) / len(g) for g, m in zip(groups, means, strict=True)]
    est = max(0.0, var_means - sum(within) / len(within))
    df = len(groups) - 1
    return est * df, float(df)


def within_nodes(by_pod: Mapping[str, Sequence[float]], nodes: Mapping[str, str]) -> tuple[float, float]:
    """(sum of squares, df) of the restart variance measured on pods of one revision that share a node: the spread
    of their means around their node's mean (the node's part is common to them), the windows' own noise removed
    (method of moments, as `between_pods`). Pods with fewer than two values or no known node are left out; (0, 0)
    where no node holds two such pods."""
    groups: dict[str, list[list[float]]] = {}
    for pod, xs in by_pod.items():
        node = nodes.get(pod)
        if node is not None and len(xs) >= 2:
            groups.setdefault(node, []).append(list(xs))
    ss = noise = df = 0.0
    for members in groups.values():
        if len(members) < 2:
            continue
        means = [sum(g) / len(g) for g in members]
        grand = sum(means) / len(means)
        ss += sum((m - grand) ** 2 for m in means)
        k = len(members) - 1
        df += k
        noise += k * sum(sum((x - m) ** 2 for x in g) / (len(g) - 1) / len(g)
                         for g, m in zip(members, means, strict=True)) / len(members)
    if df <= 0:
        return 0.0, 0.0
    return max(0.0, ss - noise), df


def within_nodes_before(before: Mapping[str, Before]) -> tuple[float, float]:
    """`within_nodes` on the stable pods' pre-period means (status.rollout.before), kept for the whole rollout: the
    look that ends it still has them when the pods that shared a node are gone. The means carry their windows'
    noise, which is not removed here (their variances are not kept): a reading a little high, the conservative
    side (a larger restart share pairs less)."""
    groups: dict[str, list[float]] = {}
    for b in before.values():
        if b.node is not None and b.windows >= 2:
            groups.setdefault(b.node, []).append(b.mean_log)
    ss = df = 0.0
    for means in groups.values():
        if len(means) >= 2:
            grand = sum(means) / len(means)
            ss += sum((m - grand) ** 2 for m in means)
            df += len(means) - 1
    return (ss, df) if df > 0 else (0.0, 0.0)


@dataclass(frozen=True)
class PodPlan:
    """How one canary pod is compared: its kind, the baseline pods its windows are paired with in time, the
    offset subtracted from each difference (the pre-period difference, Replace only), and the variance of its
    pod effect in the difference."""

    kind: Kind
    refs: frozenset[str]
    offset: float
    tau2: float
    shared_var: float = 0.0  # Unpaired: the stable mean's own variance, s^2 / N, common to every such pod
    coefficient: float = 1.0  # Replace: the weight on the pre-period difference (pre_period_coefficient)

    @property
    def total(self) -> float:
        return self.tau2 + self.shared_var


def pre_period_coefficient(v: Variances, controls: int, drift: float) -> tuple[float, float]:
    """(theta, variance): the regression weight on a Replace pod's pre-period difference, and the pod-level
    variance left in its comparison (CUPED's coefficient, here from the variance components, not fitted on the
    differences, so it never depends on the canary's effect).

    The difference a Replace pod's windows carry, against `controls` untouched stable pods, is
    (1 - theta) (a - C) + r_new - theta r_old + (its drift against the controls'), with a the node's offset
    (variance f s^2), C the controls' mean offset (s^2 / k), r the restarts ((1 - f) s^2 each) and the drift
    `drift` whatever theta is. Its variance (1 - theta)^2 A + (1 + theta^2) R + drift, with A = f s^2 + s^2 / k and
    R = (1 - f) s^2, is smallest at theta = A / (A + R): R + drift + A R / (A + R). theta = 1 (the plain
    difference in differences, 2 R + drift) is best only where the node holds everything (f = 1); at f = 0.5 and
    seven controls theta 0.56 leaves 0.78 s^2 + drift instead of s^2 + drift (bench/paired_gate.py).
    """
    node = max(0.0, v.pod - v.restart)
    a = node + v.pod / max(1, controls)
    r = max(0.0, v.restart)
    theta = a / (a + r) if a + r > 0 else 1.0
    return theta, (1 - theta) ** 2 * a + (1 + theta * theta) * r + drift


def plan_pods(
    canary_pods: Sequence[str],
    baseline_pods: Sequence[str],
    layout: Layout,
    v: Variances,
    *,
    placebo: float | None,
    did: bool,
    running: int | None = None,
) -> dict[str, PodPlan]:
    """Each canary pod's comparison (module docstring). `did`: this signal has a pre-period (loop latency);
    `placebo`: the drift variance measured on the untouched stable pods (None: not measurable, s^2 used);
    `running`: how many of the baseline pods run now (the stable mean an Unpaired pod is compared with is theirs;
    None: all of them)."""
    base = frozenset(baseline_pods)
    n_base = max(1, running if running is not None else len(base))
    out: dict[str, PodPlan] = {}
    for pod in canary_pods:
        node = layout.nodes.get(pod)
        options: list[PodPlan] = [PodPlan("Unpaired", base, 0.0, v.pod, v.pod / n_base)]
        same = frozenset(b for b in base if node is not None and layout.nodes.get(b) == node)
        if same:
            options.append(PodPlan("Concurrent", same, 0.0, v.restart * (1 + 1 / len(same))))
        old = layout.replaced.get(pod)
        if did and old in layout.before:
            controls = frozenset(b for b in base if b in layout.before and b != old)
            if controls:
                pre = layout.before[old].mean_log - sum(layout.before[b].mean_log for b in controls) / len(controls)
                drift = (v.pod if placebo is None else placebo) * (1 + 1 / len(controls))
                theta, tau2 = pre_period_coefficient(v, len(controls), drift)
                # A same-node pair also cancels the node's noise in time, which these pod-level variances do not
                # count: it stays preferred wherever it is no worse than the plain difference in differences.
                if not (same and options[1].total <= 2 * v.restart + drift):
                    options.append(PodPlan("Replace", controls, theta * pre, tau2, coefficient=theta))
        out[pod] = min(options, key=lambda p: p.total)
    return out
