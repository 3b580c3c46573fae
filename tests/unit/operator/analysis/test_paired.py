"""vlm_operator.analysis.gate.paired and the node-paired comparison: like with like on the same node, variances from the
fleet (never 0), dependence between windows, and the rollout's budget over steps."""

import math

import numpy as np
import pytest

from vlm_operator.analysis import stats
from vlm_operator.analysis.gate import Before, Calibration, GatePolicy, Layout, Window, decide
from vlm_operator.analysis.gate.paired import (
    Evidence,
    Variances,
    chi2_ppf,
    plan_pods,
    pooled,
    pre_period_coefficient,
)

T0 = 1_000_000.0
STAGES = {"run_batch": 0.6, "process_input_requests": 0.2, "idle": 0.05, "other": 0.15}
FUNCS = {"event_loop_overlap": 0.95, "run_batch": 0.6, "process_input_requests": 0.2}
POLICY = GatePolicy(max_regression={"loop_latency": 0.03}, max_duration_s=900, interval_s=60, stale_after_s=120,
                    pair_s=15.0)
# Earlier rollouts measured pods 2% apart, 80% of it staying with the node.
KNOWN = Calibration(pod_ss=0.02**2 * 30, pod_df=30, restart_ss=0.2 * 0.02**2 * 30, restart_df=30)


def w(rev: str, pod: str, k: int, v: float) -> Window:
    return Window(revision=rev, pod=pod, id=str(k), end=T0 + (k + 1) * 15.0, samples=500, loop_mean_seconds=v,
                  loop_p95_seconds=1.5 * v, stage_shares=STAGES, function_shares=FUNCS, iterations=400)


def fleet(node_offsets: list[float], *, replaced: int, effect: float, seed: int, n: int = 20,
          host_sd: float = 0.0) -> tuple[list[Window], list[Window], Layout]:
    """Stable pods stable-i on node-i with the node's offset; canary-0 took node-`replaced`'s GPU. The pre-period
    (before) is each stable pod's mean before the rollout; `host_sd`: noise of each node in time, shared by what
    runs on it at that moment."""
    rng = np.random.default_rng(seed)
    nodes = {f"stable-{i}": f"node-{i}" for i in range(len(node_offsets)) if i != replaced}
    nodes["canary-0"] = f"node-{replaced}"
    host = rng.normal(0, host_sd, (len(node_offsets), n)) if host_sd else np.zeros((len(node_offsets), n))
    base = [w("stable", f"stable-{i}", k, 0.02 * math.exp(off + host[i, k] + rng.normal(0, 0.01)))
            for i, off in enumerate(node_offsets) if i != replaced for k in range(n)]
    can = [w("canary", "canary-0", k, 0.02 * math.exp(node_offsets[replaced] + effect + host[replaced, k]
                                                      + rng.normal(0, 0.01))) for k in range(n)]
    before = {f"stable-{i}": Before(f"stable-{i}", f"node-{i}", math.log(0.02) + off + rng.normal(0, 0.002), 20)
              for i, off in enumerate(node_offsets)}
    return base, can, Layout(nodes, {"canary-0": f"stable-{replaced}"}, before)


def look(base, can, layout=None, calibration=KNOWN, now_k=20):
    return decide(base, can, POLICY, started_at=T0, now=T0 + now_k * 15 + 1, step_duration_s=300,
                  data_started_at=T0, layout=layout, calibration=calibration)


def test_a_node_offset_that_fools_the_unpaired_comparison_cancels_in_the_difference_in_differences():
    # The canary took the GPU of the fleet's slowest node (+6%): against the stable mean an unchanged revision
    # reads +6.5%, beyond the 3% margin; against its own node's pod before, corrected by the others' change, ~0.
    base, can, layout = fleet([0.06, 0.0, -0.02, -0.01], replaced=0, effect=0.0, seed=1)
    unpaired, paired_ = look(base, can), look(base, can, layout)
    assert unpaired.signals[0].delta > 0.05 and unpaired.verdict != "Promote"
    # The pre-period is weighted as a regression covariate (paired.pre_period_coefficient): at the calibration's
    # f = 0.8 and three controls its weight is 0.85, so 15% of the node's 6% (about 0.9 points) stays in.
    assert paired_.pairing == ("Replace",) and abs(paired_.signals[0].delta) < 0.015
    assert paired_.verdict == "Promote", paired_.message
    # A +10% canary on the fleet's fastest node reads only +8% unpaired; paired it reads +10% and is rolled back.
    base, can, layout = fleet([0.0, -0.03, 0.02, 0.01], replaced=1, effect=0.10, seed=2)
    d = look(base, can, layout)
    assert d.verdict == "Rollback" and abs(d.signals[0].delta - 0.105) < 0.01, d.message


