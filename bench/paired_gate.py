"""The gate on a whole node-paired rollout, with no extra GPU: what it decides, how often, and how fast.

Each trial simulates one rollout of an N-replica service at the shipped defaults (baseline Stable, the default
schedule 1, 2, 4, ... canary pods while a stable pod is left, each step analysed 5 minutes, maxDuration 30m,
a look every minute, 15 s telemetry windows, margin 3%, confidence 95%) and runs the operator's own gate
(`gate.decide`) at every look on the windows of that moment, evidence pooled over the steps.

The world, per window (log loop latency):
    effect (canary only) + node offset a_n (variance f s^2) + the pod's restart offset (variance (1 - f) s^2, new
    at every pod start) + host noise h_n(t) of the node in time + fleet drift g(t) + window noise e,
with the pod spread s at 2%, 5% or 8% (same-SKU GPUs differ by about 8% on average) and, in `heavy` rows, the
offsets drawn from a t distribution with 3 degrees of freedom (scaled to the same variance). Host noise is shared
by every pod on the node at that moment; "iid" rows have none, "autocorrelated" rows an AR(1) per node with
lag-one (15 s) correlation 0.6 and sd 3% per window, plus a fleet-wide AR(1) drift (sd 1%, 0.9): together with
the window noise, lag-one autocorrelation 0.45, as measured on a cloud GPU VM (0.41 at 15 s, 0.29 a minute apart).
Pods sit one per node and every node is full: each canary pod Replaces a stable pod on its node (the hard case;
a free GPU per node gives Concurrent pairs, the `surge` rows).

The gate never sees a true variance: it keeps its shipped prior (2%) and estimates the pod and restart spreads
from the stable pods and the rollout's own pairs, as on a service's first rollout.

Designs, on the same windows of each trial:
- gate: the shipped gate with the pods' layout (nodes, pairs, the stable pods' 5-minute pre-period);
- gate without layout: the same gate with every canary pod against the stable mean (Unpaired);
- judge: the judge endpoint's own code (`vlm_operator.judge.evaluate`: the request with the same steps, the pods
  by selector with their nodes and Ready times, `decide`) as Argo Rollouts or Flagger would call it each minute,
  on what it can read: the windows of the pods running at the look, from the sidecars (a stable pod the rollout
  replaced took its sidecar and its history with it), the running stable pods' 5-minute pre-period among them; no
  calibration (the judge keeps nothing between calls); its analysis clock from the canary pods' Ready times;
- competitors on the same windows, the same pods and the same schedule (each step its planned 5 minutes, looks
  every minute; none of them waits past it):
  - Kayenta: the canary's windows against the stable pods' since the rollout began, Mann-Whitney at 98% with its
    classifier; below the marginal score 75 at any look rolls back, the pass score 95 is needed at the step's end;
  - Argo Rollouts: per minute, the canary's mean over the last minute against the stable pods' over the same
    minute, a failure beyond 1 + margin, rolled back after failureLimit 2 (the third failure);
  - Flagger: the same per-minute check, rolled back after its threshold of 5 failed checks in a step;
  - OME-style per-step threshold: at each step's end, the canary's mean over the step against the stable pods'
    over the same time, rolled back beyond 1 + margin.
All rates are totals: a rollback for any reason (on evidence, or by onInconclusive at maxDuration) counts.
Warm-up: new pods run 5% slower in their first minute (the `warm-up` rows' world adds it; the gate leaves the
first minute after Ready out).

    python bench/paired_gate.py [--trials 200] [--jobs 2] [--out bench/results/paired_gate.md]

`PYTHONPATH=OLD/operator python bench/paired_gate.py ...` runs an older checkout's gate on the same worlds: the
pre-change numbers.
"""

from __future__ import annotations

import argparse
import inspect
import math
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gate_quality import kayenta_classify, kayenta_score, mann_whitney_hl  # bench/, this script's folder
from vlm_operator.analysis.gate import (
    Before,
    Calibration,
    GatePolicy,
    Layout,
    Window,
    covariates,
    decide,
    samples,
)
from vlm_operator.analysis.gate.paired import HISTORY_DF_CAP
from vlm_operator.analysis.tdist import t_ppf
from vlm_operator.api import v1alpha1 as api
from vlm_operator.judge import evaluate as judge

