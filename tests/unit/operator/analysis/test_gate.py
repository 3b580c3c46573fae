"""vlm_operator.analysis.gate: verdicts on constructed windows, the sidecar parser, and seeded error rates."""

import importlib
import math
import zlib
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlm_operator.analysis.gate import Decision, GatePolicy, Window, regressed_function
from vlm_operator.analysis.gate import decide as _decide
from vlm_operator.analysis.gate.paired import Calibration
from vlm_operator.analysis.gate.samples import make_units as _units
from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.errors import InvalidSpec
from vlm_testing.signals import STAGES, shares

T0 = 1_000_000.0
STEP = 300.0


def windows(
    revision: str,
    *,
    n: int,
    effect: float = 0.0,
    pods: int = 1,
    seed: int = 0,
    sd: float = 0.02,
    every: float = 10.0,
    tp: int = 1,
    **extra,
) -> list[Window]:
    """`n` windows per pod every `every` seconds from T0, parsed from sidecar-shaped dicts."""
    rng = np.random.default_rng([seed, zlib.crc32(revision.encode())])
    stages, functions = shares(effect)
    out = []
    for p in range(pods):
        for k in range(n):
            level = 0.020 * (1 + effect) * math.exp(rng.normal(0, sd))
            for rank in range(tp):
                d = {
                    "id": k,
                    "tp_rank": rank,
                    "start": T0 + k * every,
                    "end": T0 + (k + 1) * every,
                    "samples": 1000,
                    "loop_mean_seconds": level,
                    "loop_p95_seconds": level * 1.6,
                    "iterations": 500,
                    "stage_shares": stages,
                    "function_shares": functions,
                    "stale": False,
                    "error": None,
                    **extra,
                }
                out.append(Window.from_sidecar(revision, f"{revision}-{p}", d))
    return out


# The verdict tests judge pods of one host with no offsets of their own: a service whose finished rollouts
# measured a pod spread of 0.5% on 400 degrees of freedom (what the gate then knows before it looks). Tests
# of the spread itself pass `calibration=None` (the 2% prior alone).
TIGHT_FLEET = Calibration(pod_ss=0.005**2 * 400, pod_df=400, restart_ss=0.005**2 * 400, restart_df=400)


def decide(*args, calibration=TIGHT_FLEET, **kw) -> Decision:
    return _decide(*args, calibration=calibration, **kw)


POLICY = GatePolicy(
    max_regression={"loop_latency": 0.03, "stage_time": 0.05},
    min_samples=5,
    max_duration_s=900,
    interval_s=60,
    stale_after_s=120,
)


def run(baseline, canary, policy=POLICY, *, now=None, step=STEP, **kw) -> Decision:
    """decide() with the step's clock at T0 (as a previous look that saw the canary's first window recorded
    it): the verdict tests count time from T0; the clock itself is tested below."""
    if now is None:
        now = max(w.end for w in [*baseline, *canary]) + 1
    return decide(baseline, canary, policy, started_at=T0, now=now, step_duration_s=step, data_started_at=T0, **kw)


# -- verdicts ----------------------------------------------------------------------------------


def test_clear_regression_rolls_back_and_names_the_function():
    d = run(windows("stable", n=18, pods=3), windows("canary", n=18, effect=0.10, seed=1))
    assert d.verdict == "Rollback"
    assert d.reason == "LoopLatencyRegressed"
    assert d.regressed_function == "reconstruct_on_target_device"
    assert d.regressed_stage == "process_input_requests"
    loop = next(s for s in d.signals if s.name == "loop_latency")
    assert loop.verdict == "fail"
    assert 0.07 < loop.delta < 0.13
    assert loop.ci_low > 0.015  # beyond half the 3% margin
    assert loop.p_value < 1e-6
    assert "scheduler loop latency" in d.message and "reconstruct_on_target_device" in d.message


def test_identical_revisions_promote_once_step_time_is_reached():
    base, can = windows("stable", n=30, pods=3, seed=2, sd=0.01), windows("canary", n=30, seed=3, sd=0.01)
    early = run(base[:15] + base[30:45] + base[60:75], can[:15], now=T0 + 151)
    assert (early.verdict, early.reason) == ("Continue", "StepInProgress")
    d = run(base, can, now=T0 + 301)
    assert (d.verdict, d.reason) == ("Promote", "NoRegression")
    assert all(s.verdict == "pass" for s in d.signals)
    assert d.regressed_function is None
    names = [s.name for s in d.signals]
    assert names[0] == "loop_latency" and "stage_time:process_input_requests" in names
    assert "stage_time:idle" not in names  # more idle time is never a regression


def test_a_look_that_adds_no_evidence_is_the_same_test_again():
    """The bounds hold over every look (gate.sequential): judging the same windows later, with no new window,
    gives the same bounds, so looking often spends nothing."""
    base, can = windows("stable", n=18, pods=3), windows("canary", n=18, effect=0.10, seed=1)
    first, later = run(base, can), run(base, can, now=T0 + 190)
    assert (first.verdict, first.reason) == (later.verdict, later.reason) == ("Rollback", "LoopLatencyRegressed")
    assert later.signals[0].ci_low == pytest.approx(first.signals[0].ci_low)


def test_regression_within_half_the_margin_is_never_rolled_back():
    # 1% slower with plenty of data: certainly worse, but inside the 3% allowance.
    d = run(
        windows("stable", n=60, pods=3, seed=4, sd=0.01),
        windows("canary", n=60, effect=0.01, seed=5, sd=0.01),
    )
    assert (d.verdict, d.decided_by) == ("Promote", "evidence"), d.message
    loop = d.signals[0]
    assert loop.delta > 0  # the difference is there (with one canary pod, not surely the revision's) ...
    assert loop.ci_low < 0.015  # ... not surely beyond half the margin ...
    # ... and shown within the margin, the bound carrying the pod's own spread (0.5%): held to the 3% asked for, or
    # to what one canary pod can resolve where that is wider.
    assert loop.ci_high < loop.promote_margin == max(0.03, loop.resolvable) < 0.045


def _three_stable(n: int, sd: float, seed: int, every: float = 10.0) -> list[Window]:
    pods = [windows("stable", n=n, sd=sd, seed=seed + i, every=every) for i in range(3)]
    return [replace(w, pod=f"stable-{i}") for i, pod in enumerate(pods) for w in pod]


def test_beyond_the_margin_but_not_surely_beyond_half_of_it_waits():
    # Canary 3.5% slower than three stable pods (estimate above the 3% margin), with independent 3%
    # window noise: the corrected lower bound is near 0, far below half the margin, so no rollback yet.
    d = run(_three_stable(20, 0.03, 100), windows("canary", n=20, sd=0.03, seed=0, effect=0.035))
    loop = d.signals[0]
    assert loop.delta > 0.03
    assert -0.01 < loop.ci_low < 0.015
    assert (d.verdict, d.reason) == ("Continue", "AwaitingEvidence")


def test_a_load_ramp_shared_by_both_revisions_cancels():
    """Windows are compared with the baseline windows of the same time: a ramp that moves both revisions
    (traffic growing 2% a window) neither widens the bounds nor looks like a regression."""
    def ramp(ws):
        return [replace(w, loop_mean_seconds=w.loop_mean_seconds * (1.02 ** ((w.end - T0) / 10.0))) for w in ws]

    base = ramp(_three_stable(30, 0.01, 300))
    can = ramp(windows("canary", n=30, sd=0.01, seed=301))
    d = run(base, can)
    loop = d.signals[0]
    assert (d.verdict, d.reason) == ("Promote", "NoRegression"), d.message
    # The ramp spans +80% over the step; the bounds a few % (the one canary pod's spread, 0.5%, in both).
    assert loop.ci_high - loop.ci_low < 0.05


