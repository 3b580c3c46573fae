"""The canary gate: profiler windows of the stable and canary revisions in, one verdict out.

Pure: the caller gathers windows (Prometheus or the sidecars' /windows.json), passes the clock in
as `now`, and acts on the returned Decision. Calling `decide` twice with the same inputs gives the
same Decision, so an operator restarted mid-analysis reaches the same verdict from status.

The rule, in short (docs/canary-analysis.md has the long form and the measured error rates):
- unit of analysis: one profiler window of one pod; TP ranks of a pod that cover the same time are
  averaged first, because lock-stepped ranks are not independent observations;
- signals say what users mean by worse: loop latency, TTFT and ITL up, throughput down (log scale,
  relative), and the time per loop iteration spent in each stage up (share x loop mean, in points
  of the baseline's loop time), so a canary that is faster overall is never held back because
  the stages it did not speed up now take a larger share;
- per signal, Yuen's trimmed Welch test of canary against baseline (vlm_operator.stats), with the
  between-pod variance of the baseline's pods added (random effects), since windows of one pod share
  that pod's offset;
- Rollback when a signal is worse than half its margin with confidence (one-sided bound,
  Bonferroni-corrected over the rollout's steps, the planned looks and the signals) AND its estimate
  exceeds the margin;
- Promote when, after the step's analysis time, every signal's one-sided upper bound is inside
  its margin (non-inferiority; all must pass, so no correction across signals is needed);
- Inconclusive on stale profiler data, no traffic, too few windows or unreachable sources; at
  maxDuration this module alone applies onInconclusive (Rollback, Promote or Pause), and missing
  data never promotes. The rollout only maps the verdict to an action.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from statistics import NormalDist
from typing import Any, Literal

from vlm_operator import api, stats
from vlm_operator.errors import InvalidSpec
from vlm_operator.units import parse_duration

# Pause: stop analysing and wait for a person (onInconclusive Pause, or Promote refused without data).
Verdict = Literal["Promote", "Continue", "Rollback", "Inconclusive", "Pause"]
SignalVerdict = Literal["pass", "fail", "insufficient"]

STAGES = (
    "recv_requests",
    "process_input_requests",
    "get_next_batch_to_run",
    "run_batch",
    "process_batch_result",
    "idle",
    "other",
)
# More idle time means the canary is faster (or got less work), never a regression.
_NOT_A_REGRESSION_STAGE = "idle"
# A function whose inclusive share is at least this on both sides runs around (nearly) the whole loop:
# the loop function itself, a decorator's `wrapper` that every stage goes through. Its growth is the
# loop's growth and says nothing about where it came from.
LOOP_WIDE_SHARE = 0.9


@dataclass(frozen=True)
class _Spec:
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


SIGNALS: Mapping[str, _Spec] = {
    "loop_latency": _Spec("log", True, "LoopLatencyRegressed", "scheduler loop latency", prove=True),
    "loop_p95": _Spec("log", True, "LoopP95Regressed", "scheduler loop p95", prove=True),
    "ttft": _Spec("log", True, "TTFTRegressed", "time to first token", required=False),
    "itl": _Spec("log", True, "ITLRegressed", "inter-token latency", required=False),
    "throughput": _Spec("log", False, "ThroughputRegressed", "throughput", required=False),
    # Time per iteration in one stage (share x loop mean), divided by the baseline's loop mean: a
    # difference of 0.05 means the stage now takes 5% of the old loop time more per iteration.
    "stage_time": _Spec("linear", True, "StageTimeRegressed", "time per iteration"),
    # Busy share of one front-end role (FRONTEND_ROLES; the sidecar samples them when told to): the fraction
    # of the role's time not waiting for work, scaled to the baseline's request rate (_busy_at_reference_rate)
    # so a pod that got more traffic is not read as slower. A difference of 0.10 means the role would be busy
    # 10 points more of the time at the same traffic. Compared only where both revisions sampled the role.
    "frontend_busy": _Spec("linear", True, "FrontendBusyRegressed", "front-end busy share", required=False),
}
# The signals read from SGLang's own request metrics.
REQUEST_SIGNALS = ("ttft", "itl", "throughput")
# The SGLang processes around the scheduler whose busy share the gate compares (sidecar vlm_sidecar.roles).
FRONTEND_ROLES = ("tokenizer_manager", "tokenizer_worker", "mm_processor", "detokenizer")


# ---------------------------------------------------------------------------------------------
# Inputs


def _num(v: Any) -> float | None:
    """A finite float from a JSON value, or None (bools are not numbers here)."""
    if type(v) is float:  # the common case, kept cheap: the gate parses every window at every look
        return v if math.isfinite(v) else None
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def _positive(v: Any) -> float | None:
    f = _num(v)
    return f if f is not None and f > 0 else None


def _nonnegative(v: Any) -> float | None:
    f = _num(v)
    return f if f is not None and f >= 0 else None


def _count(v: Any) -> int:
    f = _num(v)
    return int(f) if f is not None and f > 0 else 0


def _flag(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int | float):
        return v != 0
    return isinstance(v, str) and v.strip().lower() in ("true", "1", "yes", "y")


def _share(v: Any) -> float | None:
    """One share (0-1), rounding overshoot clipped; anything else (negative, > 1.01, not a number) is None."""
    f = _num(v)
    return None if f is None or f < 0 or f > 1.01 else min(f, 1.0)


def _nonnegative_int(v: Any) -> int | None:
    f = _num(v)
    return int(f) if f is not None and f >= 0 else None


def _shares(v: Any) -> dict[str, float]:
    """Shares keyed by name; drops non-string keys and non-numbers, clips rounding overshoot to [0, 1]."""
    if not isinstance(v, Mapping):
        return {}
    out: dict[str, float] = {}
    for k, x in v.items():
        f = _num(x)
        if isinstance(k, str) and k and f is not None and f >= 0:
            out[k] = min(f, 1.0)
    return out


@dataclass(frozen=True, slots=True)
class Window:
    """One profiler window of one scheduler process (one TP rank of one pod)."""

    revision: str
    pod: str
    id: str
    end: float
    samples: int
    loop_mean_seconds: float | None
    loop_p95_seconds: float | None
    stage_shares: Mapping[str, float]
    function_shares: Mapping[str, float]
    stale: bool = False
    ttft_seconds: float | None = None
    itl_seconds: float | None = None
    throughput: float | None = None
    tp_rank: int = 0
    # Requests per second that reached their first token in the window (SGLang's TTFT histogram count);
    # 0.0: none did; None: unknown (no SGLang metrics, an older sidecar).
    request_rate: float | None = None
    iterations: int | None = None
    # The CUDA IPC feature transport (sidecar vlm_sidecar.ipc): share of the scheduler's time in it, the
    # share re-opening IPC handles, and the samples in it. None: unknown (an older sidecar, a bad value).
    feature_transport_share: float | None = None
    ipc_handle_reopen_share: float | None = None
    feature_transport_samples: int | None = None
    # Self shares of the exported functions, and the largest self share of any function the sidecar did
    # not export (the bound that lets a function absent on one side still be compared). None: unknown.
    self_shares: Mapping[str, float] = field(default_factory=dict)
    unexported_self_share_max: float | None = None
    # The front end sampled in the same window (the entry's `frontend.roles`), by role; empty: not sampled.
    frontend: Mapping[str, RoleSample] = field(default_factory=dict)

    @classmethod
    def from_sidecar(cls, revision: str, pod: str, d: Any) -> Window:
        """Build from one `/windows.json` entry; never raises, whatever the entry holds.

        Missing or malformed numbers become None (or 0 for counts, 0.0 for `end`, which makes the
        window too old to count); a window that carries an `error` is marked stale, as the sidecar
        contract says partial py-spy output is. SGLang request signals may sit at the top level
        or under an `sglang` key.
        """
        if not isinstance(d, Mapping):
            d = {}
        req = d.get("sglang")
        req = req if isinstance(req, Mapping) else {}

        def pick(key: str) -> Any:
            return d.get(key, req.get(key))

        raw_id = d.get("id")
        ident = str(raw_id) if isinstance(raw_id, str | int) and not isinstance(raw_id, bool) else ""
        err = d.get("error")
        iterations = d.get("iterations")
        return cls(
            revision=str(revision),
            pod=str(pod),
            id=ident,
            end=_num(d.get("end")) or 0.0,
            samples=_count(d.get("samples")),
            loop_mean_seconds=_positive(d.get("loop_mean_seconds")),
            loop_p95_seconds=_positive(d.get("loop_p95_seconds")),
            stage_shares=_shares(d.get("stage_shares")),
            function_shares=_shares(d.get("function_shares")),
            stale=_flag(d.get("stale")) or bool(err),
            ttft_seconds=_positive(pick("ttft_seconds")),
            itl_seconds=_positive(pick("itl_seconds")),
            throughput=_positive(pick("throughput")),
            request_rate=_nonnegative(pick("request_rate")),
            tp_rank=_count(d.get("tp_rank")),
            iterations=None if _num(iterations) is None else _count(iterations),
            feature_transport_share=_share(d.get("feature_transport_share")),
            ipc_handle_reopen_share=_share(d.get("ipc_handle_reopen_share")),
            feature_transport_samples=_nonnegative_int(d.get("feature_transport_samples")),
            self_shares=_shares(d.get("self_shares")),
            unexported_self_share_max=_share(d.get("unexported_self_share_max")),
            frontend=_roles(d.get("frontend")),
        )


@dataclass(frozen=True, slots=True)
class RoleSample:
    """One front-end role in one window: its busy share and its threads' function shares (of their time)."""

    busy_share: float
    function_shares: Mapping[str, float] = field(default_factory=dict)
    self_shares: Mapping[str, float] = field(default_factory=dict)
    unexported_self_share_max: float | None = None


