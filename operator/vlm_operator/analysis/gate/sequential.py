"""The gate's three tests at every look, and the boundaries that make looking as often as it likes safe.

At each look every signal gets one estimate of the canary's effect, pooled over canary pods (gate.compare), with
its standard error SE; its information is I = 1 / SE^2, and it grows as pods join the canary and their windows
pile up. Three one-sided tests read it:

- rollback: the lower bound above half the margin (and the estimate beyond the margin);
- expand: the upper bound below the harm ceiling (only once the step's analysis time has passed; before the
  last step);
- promote: the upper bound inside the margin (non-inferiority; the last step, after its analysis time).

Error spent over information, not over time. Each test's bound sits `boundary(alpha, I / I*)` standard errors
from the estimate, where

    boundary = sqrt(ln(1 / alpha) / 2) * (sqrt(I* / I) + sqrt(I / I*)),

the linear boundary a + c I on the score scale (estimate x information), with a c = ln(1 / alpha) / 2 and
a / c = I*. For a Brownian motion in information time the chance of ever crossing it, at any number of looks
at any information, is at most exp(-2 a c) = alpha (the reflection principle for a line; Siegmund, Sequential
Analysis, 1985). So no look count is planned, a step that runs long spends nothing, and a look that adds no
information (the pods' spread, not the windows, limits the error) is the same test again, not a new chance of a
false verdict. Its shape is Pocock-like: flat near I* (2.45 SE at alpha 5%, 2.60 at half or twice I*) where an
O'Brien-Fleming-like shape would ask for 3.9 SE at a quarter of the information. We chose the flat shape because
the decisions that matter most come early: a gross regression stopped on its first pod, a harmless canary
expanded from one pod to the next step. I* is where the boundary is tightest: the geometric mean of one pod's
information and the last step's (`target_information`), so the first step and the last pay the same.

The estimate is only approximately a Brownian motion in information (estimated variances, equal pod weights,
windows that depend on each other in time); the bench measures the rates these bounds promise
(bench/paired_gate.py). Pure, no I/O.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from vlm_operator.analysis.tdist import t_ppf

# A harmless canary (effect 0) is expanded at a look where its expand bound (one pod) is this many of its
# standard errors below the ceiling with this probability; the default ceiling is set so (`ceiling`).
EXPAND_POWER = 0.99
# The expand test's level: a canary whose effect is at the ceiling expands at most this often over a step's looks.
EXPAND_ALPHA = 0.05

_Z = NormalDist()


def boundary(alpha: float, ratio: float) -> float:
    """The bound's distance from the estimate in standard errors, for a test at level `alpha` over all looks, at
    information `ratio` = I / I* (module docstring)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    r = max(ratio, 1e-9)
    return math.sqrt(math.log(1 / alpha) / 2) * (math.sqrt(1 / r) + math.sqrt(r))


def t_boundary(alpha: float, ratio: float, df: float) -> float:
    """`boundary` with estimated variances: the t quantile (df degrees of freedom) of the same one-sided tail."""
    z = boundary(alpha, ratio)
    if not math.isfinite(df) or df > 1e6:
        return z
    tail = 1 - _Z.cdf(z)
    if tail <= 0:
        return z
    return float(t_ppf(1 - tail, max(1.0, df)))


def target_information(one_pod_var: float, last_step_pods: int) -> float:
    """I*: the geometric mean of one pod's information (1 / its variance) and the last step's (its pods'
    information): the boundary is tightest between the first step and the last."""
    return math.sqrt(max(1, last_step_pods)) / max(one_pod_var, 1e-18)


def ceiling(alpha: float, one_pod_se: float, last_step_pods: int, margin: float) -> float:
    """The default harm ceiling (on the test scale): a harmless canary on one pod expands with probability
    EXPAND_POWER at a look where its standard error is `one_pod_se`, i.e. the expand bound's distance at one pod's
    information plus the EXPAND_POWER quantile, in standard errors; never below the margin (a canary shown within
    its margin always may expand)."""
    ratio = 1 / math.sqrt(max(1, last_step_pods))
    return max(margin, (boundary(alpha, ratio) + _Z.inv_cdf(EXPAND_POWER)) * one_pod_se)


def expand_rate(ceiling_: float, effect: float, one_pod_se: float, last_step_pods: int,
                alpha: float = EXPAND_ALPHA) -> float:
    """How often a canary with true `effect` (test scale) on one pod passes the expand test at one look:
    P(effect + noise + boundary x SE < ceiling). What the status states for an effect of twice the margin."""
    if one_pod_se <= 0:
        return 1.0 if effect < ceiling_ else 0.0
    ratio = 1 / math.sqrt(max(1, last_step_pods))
    return _Z.cdf((ceiling_ - effect) / one_pod_se - boundary(alpha, ratio))
