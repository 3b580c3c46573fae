"""Re-record the py-spy golden files from the SGLang stand-in (needs py-spy and ptrace rights).

    python tests/golden/sidecar/record.py [NAME ...]

Writes <name>.chrometrace.json / <name>.raw.txt and, next to each, <name>.<fmt>.truth.json: the stand-in's
own accounting (/standin/accounting) of the iterations that lie wholly inside the recorded span (the
first to the last py-spy event): true loop mean, p50, p95, stage shares, batch kinds, durations, plus the
case's version, flags and env. test_golden.py checks the estimators against that truth. Then regenerate
the expected estimator outputs (the last outputs, for diffs):

    VLM_REGEN_GOLDEN=1 pytest tests/unit/sidecar/test_golden.py

Record on a quiet machine (a starved py-spy skips samples and the estimate then misses the truth for
reasons that are not the estimator's).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
STANDIN = ROOT / "bench" / "standin" / "sglang_standin.py"
PYSPY = shutil.which("py-spy") or str(Path(sysconfig.get_path("scripts")) / "py-spy")

CUDA_IPC_NO_CACHE = {"SGLANG_USE_CUDA_IPC_TRANSPORT": "1", "SGLANG_USE_IPC_POOL_HANDLE_CACHE": "0"}
CONSECUTIVE = {"SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP": "1"}
THREADS = ["--standin-threads", "2"]  # a few idle threads to pick the scheduler thread from (py-spy walks
# every thread on every sample: 60 would make a 1000 Hz recording lag, see docs/sidecar.md "CPU cost")

WINDOW_S = 5  # the sidecar's default window: in 2 s one missed boundary moves the mean by ~2%
CASES = [
    # name, stand-in args, env, py-spy format, rate, seconds
    # 0.5.10 shape (no decorators, self_check_during_idle), CUDA IPC without the pool-handle cache.
    ("cache_off", ["--standin-version", "0.5.10", "--standin-batch-ms", "12", *THREADS], CUDA_IPC_NO_CACHE,
     "chrometrace", 1000, WINDOW_S),
    # 0.5.17 shape (request_receiver, one nvtx wrapper, on_idle), CUDA IPC with the cache (its default).
    ("cache_on", ["--standin-version", "0.5.17", "--standin-batch-ms", "12", *THREADS], {}, "chrometrace", 1000, WINDOW_S),
    ("cache_off", ["--standin-version", "0.5.10"], CUDA_IPC_NO_CACHE, "raw", 200, 1),
    # Image prefills of 60 ms vs 12 ms decodes, two prefills in a row processed before run_batch.
    ("v0_5_10_prefill", ["--standin-version", "0.5.10", "--standin-batch-ms", "12", "--standin-prefill-ms", "60",
                         "--standin-request-rate", "12", *THREADS], {**CUDA_IPC_NO_CACHE, **CONSECUTIVE},
     "chrometrace", 1000, WINDOW_S),
    # 0.5.23 shape (ingest_requests, two wrappers, on_idle under them), cached CUDA IPC, overlap as default.
    ("v0_5_23_prefill", ["--standin-version", "0.5.23", "--mm-feature-transport", "cuda_ipc", "--standin-batch-ms",
                         "12", "--standin-prefill-ms", "60", "--standin-request-rate", "12", *THREADS], {},
     "chrometrace", 1000, WINDOW_S),
    ("v0_5_23_consecutive", ["--standin-version", "0.5.23", "--mm-feature-transport", "cuda_ipc",
                             "--standin-batch-ms", "12", "--standin-prefill-ms", "60", "--standin-request-rate",
                             "25", *THREADS], CONSECUTIVE, "chrometrace", 1000, WINDOW_S),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def events_span(out: Path, fmt: str, t0: float, t1: float) -> tuple[float, float]:
    """Unix times of the first and last sample: chrometrace `ts` is microseconds since py-spy started."""
    if fmt != "chrometrace":
        return t0, t1
    ts = [e["ts"] for e in json.loads(out.read_text())]
    return t0 + min(ts) / 1e6, t0 + max(ts) / 1e6


def record(name: str, args: list[str], env_extra: dict[str, str], fmt: str, rate: int, seconds: int) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env.update(env_extra)
    proc = subprocess.Popen([sys.executable, str(STANDIN), "--port", str(port), *args], stdout=subprocess.PIPE,
                            env=env)
    try:
        pid = json.loads(proc.stdout.readline())["pids"][0]
        time.sleep(3)
        ext = "chrometrace.json" if fmt == "chrometrace" else "raw.txt"
        out = HERE / f"{name}.{ext}"
        t0 = time.time()
        subprocess.run([PYSPY, "record", "-p", str(pid), "-o", str(out), "-f", fmt, "-r", str(rate), "-d",
                        str(seconds), "--nonblocking", "--idle"], check=True, capture_output=True)
        t1 = time.time()
        start, end = events_span(out, fmt, t0, t1)
        time.sleep(0.3)
        url = f"http://127.0.0.1:{port}/standin/accounting?start={start}&end={end}&durations=1"
        with urllib.request.urlopen(url, timeout=5) as r:
            acct = json.loads(r.read())
        if fmt == "chrometrace":
            # One event per line keeps diffs of re-recordings readable.
            events = json.loads(out.read_text())
            out.write_text("[\n" + ",\n".join(json.dumps(e, sort_keys=True) for e in events) + "\n]\n")
        truth = {"case": {"args": args, "env": env_extra, "format": fmt, "rate_hz": rate, "seconds": seconds},
                 "version": acct["version"], "loop": acct["loop"], "shape": acct["shape"],
                 "window": {"start": start, "end": end}, **acct["ranks"][0]}
        (HERE / f"{name}.{fmt}.truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
        print(f"{name}.{fmt}: {truth['iterations']} iterations, mean {truth['loop_mean_seconds'] * 1e3:.1f} ms, "
              f"p95 {truth['loop_p95_seconds'] * 1e3:.1f} ms, batches {truth['batches']}", flush=True)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    wanted = set(sys.argv[1:])
    for case in CASES:
        if not wanted or case[0] in wanted:
            record(*case)
