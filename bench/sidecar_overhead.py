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

    python bench/sidecar_overhead.py [--rounds 5] [--json out/sidecar_overhead.json]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sidecar"))

from vlm_sidecar.config import DEFAULT_DURATION_S, DEFAULT_INTERVAL_S, DEFAULT_RATE_HZ  # noqa: E402
from vlm_sidecar.estimators import summarize  # noqa: E402
from vlm_sidecar.parser import parse_chrometrace  # noqa: E402
from vlm_sidecar.sampler import PySpySampler  # noqa: E402

MODES = ("none", "nonblocking", "blocking")


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


def run_segment(mode: str, pid: int, port: int, duration: float, rate: int) -> dict:
    c0, s0 = children_cpu(), self_cpu()
    start = time.time()
    samples = None
    if mode == "none":
        time.sleep(duration)
    else:
        sampler = PySpySampler(None, rate, duration, blocking=(mode == "blocking"))
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=DEFAULT_DURATION_S)
    ap.add_argument("--rate", type=int, default=DEFAULT_RATE_HZ)
    ap.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S)
    ap.add_argument("--json", default=str(ROOT / "out" / "sidecar_overhead.json"))
    ap.add_argument("standin_args", nargs="*", help="extra stand-in flags (after --)")
    args = ap.parse_args()

    port = free_port()
    cmd = [sys.executable, str(ROOT / "bench" / "standin" / "sglang_standin.py"), "--port", str(port),
           "--standin-cost-model", "work", "--standin-version", "0.5.20", "--mm-feature-transport", "cuda_ipc",
           # Constant arrivals and costs: Poisson arrivals changed the loop's speed between segments by
           # more than the 1% this benchmark has to resolve.
           "--standin-arrivals", "fixed", "--standin-jitter", "0",
           *args.standin_args]
    standin = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    try:
        pid = json.loads(standin.stdout.readline())["pids"][0]
        time.sleep(2.0)
        segments = []
        for r in range(args.rounds):
            order = MODES[r % 3:] + MODES[: r % 3]  # rotate so no mode always follows another
            for mode in order:
                seg = run_segment(mode, pid, port, args.duration, args.rate)
                seg["round"] = r
                segments.append(seg)
                print(f"round {r} {mode:12s} {seg['iter_per_s']:8.2f} it/s", file=sys.stderr, flush=True)
    finally:
        standin.terminate()
        standin.wait()

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
    result = {"rate_hz": args.rate, "duration_s": args.duration, "interval_s": args.interval,
              "rounds": args.rounds, "baseline_iter_per_s": base, "cpu_count": os.cpu_count(),
              "loadavg_1m": os.getloadavg()[0], "modes": table, "segments": segments}
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
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