def test_too_few_samples_is_inconclusive_and_waits():
    d = run(windows("stable", n=10, pods=3), windows("canary", n=3, seed=1), now=T0 + 35)
    assert (d.verdict, d.reason) == ("Inconclusive", "TooFewSamples")
    assert "canary has 3 of 5" in d.message
    d = run([], [], now=T0 + 30)
    assert (d.verdict, d.reason) == ("Inconclusive", "TooFewSamples")


def test_stale_profiler_is_inconclusive():
    base, can = windows("stable", n=20, pods=2), windows("canary", n=20, seed=1)
    # Canary's newest window ended 200 s ago, beyond stale_after_s = 120.
    d = run(base, can, now=T0 + 400)
    assert (d.verdict, d.reason) == ("Inconclusive", "ProfilerStale")
    flagged = [replace(w, stale=True) for w in can]
    d = run(base, flagged)
    assert (d.verdict, d.reason) == ("Inconclusive", "ProfilerStale")
    assert "every canary profiler window" in d.message
    d = run(base, [], now=T0 + 200)
    assert (d.verdict, d.reason) == ("Inconclusive", "ProfilerStale")


def test_no_traffic_is_inconclusive():
    idle_stages = {"idle": 0.99, "run_batch": 0.01}
    can = windows("canary", n=10, stage_shares=idle_stages)
    d = run(windows("stable", n=10, pods=2), can)
    assert (d.verdict, d.reason) == ("Inconclusive", "NoTraffic")
    d = run(windows("stable", n=10, pods=2), windows("canary", n=10, samples=0))
    assert d.reason == "NoTraffic"


def test_old_baseline_windows_do_not_count():
    # Stable windows from before the step (different traffic, 20% slower) are ignored.
    old = [replace(w, end=w.end - 10_000) for w in windows("stable", n=30, effect=0.2, pods=3, seed=8)]
    d = run(old + windows("stable", n=30, pods=3, seed=9), windows("canary", n=30, seed=10))
    assert d.verdict == "Promote"
    assert d.signals[0].n_baseline == 90


@pytest.mark.parametrize("action", ["Rollback", "Pause", "Promote"])
def test_a_margin_the_windows_cannot_resolve_by_max_duration_is_widened_and_said_so(action):
    # A canary 1% slower, noisy windows (6%), 15 minutes: halfway the promotion bound is far above the 3% margin
    # and the windows still to come will narrow it, so the gate waits (no step advances on an estimate). By the
    # last look the windows cannot resolve 3%: the promotion bound is held to the margin they can resolve instead,
    # the canary is promoted on that evidence whatever onInconclusive says, and the message names the margin used.
    policy = replace(POLICY, on_inconclusive=action)
    base = _three_stable(20, 0.06, 200, every=45.0)
    can = windows("canary", n=20, every=45.0, sd=0.06, seed=0, effect=0.01)
    half = run([w for w in base if w.end <= T0 + 450], [w for w in can if w.end <= T0 + 450], policy, now=T0 + 451)
    assert (half.verdict, half.reason, half.decided_by) == ("Continue", "AwaitingEvidence", None), half.message
    d = run(base, can, policy, now=T0 + 901)
    loop = d.signals[0]
    assert (d.verdict, d.reason, d.decided_by) == ("Promote", "NoRegression", "evidence"), d.message
    assert loop.ci_high > 0.03 and loop.ci_high < loop.promote_margin == loop.resolvable
    assert f"resolvable {loop.promote_margin:.1%}" in d.message


@pytest.mark.parametrize("action", ["Promote", "Rollback"])
def test_last_look_keeps_the_rollback_rule_and_leaves_a_worse_but_unresolved_canary_to_on_inconclusive(action):
    # 4.5% slower at 6% window noise: confidently worse (bound above 0) and beyond the 3% margin, but not
    # confidently beyond half of it. The last look rolls back on the same rule as every other (rolling back on
    # "bound above 0" there let a canary within half the margin be rolled back far more often than the budget
    # at short maxDurations): onInconclusive decides, as for any canary the data could not resolve.
    base = _three_stable(20, 0.06, 200, every=45.0)
    can = windows("canary", n=20, every=45.0, sd=0.06, seed=0, effect=0.045)
    policy = replace(POLICY, max_regression={"loop_latency": 0.03}, on_inconclusive=action)
    before = run(base, can, policy, now=T0 + 899)
    assert before.verdict == "Continue", before
    d = run(base, can, policy, now=T0 + 901)
    assert (d.verdict, d.reason) == (action, "MaxDurationReached"), d
    assert 0 < d.signals[0].ci_low < 0.015 and d.signals[0].delta > 0.03


@pytest.mark.parametrize(
    ("action", "data", "verdict"),
    [
        ("Rollback", "undecided", "Rollback"),
        ("Pause", "undecided", "Pause"),
        ("Promote", "undecided", "Promote"),
        ("Rollback", "stale", "Rollback"),
        ("Pause", "stale", "Pause"),
        ("Promote", "stale", "Pause"),  # never promote without data
    ],
)
def test_max_duration_applies_on_inconclusive(action, data, verdict):
    policy = replace(POLICY, on_inconclusive=action)
    # Three stable pods and a canary 4% slower, with very noisy windows (15%): the estimate is beyond
    # the 3% margin but not even "worse at all" can be shown, so the last look cannot decide either; a
    # window every 45 s keeps the data fresh up to maxDuration.
    base = _three_stable(20, 0.15, 200, every=45.0)
    can = windows("canary", n=20, every=45.0, sd=0.15, seed=0, effect=0.04)
    now = T0 + 901
    if data == "stale":
        can = [w for w in can if w.end < T0 + 600]
    before = run(base, can, policy, now=now - 2)
    assert before.verdict in ("Continue", "Inconclusive") and before.reason != "MaxDurationReached"
    d = run(base, can, policy, now=now)
    assert (d.verdict, d.reason) == (verdict, "MaxDurationReached")
    assert f"onInconclusive {action}" in d.message
    if data == "undecided":
        assert before.reason == "AwaitingEvidence"
        assert d.signals[0].delta > 0.03 and d.signals[0].ci_low < 0
    else:
        assert before.reason == "ProfilerStale"


def test_throughput_drop_is_a_regression_and_a_gain_is_not():
    # Saturated pods (more than a second of arrivals waiting at both edges of every window): throughput is their
    # capacity.
    policy = replace(POLICY, max_regression={"throughput": 0.05})
    sat = {"queued_requests": 3, "request_rate": 2.0}
    base = windows("stable", n=20, pods=2, seed=13, throughput=25.0, **sat)
    worse = windows("canary", n=20, seed=14, throughput=22.0, **sat)
    better = windows("canary", n=20, seed=14, throughput=28.0, **sat)
    d = run(base, worse, policy, step=100)
    assert (d.verdict, d.reason) == ("Rollback", "ThroughputRegressed")
    assert d.signals[0].delta == pytest.approx(22 / 25 - 1)
    assert run(base, better, policy, step=100).verdict == "Promote"