def test_a_concurrent_neighbour_cancels_the_nodes_noise_in_time():
    # Host noise of 4% per window, shared by both pods on node-0 (a surge pair), not by the other nodes.
    base, can, layout = fleet([0.0, 0.0, 0.0], replaced=0, effect=0.0, seed=3, n=20, host_sd=0.04)
    # The neighbour stable-0 (kept next to the canary) rides the same noise path as the canary.
    rng = np.random.default_rng(3)
    host0 = [math.log(x.loop_mean_seconds / 0.02) for x in can]  # the canary's own noise path (effect 0)
    neighbour = [w("stable", "stable-0", k, 0.02 * math.exp(h + rng.normal(0, 0.005))) for k, h in enumerate(host0)]
    layout = Layout({**layout.nodes, "stable-0": "node-0"}, layout.replaced, layout.before)
    d = look([*base, *neighbour], can, layout)
    unpaired = look([*base, *neighbour], can)
    assert d.pairing == ("Concurrent",)
    width = d.signals[0].ci_high - d.signals[0].ci_low
    assert width < unpaired.signals[0].ci_high - unpaired.signals[0].ci_low
    assert d.verdict == "Promote", d.message


def test_with_one_stable_pod_the_spread_comes_from_the_prior_never_zero():
    # One stable pod and one canary pod 4% apart, no history: the old gate took the pods' spread as 0 and rolled
    # back on the offset of two nodes. The 2% prior keeps the bound wide, and the margin is said unresolvable.
    base, can, _ = fleet([0.0, 0.04], replaced=1, effect=0.0, seed=4, n=30)
    d = look(base, can, calibration=None, now_k=30)
    assert d.verdict != "Rollback", d.message
    assert d.signals[0].ci_low < 0.015 < d.signals[0].delta
    assert d.resolvable_margin is not None and d.resolvable_margin > 0.03 and d.warning


def test_pooled_variances_weigh_prior_history_and_look_by_degrees_of_freedom():
    assert pooled(0.0004, 1.0) == (0.0004, 1.0)
    v, df = pooled(0.0004, 1.0, (0.0001 * 9, 9.0))
    assert df == 10 and v == pytest.approx((0.0004 + 0.0009) / 10)
    c = Calibration().add(Evidence(0.0004 * 60, 60, 0.0001 * 10, 10))
    assert c.pod_df == 40 and c.pod_ss == pytest.approx(0.0004 * 40)  # capped, the variance kept
    assert c.node_bound_share == pytest.approx(0.75)


def test_the_prior_yields_to_a_fleet_that_refutes_it():
    # Seven stable pods 8% apart (6 df) refute a 2% prior: the spread is theirs, on their own degrees of freedom.
    assert pooled(0.0004, 4.0, (0.0064 * 6, 6.0), yields=True) == pytest.approx((0.0064, 6.0))
    # Without `yields` (the restart share's f = 0 start) the prior is averaged in, as before.
    assert pooled(0.0004, 4.0, (0.0064 * 6, 6.0)) == pytest.approx(((0.0016 + 0.0384) / 10, 10.0))
    # A fleet the prior could have produced keeps it: 2.5% on 6 df is within a 2% fleet's nine readings in ten.
    v, df = pooled(0.0004, 4.0, (0.000625 * 6, 6.0), yields=True)
    assert df == 10 and v == pytest.approx((0.0016 + 0.00375) / 10)
    # History counts as measured: 40 df at 3% refute the prior even with a quiet look.
    assert pooled(0.0004, 4.0, (0.0009 * 40, 40.0), (0.0, 0.0), yields=True) == pytest.approx((0.0009, 40.0))


@pytest.mark.parametrize("df", [1, 2, 6, 40])
@pytest.mark.parametrize("p", [0.5, 0.9, 0.99])
def test_chi2_quantile_matches_scipy(df, p):
    from scipy.stats import chi2

    assert chi2_ppf(p, df) == pytest.approx(chi2.ppf(p, df), rel=0.035 if df == 1 else 0.015)


def test_the_kind_is_chosen_on_variances_only_and_a_same_node_pair_needs_a_known_node_share():
    layout = Layout({"c": "n1", "s1": "n1", "s2": "n2"}, {"c": "s0"},
                    {"s0": Before("s0", "n1", 0.0, 20), "s2": Before("s2", "n2", 0.0, 20)})
    unknown = Variances(pod=0.0004, restart=0.0004, pod_df=5, restart_df=1)  # f = 0: no better than the mean
    known = Variances(pod=0.0004, restart=0.00008, pod_df=5, restart_df=30)  # f = 0.8
    assert plan_pods(["c"], ["s1", "s2"], layout, unknown, placebo=None, did=True)["c"].kind == "Unpaired"
    assert plan_pods(["c"], ["s1", "s2"], layout, known, placebo=None, did=True)["c"].kind == "Concurrent"
    no_neighbour = Layout({"c": "n1", "s2": "n2"}, layout.replaced, layout.before)
    plan = plan_pods(["c"], ["s2"], no_neighbour, known, placebo=0.00001, did=True)["c"]
    assert plan.kind == "Replace" and plan.refs == frozenset({"s2"})


