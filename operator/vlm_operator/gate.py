"""The canary gate: profiler windows of the stable and canary revisions in, one verdict out.

Pure: the caller gathers windows (Prometheus or the sidecars' /windows.json), passes the clock in
as `now`, and acts on the returned Decision. Calling `decide` twice with the same inputs gives the
same Decision, so an operator restarted mid-analysis reaches the same verdict from status.

The rule, in short (docs/canary-analysis.md has the long form and the measured error rates):
- unit of analysis: one profiler window of one pod; TP ranks of a pod that cover the same time are
  averaged first, because lock-stepped ranks are not independent observations;
- per signal, Yuen's trimmed Welch test of canary against baseline (vlm_operator.stats): latencies
  on the log scale (relative change), shares as percentage-point differences;
- Rollback when a signal is worse than half its margin with confidence (one-sided bound,
  Bonferroni-corrected over the planned looks and the signals) AND its estimate exceeds the margin;
- Promote when, after the step's analysis time, every signal's one-sided upper bound is inside
  its margin (non-inferiority; all must pass, so no correction across signals is needed);
- Inconclusive on stale profiler data, no traffic or too few windows; at maxDuration the policy's
  onInconclusive applies, except that missing data never promotes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from vlm_operator import stats
from vlm_operator.errors import InvalidSpec

Verdict = Literal["Promote", "Continue", "Rollback", "Inconclusive"]
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
# A growing idle share means the canary is faster, never a regression.
_NOT_A_REGRESSION_STAGE = "idle"


@dataclass(frozen=True)
class _Spec:
    """How one signal family is read, compared and named."""

    scale: stats.Scale
    higher_is_worse: bool
    reason: str
    label: str
    # Request signals only exist when SGLang metrics are scraped: absent on both sides they are
    # reported but do not hold back a promotion; the profiler signals always must be there.
    required: bool = True


SIGNALS: Mapping[str, _Spec] = {
    "loop_latency": _Spec("log", True, "LoopLatencyRegressed", "scheduler loop latency"),
    "loop_p95": _Spec("log", True, "LoopP95Regressed", "scheduler loop p95"),
    "ttft": _Spec("log", True, "TTFTRegressed", "time to first token", required=False),
    "itl": _Spec("log", True, "ITLRegressed", "inter-token latency", required=False),
    "throughput": _Spec("log", False, "ThroughputRegressed", "throughput", required=False),
    "stage_share": _Spec("linear", True, "StageShareRegressed", "stage share"),
    "function_share": _Spec("linear", True, "FunctionShareRegressed", "function share"),
}


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


def _count(v: Any) -> int:
    f = _num(v)
    return int(f) if f is not None and f > 0 else 0


def _flag(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int | float):
        return v != 0
    return isinstance(v, str) and v.strip().lower() in ("true", "1", "yes", "y")


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


@dataclass(frozen=True)
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
    iterations: int | None = None

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
            tp_rank=_count(d.get("tp_rank")),
            iterations=None if _num(iterations) is None else _count(iterations),
        )


@dataclass(frozen=True)
class GatePolicy:
    """What the user allows and how long the gate may take. Margins are fractions, not percent.

    max_regression: signal -> allowed worsening. Latencies (loop_latency, loop_p95, ttft, itl): relative
        increase (0.03 = 3% slower). throughput: relative drop. stage_share / function_share: absolute
        share increase (0.05 = 5 percentage points) of any one stage / function.
    confidence: 1 - the false-rollback budget of the whole analysis (spent over looks and signals).
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
    """

    max_regression: Mapping[str, float] = field(
        default_factory=lambda: {"loop_latency": 0.03, "stage_share": 0.05}
    )
    confidence: float = 0.95
    min_samples: int = 5
    max_duration_s: float = 1800.0
    on_inconclusive: Literal["Promote", "Rollback", "Pause"] = "Rollback"
    stale_after_s: float = 180.0
    interval_s: float = 60.0
    rank_merge_s: float = 5.0
    max_idle_share: float = 0.9
    min_function_share: float = 0.01
    trim: float = stats.DEFAULT_TRIM

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
        return _mean_shares([w.function_shares for w in self.windows])


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


def _mean_shares(maps: Sequence[Mapping[str, float]]) -> Mapping[str, float]:
    # A key missing from one window is below that window's top-N cut: count it as 0.
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
    name: str  # e.g. "loop_latency", "stage_share:run_batch"
    baseline: tuple[float | None, ...]
    canary: tuple[float | None, ...]


def _instances(policy: GatePolicy, b: Sequence[_Unit], c: Sequence[_Unit]) -> list[_Instance]:
    out: list[_Instance] = []
    for family in policy.max_regression:
        if family in _SCALAR_FIELDS:
            out.append(
                _Instance(
                    family, family, tuple(u.values[family] for u in b), tuple(u.values[family] for u in c)
                )
            )
        elif family == "stage_share":
            keys = set().union(*(u.stage_shares for u in (*b, *c))) - {_NOT_A_REGRESSION_STAGE}
            order = {s: i for i, s in enumerate(STAGES)}
            for k in sorted(keys, key=lambda s: (order.get(s, len(order)), s)):
                out.append(_Instance(family, f"{family}:{k}", _share(b, "stage", k), _share(c, "stage", k)))
        elif family == "function_share":
            mb = _mean_shares([u.function_shares for u in b])
            mc = _mean_shares([u.function_shares for u in c])
            keys = {
                k for k in set(mb) | set(mc) if max(mb.get(k, 0), mc.get(k, 0)) >= policy.min_function_share
            }
            for k in sorted(keys):
                out.append(
                    _Instance(family, f"{family}:{k}", _share(b, "function", k), _share(c, "function", k))
                )
    return out


def _has_values(inst: _Instance) -> bool:
    return any(v is not None for v in inst.baseline) and any(v is not None for v in inst.canary)


def _share(units: Sequence[_Unit], kind: str, key: str) -> tuple[float, ...]:
    return tuple((u.stage_shares if kind == "stage" else u.function_shares).get(key, 0.0) for u in units)


def _evaluate(
    family: str,
    insts: Sequence[_Instance],
    policy: GatePolicy,
    alpha_rollback: float,
    alpha_promote: float,
    enough: bool,
) -> list[SignalResult]:
    """Judge every member of one signal family (one vectorised test for all of them)."""
    spec = SIGNALS[family]
    margin = float(policy.max_regression[family])
    # The rollback bound sits on the "worse" side of the estimate, the promotion bound on the other.
    a_low, a_high = (
        (alpha_rollback, alpha_promote) if spec.higher_is_worse else (alpha_promote, alpha_rollback)
    )
    cmps = stats.compare_many(
        [i.baseline for i in insts],
        [i.canary for i in insts],
        scale=spec.scale,
        alpha_low=a_low,
        alpha_high=a_high,
        trim=policy.trim,
    )
    out: list[SignalResult] = []
    for inst, cmp in zip(insts, cmps, strict=True):
        if cmp is None:
            n_b = len(stats.finite(inst.baseline, positive=spec.scale == "log"))
            n_c = len(stats.finite(inst.canary, positive=spec.scale == "log"))
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
        if enough and worse_lcb > margin / 2 and worse_est > margin:
            verdict = "fail"
        elif enough and worse_ucb < margin:
            verdict = "pass"
        out.append(
            SignalResult(
                name=inst.name,
                baseline=cmp.baseline,
                canary=cmp.canary,
                delta=cmp.delta,
                ci_low=cmp.low,
                ci_high=cmp.high,
                p_value=cmp.p_greater if spec.higher_is_worse else cmp.p_less,
                n_baseline=cmp.n_baseline,
                n_canary=cmp.n_canary,
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


def _grown(
    b: Sequence[Mapping[str, float]], c: Sequence[Mapping[str, float]]
) -> dict[str, tuple[float, float]]:
    """name -> (growth canary - baseline, canary share) for every name that grew."""
    mb, mc = _mean_shares(b), _mean_shares(c)
    out = {}
    for k in set(mb) | set(mc):
        g = mc.get(k, 0.0) - mb.get(k, 0.0)
        if g > 0:
            out[k] = (g, mc.get(k, 0.0))
    return out


# Inclusive function shares nest: every caller of a function that grew grows at least as much. Among
# the functions whose growth is within this fraction of the largest, the smallest share (the deepest
# frame) is the one to name: "reconstruct_on_target_device", not "event_loop_overlap".
_NEAR_MAX_GROWTH = 0.8


def regressed_function(b: Sequence[Mapping[str, float]], c: Sequence[Mapping[str, float]]) -> str | None:
    """The function whose inclusive share grew most on the canary, preferring the deepest of near-ties."""
    grown = _grown(b, c)
    if not grown:
        return None
    top = max(g for g, _ in grown.values())
    near = [(share, -g, k) for k, (g, share) in grown.items() if g >= _NEAR_MAX_GROWTH * top]
    return min(near)[2]


def regressed_stage(b: Sequence[Mapping[str, float]], c: Sequence[Mapping[str, float]]) -> str | None:
    """The stage (idle excluded) whose share grew most on the canary; stages partition the loop."""
    grown = {k: v for k, v in _grown(b, c).items() if k != _NOT_A_REGRESSION_STAGE}
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
) -> Decision:
    """Judge the canary step that started at `started_at`, as of `now` (unix seconds)."""
    elapsed = now - started_at
    b = _side("baseline", baseline, policy, started_at, now)
    c = _side("canary", canary, policy, started_at, now)
    enough = len(b.units) >= policy.min_samples and len(c.units) >= policy.min_samples

    alpha = 1.0 - policy.confidence
    looks = stats.planned_looks(policy.max_duration_s, policy.interval_s)
    promote_looks = 1 + max(
        0, math.ceil((policy.max_duration_s - step_duration_s) / policy.interval_s - 1e-9)
    )
    by_family: dict[str, list[_Instance]] = defaultdict(list)
    for inst in _instances(policy, b.units, c.units):
        by_family[inst.family].append(inst)
    # Weighted Bonferroni: each gated family that has data gets an equal part of the rollback budget
    # per look, split evenly over its members (stages, functions), so loop latency keeps its power
    # however many functions are watched, and request signals nobody scrapes cost nothing (which
    # families have data depends on the sources, not on the values, so the bound still holds).
    # Promotion needs every signal to pass (an intersection-union test), so only the repeated
    # promotion looks divide its budget.
    families = max(1, sum(any(_has_values(i) for i in insts) for insts in by_family.values()))
    alpha_promote = stats.bonferroni(alpha, promote_looks)
    signals = tuple(
        result
        for family, insts in by_family.items()
        for result in _evaluate(
            family, insts, policy, stats.bonferroni(alpha, looks, families, len(insts)), alpha_promote, enough
        )
    )

    def attribution() -> tuple[str | None, str | None]:
        if not (b.units and c.units):
            return None, None
        return (
            regressed_function([u.function_shares for u in b.units], [u.function_shares for u in c.units]),
            regressed_stage([u.stage_shares for u in b.units], [u.stage_shares for u in c.units]),
        )

    failed = [s for s in signals if s.verdict == "fail"]
    if failed:
        # Evidence gathered while the canary ran stays evidence even if its profiler went stale since.
        worst = max(failed, key=_severity)
        fn, stage = attribution()
        msg = f"{_describe(worst)}"
        if stage or fn:
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


def _optional_absent(s: SignalResult) -> bool:
    return not SIGNALS[_family(s.name)].required and s.n_baseline == 0 and s.n_canary == 0


def _at_max_duration(
    policy: GatePolicy,
    signals: tuple[SignalResult, ...],
    why: str,
    *,
    data_missing: bool,
    attribution: Callable[[], tuple[str | None, str | None]],
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
        return Decision(
            "Inconclusive", reason, f"{prefix}; onInconclusive Promote refused without data, pausing", signals
        )
    return Decision("Inconclusive", reason, f"{prefix}; onInconclusive Pause", signals)