def test_throughput_is_compared_only_where_the_pod_was_saturated():
    # Below saturation a pod's throughput is the traffic the router sent it. A canary that got 12% less of it
    # (an empty queue at the window's edges, a request or two that arrived since the scheduler's last iteration,
    # or a sidecar that does not say) is not read as 12% slower...
    policy = replace(POLICY, max_regression={"loop_latency": 0.03, "throughput": 0.05})
    base = windows("stable", n=20, pods=2, seed=13, throughput=25.0, queued_requests=0, request_rate=4.0)
    for queued in ({"queued_requests": 0, "request_rate": 4.0}, {"queued_requests": 2, "request_rate": 4.0},
                   {"queued_requests": 9}, {}):
        light = windows("canary", n=20, seed=14, throughput=22.0, **queued)
        d = run(base, light, policy, step=100)
        tput = next(s for s in d.signals if s.name == "throughput")
        assert d.verdict == "Promote" and (tput.verdict, tput.n_canary) == ("insufficient", 0), (queued, d)
    # One canary window saturated, too few for an estimate: reported, and it holds nothing (an e2e canary waited
    # its maxDuration on "throughput n/a over 1 canary / 10 baseline windows" before this rule).
    few = [replace(w, queued_requests=9.0 if i == 0 else 0.0) for i, w in enumerate(
        windows("canary", n=20, seed=14, throughput=22.0, request_rate=4.0))]
    some = [replace(w, queued_requests=9.0 if i % 4 == 0 else 0.0) for i, w in enumerate(base)]
    d = run(some, few, policy, step=100)
    tput = next(s for s in d.signals if s.name == "throughput")
    assert d.verdict == "Promote" and (tput.verdict, tput.n_canary, tput.delta) == ("insufficient", 1, None), d
    # ... while the same pods' saturated windows are compared and a lower capacity is found among them; their
    # unsaturated windows (half of each pod's, with any throughput) are left out of it.
    mixed_base = [replace(w, queued_requests=float(i % 2 * 4), request_rate=3.0, throughput=25.0 if i % 2 else 5.0)
                  for i, w in enumerate(windows("stable", n=40, pods=2, seed=13))]
    mixed_canary = [replace(w, queued_requests=float(i % 2 * 4), request_rate=3.0, throughput=22.0 if i % 2 else 40.0)
                    for i, w in enumerate(windows("canary", n=40, seed=14))]
    d = run(mixed_base, mixed_canary, policy, step=100)
    tput = next(s for s in d.signals if s.name == "throughput")
    assert (d.verdict, d.reason) == ("Rollback", "ThroughputRegressed"), d
    assert tput.delta == pytest.approx(22 / 25 - 1)
    assert tput.n_canary == 20


def test_request_signals_missing_everywhere_do_not_block_promotion():
    policy = replace(POLICY, max_regression={"loop_latency": 0.03, "ttft": 0.1})
    d = run(windows("stable", n=30, pods=3), windows("canary", n=30, seed=1), policy)
    assert d.verdict == "Promote"
    ttft = next(s for s in d.signals if s.name == "ttft")
    assert (ttft.verdict, ttft.n_canary) == ("insufficient", 0)
    # ... and cost loop latency none of its false-rollback budget.
    only_loop = replace(POLICY, max_regression={"loop_latency": 0.03})
    alone = run(windows("stable", n=30, pods=3), windows("canary", n=30, seed=1), only_loop)
    assert d.signals[0].ci_low == alone.signals[0].ci_low


def test_stage_time_regression_names_the_stage():
    policy = replace(POLICY, max_regression={"stage_time": 0.05})
    d = run(windows("stable", n=30, pods=3), windows("canary", n=30, effect=0.25, seed=1), policy)
    assert (d.verdict, d.reason) == ("Rollback", "StageTimeRegressed")
    assert d.regressed_stage == "process_input_requests"
    assert "time per iteration of process_input_requests" in d.message
    s_pi = next(s for s in d.signals if s.name == "stage_time:process_input_requests")
    assert s_pi.delta == pytest.approx(0.25, abs=0.02)  # 25 points of the baseline's loop time


def test_a_stage_verdict_names_its_own_stage_not_the_one_that_grew_most_by_estimate(monkeypatch):
    """The evidence names the stage: where a noisier stage's point estimate grew more (run_batch on a loaded host,
    seen on the testbed), a verdict on process_input_requests' time still names process_input_requests; a verdict
    on the whole loop names the stage that grew most."""
    monkeypatch.setattr(importlib.import_module("vlm_operator.analysis.gate.decide"), "regressed_stage",
                        lambda b, c: "run_batch")
    policy = replace(POLICY, max_regression={"stage_time": 0.05})
    d = run(windows("stable", n=30, pods=3), windows("canary", n=30, effect=0.25, seed=1), policy)
    assert (d.verdict, d.reason, d.regressed_stage) == ("Rollback", "StageTimeRegressed", "process_input_requests")
    assert "grew most: stage process_input_requests" in d.message
    loop = run(windows("stable", n=18, pods=3), windows("canary", n=18, effect=0.10, seed=1))
    assert (loop.reason, loop.regressed_stage) == ("LoopLatencyRegressed", "run_batch")


def faster(revision: str, *, n: int, speedup: float, seed: int, pods: int = 1) -> list[Window]:
    """Windows of a revision whose input stage got `speedup` (fraction of the loop) cheaper, everything
    else unchanged in absolute time: the IPC cache switched on. The other stages' shares grow."""
    return windows(revision, n=n, effect=-speedup, seed=seed, pods=pods)


@pytest.mark.parametrize("speedup", [0.06, 0.10])
def test_a_faster_canary_is_promoted_not_held_for_a_share_shift(speedup):
    """Stage shares sum to 1: turning the cache on shrinks process_input_requests and grows run_batch's
    share by ~5 points with its time unchanged. The old share gate held a 6%-faster canary at
    AwaitingEvidence and rolled back a 10%-faster one (StageShareRegressed run_batch)."""
    base = windows("stable", n=30, pods=3, seed=21, sd=0.01)
    can = faster("canary", n=30, speedup=speedup, seed=22)
    b_share = base[0].stage_shares["run_batch"]
    assert can[0].stage_shares["run_batch"] - b_share > 0.03  # the share did shift
    d = run(base, can)
    assert (d.verdict, d.reason) == ("Promote", "NoRegression"), d.message
    run_batch = next(s for s in d.signals if s.name == "stage_time:run_batch")
    assert abs(run_batch.delta) < 0.01  # its time per iteration did not change


def _nested(revision: str, *, n: int, seed: int, hash_extra: float = 0.0, pods: int = 1, top_n: int = 3,
            bytes_extra: float = 0.0, bound: bool = False):
    """SGLang 0.5.2x-shaped windows: every stage runs under a decorator's `wrapper` frame (inclusive
    share ~1), hash_feature (and its leaf _hash_bytes) under handle_generate_request under
    process_input_requests, and the sidecar exports the watch list plus the top N by self time, a set
    that changes every window. `bound`: windows carry self shares and the sidecar's bound for what it
    left out (unexported_self_share_max), as the sidecar writes them."""
    rng = np.random.default_rng([seed, zlib.crc32(revision.encode())])
    out = []
    for p in range(pods):
        for k in range(n):
            loop = 0.020 * (1 + hash_extra) * math.exp(rng.normal(0, 0.01))
            self_t = {  # seconds per iteration of self time, one random function a bit hotter per window
                "recv_requests": 0.0008, "hash_feature": 0.002 + 0.020 * hash_extra,
                "handle_generate_request": 0.0005, "get_next_batch_to_run": 0.0012, "forward": 0.010,
                "process_batch_result": 0.0024, "sample": 0.0009 * (1 + rng.uniform(0, 2)),
                "detokenize_step": 0.0009 * (1 + rng.uniform(0, 2)), "wrapper": 0.0001,
                "_hash_bytes": 0.0003 + 0.020 * bytes_extra,
            }
            loop *= 1 + bytes_extra
            total = sum(self_t.values())
            sh = {f: v / total for f, v in self_t.items()}
            incl = {
                "event_loop_overlap": 1.0, "wrapper": 0.99,
                "process_input_requests": sh["hash_feature"] + sh["handle_generate_request"] + sh["_hash_bytes"],
                "handle_generate_request": sh["hash_feature"] + sh["handle_generate_request"] + sh["_hash_bytes"],
                "hash_feature": sh["hash_feature"] + sh["_hash_bytes"], "_hash_bytes": sh["_hash_bytes"],
                "run_batch": sh["forward"] + sh["sample"],
                "forward": sh["forward"], "sample": sh["sample"], "detokenize_step": sh["detokenize_step"],
                "recv_requests": sh["recv_requests"], "get_next_batch_to_run": sh["get_next_batch_to_run"],
                "process_batch_result": sh["process_batch_result"] + sh["detokenize_step"],
            }
            watch = ["process_input_requests", "hash_feature", "reconstruct_on_target_device"]
            top = sorted(sh, key=lambda f: -sh[f])[:top_n]
            exported = dict.fromkeys([*watch, *top, "event_loop_overlap", "wrapper"])
            stages = {"recv_requests": sh["recv_requests"], "process_input_requests": incl["process_input_requests"],
                      "get_next_batch_to_run": sh["get_next_batch_to_run"], "run_batch": incl["run_batch"],
                      "process_batch_result": incl["process_batch_result"], "idle": 0.0, "other": sh["wrapper"]}
            d = {"id": k, "end": T0 + (k + 1) * 10.0, "samples": 1000, "loop_mean_seconds": loop,
                 "loop_p95_seconds": loop * 1.5, "iterations": 500, "stage_shares": stages,
                 "function_shares": {f: incl.get(f, 0.0) for f in exported}, "stale": False}
            if bound:
                d["self_shares"] = {f: sh.get(f, 0.0) for f in exported}
                d["unexported_self_share_max"] = max(v for f, v in sh.items() if f not in exported)
            out.append(Window.from_sidecar(revision, f"{revision}-{p}", d))
    return out