REPO = Path(__file__).resolve().parent.parent

WINDOW_S = 15.0
LOOK_S = 60.0
PRE_S = 300.0
LOOP = 0.02
STAGES = {"run_batch": 0.6, "process_input_requests": 0.2, "idle": 0.05, "other": 0.15}
FUNCS = {"event_loop_overlap": 0.95, "run_batch": 0.6, "process_input_requests": 0.2}


def shipped_policy(replicas: int) -> GatePolicy:
    spec = api.parse_spec({"model": {"path": "m"}, "replicas": replicas, "rollout": {}})
    return GatePolicy.from_spec(spec)


@dataclass(frozen=True)
class World:
    replicas: int
    f: float
    effect: float
    noise: str  # "iid" | "autocorrelated"
    surge: bool = False
    warmup: float = 0.0  # how much slower a new pod runs in its first minute
    spread: float = 0.02  # s: sd of per-pod offsets (log scale)
    heavy: bool = False  # offsets from a t distribution with 3 df (same variance)
    # Throughput rows (`--worlds throughput`): the traffic each pod gets against its capacity ("" : no throughput
    # telemetry; "saturated": 1.5x capacity, requests always waiting; "below": 0.7x, never; "mixed": 0.8-1.25x,
    # drawn per window), the canary's capacity change (a KV-cache shrink: fewer requests fit, the loop no slower)
    # and how much less traffic the router sends each canary pod than a stable one.
    load: str = ""
    capacity: float = 0.0
    router: float = 0.0
    # Covariate rows (`--worlds covariates`): the sd of each pod's request mix per window (log prompt tokens per
    # request; AR(1) 0.6 per pod, as mixes come in bursts), which moves loop latency by MIX_SLOPE per unit.
    mix: float = 0.0
    # `history` rows: a service's later rollout, its finished rollouts having measured the pod spread and the node's
    # share (status.calibration at the cap of HISTORY_DF_CAP degrees of freedom each, the true values).
    history: bool = False


@dataclass(frozen=True)
class Result:
    verdict: str  # Promoted | RolledBack (on evidence) | Inconclusive (onInconclusive rollback at maxDuration)
    step: int  # the step the rollout ended in (0-based); for Promoted the last
    pods: int  # canary pods running when it ended
    minutes: float = 0.0  # from the first step's start to the verdict
    by: str = ""  # what decided the last step: evidence | ceiling | timeout ("" for competitors)
    reason: str = ""  # the gate's reason for a rollback on evidence (e.g. ThroughputRegressed)
    cut: float | None = None  # the last look's loop-latency variance cut by the request mix (gate.covariates)


def _ar(rng: np.random.Generator, n: int, rho: float, sd: float) -> np.ndarray:
    x = np.empty(n)
    x[0] = rng.normal(0, sd)
    innov = sd * math.sqrt(1 - rho * rho)
    for i in range(1, n):
        x[i] = rho * x[i - 1] + rng.normal(0, innov)
    return x


