"""Parts 2 and 3: the scheduler stand-in on a GPU, with real CUDA IPC and a real GPU step per iteration.

Part 2 (cache), at two offered loads (above capacity: throughput; below it, after the start-up
backlog has drained: latency): the stand-in (`testing/vlm_testing/standin/sglang_standin.py --standin-transport cuda`, SGLang 0.5.10
rules, `SGLANG_USE_CUDA_IPC_TRANSPORT=1`) is started with `SGLANG_USE_IPC_POOL_HANDLE_CACHE=0` and `=1`
in turn, in a random order inside each round; each start is warmed up, then measured over one window.
Part 3 (profiler): one stand-in with the cache on runs throughout while windows cycle, in a random
order inside each round, through no profiler, the real sidecar (`python -m vlm_sidecar`, py-spy
`--nonblocking`) and the sidecar with `--blocking` (py-spy pauses the scheduler per sample).

Per window: loop iterations/s and mean iteration time from the stand-in's own accounting
(`/standin/accounting`), TTFT and inter-token latency from its SGLang-named histograms (means exact,
percentiles interpolated inside Prometheus buckets), generated tokens/s (one per TTFT or ITL
observation). Writes one JSON file.

    python3 bench/gpu/standin_loop.py --out loop.json [--part 2 --part 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# promtext and feature_sizes sit next to this script: its folder is on sys.path when it runs.
import promtext  # noqa: E402
from feature_sizes import RESOLUTIONS, image_tokens  # noqa: E402
from feature_sizes import feature_bytes as to_bytes  # noqa: E402
from summary import percentile  # noqa: E402

STANDIN = os.path.join(REPO, "testing", "vlm_testing", "standin", "sglang_standin.py")
TTFT = "sglang:time_to_first_token_seconds"
ITL = "sglang:inter_token_latency_seconds"
PROFILER_MODES = ("none", "sidecar nonblocking", "sidecar blocking")


def _get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Standin:
    """One stand-in server process (and its scheduler and producer children)."""

    def __init__(self, args: argparse.Namespace, cache: bool, rate: float, log_path: str) -> None:
        env = dict(os.environ, SGLANG_USE_CUDA_IPC_TRANSPORT="1",
                   SGLANG_USE_IPC_POOL_HANDLE_CACHE="1" if cache else "0", PYTHONUNBUFFERED="1")
        cmd = [sys.executable, STANDIN, "--port", "0", "--enable-metrics", "--standin-transport", args.transport,
               "--standin-version", "0.5.10", "--standin-request-rate", str(rate),
               "--standin-images-per-request", str(args.images), "--standin-features-per-image", "1",
               "--standin-feature-bytes", str(args.feature_bytes), "--standin-seed", str(args.seed)]
        self.cache = cache
        self.log = open(log_path, "ab")  # noqa: SIM115 (lives as long as the process)
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=self.log)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"stand-in exited before serving (see {log_path})")
        info = json.loads(line)
        if info.get("cache") is not cache or info.get("transport") != "cuda_ipc":
            raise RuntimeError(f"stand-in resolved {info}, expected cuda_ipc with cache={cache}")
        self.port = info["port"]
        self.scheduler_pid = info["pids"][0]
        self.base = f"http://127.0.0.1:{self.port}"
        self._wait_running()

    def _wait_running(self, timeout_s: float = 120.0) -> None:
        """The loop starts only after torch, the producer and cuBLAS are up: wait for iterations."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"stand-in exited with {self.proc.returncode}")
            try:
                ranks = json.loads(_get(self.base + "/standin/accounting"))["ranks"]
                if ranks and ranks[0]["iterations"] > 50:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError("stand-in loop did not start")

    def wait_drained(self, timeout_s: float = 90.0) -> float:
        """Wait until the waiting queue is empty twice in a row; returns the seconds waited.

        The stand-in's arrival clock starts before its transport is up, so every start begins with a
        backlog; a below-capacity measurement must not include draining it.
        """
        t0 = time.monotonic()
        empty = 0
        while time.monotonic() - t0 < timeout_s:
            empty = empty + 1 if promtext.scalar(self.scrape(), "sglang:num_queue_reqs") == 0 else 0
            if empty >= 2:
                return time.monotonic() - t0
            time.sleep(0.5)
        raise RuntimeError("stand-in queue did not drain: the load is above capacity")

    def scrape(self) -> dict:
        return promtext.parse_samples(_get(self.base + "/metrics"))

    def accounting(self, start: float, end: float) -> dict:
        return json.loads(_get(f"{self.base}/standin/accounting?start={start}&end={end}"))["ranks"][0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


def measure(standin: Standin, seconds: float) -> dict:
    """One window: rates from the stand-in's accounting, latencies from its histograms."""
    t0, m0 = time.time(), standin.scrape()
    time.sleep(seconds)
    t1, m1 = time.time(), standin.scrape()
    acct = standin.accounting(t0, t1)
    span = acct["end"] - acct["start"]
    ttft = promtext.histogram_delta(promtext.histogram(m0, TTFT), promtext.histogram(m1, TTFT))
    itl = promtext.histogram_delta(promtext.histogram(m0, ITL), promtext.histogram(m1, ITL))
    return {
        "t0": t0, "t1": t1,
        "iter_per_s": acct["iterations"] / span if span > 0 else math.nan,
        "iter_ms": 1e3 * acct["loop_mean_seconds"] if acct["loop_mean_seconds"] else math.nan,
        "stage_shares": acct["stage_shares"],
        # Every TTFT and ITL observation is one generated token.
        "tokens_per_s": (ttft[2] + itl[2]) / (t1 - t0),
        "first_tokens_per_s": ttft[2] / (t1 - t0),
        "ttft": {"buckets": ttft[0], "sum": ttft[1], "count": ttft[2]},
        "itl": {"buckets": itl[0], "sum": itl[1], "count": itl[2]},
    }


def _merge(hists: list[dict]) -> tuple[list[tuple[float, float]], float, float]:
    buckets: dict[float, float] = {}
    for h in hists:
        for le, c in h["buckets"]:
            buckets[le] = buckets.get(le, 0.0) + c
    return sorted(buckets.items()), sum(h["sum"] for h in hists), sum(h["count"] for h in hists)


def summarize_windows(windows: list[dict], modes: list[str]) -> dict[str, dict]:
    """Per mode, in the order given (baseline first): medians over windows for rates, pooled
    histograms for latencies."""
    out = {}
    for mode in modes:
        ws = [w for w in windows if w["mode"] == mode]
        ttft, itl = _merge([w["ttft"] for w in ws]), _merge([w["itl"] for w in ws])
        out[mode] = {
            "windows": len(ws),
            "iter_per_s_median": percentile([w["iter_per_s"] for w in ws], 50),
            "iter_ms_median": percentile([w["iter_ms"] for w in ws], 50),
            "itl_ms_mean": 1e3 * itl[1] / itl[2] if itl[2] else math.nan,
            "itl_ms_p99": 1e3 * promtext.histogram_quantile(0.99, itl[0]),
            "tokens_per_s_median": percentile([w["tokens_per_s"] for w in ws], 50),
            "first_tokens_per_s_median": percentile([w["first_tokens_per_s"] for w in ws], 50),
            "ttft_ms_mean": 1e3 * ttft[1] / ttft[2] if ttft[2] else math.nan,
            "ttft_ms_p50": 1e3 * promtext.histogram_quantile(0.5, ttft[0]),
            "ttft_ms_p99": 1e3 * promtext.histogram_quantile(0.99, ttft[0]),
        }
    return out


def part2(args: argparse.Namespace, rng: random.Random, log: str, rate: float, drain: bool) -> dict:
    """Cache off vs on at one offered load; `drain` waits out the start-up backlog first."""
    windows = []
    for r in range(args.rounds):
        order = [False, True]
        rng.shuffle(order)
        for cache in order:
            s = Standin(args, cache, rate, log)
            try:
                drained = s.wait_drained() if drain else None
                time.sleep(args.warmup)
                w = measure(s, args.window)
            finally:
                s.stop()
            w.update(mode="cache on" if cache else "cache off", round=r, rate=rate, drain_s=drained)
            windows.append(w)
            print(f"part2 {rate:g} req/s round {r} {w['mode']}: {w['iter_per_s']:.1f} it/s, {w['iter_ms']:.2f} "
                  f"ms/it, {w['tokens_per_s']:.0f} tok/s, TTFT n={w['ttft']['count']:.0f}", flush=True)
    return {"rate": rate, "windows": windows, "summary": summarize_windows(windows, ["cache off", "cache on"])}


def _find_pyspy() -> str:
    found = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(found):
        raise RuntimeError("py-spy not found (install the wheel; see docs/benchmarks.md)")
    return found


def _sidecar(standin: Standin, blocking: bool, port: int, log: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "vlm_sidecar", "--host", "127.0.0.1", "--port", str(port),
           "--interval", "5s", "--duration", "5s", "--pyspy", _find_pyspy(),
           "--discovery-root-pid", str(standin.proc.pid), "--sglang-metrics-url", standin.base + "/metrics"]
    if blocking:
        cmd.append("--blocking")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(REPO, "sidecar"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)


def _sidecar_counts(port: int) -> dict:
    try:
        m = promtext.parse_samples(_get(f"http://127.0.0.1:{port}/metrics"))
    except OSError as e:
        return {"error": str(e)}
    windows = {dict(lb).get("result", "?"): v for (n, lb), v in m.items() if n == "vlm_profiler_windows_total"}
    return {"samples": promtext.scalar(m, "vlm_profiler_samples_total"), "windows": windows}


def part3(args: argparse.Namespace, rng: random.Random, log: str) -> dict:
    windows = []
    s = Standin(args, True, args.rate, log)
    try:
        s.wait_drained()
        time.sleep(args.warmup)
        for r in range(args.rounds):
            order = list(PROFILER_MODES)
            rng.shuffle(order)
            for i, mode in enumerate(order):
                side = None
                if mode != "none":
                    port = 19400 + 3 * r + i
                    side = _sidecar(s, mode.endswith(" blocking"), port, log)
                    time.sleep(args.sidecar_settle)  # python start, discovery, py-spy attach
                    if side.poll() is not None:
                        raise RuntimeError(f"sidecar exited with {side.returncode} (see {log})")
                w = measure(s, args.window)
                if side is not None:
                    # Counters after the next window closes, so every sample taken is counted.
                    time.sleep(1.0)
                    w["sidecar"] = _sidecar_counts(port)
                    side.send_signal(signal.SIGTERM)
                    try:
                        side.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        side.kill()
                        side.wait()
                else:
                    time.sleep(1.0)
                w.update(mode=mode, round=r)
                windows.append(w)
                print(f"part3 round {r} {mode}: {w['iter_per_s']:.1f} it/s, {w['iter_ms']:.2f} ms/it "
                      f"{w.get('sidecar', '')}", flush=True)
    finally:
        s.stop()
    return {"rate": args.rate, "windows": windows, "summary": summarize_windows(windows, list(PROFILER_MODES))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--log", default="/tmp/standin_loop.log")
    ap.add_argument("--part", type=int, action="append", choices=(2, 3))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=10.0, help="seconds measured per window")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--sidecar-settle", type=float, default=2.5)
    ap.add_argument("--rate", type=float, default=20.0,
                    help="requests/s (Poisson) below the loop's capacity: part 2 steady state and part 3")
    ap.add_argument("--saturated-rate", type=float, default=60.0,
                    help="requests/s above capacity: part 2 throughput (0 skips this regime)")
    ap.add_argument("--images", type=int, default=3, help="images (features) per request")
    ap.add_argument("--resolution", choices=tuple(RESOLUTIONS), default="1080p")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--transport", choices=("cuda", "sim"), default="cuda",
                    help="sim: the stand-in's CPU busy-wait transport (checks this script without a GPU)")
    args = ap.parse_args(argv)
    h, w = RESOLUTIONS[args.resolution]
    args.feature_bytes = to_bytes(image_tokens(h, w))
    parts = args.part or [2, 3]
    rng = random.Random(args.seed)
    result: dict[str, Any] = {
        "loop": (f"stand-in, SGLang 0.5.10 rules, {'real CUDA IPC' if args.transport == 'cuda' else 'SIM'}, "
                 f"{args.images} x {args.resolution} features per request "
                 f"({args.feature_bytes} B), {args.window:g} s windows"),
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "log")},
    }
    if args.transport == "cuda":
        import torch  # only for the record of what ran

        result.update(torch=torch.__version__, device_name=torch.cuda.get_device_name(0))
    if 2 in parts:
        if args.saturated_rate > 0:
            result["part2_saturated"] = part2(args, rng, args.log, args.saturated_rate, drain=False)
        result["part2_steady"] = part2(args, rng, args.log, args.rate, drain=True)
    if 3 in parts:
        result["part3"] = part3(args, rng, args.log)
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