def test_a_regression_below_a_decorator_names_the_function_not_the_wrapper():
    """Functions outside one side's exported set are unknown there, not 0 (the old gate read a churned
    export as 'grew by 100%' and named a wrapper or event_loop_overlap)."""
    base = _nested("stable", n=30, seed=31, pods=3)
    can = _nested("canary", n=30, seed=32, hash_extra=0.10)
    assert len({frozenset(w.function_shares) for w in can}) > 1  # the export set churns
    d = run(base, can)
    assert (d.verdict, d.reason) == ("Rollback", "LoopLatencyRegressed")
    assert d.regressed_function == "hash_feature"
    assert d.regressed_stage == "process_input_requests"


@pytest.mark.parametrize("bound", [False, True], ids=["no-bound", "bound"])
def test_a_function_exported_on_one_side_only_is_not_named_for_being_there(bound):
    """`forward` is the hottest function on both sides but only the canary's sidecar exports it: without
    the baseline's bound it is unknown there; with it, its growth is bounded by ~0 (its canary self time
    minus the baseline's bound, which is forward's own share), so it is not named either."""
    base = _nested("stable", n=20, seed=33, pods=3, top_n=0, bound=bound)  # only the watch list and wrappers
    can = _nested("canary", n=20, seed=34, hash_extra=0.10, top_n=4, bound=bound)
    d = run(base, can)
    assert d.verdict == "Rollback"
    assert d.regressed_function in ("hash_feature",)
    assert d.regressed_function not in ("forward", "wrapper", "event_loop_overlap")


def test_a_regression_in_a_function_only_the_canary_exported_is_named_through_the_bound():
    """_hash_bytes (a leaf below the watched hash_feature) is below the baseline's top-N cut in every
    window and at the top on the canary. With the baseline's bound for what it left out, its self-time
    growth is known to be at least canary minus bound, and it is named; without the bound it cannot be
    compared and its caller is the deepest function both sides exported."""
    # Top 6 exported: the bound (the largest self share left out, recv_requests' ~4%) is tight enough.
    base, can = (_nested("stable", n=30, seed=35, pods=3, bound=True, top_n=6),
                 _nested("canary", n=30, seed=36, bytes_extra=0.30, bound=True, top_n=6))
    assert not any("_hash_bytes" in w.function_shares for w in base)
    assert all("_hash_bytes" in w.function_shares for w in can)
    d = run(base, can)
    assert (d.verdict, d.regressed_function) == ("Rollback", "_hash_bytes"), d.message
    strip = [replace(w, unexported_self_share_max=None) for w in base]
    assert run(strip, can).regressed_function == "hash_feature"


def test_tp_ranks_of_one_pod_count_once():
    d = run(windows("stable", n=20, pods=2, tp=2), windows("canary", n=20, seed=1, tp=4))
    loop = d.signals[0]
    assert (loop.n_baseline, loop.n_canary) == (40, 20)


def test_same_inputs_same_decision_and_duplicates_are_harmless():
    base, can = windows("stable", n=18, pods=3), windows("canary", n=18, effect=0.10, seed=1)
    first = run(base, can)
    assert run(base, can) == first
    assert run(base + base[:20], can + can) == first  # overlapping scrapes


def test_policy_rejects_nonsense():
    with pytest.raises(InvalidSpec, match="unknown signal"):
        GatePolicy(max_regression={"loop_latnecy": 0.05})
    with pytest.raises(InvalidSpec):
        GatePolicy(confidence=1.0)
    with pytest.raises(InvalidSpec):
        GatePolicy(min_samples=2)
    with pytest.raises(InvalidSpec):
        GatePolicy(max_regression={"loop_latency": -0.1})


def test_regressed_function_prefers_the_deepest_of_nested_frames():
    def units(shares: dict, loop: float = 0.02):
        ws = [Window.from_sidecar("r", f"p{i}", {"id": i, "end": T0 + i, "samples": 10, "loop_mean_seconds": loop,
                                                  "function_shares": shares}) for i in range(4)]
        return _units(ws, 5.0)

    b = units({"event_loop": 0.95, "process_input_requests": 0.10, "handle_generate_request": 0.08, "recon": 0.001})
    c = units({"event_loop": 0.95, "process_input_requests": 0.131, "handle_generate_request": 0.11, "recon": 0.03})
    assert regressed_function(b, c) == "recon"
    # An unrelated function that grew far more wins.
    b2 = units({"event_loop": 0.95, "process_input_requests": 0.10, "recon": 0.001, "run_batch": 0.1})
    c2 = units({"event_loop": 0.95, "process_input_requests": 0.131, "recon": 0.03, "run_batch": 0.2})
    assert regressed_function(b2, c2) == "run_batch"
    assert regressed_function(b, b) is None
    # Time, not share: a loop 30% slower everywhere grew every function's time (shares unchanged); a
    # function is still named, never the loop-wide frame.
    assert regressed_function(b, units(dict(b[0].function_shares), loop=0.026)) not in (None, "event_loop")


# -- one decision point, validation, heterogeneity -------------------------------------------------


def test_unreachable_sources_never_promote_even_with_on_inconclusive_promote():
    policy = replace(POLICY, on_inconclusive="Promote")
    early = decide([], [], policy, started_at=T0, now=T0 + 300, step_duration_s=STEP, unavailable="Prometheus down")
    assert (early.verdict, early.reason) == ("Inconclusive", "SignalsUnavailable")
    late = decide([], [], policy, started_at=T0, now=T0 + 901, step_duration_s=STEP, unavailable="Prometheus down")
    assert (late.verdict, late.reason) == ("Pause", "MaxDurationReached")
    assert "refused without data" in late.message
    rolled = decide([], [], POLICY, started_at=T0, now=T0 + 901, step_duration_s=STEP, unavailable="x")
    assert rolled.verdict == "Rollback"


def test_every_spec_the_api_accepts_gives_a_policy():
    """Validate once: any analysis block the pydantic model (and so the CRD) accepts builds a GatePolicy."""
    from vlm_operator.api import v1alpha1 as api

    @settings(max_examples=150, deadline=None)
    @given(
        min_samples=st.integers(3, 1000),
        confidence=st.floats(0.5, 0.999),
        interval=st.sampled_from(["1s", "15s", "1m", "90s", "1h"]),
        max_duration=st.sampled_from(["1h", "2h", "1h30m1s"]),
        margins=st.lists(st.floats(0, 100), min_size=5, max_size=5),
        action=st.sampled_from(["Rollback", "Promote", "Pause"]),
        steps=st.integers(1, 10),
    )
    def check(min_samples, confidence, interval, max_duration, margins, action, steps):
        spec = api.parse_spec({
            "model": {"path": "m"}, "replicas": 10,
            "rollout": {"steps": [{"replicas": 1}] * steps, "analysis": {
                "minSamples": min_samples, "confidence": confidence, "interval": interval,
                "maxDuration": max_duration, "onInconclusive": action,
                "maxRegression": dict(zip(["loopLatency", "ttft", "itl", "throughput", "stageTime"], margins, strict=True)),
            }},
        })
        policy = GatePolicy.from_spec(spec)
        assert policy.steps == steps and policy.min_samples == min_samples

    check()