def test_the_pre_period_weight_is_the_regression_coefficient_and_never_worse_than_either_extreme():
    s2 = 0.0004
    for f in (0.0, 0.2, 0.5, 0.8, 1.0):
        v = Variances(pod=s2, restart=(1 - f) * s2, pod_df=30, restart_df=30)
        theta, tau2 = pre_period_coefficient(v, 7, drift=0.00001)
        assert theta == pytest.approx((f * s2 + s2 / 7) / (f * s2 + s2 / 7 + (1 - f) * s2))
        plain = 2 * (1 - f) * s2 + 0.00001  # theta = 1: the difference in differences
        none = s2 * (1 + 1 / 7) + 0.00001  # theta = 0: against the controls' mean
        assert tau2 <= min(plain, none) + 1e-15, (f, tau2, plain, none)
    # At f = 0.5 the weight 0.56 cuts the pod-level variance by a fifth against the plain difference.
    half = pre_period_coefficient(Variances(pod=s2, restart=0.5 * s2, pod_df=30, restart_df=30), 7, drift=0.0)
    assert half[0] == pytest.approx(0.5625) and half[1] == pytest.approx(0.78125 * s2)
    # Simulated pods: the weighted difference's variance is what the formula says, and smaller than theta = 1's.
    rng = np.random.default_rng(11)
    node, r_old, r_new = (rng.normal(0, math.sqrt(0.5 * s2), 200_000) for _ in range(3))
    ctrl = rng.normal(0, math.sqrt(s2 / 7), 200_000)
    pre, now = node + r_old - ctrl, node + r_new - ctrl
    assert np.var(now - half[0] * pre) == pytest.approx(half[1], rel=0.02)
    assert np.var(now - pre) == pytest.approx(2 * 0.5 * s2, rel=0.02)


def test_the_autocorrelation_factor_restores_the_coverage_of_a_mean():
    """AR(1) windows with lag-one correlation 0.5 (host noise that remembers), 40 windows: the plain standard
    error covers the true mean of a 95% interval about 70% of the time; widened by the Newey-West factor about
    85% (measured: 77% at 20 windows, 90% at 80; at correlation 0.8, 60-83%). Better, not exact: Newey-West
    undercovers on short series, which is why concurrent same-node pairs (where host noise cancels) are preferred."""
    rng = np.random.default_rng(7)
    plain = widened = 0
    trials, n = 400, 40
    for _ in range(trials):
        x = np.empty(n)
        x[0] = rng.normal()
        for i in range(1, n):
            x[i] = 0.5 * x[i - 1] + rng.normal(0, math.sqrt(0.75))
        se = x.std(ddof=1) / math.sqrt(n)
        k = stats.autocorrelation_factor([list(x)])
        plain += abs(x.mean()) < 1.96 * se
        widened += abs(x.mean()) < 1.96 * se * math.sqrt(k)
    assert plain / trials < 0.78
    assert widened / trials > 0.82 and widened >= plain + 0.08 * trials


