"""What the profiler sidecar costs the SGLang scheduler: stand-in loop throughput with and without it.

Modes, interleaved round by round in one run (so drift and neighbours hit all modes alike):
  none         no profiler
  nonblocking  one sidecar window at the default rate (`py-spy record --nonblocking`, what the sidecar runs),
               then the sidecar's own parse + estimate on the output
  blocking     the same window in py-spy's default mode, which pauses the target for every sample

The stand-in runs with `--standin-cost-model work` (a fixed amount of CPU work per stage), so a paused or
slowed scheduler shows up as fewer loop iterations per second. Each segment lasts one window.
The in-window loss applies only while a window runs; at the defaults (a window of DURATION every INTERVAL)
the time-averaged loss is in-window loss x DURATION / INTERVAL, also reported.

Part two, the cost at the operator's default cadence on a realistic target: the stand-in has `--threads`
idle threads (SGLang's scheduler has ~60; py-spy walks every thread on every sample) and the 0.5.23 loop
shape (ingest_requests, two decorator frames per stage), every iteration the same decode step. Rounds alternate "off" (no profiler) and "on" (the real `vlm-sidecar` process with
the operator's telemetry defaults, interval/duration/rate from operator/vlm_operator/api/v1alpha1.py, scraping the
stand-in's /metrics too) for `--cadence-cycles` intervals each. Reported per on-period, against the
off-periods of the same run: loop throughput loss averaged over whole intervals (so no duty-cycle
arithmetic), the sidecar's average CPU in cores (its own plus py-spy's, from /proc), its RSS (own plus
py-spy's, sampled every 0.25 s: mean and max) and the sample rate py-spy achieved.

    python bench/sidecar_overhead.py [--rounds 5] [--cadence-rounds 3] [--threads 60] [--json out/sidecar_overhead.json]

`--frontend`: the stand-in also runs its front end (testing/vlm_testing/standin/frontend.py: the main process's asyncio loop,
`--standin-cpu-workers` pool workers, the detokenizer; requests come through its HTTP server), and the cadence
part interleaves three kinds of period: off, the sidecar sampling the schedulers only (VLM_FRONTEND_ROLES=""),
and the sidecar sampling every role (its defaults): the front end's share of the sidecar's cost is the
difference. Without it the sidecar samples the schedulers only, as before the front-end roles existed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from vlm_sidecar.config import DEFAULT_DURATION_S, DEFAULT_RATE_HZ
from vlm_sidecar.estimators import summarize
from vlm_sidecar.parser import parse_chrometrace

ROOT = Path(__file__).resolve().parents[1]
from vlm_sidecar.sampler import PySpySampler, supports_main_thread  # noqa: E402

MODES = ("none", "nonblocking", "blocking")


def default_pyspy() -> str | None:
    """The py-spy the sidecar image ships (built by hack/build-binaries.sh), when it was built here."""
    out = subprocess.run(["bash", str(ROOT / "hack" / "build-binaries.sh"), "--print-pyspy-dir"],
                         capture_output=True, text=True, check=False).stdout.strip()
    path = Path(out) / "py-spy" if out else None
    return str(path) if path and os.access(path, os.X_OK) else None


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accounting(port: int, start: float, end: float) -> dict:
    url = f"http://127.0.0.1:{port}/standin/accounting?start={start}&end={end}"
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())["ranks"][0]


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_segment(mode: str, pid: int, port: int, duration: float, rate: int, pyspy: str | None = None) -> dict:
    c0, s0 = children_cpu(), self_cpu()
    start = time.time()
    samples = None
    if mode == "none":
        time.sleep(duration)
    else:
        sampler = PySpySampler(pyspy, rate, duration, blocking=(mode == "blocking"))
        out = sampler.record(pid)
        if out.output:
            summarize(parse_chrometrace(out.output), window_id=1, tp_rank=0, pid=pid, start=out.started,
                      end=out.ended, samples=out.samples, watch=(), top_n=10)
        samples = out.samples
    end = time.time()
    time.sleep(0.2)  # let the stand-in's 50 ms accounting snapshots cover the end of the segment
    acc = accounting(port, start + 0.15, end)  # skip py-spy's attach time
    return {"mode": mode, "start": start, "end": end, "iterations": acc["iterations"],
            "loop_seconds": acc["loop_seconds"], "iter_per_s": acc["iterations"] / max(acc["end"] - acc["start"], 1e-9),
            "pyspy_cpu_s": children_cpu() - c0, "sidecar_cpu_s": self_cpu() - s0, "samples": samples,
            "wall_s": end - start}


def operator_defaults() -> tuple[float, float, int]:
    """(interval s, duration s, rate Hz) of the operator's TelemetrySpec defaults (pydantic, if importable)."""
    try:
        from vlm_operator.api.units import parse_duration
        from vlm_operator.api.v1alpha1 import TelemetrySpec

        t = TelemetrySpec()
        return float(parse_duration(t.interval)), float(parse_duration(t.duration)), int(t.rate)
    except Exception as e:  # report and fall back to the documented defaults
        print(f"operator defaults not importable ({e}); using 15s/5s/1000Hz", file=sys.stderr)
        return 15.0, 5.0, 1000