def test_loop_p95_is_gated_only_when_the_spec_sets_its_margin_and_a_slower_tail_is_rolled_back():
    def policy(extra):
        return GatePolicy.from_spec(api.parse_spec({
            "model": {"path": "m"}, "replicas": 4,
            "rollout": {"steps": [{"replicas": 1, "analysis": "5m"}], "analysis": {"maxRegression": extra}}}))

    assert "loop_p95" not in policy({}).max_regression
    p = policy({"loopP95": 5})
    assert p.max_regression["loop_p95"] == 0.05
    base = [Window("stable", f"s{i % 3}", str(i), T0 + 15 * i, 500, 0.020, 0.030, STAGES, {}) for i in range(60)]
    slow = [Window("canary", "c0", str(i), T0 + 15 * i, 500, 0.020, 0.036, STAGES, {}) for i in range(60)]
    d = decide(base, slow, replace(p, max_regression={"loop_latency": 0.03, "loop_p95": 0.05}), started_at=T0,
               now=T0 + 900, step_duration_s=300)
    assert (d.verdict, d.reason) == ("Rollback", "LoopP95Regressed"), d.message


@pytest.mark.parametrize("bad", [{"minSamples": 2}, {"interval": "0s"}, {"maxRegression": {"stageShare": 5}}])
def test_analysis_the_gate_cannot_run_is_refused_by_the_model(bad):
    from pydantic import ValidationError

    from vlm_operator.api import v1alpha1 as api

    with pytest.raises(ValidationError):
        api.parse_spec({"model": {"path": "m"}, "rollout": {"analysis": bad}})


def _offset_pods(revision: str, offsets: list[float], *, n: int, seed: int, effect: float = 0.0) -> list[Window]:
    out = []
    for i, off in enumerate(offsets):
        for w in windows(revision, n=n, seed=seed + i, sd=0.01, effect=effect):
            out.append(replace(w, pod=f"{revision}-{i}", loop_mean_seconds=w.loop_mean_seconds * math.exp(off)))
    return out


def test_between_pod_spread_widens_the_bounds_and_is_reported():
    """One canary pod on a node 4% slower than average, against three stable pods that differ by ~3%
    among themselves: the window-level test alone would call that a regression beyond the margin."""
    base = _offset_pods("stable", [-0.03, 0.0, 0.03], n=30, seed=40)
    can = _offset_pods("canary", [0.04], n=30, seed=50)
    d = run(base, can, calibration=None)  # no history: the prior and these pods' own spread
    assert d.verdict != "Rollback", d.message
    assert d.warning and "can resolve" in d.warning
    loop = d.signals[0]
    assert loop.delta > 0.03 and loop.ci_low < 0.015  # beyond the margin, but one pod: not surely the revision


def test_a_fixed_expand_ceiling_below_what_one_pod_needs_is_warned_with_the_harmless_expand_rate():
    """Pods 3% apart: one canary pod's standard error calls for a ceiling well above a 3% margin. A user's
    expandCeiling at the margin caps the harm a step may expose, and the decision says what that costs."""
    base = _offset_pods("stable", [-0.03, 0.0, 0.03], n=30, seed=40)
    can = _offset_pods("canary", [0.0], n=30, seed=50)
    free = run(base, can, calibration=None)
    loop = free.signals[0]
    assert free.ceiling_warning is None and loop.default_ceiling is None and loop.ceiling > 0.03
    capped = run(base, can, replace(POLICY, expand_ceiling={"loop_latency": 0.03}), calibration=None)
    c = capped.signals[0]
    assert c.ceiling == pytest.approx(0.03) and c.default_ceiling == pytest.approx(loop.ceiling)
    assert 0 <= c.harmless_expand_rate < 0.9  # a harmless canary rarely expands under it
    assert capped.ceiling_warning.startswith("expandCeiling.loopLatency 3.0% is below the ")
    assert f"{c.harmless_expand_rate:.0%} of the time" in capped.ceiling_warning
    above = run(base, can, replace(POLICY, expand_ceiling={"loop_latency": loop.ceiling * 1.5}), calibration=None)
    assert above.ceiling_warning is None and above.signals[0].default_ceiling is None  # above the default: silent


def test_the_rollback_budget_is_split_over_the_gated_signals_not_over_steps_or_looks():
    base, can = windows("stable", n=18, pods=3), windows("canary", n=18, effect=0.04, seed=1)
    loop_only = replace(POLICY, max_regression={"loop_latency": 0.03})
    one, two = run(base, can, loop_only), run(base, can)
    assert two.signals[0].ci_low < one.signals[0].ci_low  # loop latency and stage time share the budget
    three_steps = run(base, can, replace(loop_only, steps=3), step=0)
    assert three_steps.signals[0].ci_low == pytest.approx(one.signals[0].ci_low)  # steps need no share


# -- the sidecar parser --------------------------------------------------------------------------


def test_from_sidecar_reads_a_well_formed_entry():
    w = Window.from_sidecar(
        "rev2",
        "pod-a",
        {
            "id": 17,
            "tp_rank": 1,
            "start": 10.0,
            "end": 20.0,
            "samples": 998,
            "loop_mean_seconds": 0.021,
            "loop_p50_seconds": 0.02,
            "loop_p95_seconds": 0.034,
            "iterations": 470,
            "stage_shares": {"run_batch": 0.55, "idle": 0.05},
            "function_shares": {"hash_feature": 0.04},
            "top_function": "forward",
            "stale": False,
            "error": None,
            "sglang": {"ttft_seconds": 0.84, "itl_seconds": 0.06},
            "throughput": 25.7,
        },
    )
    assert (w.revision, w.pod, w.id, w.tp_rank, w.end, w.samples, w.iterations) == (
        "rev2",
        "pod-a",
        "17",
        1,
        20.0,
        998,
        470,
    )
    assert (w.loop_mean_seconds, w.loop_p95_seconds) == (0.021, 0.034)
    assert (w.ttft_seconds, w.itl_seconds, w.throughput) == (0.84, 0.06, 25.7)
    assert w.stage_shares == {"run_batch": 0.55, "idle": 0.05} and not w.stale


def test_from_sidecar_on_garbage():
    w = Window.from_sidecar(
        "r",
        "p",
        {
            "id": True,
            "end": "yesterday",
            "samples": -3,
            "loop_mean_seconds": "NaN",
            "loop_p95_seconds": -0.1,
            "stage_shares": [0.5, 0.5],
            "function_shares": {1: 0.5, "f": "x", "g": 1.0000001, "h": float("inf"), "": 0.2, "k": -0.1},
            "stale": "no",
            "iterations": "many",
            "sglang": "down",
        },
    )
    assert (w.id, w.end, w.samples, w.iterations) == ("", 0.0, 0, None)
    assert (w.loop_mean_seconds, w.loop_p95_seconds) == (None, None)
    assert w.stage_shares == {} and w.function_shares == {"g": 1.0}
    assert w.stale is False
    assert Window.from_sidecar("r", "p", {"stale": "true"}).stale is True
    assert Window.from_sidecar("r", "p", {"error": "py-spy timed out"}).stale is True
    for junk in (None, [], "x", 3, {"end": float("nan")}):
        assert Window.from_sidecar("r", "p", junk).samples == 0


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
    max_leaves=10,
)
_keys = st.sampled_from(
    [
        "id",
        "end",
        "samples",
        "loop_mean_seconds",
        "loop_p95_seconds",
        "stage_shares",
        "function_shares",
        "stale",
        "error",
        "iterations",
        "tp_rank",
        "sglang",
        "ttft_seconds",
        "throughput",
    ]
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_keys, _json, max_size=8))
def test_from_sidecar_never_raises_and_never_trusts_a_bad_window(entry):
    w = Window.from_sidecar("r", "p", entry)
    assert w.samples >= 0 and w.tp_rank >= 0 and math.isfinite(w.end)
    for v in (w.loop_mean_seconds, w.loop_p95_seconds, w.ttft_seconds, w.throughput):
        assert v is None or (math.isfinite(v) and v > 0)
    assert all(0 <= s <= 1 for s in [*w.stage_shares.values(), *w.function_shares.values()])
    # And the gate accepts whatever came out.
    decide([w], [w], POLICY, started_at=0.0, now=T0, step_duration_s=STEP)


