"""Decision quality of the canary gate against Flagger- and Argo-style threshold rules, on the same windows.

Simulates profiler windows as the sidecars publish them (or replays recorded ones), runs the real
`vlm_operator.gate.decide` once per analysis interval, and judges the same data with:
- Flagger-style: each interval, canary loop p95 < a fixed threshold; rollback after N failed checks
  (a check with no data fails, as in Flagger); promote after the step's intervals;
- Argo-style failureLimit=0: the same per-interval measurement, the first failure rolls back; and an
  Argo variant whose query is the ratio canary p95 / stable p95 (the usual AnalysisTemplate trick).

What a "window" is here: the sidecar publishes one window per TP rank every `window_s` (10 s), so
an analysis interval (60 s) holds `windows_per_interval` (6) windows per pod and rank. "Detected
within 5 windows" in the issue is read as "within 5 analysis intervals" = 5 minutes, i.e. 30
windows of the single canary pod. The table also gives the rate at 2 windows per interval.

Noise model (per-window, multiplicative, from a 20 ms loop): a few % per window with Student-t(3)
tails, 2% of windows hit by a +20..60% spike (GC, a long prefill), a fixed offset per pod (node
CPU, traffic mix), TP ranks agreeing to 0.5%, and a load level shared by all pods that drifts
between intervals (what an absolute threshold cannot tell from a regression).

Run: python bench/gate_quality.py [--trials 200] [--json out/gate_quality.json] [--replay FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from vlm_operator.gate import GatePolicy, Window, decide

STAGE_BASE = {  # busy-loop time shares of an SGLang VLM scheduler, roughly the seed profile
    "recv_requests": 0.04,
    "process_input_requests": 0.13,
    "get_next_batch_to_run": 0.06,
    "run_batch": 0.55,
    "process_batch_result": 0.12,
    "idle": 0.05,
    "other": 0.05,
}
TRUE_FUNCTION = "reconstruct_on_target_device"
TRUE_STAGE = "process_input_requests"


@dataclass(frozen=True)
class Sim:
    base_loop_s: float = 0.020
    window_s: float = 10.0
    windows_per_interval: int = 6
    baseline_pods: int = 3
    canary_pods: int = 1
    tp: int = 2
    window_sd: float = 0.03  # per-window log-sd of the loop mean
    tail_df: float = 3.0
    spike_p: float = 0.02
    pod_sd: float = 0.005  # log-sd of the fixed per-pod offset (assumed; see the sensitivity rows)
    rank_sd: float = 0.005
    drift_sd: float = 0.01  # log-sd of the shared load step between intervals
    p95_ratio: float = 1.6
    share_conc: float = 3000.0  # Dirichlet concentration of per-window stage shares

    @property
    def interval_s(self) -> float:
        return self.window_s * self.windows_per_interval


def _heavy(rng: np.random.Generator, sim: Sim, size: int) -> np.ndarray:
    t = rng.standard_t(sim.tail_df, size) / math.sqrt(sim.tail_df / (sim.tail_df - 2))
    spikes = np.where(rng.random(size) < sim.spike_p, np.log(rng.uniform(1.2, 1.6, size)), 0.0)
    return sim.window_sd * t + spikes


def _shares(rng: np.random.Generator, sim: Sim, effect: float) -> tuple[dict, dict]:
    # A loop-latency regression of `effect` is extra time in input processing (the IPC-cache shape):
    # that stage and the reconstruct frame gain it, everything else is diluted by 1 + effect.
    extra = max(effect, 0.0)
    t = dict(STAGE_BASE)
    t[TRUE_STAGE] += extra
    total = sum(t.values())
    mean = np.array([v / total for v in t.values()])
    drawn = rng.dirichlet(mean * sim.share_conc)
    stages = {k: float(v) for k, v in zip(t, drawn, strict=True)}
    pi, noise = stages[TRUE_STAGE], rng.lognormal(0, 0.05, 6)
    base_pi = STAGE_BASE[TRUE_STAGE] / total
    functions = {
        "event_loop_overlap": 1.0 - stages["idle"],
        "process_input_requests": pi,
        "handle_generate_request": min(pi, 0.85 * base_pi * noise[0] + extra / total),
        TRUE_FUNCTION: min(pi, 0.02 * noise[1] / total + extra / total),
        "hash_feature": min(pi, 0.35 * base_pi * noise[2]),
        "run_batch": stages["run_batch"],
        "forward_batch_generation": 0.9 * stages["run_batch"] * min(1.0, noise[3]),
        "process_batch_result": stages["process_batch_result"],
        "stream_output": 0.5 * stages["process_batch_result"] * noise[4],
        "recv_requests": stages["recv_requests"],
        "recv_pyobj": 0.8 * stages["recv_requests"] * min(1.0, noise[5]),
    }
    return stages, functions


def simulate(rng: np.random.Generator, sim: Sim, effect: float, intervals: int, t0: float) -> list[dict]:
    """All sidecar windows of one trial: dicts as in /windows.json plus `revision` and `pod`."""
    n_win = intervals * sim.windows_per_interval
    load = np.cumsum(rng.normal(0, sim.drift_sd, intervals))
    out: list[dict] = []
    pods = [("stable", f"stable-{i}") for i in range(sim.baseline_pods)]
    pods += [("canary", f"canary-{i}") for i in range(sim.canary_pods)]
    for revision, pod in pods:
        offset = rng.normal(0, sim.pod_sd)
        eff = effect if revision == "canary" else 0.0
        noise = _heavy(rng, sim, n_win)
        for k in range(n_win):
            end = t0 + (k + 1) * sim.window_s
            level = offset + load[k // sim.windows_per_interval] + noise[k] + math.log1p(eff)
            stages, functions = _shares(rng, sim, eff)
            for rank in range(sim.tp):
                mean = sim.base_loop_s * math.exp(level + rng.normal(0, sim.rank_sd))
                out.append(
                    {
                        "revision": revision,
                        "pod": pod,
                        "id": str(k),
                        "tp_rank": rank,
                        "start": end - sim.window_s,
                        "end": end,
                        "samples": int(sim.window_s * 100),
                        "loop_mean_seconds": mean,
                        "loop_p50_seconds": mean * 0.95,
                        "loop_p95_seconds": mean * sim.p95_ratio * math.exp(rng.normal(0, 0.04)),
                        "iterations": int(sim.window_s / mean),
                        "stage_shares": stages,
                        "function_shares": functions,
                        "top_function": "forward_batch_generation",
                        "stale": False,
                        "error": None,
                    }
                )
    return out


def replay(
    rng: np.random.Generator,
    sim: Sim,
    recorded: dict[str, list[dict]],
    effect: float,
    intervals: int,
    t0: float,
) -> list[dict]:
    """Windows of one trial drawn from recorded pods: each simulated pod replays a random recorded pod
    from a random start (circularly), re-timed to the trial clock; the canary gets `effect` on its loop
    times and the matching extra input-processing share."""
    names = sorted(recorded)
    out: list[dict] = []
    pods = [("stable", f"stable-{i}") for i in range(sim.baseline_pods)]
    pods += [("canary", f"canary-{i}") for i in range(sim.canary_pods)]
    n_win = intervals * sim.windows_per_interval
    for revision, pod in pods:
        src = recorded[names[rng.integers(len(names))]]
        by_rank: dict[int, list[dict]] = {}
        for w in src:
            by_rank.setdefault(int(w.get("tp_rank", 0) or 0), []).append(w)
        start = int(rng.integers(max(len(v) for v in by_rank.values())))
        eff = effect if revision == "canary" else 0.0
        for rank, seq in by_rank.items():
            for k in range(n_win):
                w = dict(seq[(start + k) % len(seq)])
                w.update(revision=revision, pod=pod, id=str(k), tp_rank=rank, end=t0 + (k + 1) * sim.window_s)
                for key in ("loop_mean_seconds", "loop_p50_seconds", "loop_p95_seconds"):
                    if isinstance(w.get(key), int | float):
                        w[key] = w[key] * (1 + eff)
                if eff > 0 and isinstance(w.get("stage_shares"), dict):
                    st = {s: v / (1 + eff) for s, v in w["stage_shares"].items()}
                    st[TRUE_STAGE] = st.get(TRUE_STAGE, 0.0) + eff / (1 + eff)
                    w["stage_shares"] = st
                    fn = {f: v / (1 + eff) for f, v in (w.get("function_shares") or {}).items()}
                    fn[TRUE_FUNCTION] = fn.get(TRUE_FUNCTION, 0.0) + eff / (1 + eff)
                    w["function_shares"] = fn
                out.append(w)
    return out


# ---------------------------------------------------------------------------------------------
# Rules


@dataclass(frozen=True)
class Outcome:
    verdict: str  # Promote | Rollback | Inconclusive (ran out of time without either)
    interval: int  # 1-based interval at which it was decided
    reason: str = ""
    function: str | None = None
    stage: str | None = None
    names_culprit: bool = False  # only the gate names a function; threshold rules cannot


def run_gate(windows: list[dict], sim: Sim, policy: GatePolicy, step_intervals: int, t0: float) -> Outcome:
    parsed = [Window.from_sidecar(w["revision"], w["pod"], w) for w in windows]
    stable = [w for w in parsed if w.revision == "stable"]
    canary = [w for w in parsed if w.revision == "canary"]
    looks = round(policy.max_duration_s / sim.interval_s)
    for i in range(1, looks + 1):
        now = t0 + i * sim.interval_s
        d = decide(
            [w for w in stable if w.end <= now],
            [w for w in canary if w.end <= now],
            policy,
            started_at=t0,
            now=now,
            step_duration_s=step_intervals * sim.interval_s,
        )
        if d.verdict in ("Promote", "Rollback"):
            return Outcome(d.verdict, i, d.reason, d.regressed_function, d.regressed_stage, True)
    return Outcome("Inconclusive", looks, d.reason)


def _interval_p95(windows: list[dict], revision: str, i: int, sim: Sim, t0: float) -> float | None:
    lo, hi = t0 + (i - 1) * sim.interval_s, t0 + i * sim.interval_s
    vals = [
        w["loop_p95_seconds"]
        for w in windows
        if w["revision"] == revision and lo < w["end"] <= hi and w.get("loop_p95_seconds")
    ]
    return float(np.mean(vals)) if vals else None


def run_threshold(
    windows: list[dict], sim: Sim, step_intervals: int, t0: float, *, limit: float, failures: int, ratio: bool
) -> Outcome:
    """Flagger (failures=N) or Argo (failures=1, i.e. failureLimit=0) style, absolute or ratio query."""
    failed = 0
    for i in range(1, step_intervals + 1):
        c = _interval_p95(windows, "canary", i, sim, t0)
        b = _interval_p95(windows, "stable", i, sim, t0) if ratio else 1.0
        ok = c is not None and b is not None and c / b <= limit
        failed += 0 if ok else 1
        if failed >= failures:
            return Outcome("Rollback", i)
    return Outcome("Promote", step_intervals)


# ---------------------------------------------------------------------------------------------
# Experiment


def make_rules(sim: Sim, policy: GatePolicy, step: int, t0: float, *, flagger_n: int):
    nominal = sim.base_loop_s * sim.p95_ratio
    rules: dict[str, Callable[[list[dict]], Outcome]] = {
        f"gate (ours, margin {policy.max_regression['loop_latency']:.0%})": lambda w: run_gate(
            w, sim, policy, step, t0
        )
    }
    for pct in (0.05, 0.10):
        rules[f"Flagger p95<{1 + pct:.2f}x, {flagger_n} fails"] = lambda w, p=pct: run_threshold(
            w, sim, step, t0, limit=nominal * (1 + p), failures=flagger_n, ratio=False
        )
        rules[f"Argo p95<{1 + pct:.2f}x, failureLimit 0"] = lambda w, p=pct: run_threshold(
            w, sim, step, t0, limit=nominal * (1 + p), failures=1, ratio=False
        )
    rules["Argo p95 ratio<1.05, failureLimit 0"] = lambda w: run_threshold(
        w, sim, step, t0, limit=1.05, failures=1, ratio=True
    )
    return rules


def trial_windows(rng, sim, effect, intervals, t0, recorded):
    if recorded is not None:
        return replay(rng, sim, recorded, effect, intervals, t0)
    return simulate(rng, sim, effect, intervals, t0)


def _run_trials(args: tuple) -> dict[str, list[Outcome]]:
    """Worker: a chunk of trials of one effect, every rule on the same windows (picklable for the pool)."""
    sim, policy, step, effect, seed, trial_ids, recorded, only_gate, flagger_n = args
    t0 = 1_000_000.0
    intervals = round(policy.max_duration_s / sim.interval_s)
    rules = make_rules(sim, policy, step, t0, flagger_n=flagger_n)
    if only_gate:
        rules = {k: v for k, v in rules.items() if k.startswith("gate")}
    out: dict[str, list[Outcome]] = {k: [] for k in rules}
    for trial in trial_ids:
        # One generator per trial, the same for every effect: rules and effects see the same noise.
        rng = np.random.default_rng([seed, trial])
        windows = trial_windows(rng, sim, effect, intervals, t0, recorded)
        for name, rule in rules.items():
            out[name].append(rule(windows))
    return out


def evaluate(
    pool: Executor,
    sim: Sim,
    policy: GatePolicy,
    step: int,
    effects: Sequence[float],
    trials: int,
    seed: int,
    recorded,
    *,
    only_gate: bool = False,
    flagger_n: int = 2,
    jobs: int = 2,
) -> dict[float, list[Future]]:
    """Submit the trials of every effect to the pool, split into one chunk per worker."""
    chunks = [list(range(trials))[i::jobs] for i in range(jobs)]
    return {
        effect: [
            pool.submit(_run_trials, (sim, policy, step, effect, seed, ids, recorded, only_gate, flagger_n))
            for ids in chunks
        ]
        for effect in effects
    }


def collect(futures: dict[float, list[Future]], trials: int, step: int) -> dict:
    """For each effect: per rule, rollback rate (and how much of it came from maxDuration), rollback
    rate within `step` intervals, promote rate, median decision interval, and (gate only) how often
    a rollback named the function that really regressed."""
    result: dict = {}
    for effect, futs in futures.items():
        outcomes: dict[str, list[Outcome]] = {}
        for f in futs:
            for name, outs in f.result().items():
                outcomes.setdefault(name, []).extend(outs)
        per_rule = {}
        for name, outs in outcomes.items():
            rb = [o for o in outs if o.verdict == "Rollback"]
            timeout = [o for o in rb if o.reason == "MaxDurationReached"]
            named = [o for o in rb if o.names_culprit and o.reason != "MaxDurationReached"]
            per_rule[name] = {
                "rollback": len(rb) / trials,
                "rollback_on_timeout": len(timeout) / trials,
                "rollback_within_step": sum(o.interval <= step for o in rb) / trials,
                "promote": sum(o.verdict == "Promote" for o in outs) / trials,
                "median_interval": float(np.median([o.interval for o in outs])),
                "named_function": (sum(o.function == TRUE_FUNCTION for o in named) / len(named))
                if named
                else None,
                "named_stage": (sum(o.stage == TRUE_STAGE for o in named) / len(named)) if named else None,
            }
        result[f"{effect:+.0%}"] = per_rule
    return result


def _pct(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:5.1f}%"


def print_main(res: dict, step: int) -> None:
    names = list(next(iter(res.values())))
    head = f"{'rule':38s} {'A/A RB':>7s} {'(timeout)':>9s} {'A/A prom.':>9s} {'+2% RB':>7s}"
    big = [e for e in res if e not in ("+0%", "+2%")]
    for e in big:
        head += f" {e + ' RB<=' + str(step):>10s}"
    head += f" {'+5% med.':>8s} {'fn named':>8s}"
    print(head)
    print("-" * len(head))
    for n in names:
        aa = res["+0%"][n]
        row = f"{n:38s} {_pct(aa['rollback']):>7s} {_pct(aa['rollback_on_timeout']):>9s} {_pct(aa['promote']):>9s}"
        row += f" {_pct(res['+2%'][n]['rollback']) if '+2%' in res else '-':>7s}"
        for e in big:
            row += f" {_pct(res[e][n]['rollback_within_step']):>10s}"
        r5 = res.get("+5%", {}).get(n)
        row += f" {r5['median_interval'] if r5 else float('nan'):8.1f} {_pct(r5['named_function'] if r5 else None):>8s}"
        print(row)


def load_recorded(path: Path) -> dict[str, list[dict]]:
    """Recorded windows: a list of /windows.json entries each with a `pod` key, or {pod: [entries]}."""
    data = json.loads(path.read_text())
    pods: dict[str, list[dict]] = {}
    if isinstance(data, dict):
        for pod, entries in data.items():
            pods[str(pod)] = [e for e in entries if isinstance(e, dict)]
    else:
        for e in data:
            if isinstance(e, dict):
                pods.setdefault(str(e.get("pod", "pod")), []).append(e)
    for entries in pods.values():
        entries.sort(key=lambda e: (float(e.get("end") or 0), int(e.get("tp_rank") or 0)))
    if not pods:
        raise SystemExit(f"{path}: no windows")
    return pods


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seed", type=int, default=20260515)
    ap.add_argument("--margin", type=float, default=0.03, help="allowed loop-latency increase (fraction)")
    ap.add_argument("--json", type=Path, default=Path("out/gate_quality.json"))
    ap.add_argument("--replay", type=Path, help="recorded windows JSON instead of the simulator")
    ap.add_argument("--record", type=Path, help="write one simulated A/A trial's windows here and exit")
    ap.add_argument("--quick", action="store_true", help="main table only, no sensitivity sweeps")
    ap.add_argument("--sens-trials", type=int, default=100, help="trials per sensitivity row")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    args = ap.parse_args(argv)

    sim = Sim()
    step = 5
    policy = GatePolicy(
        max_regression={"loop_latency": args.margin, "stage_share": 0.05},
        confidence=0.95,
        min_samples=5,
        max_duration_s=15 * sim.interval_s,
        interval_s=sim.interval_s,
        stale_after_s=3 * sim.interval_s,
    )
    if args.record:
        rng = np.random.default_rng([args.seed, 99])
        windows = simulate(rng, sim, 0.0, 15, 1_000_000.0)
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(windows))
        print(f"wrote {len(windows)} windows to {args.record}")
        return 0
    recorded = load_recorded(args.replay) if args.replay else None

    t_start = time.perf_counter()
    report: dict = {
        "sim": asdict(sim),
        "policy": {**asdict(policy), "max_regression": dict(policy.max_regression)},
        "step_intervals": step,
        "trials": args.trials,
        "seed": args.seed,
        "source": str(args.replay) if args.replay else "simulated",
    }
    print(
        f"{args.trials} trials per row; interval {sim.interval_s:.0f}s = {sim.windows_per_interval} windows x "
        f"{sim.tp} TP ranks per pod; {sim.baseline_pods} stable pods, {sim.canary_pods} canary pod; "
        f"step {step} intervals, maxDuration {policy.max_duration_s / sim.interval_s:.0f} intervals; "
        f"source {report['source']}"
    )
    variants: dict[str, tuple[Sim, GatePolicy]] = {}
    if not args.quick and recorded is None:

        def at(v: Sim, pol: GatePolicy = policy) -> tuple[Sim, GatePolicy]:
            return v, replace(pol, max_duration_s=15 * v.interval_s, interval_s=v.interval_s)

        variants = {
            "pod offset sd 0%": at(replace(sim, pod_sd=0.0)),
            "pod offset sd 1%": at(replace(sim, pod_sd=0.01)),
            "pod offset sd 2%": at(replace(sim, pod_sd=0.02)),
            "pod offset sd 1%, 2 canary pods": at(replace(sim, pod_sd=0.01, canary_pods=2)),
            "2 windows/interval (30 s windows)": at(replace(sim, windows_per_interval=2, window_s=30.0)),
            "window noise sd 6%": at(replace(sim, window_sd=0.06)),
            "5 families gated, maxDuration 30 intervals": (
                sim,
                replace(
                    policy,
                    max_regression={
                        "loop_latency": 0.03,
                        "ttft": 0.10,
                        "itl": 0.10,
                        "throughput": 0.05,
                        "stage_share": 0.05,
                    },
                    max_duration_s=30 * sim.interval_s,
                ),
            ),
            "margin 5% (API default)": at(
                sim, replace(policy, max_regression={"loop_latency": 0.05, "stage_share": 0.05})
            ),
        }
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        # Submit everything first so both workers stay busy; results are collected in order.
        pending_main = evaluate(
            pool, sim, policy, step, [0.0, 0.02, 0.05, 0.10], args.trials, args.seed, recorded, jobs=args.jobs
        )
        pending_sens = {
            label: evaluate(
                pool,
                v,
                pol,
                step,
                [0.0, 0.05],
                args.sens_trials,
                args.seed,
                None,
                only_gate=True,
                jobs=args.jobs,
            )
            for label, (v, pol) in variants.items()
        }
        main_res = collect(pending_main, args.trials, step)
        sens = {label: collect(p, args.sens_trials, step) for label, p in pending_sens.items()}
    report["main"] = main_res
    print(
        "\nRB: rolled back at any time in the analysis (15 intervals), (timeout): of which by onInconclusive"
        " at maxDuration;\nRB<=5: rolled back within the 5-interval step; med.: median interval of the verdict."
    )
    print_main(main_res, step)
    if sens:
        print(f"\nSensitivity of the gate ({args.sens_trials} trials each):")
        for label, r in sens.items():
            g = next(iter(r["+0%"]))
            aa, r5 = r["+0%"][g], r["+5%"][g]
            print(
                f"  {label:36s} A/A RB {_pct(aa['rollback'])} (timeout {_pct(aa['rollback_on_timeout'])})"
                f"  A/A promote {_pct(aa['promote'])}   +5% RB<=5 {_pct(r5['rollback_within_step'])}"
            )
        report["sensitivity"] = {
            label: {e: next(iter(v.values())) for e, v in r.items()} for label, r in sens.items()
        }

    report["seconds"] = round(time.perf_counter() - t_start, 1)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(f"\n{report['seconds']}s; wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