def _roles(v: Any) -> dict[str, RoleSample]:
    """The sampled front-end roles of a `/windows.json` entry's `frontend` object (roles without a busy
    share, unknown roles and malformed values are left out)."""
    roles = v.get("roles") if isinstance(v, Mapping) else None
    if not isinstance(roles, Mapping):
        return {}
    out = {}
    for role in FRONTEND_ROLES:
        r = roles.get(role)
        busy = _share(r.get("busy_share")) if isinstance(r, Mapping) else None
        if busy is not None:
            out[role] = RoleSample(busy, _shares(r.get("function_shares")), _shares(r.get("self_shares")),
                                   _share(r.get("unexported_self_share_max")))
    return out


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
    min_function_share: functions below this share on both sides are not tested (noise, and every
        extra test costs power).
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
    min_function_share: float = 0.01
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
            if _num(margin) is None or margin < 0:
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
            },
            confidence=a.confidence,
            steps=len(spec.rollout.steps),
            min_samples=a.min_samples,
            max_duration_s=parse_duration(a.max_duration),
            on_inconclusive=a.on_inconclusive,
            interval_s=parse_duration(a.interval),
            stale_after_s=max(3 * parse_duration(spec.telemetry.interval), 60.0),
            pair_s=parse_duration(spec.telemetry.interval),
        )


# ---------------------------------------------------------------------------------------------
# Outputs


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
    # Where this step's analysis clock started (unix seconds): the end of the canary's first fresh profiler
    # window after its pods were Ready; None while no such window exists (the clock then runs from Ready).
    clock_started_at: float | None = None


# ---------------------------------------------------------------------------------------------
# Preparing one revision's windows