# -- seeded error rates --------------------------------------------------------------------------


def test_no_false_rollbacks_and_full_power_on_seeded_runs():
    """40 seeded A/A and +10% runs judged at the end of each of 3 intervals (sequential looks)."""
    false_rb = detected = 0
    for seed in range(40):
        base = windows("stable", n=18, pods=3, seed=100 + seed, sd=0.03)
        same = windows("canary", n=18, seed=200 + seed, sd=0.03)
        slow = windows("canary", n=18, effect=0.10, seed=200 + seed, sd=0.03)
        for look in (1, 2, 3):
            now = T0 + 60 * look + 1
            cut = lambda ws, now=now: [w for w in ws if w.end <= now]  # noqa: E731
            false_rb += run(cut(base), cut(same), now=now).verdict == "Rollback"
        detected += any(
            run(cut(base), cut(slow), now=T0 + 60 * k + 1).verdict == "Rollback"
            for k in (1, 2, 3)
            for cut in [lambda ws, k=k: [w for w in ws if w.end <= T0 + 60 * k + 1]]
        )
    assert false_rb == 0
    assert detected == 40


def test_fresh_baseline_uses_the_stable_pods_to_know_how_much_pods_differ():
    """One fresh baseline pod against one canary pod: their difference carries two pods' offsets, which
    only the long-running stable pods next to them can measure."""
    fresh = _offset_pods("stable", [-0.02], n=30, seed=60)
    can = _offset_pods("canary", [0.02], n=30, seed=61)  # A/A: the canary's node is just 4% slower
    stable = _offset_pods("stable", [-0.025, 0.0, 0.025], n=30, seed=62)
    naive = run(fresh, can)  # one pod a side: only the history (0.5%) says how much pods differ
    d = decide(fresh, can, POLICY, started_at=T0, now=T0 + 301, step_duration_s=STEP, spread_reference=stable)
    assert d.verdict != "Rollback", d.message
    assert d.signals[0].ci_low < naive.signals[0].ci_low  # the stable pods show a wider spread
    real = _offset_pods("canary", [0.0], n=30, seed=63, effect=0.25)
    assert decide(fresh, real, POLICY, started_at=T0, now=T0 + 301, step_duration_s=STEP,
                  spread_reference=stable).verdict == "Rollback"


# -- the front end (maxRegression.frontendBusy) ---------------------------------------------------

FE_POLICY = replace(POLICY, max_regression={"loop_latency": 0.03, "stage_time": 0.05, "frontend_busy": 0.10})


def _pool(busy: float, convert: float, cut: float | None) -> dict:
    """The image processor pool's role entry: workers `busy` of the time, `convert` of it in convert_color
    (a step only the canary has, so only its sidecar exports it), the rest in resize and normalize."""
    work = busy - convert
    fns = {"_process_worker": 1.0, "preprocess_image": busy, "normalize": 0.55 * work, "resize": 0.4 * work,
           "get": 1.0 - busy}
    selfs = {"normalize": 0.55 * work, "resize": 0.4 * work, "get": 1.0 - busy}
    if convert > 0:
        fns["convert_color"] = selfs["convert_color"] = convert
    return {"busy_share": busy, "function_shares": fns, "self_shares": selfs, "unexported_self_share_max": cut}


def with_frontend(ws: list[Window], *, busy: float, convert: float = 0.0, loop_busy: float = 0.2,
                  sd: float = 0.02, seed: int = 0, cut: float | None = 0.01) -> list[Window]:
    """The same windows with a front end sampled beside each: pool busy share `busy` (+ window noise), the
    tokenizer loop `loop_busy`."""
    rng = np.random.default_rng(seed)
    out = []
    for w in ws:
        b = min(1.0, max(0.0, busy + rng.normal(0, sd)))
        roles = {"mm_processor": _pool(b, min(convert, b), cut),
                 "tokenizer_manager": {"busy_share": loop_busy + rng.normal(0, sd / 2),
                                       "function_shares": {"run": 1.0, "handle_generate_request": loop_busy}}}
        out.append(Window.from_sidecar(w.revision, w.pod, {
            "id": w.id, "tp_rank": w.tp_rank, "end": w.end, "samples": w.samples,
            "loop_mean_seconds": w.loop_mean_seconds, "loop_p95_seconds": w.loop_p95_seconds,
            "iterations": w.iterations, "stage_shares": dict(w.stage_shares),
            "function_shares": dict(w.function_shares), "frontend": {"id": 1, "roles": roles}}))
    return out


def test_a_slower_image_preprocessing_is_rolled_back_naming_the_front_end_function():
    """The scheduler is unchanged; the canary's pool spends 12 more points of its time per image in a new
    convert_color step, which only the canary's sidecar exports (compared through the baseline's bound)."""
    base = with_frontend(windows("stable", n=30, pods=3, seed=41), busy=0.30, seed=1)
    can = with_frontend(windows("canary", n=30, seed=42), busy=0.42, convert=0.12, seed=2)
    d = run(base, can, FE_POLICY)
    assert (d.verdict, d.reason) == ("Rollback", "FrontendBusyRegressed"), d.message
    assert (d.regressed_function, d.regressed_stage) == ("convert_color", None)
    assert "front-end busy share of mm_processor" in d.message and "mm_processor function convert_color" in d.message
    sig = {s.name: s for s in d.signals}
    assert sig["frontend_busy:mm_processor"].delta == pytest.approx(0.12, abs=0.02)
    assert sig["frontend_busy:tokenizer_manager"].verdict != "fail"
    assert sig["loop_latency"].verdict != "fail"
    # Without the baseline's bound, convert_color cannot be compared: the deepest frame both exported grew.
    assert run([replace(w, frontend={r: replace(x, unexported_self_share_max=None) for r, x in w.frontend.items()})
                for w in base], can, FE_POLICY).regressed_function == "preprocess_image"


def test_a_faster_front_end_is_promoted():
    base = with_frontend(windows("stable", n=30, pods=3, seed=43, sd=0.01), busy=0.40, seed=3)
    can = with_frontend(windows("canary", n=30, seed=44, sd=0.01), busy=0.20, seed=4)
    d = run(base, can, FE_POLICY)
    assert (d.verdict, d.reason) == ("Promote", "NoRegression"), d.message
    assert next(s for s in d.signals if s.name == "frontend_busy:mm_processor").verdict == "pass"


def with_rate(ws: list[Window], rate: float, sd: float = 0.0, seed: int = 0) -> list[Window]:
    """The windows with a request rate (requests/s reaching their first token), optionally noisy."""
    rng = np.random.default_rng(seed)
    return [replace(w, request_rate=max(0.0, rate + rng.normal(0, sd)) if sd else rate) for w in ws]


def test_a_canary_busier_only_because_it_got_more_traffic_is_not_rolled_back():
    """The canary pod gets 1.6x the baseline's requests (uneven balancing): its pool is busy 0.48 instead of
    0.30, at the same cost per request. Scaled to the baseline's request rate it is as busy as the baseline;
    the raw shares (what a sidecar without SGLang's counters gives) would read +18 points and roll back."""
    base = with_frontend(windows("stable", n=30, pods=3, seed=47, sd=0.01), busy=0.30, seed=6)
    can = with_frontend(windows("canary", n=30, seed=48, sd=0.01), busy=0.48, seed=7)
    d = run(with_rate(base, 10.0, sd=0.3, seed=8), with_rate(can, 16.0, sd=0.5, seed=9), FE_POLICY)
    assert (d.verdict, d.reason) == ("Promote", "NoRegression"), d.message
    sig = next(s for s in d.signals if s.name == "frontend_busy:mm_processor")
    assert sig.verdict == "pass" and abs(sig.delta) < 0.03, sig
    raw = run(base, can, FE_POLICY)
    assert (raw.verdict, raw.reason) == ("Rollback", "FrontendBusyRegressed"), raw.message


