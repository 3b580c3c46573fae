"""The canary gate: profiler windows of the baseline and canary in, one verdict out. Pure, no I/O.

A small public face over rooms by concern:
- `policy`: the signals, how each is read and named, and `GatePolicy` (built from the spec once);
- `samples`: one revision's windows made into analysis units (TP ranks merged, idle and stale left out);
- `paired`: what each canary pod is compared with (a stable pod on its node now, its node's pod before, or the
  stable mean) and the pod-level variances from the fleet (empirical Bayes over history, prior and look);
- `covariates`: the request mix as a regression covariate of the request-driven signals (fitted on the baseline);
- `compare`: the statistics of one look (time-paired differences per canary pod, their dependence in time,
  the pod-level variance);
- `attribution`: the stage and function that grew most;
- `decide`: the verdict rules and their messages, the only entry point;
- `verdict`: the records it returns.
The window record itself (`vlm_operator.analysis.window.Window`) belongs to the sources and the gate alike.
"""

from vlm_operator.analysis.gate.attribution import (
    regressed_function,
    regressed_role_function,
    regressed_stage,
)
from vlm_operator.analysis.gate.decide import (
    ceiling_before_start,
    decide,
    pre_period,
    resolvable_before_start,
    resolvable_margin,
)
from vlm_operator.analysis.gate.paired import PRE_PERIOD_S, Before, Calibration, Evidence, Layout
from vlm_operator.analysis.gate.policy import REQUEST_SIGNALS, SIGNALS, GatePolicy, SignalVerdict, Verdict
from vlm_operator.analysis.gate.verdict import Decision, SignalResult
from vlm_operator.analysis.window import RoleSample, Window
from vlm_operator.api.names import FRONTEND_ROLES, STAGES

__all__ = [
    "FRONTEND_ROLES",
    "PRE_PERIOD_S",
    "REQUEST_SIGNALS",
    "SIGNALS",
    "STAGES",
    "Before",
    "Calibration",
    "Decision",
    "Evidence",
    "GatePolicy",
    "Layout",
    "RoleSample",
    "SignalResult",
    "SignalVerdict",
    "Verdict",
    "Window",
    "ceiling_before_start",
    "decide",
    "pre_period",
    "regressed_function",
    "regressed_role_function",
    "regressed_stage",
    "resolvable_before_start",
    "resolvable_margin",
]