class _Unit:
    """The analysis unit: one pod over one window, its TP ranks averaged (computed on first use,
    since function shares are only needed when gated or when a rollback names the culprit)."""

    def __init__(self, windows: Sequence[Window]):
        self.windows = tuple(windows)
        self.pod = self.windows[0].pod
        self.end = max(w.end for w in self.windows)

    @cached_property
    def values(self) -> Mapping[str, float | None]:
        return {
            name: _mean([getattr(w, attr) for w in self.windows]) for name, attr in _SCALAR_FIELDS.items()
        }

    @cached_property
    def stage_shares(self) -> Mapping[str, float]:
        return _mean_shares([w.stage_shares for w in self.windows])

    @cached_property
    def function_shares(self) -> Mapping[str, float]:
        # The keys of a window's function_shares are what its sidecar exported (the watch list plus the
        # top N by self time, a set that changes from window to window): a missing key is unknown, not 0.
        return _mean_present([w.function_shares for w in self.windows])

    @cached_property
    def stage_seconds(self) -> Mapping[str, float]:
        """Seconds per loop iteration spent in each stage: share x loop mean."""
        loop = self.values["loop_latency"]
        return {k: v * loop for k, v in self.stage_shares.items()} if loop else {}

    @cached_property
    def function_seconds(self) -> Mapping[str, float]:
        """Seconds per loop iteration inside each exported function (inclusive share x loop mean)."""
        loop = self.values["loop_latency"]
        return {k: v * loop for k, v in self.function_shares.items()} if loop else {}

    @cached_property
    def self_seconds(self) -> Mapping[str, float]:
        """Seconds per loop iteration in each exported function's own code (self share x loop mean)."""
        loop = self.values["loop_latency"]
        return {k: v * loop for k, v in _mean_present([w.self_shares for w in self.windows]).items()} if loop else {}

    @cached_property
    def unexported_self_seconds(self) -> float | None:
        """At most this many seconds per iteration in the own code of any function this unit's sidecar did
        not export (the largest bound over its windows); None when a window did not say."""
        loop = self.values["loop_latency"]
        cuts = [w.unexported_self_share_max for w in self.windows]
        return max(cuts) * loop if loop and cuts and None not in cuts else None


    @cached_property
    def fns(self) -> _Fns:
        """The scheduler's exported functions, in seconds per loop iteration."""
        return _Fns(self.function_seconds, self.self_seconds, self.unexported_self_seconds, self.function_shares)

    @cached_property
    def request_rate(self) -> float | None:
        """Requests per second in this pod's window (its TP ranks read the same SGLang counters)."""
        return _mean([w.request_rate for w in self.windows])

    @cached_property
    def frontend_busy(self) -> Mapping[str, float]:
        """Busy share per sampled front-end role (TP ranks' copies of one front-end window averaged)."""
        return _mean_present([{r: x.busy_share for r, x in w.frontend.items()} for w in self.windows])

    def role_fns(self, role: str) -> _Fns | None:
        """One front-end role's exported functions, as shares of its threads' time; None: not sampled."""
        got = [w.frontend[role] for w in self.windows if role in w.frontend]
        if not got:
            return None
        incl = _mean_present([x.function_shares for x in got])
        cuts = [x.unexported_self_share_max for x in got]
        return _Fns(incl, _mean_present([x.self_shares for x in got]), None if None in cuts else max(cuts), incl)


@dataclass(frozen=True)
class _Fns:
    """One unit's exported functions for attribution: inclusive and self time, in one unit of time per side
    (scheduler: seconds per loop iteration; front-end role: share of its time); `cut`: at most this much self
    time in any function left out of the export (None: unknown); `shares`: inclusive shares (loop-wide test)."""

    incl: Mapping[str, float]
    self_: Mapping[str, float]
    cut: float | None
    shares: Mapping[str, float]


_SCALAR_FIELDS = {
    "loop_latency": "loop_mean_seconds",
    "loop_p95": "loop_p95_seconds",
    "ttft": "ttft_seconds",
    "itl": "itl_seconds",
    "throughput": "throughput",
}


@dataclass(frozen=True)
class _Side:
    units: tuple[_Unit, ...]
    problem: tuple[str, str] | None  # (reason, message)


def _has_traffic(w: Window, max_idle: float) -> bool:
    if w.samples <= 0 or w.loop_mean_seconds is None or w.iterations == 0:
        return False
    return w.stage_shares.get("idle", 0.0) <= max_idle


def _dedup(windows: Iterable[Window]) -> list[Window]:
    # The caller may hand over overlapping scrapes of /windows.json; the last copy of a window wins.
    seen: dict[tuple[str, int, str], Window] = {}
    for w in windows:
        seen[(w.pod, w.tp_rank, w.id or f"end={w.end!r}")] = w
    return list(seen.values())


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def _mean_present(maps: Sequence[Mapping[str, float]]) -> Mapping[str, float]:
    """Per key, the mean over the maps that have it."""
    if len(maps) == 1:
        return maps[0]
    total: dict[str, list[float]] = {}
    for m in maps:
        for k, v in m.items():
            total.setdefault(k, []).append(v)
    return {k: sum(v) / len(v) for k, v in total.items()}


def _mean_shares(maps: Sequence[Mapping[str, float]]) -> Mapping[str, float]:
    # Stage shares: every window carries every stage, so a missing key is a stage never seen (0).
    if len(maps) == 1:
        return maps[0]
    total: dict[str, float] = {}
    for m in maps:
        for k, v in m.items():
            total[k] = total.get(k, 0.0) + v
    return {k: v / len(maps) for k, v in total.items()}


def _units(windows: Sequence[Window], merge_s: float) -> list[_Unit]:
    """Group each pod's windows into time slices (one window per TP rank at most) and average them."""
    by_pod: dict[str, list[Window]] = defaultdict(list)
    for w in windows:
        by_pod[w.pod].append(w)
    units: list[_Unit] = []
    for pod in sorted(by_pod):
        group: list[Window] = []
        for w in sorted(by_pod[pod], key=lambda w: (w.end, w.tp_rank, w.id)):
            if group and (w.end - group[0].end > merge_s or any(g.tp_rank == w.tp_rank for g in group)):
                units.append(_Unit(group))
                group = []
            group.append(w)
        if group:
            units.append(_Unit(group))
    return units


