"""The canary gate: profiler windows of the baseline and canary in, one verdict out. Pure, no I/O.

A small public face over rooms by concern:
- `policy`: the signals, how each is read and named, and `GatePolicy` (built from the spec once);
- `samples`: one revision's windows made into analysis units (TP ranks merged, idle and stale left out);
- `compare`: the statistics of one look (paired differences, between-pod variance, the budget's split);
- `attribution`: the stage and function that grew most;
- `decide`: the verdict rules and their messages, the only entry point;
- `verdict`: the records it returns.
The window record itself (`vlm_operator.window.Window`) belongs to the sources and the gate alike.
"""

from ..names import FRONTEND_ROLES, STAGES
from ..window import RoleSample, Window
from .attribution import regressed_function, regressed_role_function, regressed_stage
from .decide import decide
from .policy import REQUEST_SIGNALS, SIGNALS, GatePolicy, SignalVerdict, Verdict
from .verdict import Decision, SignalResult

__all__ = [
    "FRONTEND_ROLES",
    "REQUEST_SIGNALS",
    "SIGNALS",
    "STAGES",
    "Decision",
    "GatePolicy",
    "RoleSample",
    "SignalResult",
    "SignalVerdict",
    "Verdict",
    "Window",
    "decide",
    "regressed_function",
    "regressed_role_function",
    "regressed_stage",
]
