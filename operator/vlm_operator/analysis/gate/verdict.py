"""What the gate returns: one Decision with every signal's result. Plain records, no logic."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from vlm_operator.analysis.gate.paired import Evidence, Kind
from vlm_operator.analysis.gate.policy import SignalVerdict, Verdict


@dataclass(frozen=True)
class SignalResult:
    """One signal (or one stage / function of a share family) compared across revisions.

    delta: relative change canary/baseline - 1 for latencies and throughput, absolute share difference
    for shares. ci_low / ci_high: the one-sided bounds the decision used (the lower one at the
    rollback level, corrected for looks and signals; the upper one at the promotion level).
    p_value: one-sided, against "the canary is not worse". None where there were too few values.
    """

    name: str
    baseline: float | None
    canary: float | None
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    n_baseline: int
    n_canary: int
    verdict: SignalVerdict
    margin: float = 0.0
    # The expand test's bound on the worse side, the harm ceiling it is held to, the margin the promotion bound
    # is held to (the margin, or what the schedule can resolve where that is wider) and that resolvable margin,
    # all on the signal's own scale; the look's information as a share of the boundary's target I*
    # (gate.sequential) and the canary pods the estimate pooled.
    expand_bound: float | None = None
    ceiling: float | None = None
    promote_margin: float | None = None
    resolvable: float | None = None
    information: float | None = None
    pods: int = 0
    # The pooled estimate's standard error and degrees of freedom on the test scale (log ratio, or points): what
    # the bounds are built from (bench/paired_gate.py --coverage checks how often estimate +- t se covers the truth).
    se: float | None = None
    df: float | None = None
    # Set where a fixed ceiling (expandCeiling) is below the default one pod's noise calls for: that default, and
    # how often a harmless canary on one pod passes the expand test at one look under the fixed ceiling.
    default_ceiling: float | None = None
    harmless_expand_rate: float | None = None
    # The share of the baseline's window variance the request mix explained, where the signal was adjusted for it
    # (gate.covariates); None: compared as measured.
    covariate_cut: float | None = None


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str
    message: str
    signals: tuple[SignalResult, ...] = ()
    regressed_function: str | None = None
    regressed_stage: str | None = None
    # Set when the pods' own spread is too large for the margin to be resolved (see _resolution).
    warning: str | None = None
    # Set when a fixed expandCeiling is below what one canary pod's noise calls for (see _ceiling_warning).
    ceiling_warning: str | None = None
    # Where this step's analysis clock started (unix seconds): the end of the canary's first fresh profiler
    # window after its pods were Ready; None while no such window exists (the clock then runs from Ready).
    clock_started_at: float | None = None
    # What decided the step (evidence: a bound crossed its margin; ceiling: every expand bound under its
    # ceiling; timeout: maxDuration and onInconclusive); None while the step goes on.
    decided_by: str | None = None
    # What this look measured about the pods (for the service's calibration), the loop-latency margin the
    # rollout can resolve (resolvable_margin), and the comparisons its canary pods got (gate.paired).
    evidence: Evidence | None = None
    resolvable_margin: float | None = None
    pairing: tuple[Kind, ...] = ()
    # How much slower the canary pods ran in the warm-up the gate left out (relative; None: not measured).
    warmup_shift: float | None = None
    # Per side ("baseline", "canary"): how far the sidecar's stage shares and SGLang's own stage counters are apart
    # (gate.samples.sglang_disagreement, a fraction); a side whose SGLang exports no stage counters is left out.
    sglang_disagreement: Mapping[str, float] = field(default_factory=dict)
