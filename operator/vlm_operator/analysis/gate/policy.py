"""The gate's policy: which signals exist, how each is read and named, and what a user allows.

`GatePolicy.from_spec` is the one mapping from the VLMService API to the gate; the API model carries every
constraint `GatePolicy` checks, so a spec the API server accepted never fails here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from vlm_operator.analysis import stats
from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.errors import InvalidSpec
from vlm_operator.api.units import parse_duration

# Pause: stop analysing and wait for a person (onInconclusive Pause, or Promote refused without data).
Verdict = Literal["Promote", "Continue", "Rollback", "Inconclusive", "Pause"]
# pass: the promotion bound inside its margin; expand: the expand bound under the harm ceiling; fail: the
# rollback bound beyond half the margin and the estimate beyond it (gate.compare.evaluate).
SignalVerdict = Literal["pass", "expand", "fail", "insufficient"]

# More idle time means the canary is faster (or got less work), never a regression.
NOT_A_REGRESSION_STAGE = "idle"


@dataclass(frozen=True)
class SignalSpec:
    """How one signal family is read, compared and named."""

    scale: stats.Scale
    higher_is_worse: bool
    reason: str
    label: str
    # Request signals only exist when SGLang metrics are scraped (throughput only where pods were saturated): with
    # no estimate yet (too few paired windows) they are reported but do not hold back a promotion; with one they
    # are held to their bounds. The profiler signals always must be there.
    required: bool = True


SIGNALS: Mapping[str, SignalSpec] = {
    "loop_latency": SignalSpec("log", True, "LoopLatencyRegressed", "scheduler loop latency"),
    "loop_p95": SignalSpec("log", True, "LoopP95Regressed", "scheduler loop p95"),
    "ttft": SignalSpec("log", True, "TTFTRegressed", "time to first token", required=False),
    "itl": SignalSpec("log", True, "ITLRegressed", "inter-token latency", required=False),
    "throughput": SignalSpec("log", False, "ThroughputRegressed", "throughput", required=False),
    # Time per iteration in one stage (share x loop mean), divided by the baseline's loop mean: a
    # difference of 0.05 means the stage now takes 5% of the old loop time more per iteration.
    "stage_time": SignalSpec("linear", True, "StageTimeRegressed", "time per iteration"),
    # SGLang's own stage accounting (sglang:scheduler_stage_seconds_total, 0.5.20 on, through the sidecar's
    # windows): one stage's share of the scheduler's wall time at the baseline's forward-pass rate (gate.compare
    # _sglang_stage_instances), a second stage signal that needs no profiler. A difference of 0.05 means the stage
    # takes 5 points more of the scheduler's time per forward pass; it shares stage_time's
    # margin (maxRegression.stageTime) and ceiling, and is compared only where both revisions' SGLang exports it.
    "sglang_stage_time": SignalSpec("linear", True, "StageTimeRegressed", "share of SGLang's stage time",
                                    required=False),
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
        per iteration, as a fraction of the baseline's loop time (0.05 = 5 points). sglang_stage_time: growth of
        one stage's share of the scheduler's wall time in SGLang's own counters (0.05 = 5 points). frontend_busy: growth
        of one front-end role's busy share at the baseline's request rate (0.10 = 10 points).
    confidence: 1 - the error budget of each test over the whole rollout: rolling back a canary within half its
        margin (split over the gated signals) and promoting one beyond its promotion margin.
    steps: canary steps of the rollout.
    min_samples: analysis units (pod windows, TP ranks merged) per revision before any verdict.
    max_duration_s: analysis time of a step after which on_inconclusive decides.
    on_inconclusive: Rollback by default: a canary that could not be shown harmless does not ship.
        Promote applies only when the data were there but undecided; never on missing data.
    stale_after_s: a revision whose newest usable window is older than this (vs `now`) is stale.
    interval_s: time between analyses (the bounds hold at every look, however many: gate.sequential).
    rank_merge_s: windows of one pod ending this close together are one time slice (TP ranks).
    max_idle_share: windows idler than this carry no traffic and are left out.
    trim: fraction trimmed from each tail by the test.
    pair_s: a canary window is paired with the baseline windows that ended within half this of it (else
        within this): the telemetry interval, so each pod contributes about one window per pair.
    step_durations_s: each step's planned analysis time (the schedule's); empty: every step maxDuration.
    step_pods: canary pods in each step (for the resolvable margin); empty: one.
    warmup_s: a canary pod's windows that end within this of its Ready time are left out of the comparison
        (cold caches, first requests of each shape, allocator growth): a restart's warm-up is not the revision's
        effect. The gate measures what it left out (`Decision.warmup_shift`).
    expand_ceiling: signal -> a fixed harm ceiling (same units as max_regression); a signal not named gets the
        default derived from one pod's standard error at each look (gate.sequential.ceiling).
    """

    max_regression: Mapping[str, float] = field(
        default_factory=lambda: {"loop_latency": 0.03, "stage_time": 0.05, "sglang_stage_time": 0.05}
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
    step_durations_s: tuple[float, ...] = ()
    step_pods: tuple[int, ...] = ()
    warmup_s: float = 60.0
    expand_ceiling: Mapping[str, float] = field(default_factory=dict)

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
        if self.step_durations_s and len(self.step_durations_s) != self.steps:
            raise InvalidSpec("one analysis time per step", field="spec.rollout.steps")
        for name, c in self.expand_ceiling.items():
            if name not in self.max_regression:
                raise InvalidSpec(f"{name}: a ceiling for a signal that is not gated", field=f"{where}.expandCeiling")
            if not c >= self.max_regression[name]:
                raise InvalidSpec(f"{name}: the ceiling must be at least the margin", field=f"{where}.expandCeiling")

    @classmethod
    def from_spec(cls, spec: api.VLMServiceSpec) -> GatePolicy:
        """The policy of a validated spec. The API model carries every constraint this class checks, so
        a spec the API server accepted never fails here (tests/unit/operator/analysis/test_gate.py fuzzes that)."""
        if spec.rollout is None:
            raise InvalidSpec("no rollout block", field="spec.rollout")
        return cls.from_rollout(spec.rollout, spec.steps(), spec.telemetry.interval)

    @classmethod
    def from_rollout(cls, rollout: api.RolloutSpec, schedule: list[api.RolloutStep], telemetry_interval: str
                     ) -> GatePolicy:
        """The policy of a validated rollout block with its step schedule and the sidecars' telemetry interval:
        `from_spec`'s mapping, shared with the judge endpoint (vlm_operator.judge.evaluate), so the two cannot drift."""
        a = rollout.analysis
        m = a.max_regression
        return cls(
            max_regression={
                "loop_latency": m.loop_latency / 100,
                "ttft": m.ttft / 100,
                "itl": m.itl / 100,
                "throughput": m.throughput / 100,
                "stage_time": m.stage_time / 100,
                "sglang_stage_time": m.stage_time / 100,
                "frontend_busy": m.frontend_busy / 100,
                # Gated only when set (the p95 of a window is noisier than its mean: an opt-in signal).
                **({"loop_p95": m.loop_p95 / 100} if m.loop_p95 is not None else {}),
            },
            expand_ceiling=_sglang_too({
                k: v / 100 for k, v in (a.expand_ceiling.model_dump(by_alias=False) if a.expand_ceiling else {}).items()
                if v is not None and (k != "loop_p95" or m.loop_p95 is not None)}),
            confidence=a.confidence,
            steps=len(schedule),
            step_durations_s=tuple(parse_duration(s.analysis) for s in schedule),
            step_pods=tuple(s.replicas for s in schedule),
            min_samples=a.min_samples,
            max_duration_s=parse_duration(a.max_duration),
            on_inconclusive=a.on_inconclusive,
            interval_s=parse_duration(a.interval),
            stale_after_s=max(3 * parse_duration(telemetry_interval), 60.0),
            pair_s=parse_duration(telemetry_interval),
        )


def _sglang_too(ceilings: dict[str, float]) -> dict[str, float]:
    """SGLang's stage signal holds to stage_time's fixed ceiling, where one is set (one setting for both)."""
    return {**ceilings, "sglang_stage_time": ceilings["stage_time"]} if "stage_time" in ceilings else ceilings


def family_of(name: str) -> str:
    """The signal family of a signal name ("stage_time:run_batch" -> "stage_time")."""
    return name.split(":", 1)[0]