def simulate(world: World, seed: int, designs: tuple[str, ...]) -> dict[str, Result]:
    rng = np.random.default_rng(seed)
    policy = shipped_policy(world.replicas)
    n = world.replicas
    steps = policy.step_pods
    horizon = PRE_S + len(steps) * policy.max_duration_s + 120  # every step may run to maxDuration
    ticks = int(horizon // WINDOW_S) + 1
    nodes = [f"node-{i}" for i in range(n)]
    S = world.spread

    def offsets(sd: float, k: int) -> np.ndarray:
        if not world.heavy:
            return rng.normal(0, sd, k)
        return rng.standard_t(3, k) * sd / math.sqrt(3.0)  # t(3) has variance 3

    a = offsets(math.sqrt(world.f) * S, n)
    if world.noise == "autocorrelated":
        host = np.stack([_ar(rng, ticks, 0.6, 0.03) for _ in range(n)])
        drift = _ar(rng, ticks, 0.9, 0.01)
    else:
        host = np.zeros((n, ticks))
        drift = np.zeros(ticks)
    restart_sd = math.sqrt(1 - world.f) * S
    stable_r = offsets(restart_sd, n)
    canary_r = offsets(restart_sd, n)
    eps = rng.normal(0, 0.02, (2, n, ticks))
    mixes = np.stack([np.stack([_ar(rng, ticks, 0.6, world.mix) for _ in range(n)]) for _ in range(2)]) \
        if world.mix else None
    t0 = PRE_S  # the first step starts here (pre-period before it)

    def value(node: int, canary: bool, k: int) -> float:
        r = canary_r[node] if canary else stable_r[node]
        cs = canary_start.get(node)
        warm = world.warmup if canary and cs is not None and (k + 1) * WINDOW_S <= cs + 60 + WINDOW_S else 0.0
        mix = MIX_SLOPE * mixes[int(canary), node, k] if mixes is not None else 0.0
        return LOOP * math.exp((world.effect if canary else 0.0) + a[node] + r + host[node, k] + drift[k]
                               + eps[int(canary), node, k] + warm + mix)

    # Throughput (the `load` rows): the pod's capacity follows its speed (the same offsets and noise as its loop
    # latency) and the canary's capacity change; its traffic is the router's share times the load level, with
    # 10% of noise per window. Served: the smaller of the two (2% counter noise); requests wait when traffic
    # exceeds capacity.
    level = {"saturated": (1.5, 1.5), "below": (0.7, 0.7), "mixed": (0.8, 1.25)}.get(world.load)
    if level is not None:
        traffic = np.exp(rng.normal(0, 0.10, (2, n, ticks))) * rng.uniform(*level, (1, 1, ticks))
        tnoise = rng.normal(0, 0.02, (2, n, ticks))

    def win(rev: str, pod: str, k: int, v: float) -> Window:
        tput = queued = None
        if level is not None:
            c, node = rev == "canary", int(pod.rsplit("-", 1)[1])
            cap = TOKENS_S * LOOP / v * math.exp(-world.capacity if c else 0.0)  # a slower loop serves less too
            got = TOKENS_S * traffic[int(c), node, k] * (1 - world.router if c else 1.0)
            # saturated: a backlog of several seconds of arrivals (10 requests/s) at the window's edges
            tput, queued = min(cap, got) * math.exp(tnoise[int(c), node, k]), 50.0 if got > cap else 0.0
        prompt = None
        if mixes is not None:
            prompt = 800.0 * math.exp(mixes[int(rev == "canary"), int(pod.rsplit("-", 1)[1]), k])
        return Window(revision=rev, pod=pod, id=str(k), end=(k + 1) * WINDOW_S, samples=500,
                      loop_mean_seconds=v, loop_p95_seconds=v * 1.5, stage_shares=STAGES, function_shares=FUNCS,
                      iterations=400, throughput=tput, queued_requests=queued, prompt_tokens_per_request=prompt,
                      request_rate=10.0 if level is not None else None)

    # canary pod i replaces the stable pod on node i when its step starts (pods start in order 0, 1, 2, ...);
    # the steps start when the design moves on (planned: after each step's analysis time)
    planned: list[float] = []
    t = t0
    for j, d in enumerate(policy.step_durations_s):
        planned.append(t)
        if j < len(steps) - 1:
            t += d
    canary_start: dict[int, float] = {}

    def place(step: int, at: float) -> None:
        for i in range(steps[step]):
            canary_start.setdefault(i, at)

    def windows_at(now: float, step: int) -> tuple[list[Window], list[Window]]:
        base, can = [], []
        for i in range(n):
            cs = canary_start.get(i) if i < steps[step] else None
            for k in range(int(now // WINDOW_S)):
                end = (k + 1) * WINDOW_S
                if end > now:
                    break
                if cs is None or end <= cs or (world.surge and end > cs):
                    base.append(win("stable", f"stable-{i}", k, value(i, False, k)))
                if cs is not None and end > cs + WINDOW_S:  # its first window is start-up
                    can.append(win("canary", f"canary-{i}", k, value(i, True, k)))
        return base, can

    pre_k = [k for k in range(int(t0 // WINDOW_S)) if (k + 1) * WINDOW_S > t0 - PRE_S]
    before = {f"stable-{i}": Before(f"stable-{i}", nodes[i], float(np.mean([math.log(value(i, False, k)) for k in pre_k])),
                                    len(pre_k)) for i in range(n)}
    replaced = {f"canary-{i}": f"stable-{i}" for i in range(n)}

    def running(now: float, step: int) -> dict[str, str]:
        """Pod -> node of the pods running at `now` (a replaced stable pod is gone; with surge it stays)."""
        out = {}
        for i in range(n):
            cs = canary_start.get(i) if i < steps[step] else None
            if cs is None or world.surge:
                out[f"stable-{i}"] = nodes[i]
            if cs is not None:
                out[f"canary-{i}"] = nodes[i]
        return out
    calibration = Calibration()
    if world.history:
        df = HISTORY_DF_CAP
        calibration = Calibration(S * S * df, df, (1 - world.f) * S * S * df, df)
    out: dict[str, Result] = {}
    for name in designs:
        if name == COVERAGE:
            continue
        pairs = name in ("gate", RAW_THROUGHPUT)
        # The gate as it compared throughput before: over every window, saturated or not.
        samples.SCALAR_FIELDS["throughput"] = "throughput" if name == RAW_THROUGHPUT else SATURATED
        # The gate without the request mix as a covariate.
        covariates.fit = _no_covariate if name == NO_COVARIATES else FIT
        result = None
        canary_start.clear()
        start = t0
        for j in range(len(steps)):
            place(j, start)
            analysis = policy.step_durations_s[j]
            e = LOOK_S
            while True:
                now = start + e
                base, can = windows_at(now, j)
                ready = {f"canary-{i}": canary_start[i] + WINDOW_S for i in range(steps[j])}
                if name == JUDGE:
                    d = judge_look(policy, n, running(now, j), ready, base, can, j, now)
                else:
                    layout = Layout(running(now, j), replaced, before, ready) if pairs else Layout(started=ready)
                    d = decide(base, can, policy, started_at=start, now=now, step_duration_s=analysis,
                               data_started_at=start, step=j, evidence_since=t0, layout=layout,
                               calibration=calibration, **OLD_GATE_ARGS)
                mins = (now - t0) / 60
                by = getattr(d, "decided_by", None) or ("timeout" if d.reason == "MaxDurationReached" else "evidence")
                if d.verdict == "Rollback":
                    kind = "RolledBack" if d.reason != "MaxDurationReached" else "Inconclusive"
                    result = Result(kind, j, steps[j], mins, by, d.reason, _cut(d))
                    break
                if d.verdict == "Promote":
                    if j == len(steps) - 1:
                        result = Result("Promoted", j, steps[j], mins, by, cut=_cut(d))
                    start = now
                    break
                if d.verdict == "Pause":
                    result = Result("Inconclusive", j, steps[j], mins, "timeout")
                    break
                e += LOOK_S
            if result is not None:
                break
        out[name] = result
    samples.SCALAR_FIELDS["throughput"] = SATURATED
    covariates.fit = FIT
    canary_start.clear()
    for j, at in enumerate(planned):
        place(j, at)
    if COVERAGE in designs:  # the estimate's interval at the end of each planned step, every step run
        for j, start in enumerate(planned):
            now = start + policy.step_durations_s[j]
            base, can = windows_at(now, j)
            ready = {f"canary-{i}": canary_start[i] + WINDOW_S for i in range(steps[j])}
            d = decide(base, can, policy, started_at=start, now=now, step_duration_s=policy.step_durations_s[j],
                       data_started_at=start, step=j, evidence_since=t0,
                       layout=Layout(running(now, j), replaced, before, ready), calibration=calibration)
            s = next(x for x in d.signals if x.name == "loop_latency")
            if s.se is None or s.delta is None:
                out[f"{COVERAGE} {j}"] = Result("Missed", j, steps[j])
                continue
            half = float(t_ppf(0.975, max(1.0, min(s.df or 1e6, 1e6)))) * s.se
            out[f"{COVERAGE} {j}"] = Result("Covered" if abs(math.log1p(s.delta) - world.effect) <= half else "Missed",
                                            j, steps[j])
        return out
    for name in COMPETITORS if not world.load else ():  # they judge loop latency; the rows are about throughput
        out[name] = competitor(name, policy, planned, steps, windows_at, t0)
    return out


def judge_request(policy: GatePolicy, replicas: int, step: int) -> judge.JudgeRequest:
    """What Argo Rollouts or Flagger sends for this step: the shipped analysis and the same step schedule."""
    spec = api.parse_spec({"model": {"path": "m"}, "replicas": replicas, "rollout": {}})
    steps = [s.model_dump(by_alias=True) for s in spec.rollout.schedule(replicas)]  # type: ignore[union-attr]
    req = judge.JudgeRequest.model_validate({"namespace": "bench", "baseline": "rev=stable", "canary": "rev=canary",
                                             "steps": steps, "step": step})
    assert req.policy() == policy, "the judge's policy differs from the VLMService's at the same steps"
    return req


def judge_look(policy: GatePolicy, replicas: int, running: dict[str, str], ready: dict[str, float], base: list[Window],
               can: list[Window], step: int, now: float):
    """One look of the judge: the pods listed now (node, Ready time), the windows their sidecars still serve."""
    req = _JUDGE_REQ.get((replicas, step))
    if req is None:
        req = _JUDGE_REQ[(replicas, step)] = judge_request(policy, replicas, step)
    pods = [judge.PodRef(p, judge.CANARY if p.startswith("canary") else judge.BASELINE, None, node, True,
                         ready.get(p)) for p, node in running.items()]
    windows = [replace(w, revision=judge.BASELINE) for w in base if w.pod in running] + can
    return judge.decide(req, windows, pods, now=now)


_JUDGE_REQ: dict[tuple, judge.JudgeRequest] = {}


def competitor(name: str, policy: GatePolicy, starts: list[float], steps: tuple[int, ...], windows_at, t0: float
               ) -> Result:
    margin = policy.max_regression["loop_latency"]
    for j, start in enumerate(starts):
        looks = int(policy.step_durations_s[j] // LOOK_S)
        failures = 0
        score = 100.0
        for i in range(1, looks + 1):
            now = start + i * LOOK_S
            mins = (now - t0) / 60
            base, can = windows_at(now, j)
            if name == "Kayenta":
                x = np.array([w.loop_mean_seconds for w in can if w.end > t0])
                y = np.array([w.loop_mean_seconds for w in base if w.end > t0])
                score = kayenta_score([kayenta_classify(*mann_whitney_hl(x, y, 0.98), allowed_increase=1 + margin)])
                if score < 75.0:
                    return Result("RolledBack", j, steps[j], mins)
            elif name in ("Argo", "Flagger"):
                x = [w.loop_mean_seconds for w in can if w.end > now - LOOK_S]
                y = [w.loop_mean_seconds for w in base if w.end > now - LOOK_S]
                if not x or not y or np.mean(x) / np.mean(y) > 1 + margin:
                    failures += 1
                    if failures > (2 if name == "Argo" else 4):
                        return Result("RolledBack", j, steps[j], mins)
            elif i == looks:  # OME-style: one check at the step's end over the step
                x = [w.loop_mean_seconds for w in can if w.end > start]
                y = [w.loop_mean_seconds for w in base if w.end > start]
                if not x or not y or np.mean(x) / np.mean(y) > 1 + margin:
                    return Result("RolledBack", j, steps[j], mins)
        if name == "Kayenta" and score < 95.0:
            return Result("RolledBack", j, steps[j], (start + looks * LOOK_S - t0) / 60)
    return Result("Promoted", len(starts) - 1, steps[-1], (starts[-1] + policy.step_durations_s[-1] - t0) / 60)


RAW_THROUGHPUT = "gate, raw throughput"
COVERAGE = "coverage"  # --worlds coverage: the gate's 95% interval for loop latency at the end of each step
NO_COVARIATES = "gate without covariates"
COVARIATE_GATES = ("gate", NO_COVARIATES)
MIX_SLOPE = 0.3  # loop latency ~ (prompt tokens per request) ^ 0.3
FIT = covariates.fit


def _no_covariate(*_a, **_k) -> None:
    return None


def _cut(d) -> float | None:
    return next((s.covariate_cut for s in d.signals if s.name == "loop_latency"), None)


JUDGE = "judge"
GATES = ("gate", "gate without layout", JUDGE)
THROUGHPUT_GATES = ("gate", RAW_THROUGHPUT)
COMPETITORS = ("Kayenta", "Argo", "Flagger", "OME")
DESIGNS = (*GATES, RAW_THROUGHPUT, NO_COVARIATES, *COMPETITORS)
TOKENS_S = 1000.0  # a pod's capacity at the fleet's mean speed, generated tokens per second
SATURATED = samples.SCALAR_FIELDS["throughput"]
# The gate of an older checkout (PYTHONPATH) took the analysis time of the passed steps; this one needs none.
OLD_GATE_ARGS: dict = {}


def _chunk(args: tuple) -> list[dict[str, Result]]:
    world, seeds, gates = args
    return [simulate(world, s, gates) for s in seeds]


def run(worlds: list[World], trials: int, jobs: int, seed: int, gates: tuple[str, ...] = GATES
        ) -> dict[World, list[dict[str, Result]]]:
    tasks = []
    for wi, w in enumerate(worlds):
        seeds = [seed * 1_000_003 + wi * 10_007 + i for i in range(trials)]
        per = max(1, trials // max(1, jobs))
        tasks += [(w, seeds[i:i + per], gates) for i in range(0, trials, per)]
    results: dict[World, list[dict[str, Result]]] = {w: [] for w in worlds}
    if jobs <= 1:
        for t in tasks:
            results[t[0]] += _chunk(t)
    else:
        with ProcessPoolExecutor(jobs) as ex:
            for t, r in zip(tasks, ex.map(_chunk, tasks), strict=True):
                results[t[0]] += r
    return results


def rate(xs: list[bool]) -> str:
    return f"{100 * sum(xs) / len(xs):.1f}%" if xs else "n/a"


def row(w: World, d: str, got: list[Result]) -> dict[str, str]:
    """One table row's numbers (totals)."""
    rolled = [g.verdict != "Promoted" for g in got]
    return {
        "rolled back": rate(rolled),
        "on evidence": rate([g.verdict == "RolledBack" for g in got]),
        "promoted": rate([g.verdict == "Promoted" for g in got]),
        "early": rate([g.verdict != "Promoted" and g.pods < w.replicas / 2 for g in got]),
        "step 1": rate([g.verdict != "Promoted" and g.step == 0 for g in got]),
        "by the clock": rate([g.by == "timeout" for g in got]),
        "median min": f"{statistics.median(g.minutes for g in got):.0f}",
        "on throughput": rate([g.reason == "ThroughputRegressed" for g in got]),
        "variance cut": _median_cut(got),
    }


def _median_cut(got: list[Result]) -> str:
    """The median over rollouts of the last look's cut (a rollout where the covariate was left out counts as 0);
    "-" for a design that never uses it."""
    if all(g.cut is None for g in got):
        return "-"
    cuts = sorted(g.cut if g.cut is not None else 0.0 for g in got)
    return f"{cuts[len(cuts) // 2]:.0%}"


def coverage_markdown(results: dict[World, list[dict[str, Result]]], trials: int, seconds: float) -> str:
    lines = [
        "# The gate's interval for loop latency: coverage (bench/paired_gate.py --worlds coverage)",
        "",
        f"{trials} rollouts per row, every step run its planned 5 minutes; at each step's end, the gate's pooled "
        "estimate (pods as pods, the pod spread in its variance, the windows' dependence widened for) +- t_0.975 "
        f"standard errors against the true effect. Shipped defaults, a first rollout. Ran in {seconds:.0f} s.",
        "",
        "| spread | f | noise | effect | canary pods | covered (nominal 95%) |",
        "|---|---|---|---|---|---|",
    ]
    for w, rs in results.items():
        for key in sorted({k for r in rs for k in r if k.startswith(COVERAGE)}):
            got = [r[key] for r in rs if key in r]
            lines.append(f"| {w.spread:.0%} | {w.f} | {w.noise} | {w.effect:+.0%} | {got[0].pods} | "
                         f"{rate([g.verdict == 'Covered' for g in got])} |")
    return "\n".join(lines) + "\n"


def markdown(results: dict[World, list[dict[str, Result]]], trials: int, seconds: float, label: str) -> str:
    cols: tuple[str, ...] = ("rolled back", "on evidence", "promoted", "early", "step 1", "by the clock", "median min")
    if any(w.load for w in results):
        cols += ("on throughput",)
    if any(w.mix for w in results):
        cols += ("variance cut",)
    lines = [
        f"# The gate on node-paired rollouts (bench/paired_gate.py){label}",
        "",
        f"{trials} rollouts per row; shipped defaults (margin 3%, confidence 95%, default schedule, 5m steps, "
        f"maxDuration 30m, looks every minute); a service's first rollout (no calibration, the gate estimates every "
        f"variance); one pod per node, every canary pod replacing the stable pod of its node (`surge`: next to it). "
        f"Ran in {seconds:.0f} s.",
        "",
        "Rolled back: for any reason (on evidence, or by onInconclusive Rollback at maxDuration); on evidence: a "
        "signal confidently beyond half its margin and estimated beyond it; early: rolled back before half the "
        "replicas ran the canary; step 1: in the first step (one canary pod); by the clock: the last verdict was "
        "maxDuration's; median min: from the first step's start to the verdict.",
        "",
        "| replicas | spread | f | noise | effect | design | " + " | ".join(cols) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(cols),
    ]
    for w, rs in results.items():
        for d in DESIGNS:
            got = [r[d] for r in rs if d in r]
            if not got:
                continue
            noise = w.noise + (", surge" if w.surge else "") + (f", warm-up +{w.warmup:.0%}" if w.warmup else "")
            noise += ", heavy tails" if w.heavy else ""
            if w.history:
                noise += ", a later rollout (spread and f known from history)"
            if w.mix:
                noise += f", request mix sd {w.mix:.0%} per window"
            if w.load:
                noise += (f", traffic {w.load}, canary capacity {-w.capacity or 0.0:+.0%}, canary traffic per "
                          f"pod {-w.router or 0.0:+.0%}")
            nums = row(w, d, got)
            lines.append(f"| {w.replicas} | {w.spread:.0%} | {w.f} | {noise} | {w.effect:+.0%} | {d} | "
                         + " | ".join(nums[c] for c in cols) + " |")
    return "\n".join(lines) + "\n"


def worlds_for(which: str) -> list[World]:
    if which == "quick":
        return [World(8, 0.8, e, "iid") for e in (0.0, 0.10)]
    grid = [(s, f) for s in (0.02, 0.05, 0.08) for f in (0.0, 0.5, 0.8, 1.0)]
    if which == "core":  # the rows whose targets are rates of 1-5%: unchanged and +5%, every spread and f
        return [World(8, f, e, "autocorrelated", spread=s) for s, f in grid for e in (0.0, 0.05)]
    if which == "rest":  # the other effects of the targets' grid, and heavy-tailed offsets at 8%
        out = [World(8, f, e, "autocorrelated", spread=s) for s, f in grid for e in (-0.05, 0.03, 0.10)]
        out += [World(8, f, e, "autocorrelated", spread=0.08, heavy=True) for f in (0.5, 0.8) for e in (0.0, 0.05)]
        return out
    if which == "throughput":  # throughput per pod: router imbalance against a capacity change, by load level
        return [World(8, 0.5, 0.0, "autocorrelated", load=load, capacity=cap, router=router)
                for load, cap, router in (("below", 0.0, 0.10), ("mixed", 0.0, 0.10), ("saturated", 0.0, 0.10),
                                          ("mixed", 0.0, 0.0), ("saturated", 0.10, 0.0), ("mixed", 0.10, 0.0),
                                          ("mixed", 0.10, 0.10), ("below", 0.10, 0.0))]
    if which == "coverage":  # the interval under autocorrelated noise, at each step's end
        return [World(8, f, e, "autocorrelated", spread=s) for s in (0.02, 0.05, 0.08) for f in (0.0, 0.5, 0.8)
                for e in (0.0, 0.05)]
    if which == "judge":  # the judge beside the VLMService gate: the core rows' corners, full nodes and surge pairs
        out = [World(8, f, e, "autocorrelated", spread=s) for s in (0.02, 0.08) for f in (0.5, 0.8) for e in (0.0, 0.05)]
        return out + [World(8, f, e, "autocorrelated", surge=True) for f in (0.5, 0.8) for e in (0.0, 0.05)]
    if which == "history":  # a later rollout: what the first rollout's targets need, known from history
        return [World(8, f, e, "autocorrelated", history=True) for f in (0.5, 0.8) for e in (0.0, 0.05)]
    if which == "covariates":  # the request mix as a covariate: with and without, A/A and +5%, f 0.5 and 0.8
        return [World(8, f, e, "autocorrelated", mix=0.1) for f in (0.5, 0.8) for e in (0.0, 0.05)]
    if which == "before":  # the pre-change gate's corner of the grid (it runs ~5x slower)
        return [World(8, f, e, "autocorrelated", spread=s) for s in (0.02, 0.08) for f in (0.0, 0.8)
                for e in (0.0, 0.05, 0.10)]
    out = [World(8, f, e, noise) for noise in ("iid", "autocorrelated") for f in (0.0, 0.5, 0.8)
           for e in (0.0, 0.05, 0.10, -0.05)]
    out += [World(8, 0.5, e, "autocorrelated", surge=True) for e in (0.0, 0.05)]
    out += [World(r, 0.8, e, "iid") for r in (2, 4) for e in (0.0, 0.05)]
    out += [World(8, 0.5, e, "autocorrelated", warmup=0.05) for e in (0.0, 0.05)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "paired_gate.md")
    ap.add_argument("--worlds", choices=("quick", "core", "rest", "before", "classic", "throughput", "covariates", "history", "coverage", "judge"), default="core")
    ap.add_argument("--gates", default="", help="which of the gate designs to run (comma-separated; default "
                    f"{','.join(GATES)}, with --worlds throughput {','.join(THROUGHPUT_GATES)})")
    ap.add_argument("--quick", action="store_true", help="--worlds quick")
    ap.add_argument("--label", default="", help="appended to the report's title")
    ap.add_argument("--effects", default="", help="keep only rows of these effects, percent, comma-separated "
                    "(e.g. 0: the unchanged rows, which claim rates of 1-5%% and so need the most rollouts)")
    ap.add_argument("--spreads", default="", help="keep only rows of these pod spreads, percent (e.g. 2)")
    ap.add_argument("--fs", default="", help="keep only rows of these node shares f (e.g. 0.5,0.8,1)")
    args = ap.parse_args(argv)
    worlds = worlds_for("quick" if args.quick else args.worlds)
    if args.spreads:
        worlds = [w for w in worlds if round(w.spread * 100, 6) in {round(float(x), 6) for x in args.spreads.split(",")}]
    if args.fs:
        worlds = [w for w in worlds if round(w.f, 6) in {round(float(x), 6) for x in args.fs.split(",")}]
    if args.effects:
        keep = {round(float(e) / 100, 6) for e in args.effects.split(",")}
        worlds = [w for w in worlds if round(w.effect, 6) in keep]
    if not worlds:
        ap.error(f"--effects/--spreads/--fs: no row of --worlds {args.worlds} has those")
    t = time.time()
    gates = tuple(g for g in args.gates.split(",") if g) or {"throughput": THROUGHPUT_GATES, "coverage": (COVERAGE,),
                                                            "covariates": COVARIATE_GATES, "judge": ("gate", JUDGE)}.get(args.worlds, GATES)
    res = run(worlds, args.trials, args.jobs, args.seed, gates)
    text = (coverage_markdown(res, args.trials, time.time() - t) if gates == (COVERAGE,)
            else markdown(res, args.trials, time.time() - t, args.label))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if "analysed_before_s" in inspect.signature(decide).parameters:  # an older gate (PYTHONPATH): its own clock
    OLD_GATE_ARGS["analysed_before_s"] = None


if __name__ == "__main__":
    raise SystemExit(main())