def proc_cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of a process (children count once reaped: py-spy is)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[str]:
    """The command lines of a process's direct children (any thread's), for a diagnosis."""
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                for c in f.read().split():
                    try:
                        with open(f"/proc/{c}/cmdline", "rb") as g:
                            out.append(g.read().replace(b"\0", b" ").decode(errors="replace").strip())
                    except OSError:
                        continue
    except OSError:
        pass
    return out


def tree_rss_bytes(pid: int) -> int:
    """RSS of a process plus its direct children (the sidecar and its py-spy, started from a pool thread:
    /proc lists a child under the thread that forked it)."""
    total = 0
    pids = [pid]
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                pids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def cadence_period(on: bool, standin_pid: int, port: int, seconds: float, interval: float, duration: float,
                   rate: int, threads: int, frontend: bool = False, pyspy: str | None = None,
                   label: str | None = None) -> dict:
    """One period with (on) or without the real sidecar; loop rate from the stand-in's accounting. `frontend`:
    the sidecar samples the front-end roles too (else VLM_FRONTEND_ROLES=""). `pyspy`: the py-spy binary the
    sidecar runs (VLM_PYSPY); `label`: the period's mode name instead of on / on+frontend."""
    side = None
    cpu0 = 0.0
    rss: list[int] = []
    windows: list[dict] = []
    if on:
        sport = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VLM_", "SGLANG_"))}
        env.update(VLM_SIDECAR_PORT=str(sport), VLM_PROFILE_INTERVAL=f"{interval:g}s",
                   VLM_PROFILE_DURATION=f"{duration:g}s", VLM_PROFILE_RATE=str(rate),
                   VLM_DISCOVERY_ROOT_PID=str(standin_pid), VLM_SGLANG_METRICS_URL=f"http://127.0.0.1:{port}/metrics",
                   PYTHONPATH=os.pathsep.join([str(ROOT / "sidecar"), env.get("PYTHONPATH", "")]))
        env["VLM_FRONTEND_ROLES"] = "tokenizer_manager,tokenizer_worker,mm_processor,detokenizer" if frontend else ""
        if pyspy:
            env["VLM_PYSPY"] = pyspy
        side = subprocess.Popen([sys.executable, "-m", "vlm_sidecar"], env=env, stdout=subprocess.DEVNULL,
                                stderr=open(os.environ.get("SIDECAR_LOG", os.devnull), "ab"))  # noqa: SIM115
        deadline = time.time() + 30
        while time.time() < deadline:  # ready = imports done; the first window starts right after
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{sport}/healthz", timeout=1).read()
                break
            except OSError:
                time.sleep(0.05)
        cpu0 = proc_cpu_s(side.pid)
    start = time.time()
    while time.time() < start + seconds:
        if side is not None:
            rss.append(tree_rss_bytes(side.pid))
        time.sleep(0.25)
    end = time.time()
    cpu = 0.0
    if side is not None:
        cpu = proc_cpu_s(side.pid) - cpu0
        try:
            windows = get_json(f"http://127.0.0.1:{sport}/windows.json")
        except OSError:
            windows = []
        side.terminate()
        try:
            side.wait(60)  # a window in flight stops at once; 60 s is for a loaded machine's interpreter exit
        except subprocess.TimeoutExpired:
            left = children(side.pid)
            side.kill()
            side.wait()
            raise RuntimeError(f"the sidecar did not exit 60 s after SIGTERM; its processes then: {left}") from None
    time.sleep(0.2)
    acc = accounting(port, start, end)
    ok = [w for w in windows if w.get("samples")]
    # py-spy's "Samples" counts stack traces: with --idle, one per Python thread per sample.
    fe = [w["frontend"] for w in windows if w.get("frontend")]
    return {"mode": (label or ("on+frontend" if frontend else "on")) if on else "off", "start": start,
            "frontend_windows": len(fe),
            "frontend_processes": fe[-1]["roles"] and {r: v["processes"] for r, v in fe[-1]["roles"].items()}
            if fe else None, "end": end, "iterations": acc["iterations"],
            "iter_per_s": acc["iterations"] / max(acc["loop_seconds"], 1e-9) if acc["iterations"] else 0.0,
            "loop_mean_seconds": acc["loop_mean_seconds"], "batches": acc.get("batches"),
            "sidecar_cpu_cores": cpu / (end - start) if on else 0.0,
            "rss_mean_mib": statistics.mean(rss) / 2**20 if rss else 0.0,
            "rss_max_mib": max(rss) / 2**20 if rss else 0.0,
            "windows": len(windows), "windows_ok": sum(1 for w in windows if w.get("result") == "ok"),
            "window_results": [w.get("result") for w in windows], "window_errors": [w.get("error") for w in windows],
            "window_wall_s": [w["end"] - w["start"] for w in windows],
            "traces": [w.get("samples") for w in windows],
            "sample_rate_hz": statistics.mean(w["samples"] / threads / (w["end"] - w["start"]) for w in ok)
            if ok else None}