def test_a_front_end_slower_per_request_at_less_traffic_is_still_rolled_back():
    """The canary gets 0.7x the requests and costs 1.8x per request: raw busy share 0.30 -> 0.38 (+8 points,
    inside the margin), at the baseline's traffic 0.54 (+24 points): rolled back."""
    base = with_frontend(windows("stable", n=30, pods=3, seed=49, sd=0.01), busy=0.30, seed=10)
    can = with_frontend(windows("canary", n=30, seed=50, sd=0.01), busy=0.378, convert=0.1, seed=11)
    d = run(with_rate(base, 10.0), with_rate(can, 7.0), FE_POLICY)
    assert (d.verdict, d.reason) == ("Rollback", "FrontendBusyRegressed"), d.message
    sig = next(s for s in d.signals if s.name == "frontend_busy:mm_processor")
    assert sig.delta == pytest.approx(0.24, abs=0.03), sig
    assert run(base, can, FE_POLICY).reason != "FrontendBusyRegressed"  # the raw shares would let it through


def test_front_end_shares_are_scaled_only_when_every_window_has_a_request_rate():
    """One canary window without a rate (an older sidecar, SGLang's /metrics unreachable): the raw shares are
    compared, all of them; a window with no request at all has no per-request cost and is left out."""
    base = with_rate(with_frontend(windows("stable", n=30, pods=3, seed=51, sd=0.01), busy=0.30, seed=12), 10.0)
    can = with_rate(with_frontend(windows("canary", n=30, seed=52, sd=0.01), busy=0.48, seed=13), 16.0)
    mixed = run(base, [replace(can[0], request_rate=None), *can[1:]], FE_POLICY)
    assert mixed.reason == "FrontendBusyRegressed", mixed.message
    idle = run(base, [replace(can[0], request_rate=0.0), *can[1:]], FE_POLICY)
    assert idle.verdict == "Promote", idle.message
    assert Window.from_sidecar("r", "p", {"request_rate": 0}).request_rate == 0.0
    assert Window.from_sidecar("r", "p", {"request_rate": -1}).request_rate is None
    assert Window.from_sidecar("r", "p", {"sglang": {"request_rate": "2.5"}}).request_rate == 2.5


def test_a_front_end_sampled_on_one_side_only_is_not_compared_and_costs_nothing():
    """Front-end sampling turned on with the canary (telemetry.frontendRoles is part of the pod template):
    the baseline has no front-end windows, so the family is left out, as it is when nobody samples it."""
    base = windows("stable", n=30, pods=3, seed=45, sd=0.01)
    can = windows("canary", n=30, seed=46, sd=0.01)
    plain = run(base, can, FE_POLICY)
    one_side = run(base, with_frontend(can, busy=0.9, seed=5), FE_POLICY)
    assert (plain.verdict, one_side.verdict) == ("Promote", "Promote")
    assert not any(s.name.startswith("frontend_busy") for s in [*plain.signals, *one_side.signals])
    without = run(base, can, POLICY)
    assert plain.signals[0].ci_low == without.signals[0].ci_low  # no budget spent on an absent family


SG_POLICY = replace(POLICY, max_regression={"loop_latency": 0.03, "stage_time": 0.05, "sglang_stage_time": 0.05})


def with_sglang(ws: list[Window], shares: dict[str, float], *, passes: float | None, rate: float | None = None,
                sd: float = 0.005, seed: int = 0) -> list[Window]:
    """The windows with SGLang's own counters read over each: `shares` of the scheduler's wall time per stage
    (idle included) plus window noise, `passes` forward passes per second, and optionally a request rate."""
    rng = np.random.default_rng(seed)
    out = []
    for w in ws:
        noisy = {k: max(0.0, v + rng.normal(0, sd)) for k, v in shares.items()}
        total = sum(noisy.values())
        out.append(replace(w, sglang_stage_shares={k: v / total for k, v in noisy.items()}, forward_pass_rate=passes,
                           request_rate=rate if rate is not None else w.request_rate))
    return out


# SGLang's wall-time shares of a loop 95% busy (signals.STAGES without the profiler's "other").
SGLANG = {"recv_requests": 0.04, "process_input_requests": 0.14, "get_next_batch_to_run": 0.06, "run_batch": 0.58,
          "process_batch_result": 0.13, "idle": 0.05}


def test_sglang_stage_counters_roll_back_a_slower_stage_the_profiler_did_not_see():
    """The profiler's windows are identical; SGLang's own counters show the input stage taking 10 more points of
    the scheduler's time at the same pass rate: rolled back on the second stage signal, naming SGLang's category."""
    slower = dict(SGLANG, process_input_requests=0.24, idle=0.0, run_batch=0.53)
    base = with_sglang(windows("stable", n=30, pods=3, seed=61, sd=0.01), SGLANG, passes=40.0, seed=1)
    can = with_sglang(windows("canary", n=30, seed=62, sd=0.01), slower, passes=40.0, seed=2)
    d = run(base, can, SG_POLICY)
    assert (d.verdict, d.reason) == ("Rollback", "StageTimeRegressed"), d.message
    assert d.regressed_stage == "process_input_requests"
    sig = {s.name: s for s in d.signals}
    assert sig["sglang_stage_time:process_input_requests"].verdict == "fail"
    assert sig["sglang_stage_time:process_input_requests"].delta == pytest.approx(0.10, abs=0.02)
    assert sig["stage_time:process_input_requests"].verdict != "fail"  # the profiler saw nothing
    assert "sglang_stage_time:idle" not in sig  # more idle time is never a regression
    # The same windows with the family switched off (an older SGLang): nothing to roll back on.
    assert run(base, can, POLICY).verdict != "Rollback"


def test_a_canary_faster_in_one_stage_is_not_held_for_the_other_stages_shares():
    """A loop 75% busy. The canary's input stage costs 9 points less per pass; at the same traffic its loop runs
    1.3x the passes (smaller batches, sooner), each as long in run_batch, so run_batch takes 1.3x the wall time:
    +13.5 points of share. Per forward pass it is unchanged and promoted; at the same traffic without the pass
    count (shares as they are, which is what scaling per request gives here) it reads +13.5 points and is rolled
    back, as a faster canary was on the testbed; without a pass count the family is left out."""
    lighter = {"recv_requests": 0.03, "process_input_requests": 0.14, "get_next_batch_to_run": 0.04, "run_batch": 0.45,
               "process_batch_result": 0.09, "idle": 0.25}
    fast = {k: 1.3 * v for k, v in dict(lighter, process_input_requests=0.05).items() if k != "idle"}
    fast["idle"] = 1 - sum(fast.values())
    base = windows("stable", n=30, pods=3, seed=63, sd=0.01)
    can = windows("canary", n=30, seed=64, sd=0.01)
    sg_base, sg_can = with_sglang(base, lighter, passes=40.0, rate=10.0, seed=3), \
        with_sglang(can, fast, passes=52.0, rate=10.0, seed=4)
    d = run(sg_base, sg_can, SG_POLICY)
    assert (d.verdict, d.reason) == ("Promote", "NoRegression"), d.message
    sig = {s.name: s for s in d.signals}
    assert abs(sig["sglang_stage_time:run_batch"].delta) < 0.02 and sig["sglang_stage_time:run_batch"].verdict == "pass"
    assert sig["sglang_stage_time:process_input_requests"].delta < -0.05
    per_request = run(with_sglang(base, lighter, passes=10.0, seed=3), with_sglang(can, fast, passes=10.0, seed=4),
                      SG_POLICY)  # a pass count that does not move: the shares as they are, at the same traffic
    assert (per_request.verdict, per_request.reason) == ("Rollback", "StageTimeRegressed"), per_request.message
    no_passes = run(with_sglang(base, lighter, passes=None, seed=3), with_sglang(can, fast, passes=None, seed=4),
                    SG_POLICY)
    assert not any(s.name.startswith("sglang_stage_time") for s in no_passes.signals)


