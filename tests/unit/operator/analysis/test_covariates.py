"""The request mix as a covariate (vlm_operator.analysis.gate.covariates): fitted on the baseline, applied to both
revisions, left out where it would hide or invent an effect."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from vlm_operator.analysis.gate import GatePolicy, Window, decide
from vlm_operator.analysis.gate import covariates as cov
from vlm_operator.analysis.gate.samples import make_units

T0 = 1_000_000.0
STAGES = {"run_batch": 0.6, "process_input_requests": 0.2, "idle": 0.05, "other": 0.15}
FUNCS = {"event_loop_overlap": 0.95, "run_batch": 0.6, "process_input_requests": 0.2}
POLICY = GatePolicy(max_regression={"loop_latency": 0.03}, max_duration_s=900, interval_s=60, stale_after_s=120,
                    pair_s=15.0)
SLOPE = 0.3  # loop latency ~ (prompt tokens per request) ^ 0.3


def fleet(rev: str, pods: int, n: int, *, effect: float = 0.0, seed: int = 0, mix_sd: float = 0.4,
          mix_shift: float = 0.0, slope: float = SLOPE, with_mix: bool = True) -> list[Window]:
    """Windows every 15 s; each window's prompt tokens per request lognormal around 800 (`mix_sd`), moving its loop
    latency by `slope`, plus 2% of window noise."""
    rng = np.random.default_rng([seed, len(rev)])
    out = []
    for p in range(pods):
        for k in range(n):
            x = mix_shift + rng.normal(0, mix_sd)
            v = 0.02 * math.exp(effect + slope * x + rng.normal(0, 0.02))
            out.append(Window(revision=rev, pod=f"{rev}-{p}", id=str(k), end=T0 + (k + 1) * 15.0, samples=500,
                              loop_mean_seconds=v, loop_p95_seconds=1.5 * v, stage_shares=STAGES,
                              function_shares=FUNCS, iterations=400,
                              prompt_tokens_per_request=800 * math.exp(x) if with_mix else None))
    return out


def look(base, can):
    return decide(base, can, POLICY, started_at=T0, now=max(w.end for w in [*base, *can]) + 1, step_duration_s=300,
                  data_started_at=T0)


def test_the_slope_is_fitted_on_the_baseline_and_cuts_the_noise_the_mix_makes():
    base, can = fleet("stable", 3, 30, seed=1), fleet("canary", 1, 30, effect=0.05, seed=2)
    adj = cov.fit("loop_latency", make_units(base, 5.0), make_units(can, 5.0))
    assert adj is not None and adj.slope == pytest.approx(SLOPE, abs=0.02)
    # The mix makes (0.3 x 0.4)^2 of variance against 0.02^2 of window noise: it explains 97% of it.
    assert adj.variance_cut == pytest.approx(0.12**2 / (0.12**2 + 0.02**2), abs=0.02)
    with_mix = look(base, can)
    plain = look([replace(w, prompt_tokens_per_request=None) for w in base],
                 [replace(w, prompt_tokens_per_request=None) for w in can])
    s, p = with_mix.signals[0], plain.signals[0]
    assert s.covariate_cut == pytest.approx(adj.variance_cut) and p.covariate_cut is None
    # The effect is kept (+5%), read at +1.8% without the covariate (the canary drew lighter requests), and its
    # interval narrower: the window noise is mostly gone; one canary pod's spread (the 2% prior) stays in both.
    assert s.delta == pytest.approx(0.05, abs=0.015)
    assert (s.ci_high - s.ci_low) < 0.6 * (p.ci_high - p.ci_low), (s, p)


def test_a_canary_whose_windows_served_heavier_requests_by_chance_is_not_read_as_slower():
    # The same revision; the canary pod's windows happened to draw a mix 10% heavier (within chance at this
    # spread): without the covariate it reads about +3% slower; with it, about 0.
    base = fleet("stable", 3, 30, seed=3)
    can = fleet("canary", 1, 30, seed=4, mix_shift=0.1)
    d = look(base, can)
    assert d.signals[0].covariate_cut is not None
    assert abs(d.signals[0].delta) < 0.01, d.signals[0]
    plain = look([replace(w, prompt_tokens_per_request=None) for w in base],
                 [replace(w, prompt_tokens_per_request=None) for w in can])
    assert plain.signals[0].delta > 0.02, plain.signals[0]


def test_left_out_where_the_revision_moved_the_mix_or_the_mix_does_not_matter_or_is_unknown():
    base = fleet("stable", 3, 30, seed=5, mix_sd=0.1)
    units = make_units(base, 5.0)
    # A new tokenizer: every canary request counts 50% more tokens, far beyond chance; adjusting would call a
    # revision 0.3 x log 1.5 = 12% faster than it is.
    moved = make_units(fleet("canary", 1, 30, seed=6, mix_sd=0.1, mix_shift=math.log(1.5)), 5.0)
    assert cov.fit("loop_latency", units, moved) is None
    # A mix the signal does not follow: no slope, no adjustment (it would only add noise).
    flat = fleet("stable", 3, 30, seed=7, slope=0.0)
    assert cov.fit("loop_latency", make_units(flat, 5.0), make_units(fleet("canary", 1, 30, seed=8, slope=0.0), 5.0)) \
        is None
    # An older sidecar (no prompt_tokens_per_request), or too few canary windows yet.
    assert cov.fit("loop_latency", units, make_units(fleet("canary", 1, 30, seed=9, with_mix=False), 5.0)) is None
    assert cov.fit("loop_latency", units, make_units(fleet("canary", 1, 5, seed=9), 5.0)) is None
    # The stage and share families are not request-driven signals: never adjusted.
    assert "stage_time" not in cov.FAMILIES and "loop_latency" in cov.FAMILIES