def _side(name: str, windows: Sequence[Window], policy: GatePolicy, started_at: float, now: float) -> _Side:
    # Only windows that end after the step started: the stable revision's older windows saw other
    # traffic, and comparing concurrent windows keeps load changes out of the difference.
    period = _dedup(w for w in windows if w.end >= started_at)
    fresh = [w for w in period if not w.stale]
    busy = [w for w in fresh if _has_traffic(w, policy.max_idle_share)]
    units = tuple(_units(busy, policy.rank_merge_s))
    elapsed = now - started_at
    newest = max((w.end for w in fresh), default=None)
    if newest is None or now - newest > policy.stale_after_s:
        if period and not fresh:
            return _Side(
                units, ("ProfilerStale", f"every {name} profiler window since the step began is stale")
            )
        if newest is not None:
            return _Side(
                units, ("ProfilerStale", f"newest {name} profiler window is {now - newest:.0f}s old")
            )
        if elapsed > policy.stale_after_s:
            return _Side(units, ("ProfilerStale", f"no {name} profiler window in {elapsed:.0f}s"))
        return _Side(units, ("TooFewSamples", f"no {name} profiler window yet"))
    if not busy:
        return _Side(
            units, ("NoTraffic", f"{name} schedulers saw no traffic in {len(fresh)} fresh window(s)")
        )
    if len(units) < policy.min_samples:
        return _Side(units, ("TooFewSamples", f"{name} has {len(units)} of {policy.min_samples} windows"))
    return _Side(units, None)


# ---------------------------------------------------------------------------------------------
# Signals


@dataclass(frozen=True)
class _Instance:
    family: str
    name: str  # e.g. "loop_latency", "stage_time:run_batch"
    baseline: tuple[float | None, ...]
    canary: tuple[float | None, ...]
    baseline_pods: tuple[str, ...] = ()
    canary_pods: tuple[str, ...] = ()
    reference: tuple[float | None, ...] = ()
    reference_pods: tuple[str, ...] = ()
    baseline_ends: tuple[float, ...] = ()
    canary_ends: tuple[float, ...] = ()

    def pairs(self, log: bool, pair_s: float) -> list[float]:
        """One difference per canary unit: its value minus the mean of the baseline units that ended at
        about the same time (within pair_s / 2, else pair_s), on the test scale. Load shared by both
        revisions cancels; canary units without a concurrent baseline are left out."""

        def f(v: float | None) -> float | None:
            if v is None or not math.isfinite(v) or (log and v <= 0):
                return None
            return math.log(v) if log else v

        base = [(e, x) for e, v in zip(self.baseline_ends, self.baseline, strict=True) if (x := f(v)) is not None]
        out = []
        for e, v in zip(self.canary_ends, self.canary, strict=True):
            x = f(v)
            if x is None:
                continue
            for width in (pair_s / 2, pair_s):
                near = [b for t, b in base if abs(t - e) <= width]
                if near:
                    out.append(x - sum(near) / len(near))
                    break
        return out

    def tau2(self, log: bool) -> float:
        """Between-pod variance: from the reference pods where there are enough, else the baseline's."""
        if len(set(self.reference_pods)) >= 2:
            return _between_pod_var(self.reference, self.reference_pods, log)
        return _between_pod_var(self.baseline, self.baseline_pods, log)

    def extra_var(self, log: bool) -> float:
        """Between-pod variance of the difference of the two sides' means: tau^2 (1/k_b + 1/k_c)."""
        tau2 = self.tau2(log)
        if tau2 <= 0:
            return 0.0
        k_b = max(1, len(set(self.baseline_pods)))
        k_c = max(1, len(set(self.canary_pods)))
        return tau2 * (1 / k_b + 1 / k_c)


def _instances(
    policy: GatePolicy, b: Sequence[_Unit], c: Sequence[_Unit], ref: Sequence[_Unit] = ()
) -> list[_Instance]:
    """One test per signal (and per stage). `ref`: units of other pods of the baseline's revision (the
    long-running stable pods next to a fresh baseline), used only to estimate how much pods differ."""
    out: list[_Instance] = []
    for family in policy.max_regression:
        if family in _SCALAR_FIELDS:
            out.append(
                _Instance(
                    family, family, tuple(u.values[family] for u in b), tuple(u.values[family] for u in c),
                    _pods(b), _pods(c), tuple(u.values[family] for u in ref), _pods(ref), _ends(b), _ends(c),
                )
            )
        elif family == "stage_time":
            loop_ref = _reference_loop(b)
            if loop_ref is None:
                continue
            keys = set().union(*(u.stage_seconds for u in (*b, *c))) - {_NOT_A_REGRESSION_STAGE}
            order = {s: i for i, s in enumerate(STAGES)}
            for k in sorted(keys, key=lambda s: (order.get(s, len(order)), s)):
                out.append(
                    _Instance(
                        family, f"{family}:{k}",
                        tuple(_per_loop(u.stage_seconds, k, loop_ref) for u in b),
                        tuple(_per_loop(u.stage_seconds, k, loop_ref) for u in c),
                        _pods(b), _pods(c),
                        tuple(_per_loop(u.stage_seconds, k, loop_ref) for u in ref), _pods(ref),
                        _ends(b), _ends(c),
                    )
                )
        elif family == "frontend_busy":
            for role in FRONTEND_ROLES:
                busy = _busy_at_reference_rate(role, b, c, ref)
                vb, vc = tuple(busy(u) for u in b), tuple(busy(u) for u in c)
                if not any(v is not None for v in vb) or not any(v is not None for v in vc):
                    continue  # compared only where both revisions sampled the role
                out.append(
                    _Instance(
                        family, f"{family}:{role}", vb, vc, _pods(b), _pods(c),
                        tuple(busy(u) for u in ref), _pods(ref), _ends(b), _ends(c),
                    )
                )
    return out