def run_cadence(args, standin_pid: int, port: int) -> dict:
    interval, duration, rate = operator_defaults()
    rate = args.cadence_rate or rate
    interval = args.cadence_interval or interval
    seconds = interval * args.cadence_cycles
    periods = []
    # (on, front end, py-spy, label)
    kinds = [(False, False, None, None), (True, False, args.pyspy, None)]
    kinds += [(True, True, args.pyspy, None)] if args.frontend else []
    kinds += [(True, False, args.compare_pyspy, "on+compare")] if args.compare_pyspy else []
    for r in range(args.cadence_rounds):
        order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]  # rotated: no kind always follows another
        for on, fe, pyspy, label in order:
            # py-spy's Samples count one stack per sampled thread per round: with --main-thread, one.
            sampled = 1 if pyspy and supports_main_thread(pyspy) else args.threads + 1
            p = cadence_period(on, standin_pid, port, seconds, interval, duration, rate, sampled, fe,
                               pyspy, label)
            p["round"] = r
            periods.append(p)
            print(f"cadence round {r} {p['mode']:3s} {p['iter_per_s']:8.2f} it/s  cpu {p['sidecar_cpu_cores']:.3f} "
                  f"rss {p['rss_max_mib']:.0f} MiB  rate {p['sample_rate_hz']}  windows {p['window_results']} "
                  f"{[round(x, 1) for x in p['window_wall_s']]} s", file=sys.stderr, flush=True)
    on = [p for p in periods if p["mode"] == "on"]
    paired = [p["iter_per_s"] / next(b["iter_per_s"] for b in periods if b["mode"] == "off"
                                     and b["round"] == p["round"]) - 1 for p in on]
    rates = [p["sample_rate_hz"] for p in on if p["sample_rate_hz"]]
    fe = [p for p in periods if p["mode"] == "on+frontend"]
    frontend = None
    if fe:
        fe_paired = [p["iter_per_s"] / next(b["iter_per_s"] for b in periods if b["mode"] == "off"
                                            and b["round"] == p["round"]) - 1 for p in fe]
        frontend = {"averaged_loss": -statistics.mean(fe_paired), "averaged_loss_per_round": [-x for x in fe_paired],
                    "sidecar_cpu_cores_mean": statistics.mean(p["sidecar_cpu_cores"] for p in fe),
                    "sidecar_rss_max_mib": max(p["rss_max_mib"] for p in fe),
                    "processes": fe[-1]["frontend_processes"],
                    "windows": [r for p in fe for r in p["window_results"]]}
    cmp = [p for p in periods if p["mode"] == "on+compare"]
    compare = None
    if cmp:
        c_paired = [p["iter_per_s"] / next(b["iter_per_s"] for b in periods if b["mode"] == "off"
                                           and b["round"] == p["round"]) - 1 for p in cmp]
        c_rates = [p["sample_rate_hz"] for p in cmp if p["sample_rate_hz"]]
        compare = {"pyspy": args.compare_pyspy, "averaged_loss": -statistics.mean(c_paired),
                   "averaged_loss_per_round": [-x for x in c_paired],
                   "sidecar_cpu_cores_mean": statistics.mean(p["sidecar_cpu_cores"] for p in cmp),
                   "sidecar_rss_max_mib": max(p["rss_max_mib"] for p in cmp),
                   "sample_rate_hz_mean": statistics.mean(c_rates) if c_rates else None,
                   "windows": [r for p in cmp for r in p["window_results"]]}
    return {"interval_s": interval, "duration_s": duration, "rate_hz": rate, "threads": args.threads,
            "native_threads": args.native_threads, "pyspy": args.pyspy, "compare": compare,
            "frontend": frontend,
            "cycles_per_period": args.cadence_cycles, "rounds": args.cadence_rounds,
            "averaged_loss": -statistics.mean(paired), "averaged_loss_per_round": [-x for x in paired],
            "sidecar_cpu_cores_mean": statistics.mean(p["sidecar_cpu_cores"] for p in on),
            "sidecar_rss_mean_mib": statistics.mean(p["rss_mean_mib"] for p in on),
            "sidecar_rss_max_mib": max(p["rss_max_mib"] for p in on),
            "sample_rate_hz_mean": statistics.mean(rates) if rates else None,
            "periods": periods}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=DEFAULT_DURATION_S)
    ap.add_argument("--rate", type=int, default=DEFAULT_RATE_HZ)
    ap.add_argument("--interval", type=float, default=operator_defaults()[0],
                    help="for the in-window duty-cycle arithmetic (default: the operator's interval)")
    ap.add_argument("--cadence-rounds", type=int, default=3, help="off/on pairs at the operator's cadence (0: skip)")
    ap.add_argument("--cadence-cycles", type=int, default=2, help="sampling intervals per off or on period")
    ap.add_argument("--cadence-interval", type=float, default=None,
                    help="seconds between windows in the cadence part (default: the operator's; the smoke test "
                         "shortens it, the numbers reported use the default)")
    ap.add_argument("--threads", type=int, default=60, help="idle threads in the stand-in's scheduler")
    ap.add_argument("--native-threads", type=int, default=0,
                    help="native idle threads in the stand-in's scheduler (CUDA, NCCL, OpenMP in a real one)")
    ap.add_argument("--pyspy", default=default_pyspy(),
                    help="the py-spy the sidecar runs (default: the sidecar image's build from "
                         "hack/build-binaries.sh when built, else py-spy on PATH)")
    ap.add_argument("--compare-pyspy", default=None,
                    help="a second py-spy (e.g. the PyPI wheel's) measured in its own interleaved periods")
    ap.add_argument("--cadence-rate", type=int, default=None, help="py-spy rate for the cadence part "
                    "(default: the operator's)")
    ap.add_argument("--frontend", action="store_true",
                    help="run the stand-in's front end and measure the sidecar with front-end sampling too")
    ap.add_argument("--json", default=str(ROOT / "out" / "sidecar_overhead.json"))
    ap.add_argument("standin_args", nargs="*", help="extra stand-in flags (after --)")
    args = ap.parse_args()

    port = free_port()
    cmd = [sys.executable, str(ROOT / "testing" / "vlm_testing" / "standin" / "sglang_standin.py"), "--port", str(port),
           "--standin-cost-model", "work", "--mm-feature-transport", "cuda_ipc",
           # Constant arrivals and costs: Poisson arrivals changed the loop's speed between segments by
           # more than the 1% this benchmark has to resolve.
           "--standin-arrivals", "fixed", "--standin-jitter", "0", "--standin-version", "0.5.23",
           # Every iteration the same decode step: with the prefill/decode mix a slowed loop takes in more
           # requests per prefill and runs fewer, longer iterations, so iterations/s would not measure speed.
           "--standin-prefill-ms", "0",
           "--standin-threads", str(args.threads), "--standin-native-threads", str(args.native_threads),
           "--enable-metrics",
           # The front end light enough to never be the bottleneck (2 images of 2 ms per request), and requests
           # that never finish at a constant decode cost: iterations/s stays the scheduler's speed whenever the
           # front end has delivered 8 (an emptied batch would make fast idle iterations, a growing one slower ones).
           *(["--standin-frontend", "--standin-image-cost-ms", "2", "--standin-request-rate", "5",
              "--standin-output-tokens", "100000000", "--standin-batch-per-req-ms", "0", "--standin-max-running", "8"]
             if args.frontend else []),
           *args.standin_args]
    standin = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    try:
        pid = json.loads(standin.stdout.readline())["pids"][0]
        time.sleep(2.0)
        segments = []
        cadence = None
        for r in range(args.rounds):
            order = MODES[r % 3:] + MODES[: r % 3]  # rotate so no mode always follows another
            for mode in order:
                seg = run_segment(mode, pid, port, args.duration, args.rate, args.pyspy)
                seg["round"] = r
                segments.append(seg)
                print(f"round {r} {mode:12s} {seg['iter_per_s']:8.2f} it/s", file=sys.stderr, flush=True)
        cadence = run_cadence(args, standin.pid, port) if args.cadence_rounds > 0 else None
    finally:
        standin.terminate()
        standin.wait()

    result = {"cpu_count": os.cpu_count(), "loadavg_1m": os.getloadavg()[0], "threads": args.threads,
              "standin_cmd": cmd[1:]}
    if segments:
        base = statistics.median(s["iter_per_s"] for s in segments if s["mode"] == "none")
        duty = args.duration / args.interval
        table = []
        for mode in MODES:
            segs = [s for s in segments if s["mode"] == mode]
            # Paired with the same round's baseline, to cancel slow drift on a shared host.
            paired = [s["iter_per_s"] / next(b["iter_per_s"] for b in segments if b["mode"] == "none"
                                             and b["round"] == s["round"]) - 1 for s in segs]
            loss = -statistics.median(paired)
            table.append({
                "mode": mode,
                "iter_per_s_median": statistics.median(s["iter_per_s"] for s in segs),
                "in_window_loss": loss,
                "in_window_loss_min": -max(paired), "in_window_loss_max": -min(paired),
                "time_averaged_loss_at_defaults": loss * duty,
                "pyspy_cpu_cores": statistics.median(s["pyspy_cpu_s"] / s["wall_s"] for s in segs),
                "sidecar_parse_cpu_s_per_window": statistics.median(s["sidecar_cpu_s"] for s in segs),
            })
        result.update({"rate_hz": args.rate, "duration_s": args.duration, "interval_s": args.interval,
                       "rounds": args.rounds, "baseline_iter_per_s": base, "modes": table, "segments": segments})
        print(f"\nstand-in loop throughput, {args.rounds} interleaved rounds of {args.duration:g} s windows at "
              f"{args.rate} Hz (defaults: a window every {args.interval:g} s); {os.cpu_count()} CPUs, "
              f"load {os.getloadavg()[0]:.1f}")
        print(f"{'mode':12s} {'it/s':>8s} {'in-window loss':>15s} {'(range)':>16s} {'avg loss @defaults':>19s} "
              f"{'py-spy cores':>13s} {'parse CPU s':>12s}")
        for t in table:
            rng = f"{t['in_window_loss_min'] * 100:+.1f}..{t['in_window_loss_max'] * 100:+.1f}%"
            print(f"{t['mode']:12s} {t['iter_per_s_median']:8.2f} {t['in_window_loss'] * 100:14.2f}% {rng:>16s} "
                  f"{t['time_averaged_loss_at_defaults'] * 100:18.2f}% {t['pyspy_cpu_cores']:13.3f} "
                  f"{t['sidecar_parse_cpu_s_per_window']:12.3f}")
    if cadence is not None:
        result["cadence"] = cadence
        c = cadence
        print(f"\nat the operator's cadence ({c['duration_s']:g} s windows every {c['interval_s']:g} s at "
              f"{c['rate_hz']} Hz), real vlm-sidecar vs none, {c['rounds']} interleaved off/on rounds of "
              f"{c['cycles_per_period']} intervals, stand-in with {c['threads']} idle Python threads and "
              f"{c['native_threads']} native ones; py-spy {c['pyspy'] or 'on PATH'}:")
        per = ", ".join(f"{x * 100:+.2f}%" for x in c["averaged_loss_per_round"])
        rate = f"{c['sample_rate_hz_mean']:.0f} Hz" if c["sample_rate_hz_mean"] else "n/a"
        print(f"  loop throughput loss averaged: {c['averaged_loss'] * 100:.2f}% (per round {per})")
        print(f"  sidecar CPU (own + py-spy): {c['sidecar_cpu_cores_mean']:.3f} cores averaged")
        print(f"  sidecar RSS (own + py-spy): mean {c['sidecar_rss_mean_mib']:.0f} MiB, max {c['sidecar_rss_max_mib']:.0f} MiB")
        walls = [round(x, 1) for p in c["periods"] for x in p["window_wall_s"]]
        results = [r for p in c["periods"] for r in p["window_results"]]
        print(f"  achieved sample rate: {rate} (asked {c['rate_hz']} Hz); windows {results}, wall s {walls}")
        if c["frontend"]:
            f = c["frontend"]
            per = ", ".join(f"{x * 100:+.2f}%" for x in f["averaged_loss_per_round"])
            print(f"  with front-end sampling ({f['processes']}): loss {f['averaged_loss'] * 100:.2f}% (per round "
                  f"{per}), sidecar CPU {f['sidecar_cpu_cores_mean']:.3f} cores, RSS max {f['sidecar_rss_max_mib']:.0f} "
                  f"MiB, windows {f['windows']}")
        if c["compare"]:
            f = c["compare"]
            per = ", ".join(f"{x * 100:+.2f}%" for x in f["averaged_loss_per_round"])
            rate = f"{f['sample_rate_hz_mean']:.0f} Hz" if f["sample_rate_hz_mean"] else "n/a"
            print(f"  with py-spy {f['pyspy']}: loss {f['averaged_loss'] * 100:.2f}% (per round {per}), sidecar CPU "
                  f"{f['sidecar_cpu_cores_mean']:.3f} cores, RSS max {f['sidecar_rss_max_mib']:.0f} MiB, rate {rate}, "
                  f"windows {f['windows']}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