def test_sglang_counters_on_one_side_only_are_not_compared_and_the_distance_is_reported():
    """The canary runs an SGLang that counts its stages, the baseline one that does not: the family is left out
    and costs no budget. Where both count, the sidecar/SGLang distance is reported per side."""
    base = windows("stable", n=30, pods=3, seed=65, sd=0.01)
    can = windows("canary", n=30, seed=66, sd=0.01)
    one_side = run(base, with_sglang(can, SGLANG, passes=40.0), SG_POLICY)
    assert not any(s.name.startswith("sglang_stage_time") for s in one_side.signals)
    assert one_side.signals[0].ci_low == run(base, with_sglang(can, SGLANG, passes=40.0), POLICY).signals[0].ci_low
    assert set(one_side.sglang_disagreement) == {"canary"}
    # The profiler's shares (signals.STAGES, "other" only the sidecar knows) against SGLang's: over the stages
    # both know, renormalised, they are under a point apart; a canary SGLang counts 3 points more input is 3 apart.
    both = run(with_sglang(base, SGLANG, passes=40.0, sd=0.0),
               with_sglang(can, dict(SGLANG, process_input_requests=0.17, run_batch=0.55), passes=40.0, sd=0.0), SG_POLICY)
    assert both.sglang_disagreement["baseline"] < 0.01
    assert both.sglang_disagreement["canary"] == pytest.approx(0.03, abs=0.005)


def test_from_sidecar_reads_sglang_s_stage_shares_and_drops_garbage():
    w = Window.from_sidecar("r", "p", {"sglang_stage_shares": {"run_batch": 0.6, "idle": 0.1, "bad": "x", "neg": -1}})
    assert w.sglang_stage_shares == {"run_batch": 0.6, "idle": 0.1}
    assert Window.from_sidecar("r", "p", {"sglang_stage_shares": None}).sglang_stage_shares == {}
    assert Window.from_sidecar("r", "p", {"sglang_stage_shares": [1, 2]}).sglang_stage_shares == {}
    assert Window.from_sidecar("r", "p", {"forward_pass_rate": 41.5}).forward_pass_rate == 41.5
    assert Window.from_sidecar("r", "p", {"forward_pass_rate": -1}).forward_pass_rate is None


def test_from_sidecar_reads_the_front_end_roles_and_drops_garbage():
    good = Window.from_sidecar("r", "p", {"frontend": {"roles": {
        "mm_processor": _pool(0.3, 0.0, 0.01), "detokenizer": {"busy_share": 0.05},
        "scheduler": {"busy_share": 0.9},  # not a front-end role
        "tokenizer_worker": {"busy_share": "high"}, "bogus": {"busy_share": 0.5}}}})
    assert set(good.frontend) == {"mm_processor", "detokenizer"}
    assert good.frontend["mm_processor"].busy_share == 0.3
    assert good.frontend["mm_processor"].unexported_self_share_max == 0.01
    assert good.frontend["detokenizer"].function_shares == {}
    for junk in (None, [], {"roles": []}, {"roles": {"mm_processor": 3}}, {"roles": {"mm_processor": {"busy_share": -1}}}):
        assert Window.from_sidecar("r", "p", {"frontend": junk}).frontend == {}


# -- the step's clock ---------------------------------------------------------------------------


def test_the_clock_starts_at_the_canary_s_first_fresh_window_not_at_ready():
    """Pods Ready at T0, the canary's sidecar delivers its first window 300 s later (slow to find the
    scheduler): maxDuration (900 s) runs from that window, so 901 s after Ready is no timeout; and once
    found, the clock stays where it was found."""
    late = 300.0
    base = [replace(w, end=w.end + late) for w in _three_stable(20, 0.15, 200, every=45.0)]
    can = [replace(w, end=w.end + late) for w in windows("canary", n=20, every=45.0, sd=0.15, seed=0, effect=0.04)]
    first = min(w.end for w in can)
    stale_first = replace(can[0], end=T0 + 10, stale=True)  # a stale window is no data: it starts nothing
    now = T0 + 901
    d = decide(base, [stale_first, *[w for w in can if w.end <= now]], POLICY, started_at=T0, now=now,
               step_duration_s=STEP)
    assert d.clock_started_at == first == T0 + late + 45
    assert d.reason != "MaxDurationReached"
    assert d.signals[0].n_canary == sum(1 for w in can if w.end <= now)
    # The operator hands the found clock back: the last look is maxDuration after it.
    at_max = decide(base, can, POLICY, started_at=T0, now=first + 901, step_duration_s=STEP, data_started_at=first)
    assert (at_max.reason, at_max.clock_started_at) == ("MaxDurationReached", first)
    # Without the found clock (the old behaviour: from Ready) the same look came 345 s earlier.
    assert decide(base, can, POLICY, started_at=T0, now=T0 + 901, step_duration_s=STEP,
                  data_started_at=T0).reason == "MaxDurationReached"


def test_a_canary_whose_profiler_never_delivers_is_timed_from_ready_and_never_promoted():
    base = _three_stable(20, 0.02, 200, every=45.0)
    stale = [replace(w, stale=True) for w in windows("canary", n=20, every=45.0, seed=1)]
    for action in ("Promote", "Pause", "Rollback"):
        policy = replace(POLICY, on_inconclusive=action)
        d = decide(base, stale, policy, started_at=T0, now=T0 + 901, step_duration_s=STEP)
        assert d.clock_started_at is None
        assert d.reason == "MaxDurationReached" and d.verdict != "Promote" and "ProfilerStale" in d.message


def _with_ttft(ws: list[Window], ttft: float, sd: float, seed: int) -> list[Window]:
    rng = np.random.default_rng(seed)
    return [replace(w, ttft_seconds=ttft * math.exp(rng.normal(0, sd))) for w in ws]


def test_a_noisy_ttft_within_its_margin_is_not_promoted_on_its_estimate():
    """Request signals are held to the same bounds as the rest: a TTFT estimate inside the 10% margin on 20 noisy
    windows (per-window log sd 0.4, as the stand-in's) does not promote the canary while windows still to come
    can narrow its bound; the same revision on 200 windows is promoted inside the margin itself; at the last look
    the 20 windows' bound is held to the margin they can resolve, and the decision says so."""
    policy = replace(POLICY, max_regression={"loop_latency": 0.03, "ttft": 0.1}, max_duration_s=3600)

    def pair(n: int, seed: int):
        base = _with_ttft(windows("stable", n=n, seed=seed, sd=0.005), 0.5, 0.4, seed)
        can = _with_ttft(windows("canary", n=n, seed=seed + 1, sd=0.005), 0.5 * 1.02, 0.4, seed + 1)
        return base, can

    base, can = pair(20, 40)
    held = run(base, can, policy, step=100)
    ttft = next(s for s in held.signals if s.name == "ttft")
    assert ttft.delta <= 0.1 and ttft.ci_high > 0.2, ttft  # inside the margin, bound wide
    assert (held.verdict, held.reason) == ("Continue", "AwaitingEvidence"), held
    assert "time to first token" in held.message
    last = run(base, can, replace(policy, max_duration_s=200), step=100)  # windows to T0 + 200: the last look
    ttft = next(s for s in last.signals if s.name == "ttft")
    assert (last.verdict, last.decided_by) == ("Promote", "evidence"), last
    assert ttft.promote_margin > 0.2 and "resolvable" in last.message
    base, can = pair(200, 50)
    d = run(base, can, policy, step=100)
    ttft = next(s for s in d.signals if s.name == "ttft")
    assert ttft.ci_high < ttft.promote_margin and (d.verdict, d.reason) == ("Promote", "NoRegression"), (ttft, d)
