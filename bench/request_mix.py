"""How much of a pod's window-to-window loop latency the request mix explains, on the stand-in's real scheduler loop.

The gate adjusts the request-driven signals for each window's prompt tokens per request (gate.covariates, fitted
on the baseline's windows). This measures the cut on the stand-in (testing/vlm_testing/standin): its scheduler
processes run their loop for real, prefills with images cost more than text, and it counts its finished requests'
prompt tokens (32 of text plus 256 per image) in SGLang's counters. Per window, the loop mean comes from the
stand-in's own accounting of its iterations and prompt tokens per request from its /metrics, read at both edges as
the sidecar reads them (vlm_sidecar.sglang_metrics). Two runs:

- `bursts`: images per request redrawn every `--mix-period` seconds (0 to 4, mean 2): a mix that comes in bursts;
- `constant`: 2 images per every request (what the e2e tier runs): nothing for the covariate to explain.

For each, the fit the gate would make on those windows and the variance of log loop latency before and after.

    python bench/request_mix.py [--seconds 180] [--window 5] [--mix-period 20] [--out bench/results/request_mix.md]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from vlm_operator.analysis.gate import Window
from vlm_operator.analysis.gate import covariates as cov
from vlm_operator.analysis.gate.samples import make_units
from vlm_sidecar import sglang_metrics

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "testing" / "vlm_testing" / "standin" / "sglang_standin.py"
STAGES = {"run_batch": 0.6, "other": 0.4}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.read().decode()


def windows(mix_period: float, seconds: float, window: float, rate: float) -> list[Window]:
    """Run the stand-in `seconds` and cut its life into windows of `window` seconds."""
    port = free_port()
    cmd = [sys.executable, str(STANDIN), "--port", str(port), "--enable-metrics", "--standin-version", "0.5.23",
           "--standin-request-rate", str(rate), "--standin-output-tokens", "16",
           "--standin-mix-period", str(mix_period)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    out: list[Window] = []
    try:
        json.loads(proc.stdout.readline())  # the stand-in says it is up
        time.sleep(3.0)  # warm-up: the first requests finish
        before, t0 = sglang_metrics.parse(_get(port, "/metrics")), time.time()
        k = 0
        while time.time() - t0 < seconds:
            time.sleep(max(0.0, t0 + (k + 1) * window - time.time()))
            end = time.time()
            after = sglang_metrics.parse(_get(port, "/metrics"))
            start = end - window
            acct = json.loads(_get(port, f"/standin/accounting?start={start}&end={end}"))["ranks"][0]
            req = sglang_metrics.request_signals(before, after, window)
            before = after
            if acct.get("iterations") and acct.get("loop_mean_seconds"):
                out.append(Window(revision="r", pod="standin", id=str(k), end=end, samples=1000,
                                  loop_mean_seconds=acct["loop_mean_seconds"], loop_p95_seconds=None,
                                  stage_shares=STAGES, function_shares={}, iterations=acct["iterations"],
                                  prompt_tokens_per_request=req.get("prompt_tokens_per_request")))
            k += 1
    finally:
        proc.terminate()
        proc.wait(10)
    return out


def measure(ws: list[Window]) -> dict:
    """The gate's fit on these windows (the same windows as both sides: no shift of the mix) and the variance of
    log loop latency before and after the adjustment."""
    units = make_units(ws, 0.0)
    adj = cov.fit("loop_latency", units, units)
    logs = [math.log(w.loop_mean_seconds) for w in ws]
    mixes = [w.prompt_tokens_per_request for w in ws if w.prompt_tokens_per_request]
    var = _var(logs)
    out = {"windows": len(ws), "var_before": var, "mix_cv": _cv(mixes)}
    if adj is None:
        return {**out, "fit": "left out", "var_after": var, "cut": 0.0}
    after = [math.log(adj.apply(u.values["loop_latency"], u)) for u in units]
    return {**out, "fit": f"slope {adj.slope:.3f}", "var_after": _var(after), "cut": adj.variance_cut}


def _var(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / max(1, len(xs) - 1)


def _cv(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(_var(xs)) / m


def markdown(rows: dict[str, dict], args: argparse.Namespace) -> str:
    lines = [
        "# The request mix as a covariate, on the stand-in (bench/request_mix.py)",
        "",
        f"{args.seconds:.0f} s per run, windows of {args.window:.0f} s, {args.rate:.0f} requests/s, 16 output tokens "
        f"each; `bursts`: images per request redrawn every {args.mix_period:.0f} s from 0-4. The fit is the gate's "
        "(gate.covariates, loop latency on log prompt tokens per request within the pod); sd: of log loop latency "
        "per window.",
        "",
        "| run | windows | prompt tokens/request, cv | fit | variance explained | loop sd before | loop sd after |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['windows']} | {r['mix_cv']:.0%} | {r['fit']} | {r['cut']:.0%} | "
                     f"{math.sqrt(r['var_before']):.2%} | {math.sqrt(r['var_after']):.2%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--window", type=float, default=5.0)
    ap.add_argument("--mix-period", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "request_mix.md")
    args = ap.parse_args(argv)
    rows = {name: measure(windows(period, args.seconds, args.window, args.rate))
            for name, period in (("bursts", args.mix_period), ("constant", 0.0))}
    text = markdown(rows, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
