"""The gate's policy: which signals exist, how each is read and named, and what a user allows.

`GatePolicy.from_spec` is the one mapping from the VLMService API to the gate; the API model carries every
constraint `GatePolicy` checks, so a spec the API server accepted never fails here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from vlm_operator import api, stats
from vlm_operator.errors import InvalidSpec
from vlm_operator.units import parse_duration

# Pause: stop analysing and wait for a person (onInconclusive Pause, or Promote refused without data).
Verdict = Literal["Promote", "Continue", "Rollback", "Inconclusive", "Pause"]
SignalVerdict = Literal["pass", "fail", "insufficient"]

# More idle time means the canary is faster (or got less work), never a regression.
NOT_A_REGRESSION_STAGE = "idle"


@dataclass(frozen=True)
class SignalSpec:
    """How one signal family is read, compared and named."""

    scale: stats.Scale
    higher_is_worse: bool
    reason: str
    label: str
    # Promotion needs this signal's bound inside the margin (proof of non-inferiority). The other signals
    # hold a canary back only while their estimate is beyond the margin, and roll it back on evidence.
    prove: bool = False
    # Request signals only exist when SGLang metrics are scraped: absent on both sides they are
    # reported but do not hold back a promotion; the profiler signals always must be there.
    required: bool = True


SIGNALS: Mapping[str, SignalSpec] = {
    "loop_latency": SignalSpec("log", True, "LoopLatencyRegressed", "scheduler loop latency", prove=True),
    "loop_p95": SignalSpec("log", True, "LoopP95Regressed", "scheduler loop p95", prove=True),
    "ttft": SignalSpec("log", True, "TTFTRegressed", "time to first token", required=False),
    "itl": SignalSpec("log", True, "ITLRegressed", "inter-token latency", required=False),
    "throughput": SignalSpec("log", False, "ThroughputRegressed", "throughput", required=False),
    # Time per iteration in one stage (share x loop mean), divided by the baseline's loop mean: a
    # difference of 0.05 means the stage now takes 5% of the old loop time more per iteration.
    "stage_time": SignalSpec("linear", True, "StageTimeRegressed", "time per iteration"),
    # Busy share of one front-end role (FRONTEND_ROLES; the sidecar samples them when told to): the fraction
    # of the role's time not waiting for work, scaled to the baseline's request rate (_busy_at_reference_rate)
    # so a pod that got more traffic is not read as slower. A difference of 0.10 means the role would be busy
    # 10 points more of the time at the same traffic. Compared only where both revisions sampled the role.
    "frontend_busy": SignalSpec("linear", True, "FrontendBusyRegressed", "front-end busy share", required=False),
}
# The signals read from SGLang's own request metrics.
REQUEST_SIGNALS = ("ttft", "itl", "throughput")

@dataclass(frozen=True)
class GatePolicy:
    """What the user allows and how long the gate may take. Margins are fractions, not percent.

    max_regression: signal -> allowed worsening. Latencies (loop_latency, loop_p95, ttft, itl): relative
        increase (0.03 = 3% slower). throughput: relative drop. stage_time: growth of one stage's time
        per iteration, as a fraction of the baseline's loop time (0.05 = 5 points). frontend_busy: growth
        of one front-end role's busy share at the baseline's request rate (0.10 = 10 points).
    confidence: 1 - the false-rollback budget of the whole rollout (spent over steps, looks, signals).
    steps: canary steps of the rollout; each step gets an equal part of the budget.
    min_samples: analysis units (pod windows, TP ranks merged) per revision before any verdict.
    max_duration_s: analysis time of a step after which on_inconclusive decides.
    on_inconclusive: Rollback by default: a canary that could not be shown harmless does not ship.
        Promote applies only when the data were there but undecided; never on missing data.
    stale_after_s: a revision whose newest usable window is older than this (vs `now`) is stale.
    interval_s: time between analyses; max_duration_s / interval_s looks share the rollback budget.
    rank_merge_s: windows of one pod ending this close together are one time slice (TP ranks).
    max_idle_share: windows idler than this carry no traffic and are left out.
    trim: fraction trimmed from each tail by the test.
    pair_s: a canary window is paired with the baseline windows that ended within half this of it (else
        within this): the telemetry interval, so each pod contributes about one window per pair.
    inference: "bonferroni" splits the budget over the planned looks (max_duration_s / interval_s);
        "anytime" uses confidence sequences valid for any number of looks (wider at each one; measured
        in bench/gate_quality.py, not exposed in the API).
    final_alpha_share: with "bonferroni", the share of the step's rollback budget kept for the last look (at
        maxDuration), the looks before it splitting the rest; 0 (shipped) splits it evenly. A variant measured
        in bench/gate_quality.py (same rates at one canary pod, fewer onInconclusive verdicts), not in the API.
    request_bound_factor: before the last look, a request signal (TTFT, ITL, throughput) passes only when its
        estimate is within the margin and its promotion bound excludes a regression of this many margins (2,
        shipped: a TTFT 20% worse is not promoted on an estimate that noise put inside the 10% margin; the
        bound at the margin itself would rarely close on 5 s request means). 0: the estimate alone (the rule
        before 2026-12-03, measured in bench/gate_quality.py as a variant). Not in the API.
    """

    max_regression: Mapping[str, float] = field(
        default_factory=lambda: {"loop_latency": 0.03, "stage_time": 0.05}
    )
    confidence: float = 0.95
    steps: int = 1
    min_samples: int = 5
    max_duration_s: float = 1800.0
    on_inconclusive: Literal["Promote", "Rollback", "Pause"] = "Rollback"
    stale_after_s: float = 180.0
    interval_s: float = 60.0
    rank_merge_s: float = 5.0
    max_idle_share: float = 0.9
    trim: float = stats.DEFAULT_TRIM
    pair_s: float = 15.0
    inference: Literal["bonferroni", "anytime"] = "bonferroni"
    final_alpha_share: float = 0.0
    request_bound_factor: float = 2.0

    def __post_init__(self) -> None:
        where = "spec.rollout.analysis"
        unknown = sorted(set(self.max_regression) - set(SIGNALS))
        if unknown:
            raise InvalidSpec(
                f"unknown signal(s) {unknown}; known: {sorted(SIGNALS)}", field=f"{where}.maxRegression"
            )
        if not self.max_regression:
            raise InvalidSpec("at least one signal must be gated", field=f"{where}.maxRegression")
        for name, margin in self.max_regression.items():
            if not isinstance(margin, int | float) or isinstance(margin, bool) or not math.isfinite(margin) or margin < 0:
                raise InvalidSpec(f"{name}: margin must be a number >= 0", field=f"{where}.maxRegression")
        if not 0.5 <= self.confidence < 1:
            raise InvalidSpec("confidence must be in [0.5, 1)", field=f"{where}.confidence")
        if self.min_samples < stats.MIN_PER_SIDE:
            raise InvalidSpec(f"minSamples must be >= {stats.MIN_PER_SIDE}", field=f"{where}.minSamples")
        if self.on_inconclusive not in ("Promote", "Rollback", "Pause"):
            raise InvalidSpec(
                "onInconclusive must be Promote, Rollback or Pause", field=f"{where}.onInconclusive"
            )
        if self.interval_s <= 0 or self.max_duration_s <= 0 or self.stale_after_s <= 0:
            raise InvalidSpec("interval, maxDuration and staleness must be positive", field=where)
        if self.steps < 1:
            raise InvalidSpec("at least one rollout step", field="spec.rollout.steps")

    @classmethod
    def from_spec(cls, spec: api.VLMServiceSpec) -> GatePolicy:
        """The policy of a validated spec. The API model carries every constraint this class checks, so
        a spec the API server accepted never fails here (tests/unit/operator/test_gate.py fuzzes that)."""
        if spec.rollout is None:
            raise InvalidSpec("no rollout block", field="spec.rollout")
        a = spec.rollout.analysis
        m = a.max_regression
        return cls(
            max_regression={
                "loop_latency": m.loop_latency / 100,
                "ttft": m.ttft / 100,
                "itl": m.itl / 100,
                "throughput": m.throughput / 100,
                "stage_time": m.stage_time / 100,
                "frontend_busy": m.frontend_busy / 100,
                # Gated only when set (the p95 of a window is noisier than its mean: an opt-in signal).
                **({"loop_p95": m.loop_p95 / 100} if m.loop_p95 is not None else {}),
            },
            confidence=a.confidence,
            steps=len(spec.rollout.schedule(spec.replicas)),
            min_samples=a.min_samples,
            max_duration_s=parse_duration(a.max_duration),
            on_inconclusive=a.on_inconclusive,
            interval_s=parse_duration(a.interval),
            stale_after_s=max(3 * parse_duration(spec.telemetry.interval), 60.0),
            pair_s=parse_duration(spec.telemetry.interval),
        )


def bound_factor(policy: GatePolicy, family: str) -> float:
    """How many margins a family's promotion bound must stay below before the last look: 1 for the loop
    signals (proof of non-inferiority), `request_bound_factor` for request signals, 0 (none) for the rest."""
    if SIGNALS[family].prove:
        return 1.0
    return policy.request_bound_factor if family in REQUEST_SIGNALS else 0.0


def family_of(name: str) -> str:
    """The signal family of a signal name ("stage_time:run_batch" -> "stage_time")."""
    return name.split(":", 1)[0]