def _busy_at_reference_rate(
    role: str, b: Sequence[_Unit], c: Sequence[_Unit], ref: Sequence[_Unit]
) -> Callable[[_Unit], float | None]:
    """A front-end role's busy share per unit, at the baseline's request rate.

    A front end's busy share is its work per request times the requests it gets: a pod that happens to get
    more traffic (uneven balancing, a client pinned to it) is busier without being slower. So each unit's
    share is scaled to the baseline's median request rate: busy x rate_ref / rate, "how busy this pod
    would be at the baseline's traffic", still in points of busy share (the margin's unit). A unit with no
    request in its window has no per-request cost and is left out. Where a unit that sampled the role has
    no request rate at all (no SGLang metrics, an older sidecar), no unit is scaled: the raw shares are
    compared, as both revisions then share one Service's traffic only on average."""
    units = [u for u in (*b, *c, *ref) if role in u.frontend_busy]
    rates = sorted(r for u in b if role in u.frontend_busy and (r := u.request_rate) is not None and r > 0)
    if not rates or any(u.request_rate is None for u in units):
        return lambda u: u.frontend_busy.get(role)
    rate_ref = rates[len(rates) // 2]

    def busy(u: _Unit) -> float | None:
        v, r = u.frontend_busy.get(role), u.request_rate
        return None if v is None or not r else v * rate_ref / r

    return busy


def _pods(units: Sequence[_Unit]) -> tuple[str, ...]:
    return tuple(u.pod for u in units)


def _ends(units: Sequence[_Unit]) -> tuple[float, ...]:
    return tuple(u.end for u in units)


def _reference_loop(units: Sequence[_Unit]) -> float | None:
    """The baseline's typical loop time, the unit in which per-stage time differences are stated."""
    loops = sorted(v for u in units if (v := u.values["loop_latency"]) is not None)
    return loops[len(loops) // 2] if loops else None


def _per_loop(seconds: Mapping[str, float], key: str, ref: float) -> float | None:
    if not seconds:
        return None
    return seconds.get(key, 0.0) / ref


def _between_pod_var(values: Sequence[float | None], pods: Sequence[str], log: bool) -> float:
    """Method-of-moments estimate of the between-pod variance (random effects) of one side's values.

    Windows of one pod share its offset (node CPU, its own traffic mix). With at least two pods of
    at least two windows each: variance of the pod means minus the part the window noise explains.
    0 when it cannot be estimated (one pod) or is swamped by the window noise.
    """
    by_pod: dict[str, list[float]] = defaultdict(list)
    for v, p in zip(values, pods, strict=True):
        if v is None or not math.isfinite(v) or (log and v <= 0):
            continue
        by_pod[p].append(math.log(v) if log else v)
    groups = [g for g in by_pod.values() if len(g) >= 2]
    if len(groups) < 2:
        return 0.0
    means = [sum(g) / len(g) for g in groups]
    grand = sum(means) / len(means)
    var_means = sum((m - grand) ** 2 for m in means) / (len(means) - 1)
    within = [sum((x - sum(g) / len(g)) ** 2 for x in g) / (len(g) - 1) / len(g) for g in groups]
    return max(0.0, var_means - sum(within) / len(within))


def _has_values(inst: _Instance) -> bool:
    return any(v is not None for v in inst.baseline) and any(v is not None for v in inst.canary)


def _rollback_alpha(policy: GatePolicy, alpha: float, looks: int, final: bool, families: int, members: int) -> float:
    """The per-look rollback level of one member: the step's budget split over the planned looks (or a
    `final_alpha_share` of it kept for the last look, the rest over the looks before it), the families
    and the family's members."""
    share = policy.final_alpha_share if policy.inference == "bonferroni" and looks > 1 else 0.0
    if share <= 0:
        return stats.bonferroni(alpha, looks, families, members)
    if final:
        return stats.bonferroni(alpha * share, families, members)
    return stats.bonferroni(alpha * (1 - share), looks, families, members)


def _evaluate(
    family: str,
    insts: Sequence[_Instance],
    policy: GatePolicy,
    alpha_rollback: float,
    alpha_promote: float,
    enough: bool,
    final: bool = False,
) -> list[SignalResult]:
    """Judge every member of one signal family on its time-paired differences.

    `final`: this is the step's last look (maxDuration reached). The gate then decides on the data
    instead of waiting: a member fails when it is confidently worse at all (bound above 0, at the same
    per-look level, so the false-rollback budget still holds) and its estimate exceeds the margin;
    it passes when its estimate is within the margin. Only a member beyond its margin but not
    confidently worse stays undecided, for onInconclusive.

    The rollback bound carries the between-pod variance (a canary on a slow node is not a regression);
    the promotion bound does not (it proves the canary pods within the margin of the baseline pods they
    ran beside; with tau added, one canary pod could never be proven within a margin of ~3 tau).
    """
    spec = SIGNALS[family]
    log = spec.scale == "log"
    margin = float(policy.max_regression[family])
    bound = _bound_factor(policy, family)
    # The rollback bound sits on the "worse" side of the estimate, the promotion bound on the other.
    worse_low = spec.higher_is_worse
    a_low, a_high = (alpha_rollback, alpha_promote) if worse_low else (alpha_promote, alpha_rollback)
    tau = [i.extra_var(log) for i in insts]
    zero = [0.0] * len(insts)
    cmps = stats.paired_many(
        [i.pairs(log, policy.pair_s) for i in insts],
        scale=spec.scale,
        alpha_low=a_low,
        alpha_high=a_high,
        trim=policy.trim,
        extra_var_low=tau if worse_low else zero,
        extra_var_high=zero if worse_low else tau,
        anytime_r=(
            max(float(stats.MIN_PER_SIDE), policy.max_duration_s / 2 / policy.pair_s)
            if policy.inference == "anytime"
            else None
        ),
    )
    out: list[SignalResult] = []
    for inst, cmp in zip(insts, cmps, strict=True):
        n_b = len(stats.finite(inst.baseline, positive=log))
        n_c = len(stats.finite(inst.canary, positive=log))
        if cmp is None:
            out.append(
                SignalResult(inst.name, None, None, None, None, None, None, n_b, n_c, "insufficient", margin)
            )
            continue
        sign = 1.0 if spec.higher_is_worse else -1.0
        worse_est = sign * cmp.delta
        worse_lcb = cmp.low if spec.higher_is_worse else -cmp.high
        worse_ucb = cmp.high if spec.higher_is_worse else -cmp.low
        verdict: SignalVerdict = "insufficient"
        # Rollback: confidently worse than half the allowance, and most likely worse than all of it.
        # The bound alone controls false rollbacks of canaries within half the margin; the estimate
        # condition keeps small-but-certain differences (a slower node) inside the allowance.
        if enough and worse_lcb > (0.0 if final else margin / 2) and worse_est > margin:
            verdict = "fail"
        # Pass: the estimate within the margin, and before the last look the promotion bound below `bound`
        # margins where the signal has one (the loop signals' proof at 1, request signals at 2).
        elif enough and worse_est <= margin and (final or not bound or worse_ucb < bound * margin):
            verdict = "pass"
        out.append(
            SignalResult(
                name=inst.name,
                baseline=stats.center(inst.baseline, scale=spec.scale, trim=policy.trim),
                canary=stats.center(inst.canary, scale=spec.scale, trim=policy.trim),
                delta=cmp.delta,
                ci_low=cmp.low,
                ci_high=cmp.high,
                p_value=cmp.p_greater if spec.higher_is_worse else cmp.p_less,
                n_baseline=n_b,
                n_canary=n_c,
                verdict=verdict,
                margin=margin,
            )
        )
    return out


def _severity(s: SignalResult) -> float:
    spec = SIGNALS[_family(s.name)]
    worse = (s.delta or 0.0) * (1 if spec.higher_is_worse else -1)
    if s.margin > 0:
        return worse / s.margin
    return math.inf if worse > 0 else worse


def _family(name: str) -> str:
    return name.split(":", 1)[0]


def _fmt_delta(s: SignalResult) -> str:
    if s.delta is None:
        return "n/a"
    if SIGNALS[_family(s.name)].scale == "linear":
        return f"{s.delta * 100:+.1f}pp (bounds {s.ci_low * 100:+.1f}..{s.ci_high * 100:+.1f}pp, allowed {s.margin * 100:.1f}pp)"
    return f"{s.delta:+.1%} (bounds {s.ci_low:+.1%}..{s.ci_high:+.1%}, allowed {s.margin:.1%})"


def _describe(s: SignalResult) -> str:
    family = _family(s.name)
    what = SIGNALS[family].label
    if ":" in s.name:
        what = f"{what} of {s.name.split(':', 1)[1]}"
    return f"{what} {_fmt_delta(s)} over {s.n_canary} canary / {s.n_baseline} baseline windows"


# ---------------------------------------------------------------------------------------------
# Attribution


def _growth(
    b: Sequence[Mapping[str, float]], c: Sequence[Mapping[str, float]], *, min_units: int = 1
) -> dict[str, tuple[float, float]]:
    """name -> (canary - baseline mean, canary mean) for names present in at least `min_units` maps
    on each side (a name a side did not export is unknown there, never 0)."""
    mb, mc = _present_lists(b), _present_lists(c)
    out = {}
    for k in set(mb) & set(mc):
        if len(mb[k]) < min_units or len(mc[k]) < min_units:
            continue
        cb, cc = sum(mb[k]) / len(mb[k]), sum(mc[k]) / len(mc[k])
        out[k] = (cc - cb, cc)
    return out


def _present_lists(maps: Sequence[Mapping[str, float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for m in maps:
        for k, v in m.items():
            out.setdefault(k, []).append(v)
    return out


# Inclusive function times nest: every caller of a function that grew grows at least as much. Among
# the functions whose growth is within this fraction of the largest, the smallest (the deepest frame)
# is the one to name: "reconstruct_on_target_device", not its caller "process_input_requests".
_NEAR_MAX_GROWTH = 0.8


def _loop_wide(views: Sequence[_Fns]) -> set[str]:
    shares = _present_lists([v.shares for v in views])
    return {k for k, v in shares.items() if sum(v) / len(v) >= LOOP_WIDE_SHARE}


def _grown_unexported_on_baseline(b: Sequence[_Fns], c: Sequence[_Fns], need: int) -> dict[str, tuple[float, float]]:
    """Functions the canary's sidecars exported in at least `need` units and the baseline's in fewer (below
    the baseline's top-N cut in most windows): name -> (a lower bound of their growth, canary mean time).
    In a baseline unit that did not export one, its self time was at most the unit's stated bound for what
    it left out (`unexported_self_share_max`), so the baseline mean is at most the mean of the values it has
    and the bounds where it has none, and the self time grew by at least the canary mean minus that.
    Nothing for a function when a baseline unit that left it out states no bound."""
    on_b = _present_lists([v.incl for v in b])
    selfs = _present_lists([v.self_ for v in c])
    incl = _present_lists([v.incl for v in c])
    out = {}
    for k, v in selfs.items():
        if len(v) < need or k not in incl or len(on_b.get(k, ())) >= need:
            continue
        upper = [u.self_.get(k, u.cut) for u in b]
        if not upper or None in upper:
            continue
        out[k] = (sum(v) / len(v) - sum(upper) / len(upper), sum(incl[k]) / len(incl[k]))  # type: ignore[arg-type]
    return out


def _most_grown(b: Sequence[_Fns], c: Sequence[_Fns]) -> str | None:
    """The function whose time grew most on the canary, preferring the deepest of near-ties; frames around
    (nearly) all of the time on both sides are not candidates (see regressed_function)."""
    if not (b and c):
        return None
    wide = _loop_wide(b) & _loop_wide(c)
    need = max(1, min(len(b), len(c)) // 2)
    both = _growth([v.incl for v in b], [v.incl for v in c], min_units=need)
    grown = {
        k: v
        for k, v in {**_grown_unexported_on_baseline(b, c, need), **both}.items()
        if v[0] > 0 and k not in wide
    }
    if not grown:
        return None
    top = max(g for g, _ in grown.values())
    near = [(t, -g, k) for k, (g, t) in grown.items() if g >= _NEAR_MAX_GROWTH * top]
    return min(near)[2]


def regressed_function(b: Sequence[_Unit], c: Sequence[_Unit]) -> str | None:
    """The scheduler function whose time per iteration grew most on the canary, preferring the deepest of
    near-ties; loop-wide frames are not candidates. A function the baseline's sidecars (mostly) did not
    export is compared through the bound they state for what they left out: its self-time growth is at
    least its canary self time minus that bound. Without the bound it is unknown there and not a
    candidate; so is a function only the baseline exported (it can only have shrunk or stayed)."""
    return _most_grown([u.fns for u in b], [u.fns for u in c])


def regressed_role_function(b: Sequence[_Unit], c: Sequence[_Unit], role: str) -> str | None:
    """The same for one front-end role: the function whose share of the role's time grew most (the role's
    own frames around all of its time, `_process_worker` or the event loop's `run`, are not candidates)."""
    return _most_grown([f for u in b if (f := u.role_fns(role))], [f for u in c if (f := u.role_fns(role))])


def regressed_stage(b: Sequence[_Unit], c: Sequence[_Unit]) -> str | None:
    """The stage (idle excluded) whose time per iteration grew most on the canary."""
    grown = {
        k: v
        for k, v in _growth([u.stage_seconds for u in b], [u.stage_seconds for u in c]).items()
        if k != _NOT_A_REGRESSION_STAGE and v[0] > 0
    }
    if not grown:
        return None
    return max(grown.items(), key=lambda kv: (kv[1][0], kv[0]))[0]


# ---------------------------------------------------------------------------------------------
# The decision


def decide(
    baseline: Sequence[Window],
    canary: Sequence[Window],
    policy: GatePolicy,
    *,
    started_at: float,
    now: float,
    step_duration_s: float,
    unavailable: str | None = None,
    spread_reference: Sequence[Window] = (),
    data_started_at: float | None = None,
) -> Decision:
    """Judge the canary step whose canary pods were all Ready at `started_at`, as of `now` (unix seconds).

    The step's clock (analysisTime, maxDuration, the planned looks) starts at the end of the canary's
    first fresh profiler window at or after `started_at` (`data_started_at` once a previous look found
    it; the decision returns it as `clock_started_at`), so neither start-up nor a sidecar that takes a
    while to find the scheduler eats the analysis time. While no such window exists the clock runs from
    `started_at`: a canary whose profiler never delivers reaches maxDuration as ProfilerStale, which is
    decided as missing data (never a promotion). `unavailable`: the signal sources could not be read this
    time (the message says why); that is a data problem like a stale profiler, decided here too.
    `spread_reference`: windows of other pods of the baseline's revision (the stable pods, when the
    baseline is fresh), used only to estimate the between-pod variance.
    """
    clock = data_started_at
    if clock is None and unavailable is None:
        clock = min((w.end for w in canary if not w.stale and w.end >= started_at), default=None)
    started_at = clock if clock is not None else started_at
    elapsed = now - started_at
    if unavailable is not None:
        b = c = _Side((), ("SignalsUnavailable", unavailable))
    else:
        b = _side("baseline", baseline, policy, started_at, now)
        c = _side("canary", canary, policy, started_at, now)
    enough = len(b.units) >= policy.min_samples and len(c.units) >= policy.min_samples

    # The false-rollback budget is per rollout: each step spends an equal part of it.
    alpha = (1.0 - policy.confidence) / policy.steps
    looks = stats.planned_looks(policy.max_duration_s, policy.interval_s)
    promote_looks = 1 + max(
        0, math.ceil((policy.max_duration_s - step_duration_s) / policy.interval_s - 1e-9)
    )
    if policy.inference == "anytime":  # the confidence sequences hold at every look: nothing to split
        looks = promote_looks = 1
    by_family: dict[str, list[_Instance]] = defaultdict(list)
    ref = _side("reference", spread_reference, policy, started_at, now).units if spread_reference else ()
    for inst in _instances(policy, b.units, c.units, ref):
        by_family[inst.family].append(inst)
    # Weighted Bonferroni: each gated family that has data gets an equal part of the rollback budget
    # per look, split evenly over its members (stages, functions), so loop latency keeps its power
    # however many functions are watched, and request signals nobody scrapes cost nothing (which
    # families have data depends on the sources, not on the values, so the bound still holds).
    # Promotion needs every signal to pass (an intersection-union test), so only the repeated
    # promotion looks divide its budget.
    families = max(1, sum(any(_has_values(i) for i in insts) for insts in by_family.values()))
    alpha_promote = stats.bonferroni(alpha, promote_looks)
    final = elapsed >= policy.max_duration_s
    signals = tuple(
        result
        for family, insts in by_family.items()
        for result in _evaluate(
            family,
            insts,
            policy,
            _rollback_alpha(policy, alpha, looks, final, families, len(insts)),
            alpha_promote,
            enough,
            final=final,
        )
    )

    def attribution(signal: str | None = None) -> tuple[str | None, str | None]:
        """(function, stage) that grew most; for a front-end signal the role's function and no stage."""
        if not (b.units and c.units):
            return None, None
        if signal is not None and _family(signal) == "frontend_busy":
            return regressed_role_function(b.units, c.units, signal.split(":", 1)[1]), None
        return regressed_function(b.units, c.units), regressed_stage(b.units, c.units)

    decision = _judge(policy, b, c, signals, elapsed, step_duration_s, attribution)
    return replace(decision, warning=_resolution(policy, by_family, alpha), clock_started_at=clock)


def _judge(
    policy: GatePolicy,
    b: _Side,
    c: _Side,
    signals: tuple[SignalResult, ...],
    elapsed: float,
    step_duration_s: float,
    attribution: Callable[..., tuple[str | None, str | None]],
) -> Decision:
    failed = [s for s in signals if s.verdict == "fail"]
    if failed:
        # Evidence gathered while the canary ran stays evidence even if its profiler went stale since.
        worst = max(failed, key=_severity)
        fn, stage = attribution(worst.name)
        msg = f"{_describe(worst)}"
        if _family(worst.name) == "frontend_busy":
            msg += f"; grew most: {worst.name.split(':', 1)[1]} function {fn or 'n/a'}"
        elif stage or fn:
            msg += f"; grew most: stage {stage or 'n/a'}, function {fn or 'n/a'}"
        return Decision("Rollback", SIGNALS[_family(worst.name)].reason, msg, signals, fn, stage)

    at_max = elapsed >= policy.max_duration_s
    problem = c.problem or b.problem
    if problem is not None:
        reason, msg = problem
        if not at_max:
            return Decision("Inconclusive", reason, msg, signals)
        return _at_max_duration(
            policy, signals, f"{reason}: {msg}", data_missing=True, attribution=attribution
        )

    blocking = [s for s in signals if not (s.verdict == "insufficient" and _optional_absent(s))]
    if not blocking:
        msg = "none of the gated signals has values on either revision"
        if not at_max:
            return Decision("Inconclusive", "TooFewSamples", msg, signals)
        return _at_max_duration(policy, signals, msg, data_missing=True, attribution=attribution)
    if all(s.verdict == "pass" for s in blocking):
        if elapsed >= step_duration_s:
            worst = max(blocking, key=_severity)
            if at_max and not all(_proven(policy, s) for s in blocking):
                # The last look decides on the estimates: none is beyond its margin, none confidently
                # worse beyond it; holding a canary back for noise is what this look exists to avoid.
                return Decision(
                    "Promote",
                    "WithinMarginAtMaxDuration",
                    f"at maxDuration every estimate is within its margin (not all proven); "
                    f"closest: {_describe(worst)}",
                    signals,
                )
            return Decision(
                "Promote", "NoRegression", f"all signals within margin; closest: {_describe(worst)}", signals
            )
        msg = f"no regression so far; step analysis time {elapsed:.0f}s of {step_duration_s:.0f}s"
        return Decision("Continue", "StepInProgress", msg, signals)
    undecided = [s for s in blocking if s.verdict != "pass"] or list(signals)
    msg = "undecided: " + "; ".join(_describe(s) for s in undecided[:3])
    if not at_max:
        return Decision("Continue", "AwaitingEvidence", msg, signals)
    return _at_max_duration(policy, signals, msg, data_missing=False, attribution=attribution)


def _bound_factor(policy: GatePolicy, family: str) -> float:
    """How many margins a family's promotion bound must stay below before the last look: 1 for the loop
    signals (proof of non-inferiority), `request_bound_factor` for request signals, 0 (none) for the rest."""
    if SIGNALS[family].prove:
        return 1.0
    return policy.request_bound_factor if family in REQUEST_SIGNALS else 0.0


def _proven(policy: GatePolicy, s: SignalResult) -> bool:
    """What a promotion before the last look needs beyond the estimate holds (`_bound_factor`)."""
    family = _family(s.name)
    spec = SIGNALS[family]
    factor = _bound_factor(policy, family)
    if not factor:
        return True
    bound = s.ci_high if spec.higher_is_worse else (None if s.ci_low is None else -s.ci_low)
    if bound is None:
        return False
    return bound < factor * s.margin


def _optional_absent(s: SignalResult) -> bool:
    return not SIGNALS[_family(s.name)].required and s.n_baseline == 0 and s.n_canary == 0


def _at_max_duration(
    policy: GatePolicy,
    signals: tuple[SignalResult, ...],
    why: str,
    *,
    data_missing: bool,
    attribution: Callable[..., tuple[str | None, str | None]],
) -> Decision:
    reason = "MaxDurationReached"
    action = policy.on_inconclusive
    prefix = f"no verdict within maxDuration {policy.max_duration_s:.0f}s ({why})"
    if action == "Rollback":
        fn, stage = attribution()
        return Decision("Rollback", reason, f"{prefix}; onInconclusive Rollback", signals, fn, stage)
    if action == "Promote" and not data_missing:
        return Decision("Promote", reason, f"{prefix}; onInconclusive Promote", signals)
    if action == "Promote":
        return Decision("Pause", reason, f"{prefix}; onInconclusive Promote refused without data, pausing", signals)
    return Decision("Pause", reason, f"{prefix}; onInconclusive Pause", signals)


def _resolution(policy: GatePolicy, by_family: Mapping[str, Sequence[_Instance]], alpha: float) -> str | None:
    """A warning when the pods' own spread alone keeps the loop-latency margin from being resolved.

    With one canary pod the revision's effect and that pod's offset are one number: the smallest
    regression the gate can confirm is about z * sqrt(between-pod variance of the difference). When
    that exceeds half the margin, a real regression of the margin's size is rarely rolled back and
    a harmless canary on a fast node may be held back until maxDuration.
    """
    insts = by_family.get("loop_latency") or []
    if not insts:
        return None
    extra = insts[0].extra_var(log=True)
    if extra <= 0:
        return None
    looks = stats.planned_looks(policy.max_duration_s, policy.interval_s)
    z = NormalDist().inv_cdf(1 - stats.bonferroni(alpha, looks))
    resolvable = math.expm1(z * math.sqrt(extra))
    margin = policy.max_regression["loop_latency"]
    if resolvable <= margin / 2:
        return None
    spread = math.sqrt(insts[0].tau2(log=True))
    return (
        f"pods of the baseline differ by {spread:.1%} (sd) among themselves: with these pod counts the gate "
        f"can confirm only loop-latency regressions beyond about {resolvable:.1%} against a margin of "
        f"{margin:.0%}; add canary pods, use baseline Fresh, or widen maxRegression.loopLatency"
    )