@pytest.mark.parametrize("durations,max_s", [((300.0, 300.0, 300.0), 1800.0), ((60.0,), 60.0)])
def test_a_canary_within_half_the_margin_is_rolled_back_within_the_budget_over_every_look(durations, max_s):
    """The boundary case of the rollback rule (a canary +1.5%, half the 3% margin), looked at every minute over
    every step up to maxDuration, maxDuration = interval included: rollbacks on evidence stay within the
    rollout's 5% (by simulation, with the pods' spread known)."""
    policy = GatePolicy(max_regression={"loop_latency": 0.03}, steps=len(durations), step_durations_s=durations,
                        max_duration_s=max_s, interval_s=60, stale_after_s=120, pair_s=15.0)
    rng = np.random.default_rng(11)
    trials, rolled = 120, 0
    tight = Calibration(pod_ss=0.0001**2 * 1000, pod_df=1000, restart_ss=0.0001**2 * 1000, restart_df=1000)
    for _ in range(trials):
        n = int((sum(durations) + max_s) // 15) + 4
        base = [w("stable", f"stable-{i}", k, 0.02 * math.exp(rng.normal(0, 0.03))) for i in range(3) for k in range(n)]
        can = [w("canary", "canary-0", k, 0.02 * math.exp(0.015 + rng.normal(0, 0.03))) for k in range(n)]
        start, done = T0, False
        for j, d in enumerate(durations):
            e = 60.0
            while not done:
                now = start + e
                cut = lambda ws, now=now: [x for x in ws if x.end <= now]  # noqa: E731
                dec = decide(cut(base), cut(can), policy, started_at=start, now=now, step_duration_s=d,
                             data_started_at=start, step=j, evidence_since=T0, calibration=tight)
                if dec.verdict == "Rollback" and dec.reason != "MaxDurationReached":
                    rolled += 1
                    done = True
                elif dec.verdict != "Continue":
                    break
                e += 60.0
            if done or dec.verdict != "Promote":
                break
            start += d
    assert rolled / trials <= 0.05


def test_the_warm_up_after_ready_is_left_out_and_its_shift_measured():
    # An unchanged canary 12% slower in its first minute after Ready (cold caches), then like the stable pods.
    rng = np.random.default_rng(12)
    base = [w("stable", f"stable-{i}", k, 0.02 * math.exp(rng.normal(0, 0.01))) for i in range(3) for k in range(12)]
    can = [w("canary", "canary-0", k, 0.02 * math.exp((0.12 if k < 4 else 0.0) + rng.normal(0, 0.01)))
           for k in range(12)]
    ready = {"canary-0": T0}
    with_warmup = look(base, can, Layout(started=ready), now_k=12)
    without = look(base, can, now_k=12)  # a third of its windows are warm-up: more than the trim removes
    assert abs(with_warmup.signals[0].delta) < 0.01 < without.signals[0].delta
    assert with_warmup.warmup_shift == pytest.approx(0.127, abs=0.02)
    assert without.warmup_shift is None


def test_stable_pods_sharing_a_node_teach_the_node_share_on_a_first_rollout():
    """Two stable pods on each of four nodes, the nodes 4% apart and the pods on one node within 0.3% of each other:
    the node carries the spread (f near 1). With no history the within-node spread is the restart variance, so a
    canary next to a stable pod on the slowest node is compared Concurrent with it, and an unchanged revision is
    not read as the node's +6%."""
    from vlm_operator.analysis.gate.paired import within_nodes

    rng = np.random.default_rng(5)
    offsets = [0.06, -0.02, 0.0, -0.04]
    nodes, base, can = {}, [], []
    for i, off in enumerate(offsets):
        for j in range(2):
            pod = f"stable-{i}-{j}"
            if (i, j) == (0, 1):
                continue  # the canary took this pod's GPU
            nodes[pod] = f"node-{i}"
            own = rng.normal(0, 0.003)
            base += [w("stable", pod, k, 0.02 * math.exp(off + own + rng.normal(0, 0.01))) for k in range(20)]
    nodes["canary-0"] = "node-0"
    can = [w("canary", "canary-0", k, 0.02 * math.exp(0.06 + rng.normal(0, 0.003) + rng.normal(0, 0.01)))
           for k in range(20)]
    by_pod: dict[str, list[float]] = {}
    for x in base:
        by_pod.setdefault(x.pod, []).append(math.log(x.loop_mean_seconds))
    ss, df = within_nodes(by_pod, nodes)
    assert df == 3 and ss / df < 0.003**2 * 4  # three nodes with two pods: the restart spread, small
    assert within_nodes(by_pod, {}) == (0.0, 0.0)  # no layout, nothing learned
    first = look(base, can, Layout(nodes), calibration=Calibration())
    assert first.pairing == ("Concurrent",), first.pairing
    assert abs(first.signals[0].delta) < 0.015 and first.verdict != "Rollback", first.message
    assert first.evidence is not None and first.evidence.restart_df >= 3  # kept for the service's calibration
    unpaired = look(base, can, Layout({p: n for p, n in nodes.items() if p.startswith("canary")}),
                    calibration=Calibration())
    assert unpaired.signals[0].delta > 0.04  # against the stable mean, the node's offset reads as a regression


def test_the_pre_period_keeps_the_node_share_when_the_pods_that_shared_a_node_are_gone():
    from vlm_operator.analysis.gate.paired import within_nodes_before

    before = {f"s-{i}-{j}": Before(f"s-{i}-{j}", f"node-{i}", math.log(0.02) + off + (0.003 if j else -0.003), 20)
              for i, off in enumerate([0.06, -0.02, 0.0]) for j in range(2)}
    ss, df = within_nodes_before(before)
    assert df == 3 and ss / df == pytest.approx(2 * 0.003**2)  # the pods' spread around their node's mean
    alone = {p: b for p, b in before.items() if p.endswith("-0")}
    assert within_nodes_before(alone) == (0.0, 0.0)  # one pod per node: nothing to learn
