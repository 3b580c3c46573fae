"""Decision quality of the canary gate at the shipped defaults, against Flagger, Argo Rollouts, Kayenta
and an OME-style worst-series threshold, on the same simulated windows.

What is simulated (docs/canary-analysis.md explains the gate itself):
- the cadence of a real fleet at the API defaults (operator/vlm_operator/api/v1alpha1.py): each sidecar records
  a 5 s window every 15 s (telemetry.duration / interval, TP 1), the gate looks once a minute
  (analysis.interval 1m) for at most 30 minutes (maxDuration), one step of one canary pod analysed
  for 5 minutes; policy from the API model (`GatePolicy.from_spec` when the gate has it);
- windows as sidecar `/windows.json` entries (id, tp_rank, end, samples, loop_mean/p95, iterations,
  stage_shares, function_shares (inclusive), self_shares, exported_functions = watch list + top N by
  self time, stale, ttft/itl/throughput), turned into gate windows by `Window.from_sidecar` only;
- noise calibrated from recorded windows (bench/data/gate_noise.json, `--record-noise` re-records it
  with the real sidecar and py-spy against testing/vlm_testing/standin/sglang_standin.py): per-window log loop
  mean residuals (resampled), stage/function share spread (Dirichlet concentration), iterations,
  p95/mean, TTFT and ITL relative to the loop, throughput; what recording cannot give (pod-to-pod
  spread on real nodes, a long tail of small functions) is a declared parameter;
- baseline modes: Stable (3 long-running stable pods, each with its own offset) and Fresh (as many
  freshly started stable pods as canary pods, offsets drawn like the canary's).

Competitors judge the loop mean per window (the same signal), each at its strongest fair setting:
one knob is swept and the value with the best +5% detection at a false-rollback rate (A/A, 1% pod
spread, Stable) of at most 5% is used in the table; the output also gives each competitor's best
detection at the gate's own false-rollback rate, and the sweep is drawn in
bench/results/gate_tradeoff.png (with the gate's points, shipped policy and profiler signals only).
Runtime is the gate's: about 0.5 CPU-s per trial (30 decide() calls when undecided), so the default
200 trials per row take roughly 25 min of CPU on 2 workers; use --trials for a quicker look.

The front-end rows (`aa1fe up5fe fe15 fefast`: the sidecars sample the front end, telemetry.frontendRoles) draw
each role's per-window busy share from the `frontend` entry of the calibration, recorded with the real sidecar
on the stand-in's front end (`--record-frontend-noise`).

Run: python bench/gate_quality.py [--trials 200] [--jobs 2] [--record-noise] [--record-frontend-noise]
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import datetime as _dt
import hashlib
import inspect
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np
from scipy import stats as _st

from vlm_operator.analysis import gate
from vlm_operator.api import names

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "testing" / "vlm_testing" / "standin" / "sglang_standin.py"
NOISE_FILE = ROOT / "bench" / "data" / "gate_noise.json"
RESULTS = ROOT / "bench" / "results"

# =============================================================================================
# Recording the noise: the real sidecar (real py-spy) against the stand-in

# Two "revisions" of the stand-in: SGLang 0.5.10 with CUDA IPC transport, pool-handle cache off
# (stable) and on (the IPC-cache canary whose input stage shrinks).
RECORD_PHASES = (
    ("cache_off", ["--standin-version", "0.5.10", "--standin-seed", "1"],
     {"SGLANG_USE_CUDA_IPC_TRANSPORT": "1", "SGLANG_USE_IPC_POOL_HANDLE_CACHE": "0"}),
    ("cache_on", ["--standin-version", "0.5.10", "--standin-seed", "2"],
     {"SGLANG_USE_CUDA_IPC_TRANSPORT": "1", "SGLANG_USE_IPC_POOL_HANDLE_CACHE": "1"}),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _request_counters(text: str) -> dict[str, float]:
    """ttft / itl histogram sums and counts and generated tokens from the stand-in's /metrics."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, _, val = line.rpartition(" ")
        base = name.split("{", 1)[0]
        if base in (
            "sglang:time_to_first_token_seconds_sum",
            "sglang:time_to_first_token_seconds_count",
            "sglang:inter_token_latency_seconds_sum",
            "sglang:inter_token_latency_seconds_count",
            "sglang:generation_tokens_total",
        ):
            out[base] = float(val)
    return out


def record_phase(label: str, standin_args: list[str], env: dict[str, str], seconds: float,
                 interval: str, duration: str, tp: int, sidecar_env: dict[str, str] | None = None) -> dict:
    """Run stand-in + `python -m vlm_sidecar` for `seconds`; return the windows and request deltas."""
    port, sc_port = _free_port(), _free_port()
    # Other people edit the stand-in and the estimator while we record: note which versions ran.
    digest = hashlib.sha256(STANDIN.read_bytes()).hexdigest()[:12]
    est_digest = hashlib.sha256((ROOT / "sidecar" / "vlm_sidecar" / "estimators.py").read_bytes()).hexdigest()[:12]
    load_start = round(os.getloadavg()[0], 2)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    st_cmd = [sys.executable, str(STANDIN), "--port", str(port), "--enable-metrics", "--tp", str(tp),
              *standin_args]
    standin = subprocess.Popen(st_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**base_env, **env})
    sidecar = None
    try:
        info = json.loads(standin.stdout.readline() or b"{}")
        if "pids" not in info:
            raise RuntimeError(f"stand-in did not start: {standin.stderr.read().decode()[-2000:]}")
        time.sleep(1.5)
        sc_env = dict(base_env, VLM_SIDECAR_PORT=str(sc_port), VLM_PROFILE_INTERVAL=interval,
                      VLM_PROFILE_DURATION=duration, VLM_DISCOVERY_ROOT_PID=str(standin.pid),
                      VLM_SGLANG_METRICS_URL="", VLM_WINDOW_HISTORY="1000", POD_NAME=f"standin-{label}",
                      VLM_REVISION=label, **(sidecar_env or {}))
        sc_cmd = [sys.executable, "-m", "vlm_sidecar"]
        sidecar = subprocess.Popen(sc_cmd, env=sc_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # Request counters scraped once a second; per window the delta over [start, end] gives
        # its mean TTFT, ITL and token throughput (what a Prometheus rate() over the window gives).
        scrapes: list[tuple[float, dict[str, float]]] = []
        deadline = time.time() + seconds
        while time.time() < deadline:
            with contextlib.suppress(OSError):
                scrapes.append((time.time(), _request_counters(_get(f"http://127.0.0.1:{port}/metrics").decode())))
            time.sleep(1.0)
        windows = json.loads(_get(f"http://127.0.0.1:{sc_port}/windows.json"))
    finally:
        for p in (sidecar, standin):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def at(t: float) -> dict[str, float] | None:
        before = [s for ts, s in scrapes if ts <= t]
        return before[-1] if before else None

    for w in windows:
        a, b = at(w["start"]), at(w["end"])
        if not a or not b:
            continue
        d = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in b}
        span = max(1e-9, w["end"] - w["start"])
        n_ttft = d.get("sglang:time_to_first_token_seconds_count", 0.0)
        n_itl = d.get("sglang:inter_token_latency_seconds_count", 0.0)
        w["request_rate"] = n_ttft / span
        if n_ttft > 0:
            w["ttft_seconds"] = d["sglang:time_to_first_token_seconds_sum"] / n_ttft
        if n_itl > 0:
            w["itl_seconds"] = d["sglang:inter_token_latency_seconds_sum"] / n_itl
        w["throughput"] = d.get("sglang:generation_tokens_total", 0.0) / span
    return {"label": label, "standin_cmd": " ".join(st_cmd[1:]).replace(str(ROOT) + "/", ""),
            "env": env, "windows": windows, "standin_sha256": digest, "estimators_sha256": est_digest,
            "load_average": [load_start, round(os.getloadavg()[0], 2)]}


def _git_state() -> dict:
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    return {
        "head": git("rev-parse", "--short", "HEAD"),
        "dirty": git("status", "--short", "--", "testing/vlm_testing/standin", "sidecar/vlm_sidecar").splitlines(),
    }


def record_noise(path: Path, seconds: float, interval: str = "6s", duration: str = "5s", tp: int = 1) -> dict:
    """Record every phase, derive the calibration, write it to `path`; returns it."""
    phases = [record_phase(lb, a, e, seconds, interval, duration, tp) for lb, a, e in RECORD_PHASES]
    cal = derive_noise(phases)
    if path.exists() and "frontend" in (old := json.loads(path.read_text())):
        cal["frontend"] = old["frontend"]  # recorded on its own (--record-frontend-noise)
    cal["recorded"] = {
        "command": f"python bench/gate_quality.py --record-noise --record-seconds {seconds:g}",
        "sidecar": f"python -m vlm_sidecar (VLM_PROFILE_INTERVAL={interval}, VLM_PROFILE_DURATION={duration}, "
                   "rate 1000 Hz, real py-spy, default watch list and top N)",
        "phases": [{"label": p["label"], "standin": p["standin_cmd"], "env": p["env"],
                    "windows": len(p["windows"]), "standin_sha256": p["standin_sha256"],
                    "estimators_sha256": p["estimators_sha256"], "load_average_start_end": p["load_average"]}
                   for p in phases],
        "seconds_per_phase": seconds,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "git": _git_state(),
        "host": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cal, indent=1, sort_keys=False) + "\n")
    # The raw windows next to it, for --replay style checks and for re-deriving.
    raw = path.with_name(path.stem + "_windows.json")
    raw.write_text(json.dumps({p["label"]: p["windows"] for p in phases}) + "\n")
    return cal


def rederive_noise(path: Path) -> dict:
    """Derive the calibration again from the raw windows saved next to it, keeping how they were recorded."""
    raw = json.loads(path.with_name(path.stem + "_windows.json").read_text())
    old = json.loads(path.read_text()) if path.exists() else {}
    cal = derive_noise([{"label": k, "windows": v} for k, v in raw.items()])
    cal["recorded"] = old.get("recorded", {})
    if "frontend" in old:
        cal["frontend"] = old["frontend"]
    path.write_text(json.dumps(cal, indent=1) + "\n")
    return cal


# The front end at the stand-in's defaults (testing/vlm_testing/standin/frontend.py: 20 requests/s of 2 images, 5 ms of
# preprocessing per image on 2 pool workers, a tokenizing asyncio loop, a detokenizer), every role sampled at
# the sidecar's front-end defaults (250 Hz for the first 2 s of each window).
FRONTEND_PHASE = ("frontend", ["--standin-version", "0.5.23", "--standin-frontend", "--standin-seed", "3"], {})
FRONTEND_ROLES = names.FRONTEND_ROLES


def record_frontend_noise(path: Path, seconds: float, interval: str = "6s", duration: str = "5s") -> dict:
    """Record the front end's per-window busy shares with the real sidecar; stored as `frontend` in `path`."""
    label, args, env = FRONTEND_PHASE
    ph = record_phase(label, args, env, seconds, interval, duration, 1,
                      sidecar_env={"VLM_FRONTEND_ROLES": ",".join(FRONTEND_ROLES)})
    cal = json.loads(path.read_text())
    cal["frontend"] = derive_frontend(ph["windows"])
    cal["frontend"]["recorded"] = {
        "command": f"python bench/gate_quality.py --record-frontend-noise --record-seconds {seconds:g}",
        "standin": ph["standin_cmd"], "sidecar": f"python -m vlm_sidecar (VLM_PROFILE_INTERVAL={interval}, "
        f"VLM_PROFILE_DURATION={duration}, VLM_FRONTEND_ROLES={','.join(FRONTEND_ROLES)}, front-end rate and "
        "duration at their defaults, real py-spy)", "windows": len(ph["windows"]),
        "standin_sha256": ph["standin_sha256"], "load_average_start_end": ph["load_average"],
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "git": _git_state(),
    }
    path.write_text(json.dumps(cal, indent=1, sort_keys=False) + "\n")
    return cal


def derive_frontend(windows: Sequence[dict]) -> dict:
    """Per role: the busy share scaled to the median request rate (what the gate compares), its mean and
    per-window residuals; the request rate's log spread (pure)."""
    ws = [w for w in windows if w.get("result") == "ok" and (w.get("request_rate") or 0) > 0
          and isinstance((w.get("frontend") or {}).get("roles"), dict)]
    if len(ws) < 5:
        raise ValueError(f"front end: only {len(ws)} usable windows")
    rates = np.array([w["request_rate"] for w in ws])
    ref = float(np.median(rates))
    roles = {}
    for role in FRONTEND_ROLES:
        got = [(w["frontend"]["roles"][role]["busy_share"], w["request_rate"]) for w in ws
               if isinstance(w["frontend"]["roles"].get(role), dict)
               and w["frontend"]["roles"][role].get("busy_share") is not None]
        if len(got) < max(5, len(ws) // 2):
            continue
        scaled = np.array([b * ref / r for b, r in got])
        roles[role] = {"windows": len(got), "busy_mean": float(np.mean([b for b, _ in got])),
                       "scaled_mean": float(scaled.mean()), "scaled_sd": float(scaled.std(ddof=1)),
                       "scaled_residuals": [round(float(x), 5) for x in scaled - scaled.mean()]}
    lr = np.log(rates)
    return {"windows": len(ws), "request_rate": {"median": ref, "log_sd": float(lr.std(ddof=1))}, "roles": roles}


def _usable(ws: Sequence[dict]) -> list[dict]:
    return [w for w in ws if not w.get("stale") and not w.get("error") and (w.get("loop_mean_seconds") or 0) > 0]


def derive_noise(phases: Sequence[dict]) -> dict:
    """Per-window noise from recorded windows (pure; `phases` as record_phase returns them)."""
    out: dict = {"phases": {}}
    for p in phases:
        ws = _usable(p["windows"])
        if len(ws) < 3:
            raise ValueError(f"phase {p['label']}: only {len(ws)} usable windows")
        loop = np.log([w["loop_mean_seconds"] for w in ws])
        resid = loop - loop.mean()
        p95 = np.log([w["loop_p95_seconds"] / w["loop_mean_seconds"] for w in ws if w.get("loop_p95_seconds")])
        stages = sorted({k for w in ws for k in w["stage_shares"]})
        st = {k: np.array([w["stage_shares"].get(k, 0.0) for w in ws]) for k in stages}
        fns = sorted({k for w in ws for k in w.get("function_shares", {})})
        fn = {k: np.array([w["function_shares"].get(k, 0.0) for w in ws]) for k in fns}
        sf = {k: np.array([w.get("self_shares", {}).get(k, 0.0) for w in ws]) for k in fns}
        exported = {k: float(np.mean([k in w.get("function_shares", {}) for w in ws])) for k in fns}
        its = np.array([w.get("iterations") or 0 for w in ws], dtype=float)
        req = {}
        for key in ("ttft_seconds", "itl_seconds", "throughput"):
            vals = np.array([w[key] for w in ws if (w.get(key) or 0) > 0])
            if vals.size >= 3:
                lv = np.log(vals)
                req[key] = {"mean": float(np.exp(lv.mean())), "log_sd": float(lv.std(ddof=1))}
        d = float(np.diff(resid).std(ddof=1) / math.sqrt(2)) if resid.size > 2 else 0.0
        # Around a running median of +-3 windows: what is left once the slow part (the recording host's
        # own load, which rose during the recording) is taken out; the drift scenario models that part.
        med = np.array([np.median(loop[max(0, i - 3): i + 4]) for i in range(loop.size)])
        detrended = loop - med
        detrended -= detrended.mean()
        lag1 = float(np.corrcoef(resid[:-1], resid[1:])[0, 1]) if resid.size > 3 else 0.0
        # Request signals relative to the loop: what is left of their noise once the loop's is known.
        for key in ("ttft_seconds", "itl_seconds"):
            pairs = [(w[key], w["loop_mean_seconds"]) for w in ws if (w.get(key) or 0) > 0]
            if key in req and len(pairs) >= 3:
                lr = np.log([a / b for a, b in pairs])
                req[key]["over_loop"] = float(np.exp(lr.mean()))
                req[key]["over_loop_log_sd"] = float(lr.std(ddof=1))
        # Dirichlet concentration that reproduces the stage shares' window-to-window spread.
        conc = [float(st[k].mean() * (1 - st[k].mean()) / st[k].var(ddof=1) - 1)
                for k in stages if st[k].mean() > 0.02 and st[k].var(ddof=1) > 1e-10]
        out["phases"][p["label"]] = {
            "windows": len(ws),
            "stale_or_error": len(p["windows"]) - len(ws),
            "loop_mean_seconds": float(np.exp(loop.mean())),
            "loop_log_sd": float(resid.std(ddof=1)),
            "loop_log_sd_successive": d,  # from successive differences: robust to a slow trend
            "loop_log_residuals": [round(float(x), 5) for x in resid],
            "loop_log_sd_detrended": float(detrended.std(ddof=1)),
            "loop_log_residuals_detrended": [round(float(x), 5) for x in detrended],
            "loop_log_kurtosis_excess": float(((resid / resid.std()) ** 4).mean() - 3),
            "loop_log_lag1_autocorr": lag1,
            "share_concentration": float(np.median(conc)) if conc else None,
            "p95_over_mean": float(np.exp(p95.mean())) if p95.size else None,
            "p95_over_mean_log_sd": float(p95.std(ddof=1)) if p95.size > 2 else None,
            "iterations_mean": float(its.mean()),
            "iterations_sd": float(its.std(ddof=1)),
            "samples_mean": float(np.mean([w.get("samples") or 0 for w in ws])),
            "stage_share_mean": {k: float(v.mean()) for k, v in st.items()},
            "stage_share_sd": {k: float(v.std(ddof=1)) for k, v in st.items()},
            "function_share_mean": {k: float(v.mean()) for k, v in fn.items()},
            "function_share_sd": {k: float(v.std(ddof=1)) for k, v in fn.items()},
            "self_share_mean": {k: float(v.mean()) for k, v in sf.items()},
            "exported_fraction": exported,
            "request": req,
        }
    return out



# =============================================================================================
# The calibrated noise


@dataclass(frozen=True)
class Noise:
    """What the simulator draws from; built from bench/data/gate_noise.json by `load_noise`."""

    loop_s: float  # stable loop mean (cache off phase)
    loop_resid: tuple[float, ...]  # recorded per-window log residuals around the pod's mean
    loop_sd: float
    share_conc: float  # Dirichlet concentration of per-window shares
    self_shares: dict[str, float]  # recorded self-time shares of the stable phase
    stage_shares: dict[str, float]
    input_speedup: float  # fraction of the stable loop time the IPC cache removes from input processing
    iterations_cv: float
    p95_ratio: float
    p95_sd: float
    ttft_over_loop: float
    ttft_sd: float
    itl_over_loop: float
    itl_sd: float
    throughput: float
    throughput_sd: float
    source: str = ""
    # The front end (`frontend` in the calibration, --record-frontend-noise): per role its busy share at the
    # median request rate and the recorded per-window residuals; the request rate and its per-window log sd.
    frontend: tuple[tuple[str, float, tuple[float, ...]], ...] = ()
    request_rate: float = 0.0
    request_rate_log_sd: float = 0.0


def load_noise(path: Path = NOISE_FILE, *, detrended: bool = True, scale: float = 1.0,
               phase: str | None = None) -> Noise:
    """The calibration file -> Noise.

    phase: the recorded stable (cache off) phase to draw from; default the quietest one (smallest
    per-window spread): the recording host is a shared 2-core box whose contention only adds noise,
    so the quietest recording is the closest to a dedicated node. Its cache-on partner gives the
    IPC-cache speed-up. `detrended`: residuals around a running median (the host's slow load changes
    removed) instead of the phase mean; `scale` multiplies them.
    """
    cal = json.loads(Path(path).read_text())
    phases = cal["phases"]
    offs = [k for k in phases if "off" in k] or list(phases)
    sd_key = "loop_log_sd_detrended" if detrended else "loop_log_sd"
    label = phase or min(offs, key=lambda k: phases[k].get(sd_key, phases[k]["loop_log_sd"]))
    off = phases[label]
    on = phases.get(label.replace("off", "on")) if "off" in label else None
    key = "loop_log_residuals_detrended" if detrended else "loop_log_residuals"
    resid = tuple(scale * r for r in off.get(key, off["loop_log_residuals"]))
    req = off.get("request", {})
    speedup = 0.0
    if on is not None:
        # The other stages keep their time per iteration: (1 - p_off) L_off = (1 - p_on) L_on. From shares
        # alone, so a phase recorded on a busier host does not pass its slowness off as the cache's effect.
        p_off = off["stage_share_mean"].get("process_input_requests", 0.0)
        p_on = on["stage_share_mean"].get("process_input_requests", 0.0)
        speedup = max(0.0, 1 - (1 - p_off) / (1 - p_on)) if p_on < 1 else 0.0
    return Noise(
        loop_s=off["loop_mean_seconds"],
        loop_resid=resid,
        loop_sd=float(np.std(resid, ddof=1)),
        share_conc=off.get("share_concentration") or 3000.0,
        self_shares=dict(off["self_share_mean"]),
        stage_shares=dict(off["stage_share_mean"]),
        input_speedup=speedup,
        iterations_cv=off["iterations_sd"] / max(1.0, off["iterations_mean"]),
        p95_ratio=off.get("p95_over_mean") or 1.6,
        p95_sd=off.get("p95_over_mean_log_sd") or 0.04,
        ttft_over_loop=req.get("ttft_seconds", {}).get("over_loop", 3.0),
        ttft_sd=req.get("ttft_seconds", {}).get("over_loop_log_sd", 0.1),
        itl_over_loop=req.get("itl_seconds", {}).get("over_loop", 1.0),
        itl_sd=req.get("itl_seconds", {}).get("over_loop_log_sd", 0.03),
        throughput=req.get("throughput", {}).get("mean", 1000.0),
        throughput_sd=req.get("throughput", {}).get("log_sd", 0.05),
        source=f"{path}:{label}",
        frontend=tuple((role, r["scaled_mean"], tuple(r["scaled_residuals"]))
                       for role, r in cal.get("frontend", {}).get("roles", {}).items()),
        request_rate=cal.get("frontend", {}).get("request_rate", {}).get("median", 0.0),
        request_rate_log_sd=cal.get("frontend", {}).get("request_rate", {}).get("log_sd", 0.0),
    )


# =============================================================================================
# The scheduler's call tree and its windows

STAGE_NAMES = names.LOOP_STAGES
WATCH = names.DEFAULT_WATCH_FUNCTIONS  # api.TelemetrySpec default
TOP_N = 10  # sidecar default
LOOP = "event_loop_overlap"
# (name, parent). Self times come from the recording where the stand-in has the frame; the rest is
# the long tail of small helpers a real scheduler has (the stand-in has few), which makes the top-N
# cut, and with it the exported set, churn from window to window.
TREE: tuple[tuple[str, str | None], ...] = (
    (LOOP, None),
    ("recv_requests", LOOP),
    ("_gap", "recv_requests"),
    ("recv_pyobj", "recv_requests"),
    ("process_input_requests", LOOP),
    ("handle_generate_request", "process_input_requests"),
    ("reconstruct_on_target_device", "handle_generate_request"),
    ("reconstruct", "reconstruct_on_target_device"),
    ("hash_feature", "handle_generate_request"),
    ("_hash_bytes", "hash_feature"),
    ("get_next_batch_to_run", LOOP),
    ("_get_new_batch_prefill", "get_next_batch_to_run"),
    ("run_batch", LOOP),
    ("forward_batch_generation", "run_batch"),
    ("_budget", "run_batch"),
    ("process_batch_result", LOOP),
    ("_observe", "process_batch_result"),
    ("stream_output", "process_batch_result"),
    ("_publish", LOOP),
    ("check_memory", LOOP),
    ("update_running_batch", "get_next_batch_to_run"),
    ("tree_cache_match", "get_next_batch_to_run"),
    ("detokenize_step", "process_batch_result"),
    ("log_stats", LOOP),
)
# Tail self-time shares (assumed: a few tenths of a percent each, around the top-10 cut).
TAIL_SELF = {
    "recv_pyobj": 0.004, "handle_generate_request": 0.003, "_hash_bytes": 0.002,
    "_get_new_batch_prefill": 0.004, "forward_batch_generation": 0.006, "stream_output": 0.003,
    "check_memory": 0.0015, "update_running_batch": 0.0025, "tree_cache_match": 0.002,
    "detokenize_step": 0.002, "log_stats": 0.001,
}
WRAPPER = "wrapper"


def _stage_of(name: str, parents: dict[str, str | None]) -> str:
    n: str | None = name
    while n is not None:
        if n in STAGE_NAMES:
            return n
        n = parents[n]
    return "other"


@dataclass(frozen=True)
class Tree:
    names: tuple[str, ...]
    self_frac: np.ndarray  # per-iteration self time, fraction of the stable loop time
    ancestors: np.ndarray  # [node, function] 1 where the function is on the node's stack
    stage_idx: np.ndarray  # node -> index into STAGES_OUT
    funcs: tuple[str, ...]


STAGES_OUT = (*STAGE_NAMES, "idle", "other")


def build_tree(noise: Noise, *, wrapper: bool) -> Tree:
    """The call tree with self-time fractions calibrated from the recording (stable = cache off)."""
    tree = list(TREE)
    if wrapper:
        # A decorator's `wrapper` frame around the loop body: every stage runs under it.
        tree = [(n, WRAPPER if p == LOOP else p) for n, p in tree]
        tree.insert(1, (WRAPPER, LOOP))
    parents = dict(tree)
    names = tuple(n for n, _ in tree)
    rec = noise.self_shares
    self_frac = {}
    for n in names:
        self_frac[n] = TAIL_SELF.get(n, rec.get(n, 0.0))
    self_frac[WRAPPER] = 0.006 if wrapper else 0.0  # the decorator's own work: usually in the top N
    self_frac[LOOP] = max(rec.get(LOOP, 0.0), 0.0005)
    # Stages: what the recording saw in each stage, less the tail we put under it (stage totals kept).
    for st in STAGE_NAMES:
        under = [n for n in names if n != st and _stage_of(n, parents) == st]
        total = noise.stage_shares.get(st, 0.0)
        self_frac[st] = max(0.0005, total - sum(self_frac[n] for n in under))
    vec = np.array([self_frac[n] for n in names])
    vec = vec / vec.sum()
    funcs = names
    anc = np.zeros((len(names), len(funcs)))
    for i, n in enumerate(names):
        m: str | None = n
        while m is not None:
            anc[i, funcs.index(m)] = 1.0
            m = parents[m]
    stage_idx = np.array([STAGES_OUT.index(_stage_of(n, parents)) for n in names])
    return Tree(names, vec, anc, stage_idx, funcs)


# =============================================================================================
# Scenarios


@dataclass(frozen=True)
class Scenario:
    """What the canary changes, and the fleet it runs in. Effects are fractions of the stable loop."""

    key: str
    label: str
    pod_sd: float = 0.01  # sd of a pod's log offset (node, traffic mix); not recordable on one host
    add_self: tuple[tuple[str, float], ...] = ()  # extra self time in a function (regression)
    scale_all: float = 1.0  # every function faster/slower by this factor (uniform change)
    input_speedup: bool = False  # the IPC cache: reconstruct time shrinks to the recorded cache-on level
    wrapper: bool = False
    ttft_factor: float = 1.0
    drift_per_min: float = 0.0  # shared load ramp (log per minute), both revisions
    expect: str = "promote"  # promote (a rollback is false) | rollback (a rollback is a detection)
    truth_function: str | None = None
    truth_stage: str | None = None
    frontend: bool = False  # the sidecars sample the front end (telemetry.frontendRoles): its family is gated
    frontend_add: tuple[tuple[str, float], ...] = ()  # canary: points of busy share added to a role
    frontend_scale: float = 1.0  # canary: every role's work per request scaled


def scenarios() -> list[Scenario]:
    rc, pi = "reconstruct_on_target_device", "process_input_requests"
    out = [Scenario(f"aa{int(s * 100)}", f"A/A, pod spread {s:.0%}", pod_sd=s) for s in (0.0, 0.01, 0.02, 0.03)]
    out += [
        Scenario(f"up{int(x * 100)}", f"loop +{x:.0%} ({rc})", add_self=((rc, x),), expect="rollback",
                 truth_function=rc, truth_stage=pi)
        for x in (0.02, 0.05, 0.10)
    ]
    out += [Scenario(f"down{int(x * 100)}", f"loop -{x:.0%} (all stages)", scale_all=1 - x) for x in (0.05, 0.10)]
    out += [
        Scenario("ipc", "input stage faster (IPC cache on)", input_speedup=True),
        Scenario("wrapper", "+5% in hash_feature under `wrapper`, churning export", wrapper=True,
                 add_self=(("hash_feature", 0.05),), expect="rollback", truth_function="hash_feature",
                 truth_stage=pi),
        Scenario("unwatched", "+5% in unwatched _hash_bytes (below top-N on stable)",
                 add_self=(("_hash_bytes", 0.05),), expect="rollback", truth_function="_hash_bytes",
                 truth_stage=pi),
        Scenario("ttft", "TTFT +20%, loop unchanged", ttft_factor=1.2, expect="rollback"),
        Scenario("drift", "A/A, load drift +2%/min (both)", drift_per_min=0.02),
        # Front-end sampling on (off by default): what its family costs and buys at its default margin.
        Scenario("aa1fe", "A/A, pod spread 1%, front end sampled", frontend=True),
        Scenario("up5fe", f"loop +5% ({rc}), front end sampled", add_self=((rc, 0.05),), frontend=True,
                 expect="rollback", truth_function=rc, truth_stage=pi),
        Scenario("fe15", "image pool +15 points busy, loop unchanged, front end sampled", frontend=True,
                 frontend_add=(("mm_processor", 0.15),), expect="rollback"),
        Scenario("fefast", "front end 2x faster, front end sampled", frontend=True, frontend_scale=0.5),
    ]
    return out


@dataclass(frozen=True)
class Cadence:
    """At the API defaults; see `cadence_from_api`."""

    window_s: float = 5.0
    every_s: float = 15.0
    interval_s: float = 60.0
    max_duration_s: float = 1800.0
    step_s: float = 300.0
    stable_pods: int = 3
    canary_pods: int = 1
    rate_hz: int = 1000


def cadence_from_api() -> Cadence:
    from vlm_operator.api import v1alpha1 as api
    from vlm_operator.api.units import parse_duration

    spec = api.parse_spec({"model": {"path": "m"}, "rollout": {}})
    a, t = spec.rollout.analysis, spec.telemetry
    return Cadence(window_s=parse_duration(t.duration), every_s=parse_duration(t.interval),
                   interval_s=parse_duration(a.interval), max_duration_s=parse_duration(a.max_duration),
                   step_s=parse_duration(spec.rollout.schedule(spec.replicas)[0].analysis),
                   canary_pods=spec.rollout.schedule(spec.replicas)[0].replicas, rate_hz=t.rate)


def make_policy() -> gate.GatePolicy:
    """The shipped policy: from the API model's defaults, through the gate's own mapping if it has one."""
    from vlm_operator.api import v1alpha1 as api

    spec = api.parse_spec({"model": {"path": "m"}, "rollout": {}})
    from_spec = getattr(gate.GatePolicy, "from_spec", None)
    if from_spec is not None:
        for arg in (spec, spec.rollout, spec.rollout.analysis):
            try:
                return from_spec(arg)
            except (TypeError, AttributeError):
                continue
    from vlm_operator.api.units import parse_duration

    a = spec.rollout.analysis
    m = a.max_regression.model_dump()
    margins = {k: v / 100 for k, v in m.items() if k in gate.SIGNALS}
    return gate.GatePolicy(
        max_regression=margins, confidence=a.confidence, min_samples=a.min_samples,
        max_duration_s=parse_duration(a.max_duration), on_inconclusive=a.on_inconclusive,
        interval_s=parse_duration(a.interval),
        stale_after_s=max(3 * parse_duration(spec.telemetry.interval), 60.0),
    )


def _resid(rng: np.random.Generator, noise: Noise, size: int) -> np.ndarray:
    """Smoothed bootstrap of the recorded per-window log residuals."""
    r = np.asarray(noise.loop_resid)
    return rng.choice(r, size) + rng.normal(0.0, 0.25 * noise.loop_sd, size)


def canary_self(tree: Tree, noise: Noise, sc: Scenario, canary: bool) -> np.ndarray:
    """Per-iteration self time of every node, in units of the stable loop time."""
    t = tree.self_frac.copy()
    if not canary:
        return t
    t = t * sc.scale_all
    if sc.input_speedup:
        i = tree.names.index("reconstruct")
        t[i] = max(0.0, t[i] - noise.input_speedup)
    for name, extra in sc.add_self:
        t[tree.names.index(name)] += extra
    return t


def pod_windows(rng: np.random.Generator, noise: Noise, tree: Tree, sc: Scenario, cad: Cadence, *,
                canary: bool, offset: float, t0: float, t_end: float, load: Callable[[np.ndarray], np.ndarray],
                pod: str, revision: str) -> list[dict]:
    """All /windows.json entries one pod's sidecar publishes between t0 and t_end."""
    phase = rng.uniform(0, cad.every_s)
    ends = np.arange(t0 + phase + cad.window_s, t_end + 1e-9, cad.every_s)
    n = len(ends)
    if n == 0:
        return []
    self_t = canary_self(tree, noise, sc, canary)
    loop_factor = self_t.sum()
    mean_shares = np.maximum(self_t, 1e-6) / loop_factor  # Dirichlet needs every weight > 0
    shares = rng.dirichlet(mean_shares * noise.share_conc, n)  # [window, node]
    incl = shares @ tree.ancestors  # inclusive share per function
    stage = np.zeros((n, len(STAGES_OUT)))
    np.add.at(stage.T, tree.stage_idx, shares.T)
    lvl = offset + load(ends - t0) + _resid(rng, noise, n)
    loop = noise.loop_s * loop_factor * np.exp(lvl)
    p95 = loop * noise.p95_ratio * np.exp(rng.normal(0, noise.p95_sd, n))
    ttft = loop * noise.ttft_over_loop * (sc.ttft_factor if canary else 1.0) * np.exp(rng.normal(0, noise.ttft_sd, n))
    itl = loop * noise.itl_over_loop * np.exp(rng.normal(0, noise.itl_sd, n))
    thr = noise.throughput * np.exp(load(ends - t0) + rng.normal(0, noise.throughput_sd, n))
    iters = np.maximum(1, np.round(cad.window_s / loop * np.exp(rng.normal(0, noise.iterations_cv * 0.3, n))))
    fe = _frontend_windows(rng, noise, sc, canary=canary, offset=offset, lvl=load(ends - t0), n=n) if sc.frontend \
        else None
    out = []
    for k in range(n):
        self_k = shares[k]
        order = np.argsort(-self_k)
        top = [tree.funcs[j] for j in order[:TOP_N]]
        exported = list(dict.fromkeys([*WATCH, *top]))
        idx = [tree.funcs.index(f) for f in exported]
        left_out = np.delete(self_k, idx)  # the sidecar's bound for what it did not export
        out.append({
            "revision": revision, "pod": pod, "id": str(k), "tp_rank": 0,
            "start": float(ends[k] - cad.window_s), "end": float(ends[k]),
            "samples": int(cad.window_s * cad.rate_hz),
            "loop_mean_seconds": float(loop[k]), "loop_p50_seconds": float(loop[k] * 0.85),
            "loop_p95_seconds": float(p95[k]), "iterations": int(iters[k]),
            "stage_shares": {s: float(stage[k, j]) for j, s in enumerate(STAGES_OUT)},
            "function_shares": {f: float(incl[k, j]) for f, j in zip(exported, idx, strict=True)},
            "self_shares": {f: float(self_k[j]) for f, j in zip(exported, idx, strict=True)},
            "exported_functions": exported,
            "unexported_self_share_max": float(left_out.max()) if left_out.size else 0.0,
            "top_function": tree.funcs[int(order[0])],
            "stale": False, "error": None, "result": "ok",
            "ttft_seconds": float(ttft[k]), "itl_seconds": float(itl[k]), "throughput": float(thr[k]),
            **(fe[k] if fe else {}),
        })
    return out


def _frontend_windows(rng: np.random.Generator, noise: Noise, sc: Scenario, *, canary: bool, offset: float,
                      lvl: np.ndarray, n: int) -> list[dict]:
    """Per window: the request rate (the recorded rate, moved by the shared load, with its recorded spread)
    and each role's busy share: its recorded busy at the median rate, slower on a slower pod (the pod's
    offset), changed on the canary as the scenario says, plus a recorded residual (resampled), then scaled
    to the window's own rate, capped at 1."""
    if not noise.frontend or noise.request_rate <= 0:
        raise ValueError("the calibration has no front end: run python bench/gate_quality.py --record-frontend-noise")
    rate = noise.request_rate * np.exp(lvl + rng.normal(0.0, noise.request_rate_log_sd, n))
    add = dict(sc.frontend_add) if canary else {}
    roles = {}
    for role, busy, resid in noise.frontend:
        per_req = busy * math.exp(offset) * (sc.frontend_scale if canary else 1.0) + add.get(role, 0.0)
        at_ref = per_req + rng.choice(np.asarray(resid), n)
        roles[role] = np.clip(at_ref * rate / noise.request_rate, 0.0, 1.0)
    return [{"request_rate": float(rate[k]),
             "frontend": {"roles": {role: {"busy_share": float(v[k]), "function_shares": {}, "self_shares": {}}
                                    for role, v in roles.items()}}} for k in range(n)]


def simulate(rng: np.random.Generator, noise: Noise, sc: Scenario, cad: Cadence, mode: str,
             t0: float = 1_000_000.0) -> tuple[list[dict], list[dict], float, list[dict]]:
    """(baseline windows, canary windows, the stable dashboard's loop mean, the long-running stable pods'
    windows in Fresh mode (else empty)) of one trial."""
    tree_b = build_tree(noise, wrapper=sc.wrapper)
    # Pods keep delivering windows past maxDuration from the step's start: the gate's clock starts at the
    # canary's first window, so its last look comes up to one analysis interval later, and it must find
    # fresh windows there (windows that stopped at t0 + maxDuration read as a stale profiler at that look,
    # and every undecided trial became an onInconclusive rollback). The competitors' looks stop at maxDuration.
    t_end = t0 + cad.max_duration_s + 2 * cad.interval_s

    def load(dt: np.ndarray) -> np.ndarray:
        return sc.drift_per_min * np.asarray(dt) / 60.0

    n_base = cad.stable_pods if mode == "Stable" else cad.canary_pods
    base_off = rng.normal(0, sc.pod_sd, n_base)
    can_off = rng.normal(0, sc.pod_sd, cad.canary_pods)
    base, can = [], []
    for i, off in enumerate(base_off):
        base += pod_windows(rng, noise, tree_b, sc, cad, canary=False, offset=off, t0=t0, t_end=t_end,
                            load=load, pod=f"{'stable' if mode == 'Stable' else 'fresh'}-{i}", revision="stable")
    for i, off in enumerate(can_off):
        can += pod_windows(rng, noise, tree_b, sc, cad, canary=True, offset=off, t0=t0, t_end=t_end,
                           load=load, pod=f"canary-{i}", revision="canary")
    # A threshold set from the stable dashboard: the long-running stable fleet's mean (its pods' offsets).
    fleet = rng.normal(0, sc.pod_sd, cad.stable_pods) if mode == "Fresh" else base_off
    dashboard = noise.loop_s * float(np.mean(np.exp(fleet)))
    reference: list[dict] = []
    if mode == "Fresh":
        # The long-running stable pods still serve next to a fresh baseline: the gate may use their
        # windows to estimate how much pods differ (drawn last, so the other windows match Stable's draws).
        for i, off in enumerate(fleet):
            reference += pod_windows(rng, noise, tree_b, sc, cad, canary=False, offset=off, t0=t0, t_end=t_end,
                                     load=load, pod=f"stable-{i}", revision="stable")
    return base, can, dashboard, reference


# =============================================================================================
# The gate, driven as the operator drives it: one decide() per analysis interval


@dataclass(frozen=True)
class Outcome:
    verdict: str  # Promote | Rollback | Pause | Inconclusive (no terminal verdict in maxDuration)
    minute: float  # minutes from the step's start to the verdict
    reason: str = ""
    function: str | None = None
    stage: str | None = None


TERMINAL = ("Promote", "Rollback", "Pause")


def _takes(fn: Callable, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def run_gate(base: list[dict], can: list[dict], policy: gate.GatePolicy, cad: Cadence, t0: float,
             reference: list[dict] | None = None) -> Outcome:
    """decide() once per interval until a terminal verdict. `reference`: the stable pods' windows next
    to a fresh baseline, passed as `spread_reference` where the gate takes it."""
    def parse(ws: list[dict]) -> tuple[list[gate.Window], list[float]]:
        parsed = sorted((gate.Window.from_sidecar(w["revision"], w["pod"], w) for w in ws), key=lambda w: w.end)
        return parsed, [w.end for w in parsed]

    b, b_end = parse(base)
    c, c_end = parse(can)
    r, r_end = parse(reference or [])
    extra: dict = {}
    d = None
    use_ref = bool(r) and _takes(gate.decide, "spread_reference")
    # The step's clock, as the operator keeps it: from the canary's first fresh window after Ready (t0), which
    # the gate reports once and is handed back after; maxDuration counts from there (from t0 without one).
    keeps_clock = _takes(gate.decide, "data_started_at")
    clock = None
    i = 0
    while True:
        i += 1
        now = t0 + i * cad.interval_s
        if use_ref:
            extra["spread_reference"] = r[: bisect.bisect_right(r_end, now)]
        if keeps_clock:
            extra["data_started_at"] = clock
        d = gate.decide(b[: bisect.bisect_right(b_end, now)], c[: bisect.bisect_right(c_end, now)], policy,
                        started_at=t0, now=now, step_duration_s=cad.step_s, **extra)
        if clock is None:
            clock = getattr(d, "clock_started_at", None)
        if d.verdict in TERMINAL:
            return Outcome(d.verdict, i * cad.interval_s / 60, d.reason, d.regressed_function, d.regressed_stage)
        if now >= (clock if clock is not None else t0) + cad.max_duration_s - 1e-6:
            return Outcome("Inconclusive", i * cad.interval_s / 60, d.reason)


# =============================================================================================
# Competitors, on the loop mean per window


@dataclass(frozen=True)
class Series:
    """Per-interval aggregates of one trial that every competitor reads."""

    ratio: np.ndarray  # [interval] mean canary loop / mean baseline loop over that interval
    canary_max: np.ndarray  # [interval] worst canary window so far (cumulative max)
    kayenta: np.ndarray  # [interval, 3] MW lower CI, HL estimate, mean ratio (growing lookback)
    dashboard: float


def series(base: list[dict], can: list[dict], cad: Cadence, t0: float, dashboard: float,
           kayenta_conf: float) -> Series:
    looks = round(cad.max_duration_s / cad.interval_s)
    be = np.array([w["end"] for w in base])
    bv = np.array([w["loop_mean_seconds"] for w in base])
    ce = np.array([w["end"] for w in can])
    cv = np.array([w["loop_mean_seconds"] for w in can])
    ratio = np.full(looks, np.nan)
    cmax = np.full(looks, np.nan)
    kay = np.full((looks, 3), np.nan)
    step_looks = round(cad.step_s / cad.interval_s)
    for i in range(looks):
        lo, hi = t0 + i * cad.interval_s, t0 + (i + 1) * cad.interval_s
        bm = (be > lo) & (be <= hi)
        cm = (ce > lo) & (ce <= hi)
        if bm.any() and cm.any():
            ratio[i] = cv[cm].mean() / bv[bm].mean()
        c_all = cv[ce <= hi]
        cmax[i] = c_all.max() if c_all.size else np.nan
        if i < step_looks:
            kay[i] = mann_whitney_hl(cv[ce <= hi], bv[be <= hi], kayenta_conf)
    return Series(ratio, cmax, kay, dashboard)


def mann_whitney_hl(experiment: np.ndarray, control: np.ndarray, conf: float) -> tuple[float, float, float]:
    """Kayenta's MannWhitney.eval (an R wilcox.test port): two-sided CI at `conf` for the location shift
    experiment - control, its Hodges-Lehmann estimate, and mean(experiment) / mean(control).

    Normal approximation of the Walsh-difference order statistics (what R uses with ties or n >= 50;
    at the 20-120 windows here the exact and approximate bounds differ by at most one order statistic)."""
    x, y = np.asarray(experiment, float), np.asarray(control, float)
    n, m = x.size, y.size
    if n == 0 or m == 0:
        return (math.nan, math.nan, math.nan)
    d = np.sort((x[:, None] - y[None, :]).ravel())
    est = float(np.median(d))
    z = _st.norm.ppf(1 - (1 - conf) / 2)
    k = math.floor(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12))
    k = min(max(k, 0), d.size - 1)
    low, _high = float(d[k]), float(d[d.size - 1 - k])
    return (low, est, float(x.mean() / y.mean()))


def kayenta_classify(low: float, est: float, mean_ratio: float, *, tolerance: float = 0.25,
                     allowed_increase: float = 1.0) -> str:
    """NetflixACAJudge / MannWhitneyClassifier for a metric with direction `increase`: High when the CI's
    lower bound is above tolerance x |HL estimate| and the mean ratio is at least the allowed increase."""
    if any(math.isnan(v) for v in (low, est, mean_ratio)):
        return "Nodata"
    upper = tolerance * abs(est)
    return "High" if low > upper and mean_ratio >= allowed_increase else "Pass"


def kayenta_score(classes: Sequence[str]) -> float:
    """Score = percentage of metrics classified Pass (equal weights, one group)."""
    return 100.0 * sum(c == "Pass" for c in classes) / len(classes) if classes else 0.0


# Each competitor: (name, knob label, grid, strongest default-ish guess).
FLAGGER_THRESHOLD = 5
KAYENTA_CONF = 0.98
KAYENTA_PASS, KAYENTA_MARGINAL = 95.0, 75.0


def flagger(s: Series, limit: float, cad: Cadence, threshold: int = FLAGGER_THRESHOLD) -> tuple[str, float]:
    """Flagger: each interval one check (canary/primary loop ratio <= limit); a failed check does not
    advance the analysis; rollback once `threshold` checks failed, promote after step/interval passes."""
    need = round(cad.step_s / cad.interval_s)
    ok = failed = 0
    for i, r in enumerate(s.ratio):
        if not np.isnan(r) and r <= limit:
            ok += 1
        else:
            failed += 1  # no data fails the check, as in Flagger
        if failed >= threshold:
            return "Rollback", i + 1.0
        if ok >= need:
            return "Promote", i + 1.0
    return "Inconclusive", float(len(s.ratio))


def argo(s: Series, limit: float, cad: Cadence, failure_limit: int) -> tuple[str, float]:
    """Argo Rollouts AnalysisRun: count = step/interval measurements of the ratio, successCondition
    result <= limit; Failed once failures exceed failureLimit, else Successful after the count."""
    count = round(cad.step_s / cad.interval_s)
    failed = 0
    for i in range(count):
        r = s.ratio[i]
        if np.isnan(r) or r > limit:
            failed += 1
            if failed > failure_limit:
                return "Rollback", i + 1.0
    return "Promote", float(count)


def kayenta(s: Series, allowed_increase: float, cad: Cadence) -> tuple[str, float]:
    """Spinnaker canary stage with Kayenta: one judgement per interval over the step (growing lookback,
    no correction for the repeated looks); below marginal fails at once, the last must reach pass."""
    count = round(cad.step_s / cad.interval_s)
    for i in range(count):
        score = kayenta_score([kayenta_classify(*s.kayenta[i], allowed_increase=allowed_increase)])
        if score < KAYENTA_MARGINAL:
            return "Rollback", i + 1.0
    return ("Promote" if score >= KAYENTA_PASS else "Rollback"), float(count)


def ome(s: Series, over: float, cad: Cadence) -> tuple[str, float]:
    """OME-style worst series: the canary's worst window over the step against a fixed threshold
    (the stable dashboard's loop mean x (1 + over)); promote at the end of the step."""
    count = round(cad.step_s / cad.interval_s)
    limit = s.dashboard * (1 + over)
    for i in range(count):
        if s.canary_max[i] > limit:
            return "Rollback", i + 1.0
    return "Promote", float(count)


COMPETITORS: dict[str, tuple[str, tuple[float, ...], Callable[[Series, float, Cadence], tuple[str, float]]]] = {
    "Flagger (ratio <= max, threshold 5)": (
        "max ratio", tuple(1 + x / 100 for x in (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 15)), flagger),
    "Argo ratio, failureLimit 0": (
        "limit", tuple(1 + x / 100 for x in (2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 20)),
        lambda s, v, c: argo(s, v, c, 0)),
    "Argo ratio, failureLimit 2": (
        "limit", tuple(1 + x / 100 for x in (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 15)),
        lambda s, v, c: argo(s, v, c, 2)),
    "Kayenta MW 0.98, tol 25%": (
        "allowed increase", tuple(1 + x / 100 for x in (0, 1, 2, 3, 4, 5, 6, 8, 10, 12)), kayenta),
    "OME worst window": (
        "over dashboard", tuple(x / 100 for x in (5, 7.5, 10, 12.5, 15, 17.5, 20, 25, 30, 40)), ome),
}


# =============================================================================================
# The experiment

MODES = ("Stable", "Fresh")
T0 = 1_000_000.0


# The gate on the competitors' signal: only the profiler families (loop latency, stage time), as when
# SGLang's request metrics are not scraped. Run on the trade-off rows only (it doubles the gate's cost).
PROFILER_ONLY = "gate, profiler signals only"
FINAL_HALF = "gate, half the budget at the last look"
# The shipped gate promotes on a request signal (TTFT, ITL, throughput) before the last look only when its
# promotion bound excludes a regression of 2 margins; these variants promote on the estimate alone (the rule
# before 2026-12-03) or at 3 margins.
REQUEST_BOUND = {0.0: "gate, request signals on the estimate alone", 3.0: "gate, request bound at 3 margins"}
VARIANT_ROWS = ("aa1", "up2", "up5", "aa2", "ttft")


def variant_policies(policy: gate.GatePolicy) -> dict[str, gate.GatePolicy]:
    out = {}
    keep = {k: v for k, v in policy.max_regression.items() if k not in ("ttft", "itl", "throughput")}
    if keep != dict(policy.max_regression):
        out[PROFILER_ONLY] = replace(policy, max_regression=keep)
    have = {f.name for f in fields(policy)}
    if "final_alpha_share" in have:
        out[FINAL_HALF] = replace(policy, final_alpha_share=0.5)
    if "request_bound_factor" in have:
        for factor, name in REQUEST_BOUND.items():
            if policy.request_bound_factor != factor:
                out[name] = replace(policy, request_bound_factor=factor)
    return out


def _run_chunk(args: tuple) -> list[tuple]:
    """Worker: trials of one scenario and mode; every rule on the same windows."""
    sc, mode, trial_ids, seed, noise, cad, with_gate = args
    policy = make_policy()
    variants = variant_policies(policy) if sc.key in VARIANT_ROWS else {}
    out = []
    for trial in trial_ids:
        rng = np.random.default_rng([seed, trial, MODES.index(mode)])
        base, can, dash, ref = simulate(rng, noise, sc, cad, mode, T0)
        g = run_gate(base, can, policy, cad, T0, ref) if with_gate else None
        gv = {name: run_gate(base, can, pol, cad, T0, ref) for name, pol in variants.items()}
        s = series(base, can, cad, T0, dash, KAYENTA_CONF)
        comp = {name: [rule(s, v, cad) for v in grid] for name, (_k, grid, rule) in COMPETITORS.items()}
        out.append((g, comp, gv))
    return out


def _summary(outs: Sequence[tuple[str, float]]) -> dict:
    n = len(outs)
    return {
        "rollback": sum(v == "Rollback" for v, _ in outs) / n,
        "promote": sum(v == "Promote" for v, _ in outs) / n,
        "median_min": float(np.median([m for _, m in outs])),
    }


def summarize_gate(outs: Sequence[Outcome], sc: Scenario) -> dict:
    n = len(outs)
    rb = [o for o in outs if o.verdict == "Rollback"]
    evidence = [o for o in rb if o.reason != "MaxDurationReached"]
    res = {
        "rollback": len(rb) / n,
        "rollback_at_max": (len(rb) - len(evidence)) / n,
        "promote": sum(o.verdict == "Promote" for o in outs) / n,
        # Promotions the clock decided: at maxDuration (onInconclusive Promote), or, in the gate before
        # 2026-12-06, on the estimates at the last look (WithinMarginAtMaxDuration).
        "promote_last_look": sum(o.verdict == "Promote" and o.reason in ("WithinMarginAtMaxDuration",
                                                                         "MaxDurationReached") for o in outs) / n,
        "pause": sum(o.verdict in ("Pause", "Inconclusive") for o in outs) / n,
        "median_min": float(np.median([o.minute for o in outs])),
        "reasons": {r: sum(o.reason == r for o in rb) for r in sorted({o.reason for o in rb})},
        "named_function": None,
        "named_stage": None,
        "functions_named": {},
    }
    if evidence and sc.truth_function:
        res["named_function"] = sum(o.function == sc.truth_function for o in evidence) / len(evidence)
        res["functions_named"] = {f or "None": sum(o.function == f for o in evidence)
                                  for f in sorted({o.function for o in evidence}, key=str)}
    if evidence and sc.truth_stage:
        res["named_stage"] = sum(o.stage == sc.truth_stage for o in evidence) / len(evidence)
    return res


def run_all(noise: Noise, cad: Cadence, trials: int, seed: int, jobs: int,
            only: Sequence[str] | None = None) -> dict:
    scs = [s for s in scenarios() if not only or s.key in only]
    tasks = []
    for mode in MODES:
        for sc in scs:
            chunks = [list(range(trials))[i::jobs] for i in range(jobs)]
            tasks += [(sc, mode, ids, seed, noise, cad, True) for ids in chunks if ids]
    results: dict = {m: {} for m in MODES}
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            done = list(pool.map(_run_chunk, tasks))
    else:
        done = [_run_chunk(t) for t in tasks]
    merged: dict[tuple[str, str], list] = {}
    for task, out in zip(tasks, done, strict=True):
        merged.setdefault((task[1], task[0].key), []).extend(out)
    for (mode, key), outs in merged.items():
        sc = next(s for s in scs if s.key == key)
        comp = {}
        for name, (_k, grid, _r) in COMPETITORS.items():
            comp[name] = [_summary([o[1][name][j] for o in outs]) for j in range(len(grid))]
        gv = {name: summarize_gate([o[2][name] for o in outs], sc) for name in outs[0][2]}
        results[mode][key] = {"label": sc.label, "expect": sc.expect,
                              "gate": summarize_gate([o[0] for o in outs], sc), "competitors": comp,
                              "gate_variants": gv}
    return results


TARGET_FR = 0.05


def tune(results: dict, aa: str = "aa1", det: str = "up5", mode: str = "Stable",
         target: float = TARGET_FR) -> dict:
    """Per competitor, the knob with the best detection of `det` at a false-rollback rate on `aa` of at
    most `target`: its strongest fair setting at that operating point."""
    chosen = {}
    for name, (knob, grid, _r) in COMPETITORS.items():
        fr = [p["rollback"] for p in results[mode][aa]["competitors"][name]]
        dr = [p["rollback"] for p in results[mode][det]["competitors"][name]]
        ok = [j for j in range(len(grid)) if fr[j] <= target + 1e-12]
        j = max(ok, key=lambda j: (dr[j], -fr[j])) if ok else min(range(len(grid)), key=lambda j: fr[j])
        chosen[name] = {"index": j, "knob": knob, "value": grid[j], "fr": fr[j], "det": dr[j],
                        "meets_target": bool(ok), "target": target}
    return chosen


# =============================================================================================
# Output


def _p(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _knob(name: str, v: float) -> str:
    knob = COMPETITORS[name][0]
    return f"{knob} {v:.0%}" if knob == "over dashboard" else f"{knob} {v:.2f}"


def markdown(results: dict, chosen: dict, meta: dict) -> str:
    lines = ["# Canary gate decision quality at the shipped defaults\n",
             f"Configuration: {meta['config']}\n",
             f"Command: `{meta['command']}` ({meta['trials']} trials per row, seed {meta['seed']}; "
             f"{meta['seconds']:.0f} s wall on {meta['jobs']} workers)\n",
             f"Gate: `operator/vlm_operator/analysis/gate/` as of {meta['gate_state']}; policy {meta['policy']}\n",
             f"Noise: {meta['noise']}\n",
             "RB = rolled back within maxDuration (a false rollback in rows expecting promote, a detection in "
             "rows expecting rollback); (max) = of which by onInconclusive at maxDuration; (last look) = promotions "
             "the clock decided (at maxDuration: before 2026-12-06 on estimates within margin, since then only "
             "by onInconclusive Promote); med = median minutes "
             "from step start to the verdict (30 = none); fn/stage = right function / stage named, of the "
             "rollbacks on evidence. Competitors at their tuned setting (below), cells `RB% (med min)`.\n"]
    names = list(COMPETITORS)
    for mode in results:
        lines.append(f"\n## Baseline {mode}" + (" (3 long-running stable pods)" if mode == "Stable" else
                                                 " (1 freshly started stable pod per canary pod)") + "\n")
        head = "| scenario | expect | gate RB (max) | gate promote (last look) | gate med | fn named | stage named | " + \
            " | ".join(names) + " |"
        lines.append(head)
        lines.append("|" + "---|" * (7 + len(names)))
        for _key, r in results[mode].items():
            g = r["gate"]
            cells = [r["label"], r["expect"], f"{_p(g['rollback'])} ({_p(g['rollback_at_max'])})",
                     f"{_p(g['promote'])} ({_p(g.get('promote_last_look'))})", f"{g['median_min']:.0f}", _p(g["named_function"]), _p(g["named_stage"])]
            for n in names:
                p = r["competitors"][n][chosen[n]["index"]]
                cells.append(f"{_p(p['rollback'])} ({p['median_min']:.0f})")
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("\nGate variant on the trade-off rows (same windows): "
                 + "; ".join(f"{mode} {r['label']}: {name} RB {_p(v['rollback'])} ({_p(v['rollback_at_max'])}), "
                             f"promote {_p(v['promote'])}, med {v['median_min']:.0f}"
                             for mode in results for r in results[mode].values()
                             for name, v in r.get("gate_variants", {}).items()) + "\n")
    lines.append("\n## Competitor settings (tuned on Stable: A/A pod spread 1% vs loop +5%)\n")
    lines.append("| competitor | knob swept | chosen | A/A 1% FR | +5% detected | note |")
    lines.append("|---|---|---|---|---|---|")
    for n, c in chosen.items():
        note = "at or below the target FR" if c["meets_target"] else "no setting reaches the target FR; lowest FR shown"
        lines.append(f"| {n} | {c['knob']} | {_knob(n, c['value'])} | {_p(c['fr'])} | {_p(c['det'])} | {note} |")
    lines.append(f"\nTarget false-rollback rate: {_p(next(iter(chosen.values()))['target'])} on A/A 1% Stable.\n")
    lines.append("\nAt the gate's own false-rollback rate (best knob value with FR no higher than the gate's, "
                 "Stable, A/A 1% / +5%):\n")
    for label, g in gate_points(results).items():
        if not label.endswith("(Stable)"):
            continue
        cells = []
        for n in COMPETITORS:
            fr = [p["rollback"] for p in results["Stable"]["aa1"]["competitors"][n]]
            dr = [p["rollback"] for p in results["Stable"]["up5"]["competitors"][n]]
            ok = [d for f, d in zip(fr, dr, strict=True) if f <= g[0] + 1e-12]
            cells.append(f"{n} {_p(max(ok)) if ok else 'none that low'}")
        lines.append(f"- {label} at FR {_p(g[0])} detects {_p(g[1])}; competitors: " + "; ".join(cells))
    lines.append("\n## Trade-off curves (Stable, FR on A/A 1% / detection of +5%, per knob value)\n")
    for n, (knob, grid, _r) in COMPETITORS.items():
        fr = results["Stable"]["aa1"]["competitors"][n]
        dr = results["Stable"]["up5"]["competitors"][n]
        pts = ", ".join(f"{_knob(n, v).split(' ')[-1]}: {_p(a['rollback'])}/{_p(b['rollback'])}"
                        for v, a, b in zip(grid, fr, dr, strict=True))
        lines.append(f"- {n} ({knob}): {pts}")
    for label, (fr, dr) in gate_points(results).items():
        lines.append(f"- {label}: {_p(fr)}/{_p(dr)}")
    lines.append("\n## Gate rollback reasons and names\n")
    for mode in results:
        for _key, r in results[mode].items():
            g = r["gate"]
            if g["reasons"] or g["functions_named"]:
                lines.append(f"- {mode} / {r['label']}: reasons {g['reasons']}; functions named {g['functions_named']}")
    return "\n".join(lines) + "\n"


def gate_points(results: dict) -> dict[str, tuple[float, float]]:
    """label -> (FR on A/A 1%, detection of +5%) for the shipped gate and its variants, per mode."""
    out = {}
    for mode in results:
        if "aa1" not in results[mode] or "up5" not in results[mode]:
            continue
        a, d = results[mode]["aa1"], results[mode]["up5"]
        out[f"gate, shipped policy ({mode})"] = (a["gate"]["rollback"], d["gate"]["rollback"])
        for name in a.get("gate_variants", {}):
            out[f"{name} ({mode})"] = (a["gate_variants"][name]["rollback"], d["gate_variants"][name]["rollback"])
    return out


def plot(results: dict, chosen: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot (pip install matplotlib)", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    for n, (_knob_name, _grid, _r) in COMPETITORS.items():
        fr = [100 * p["rollback"] for p in results["Stable"]["aa1"]["competitors"][n]]
        dr = [100 * p["rollback"] for p in results["Stable"]["up5"]["competitors"][n]]
        (line,) = ax.plot(fr, dr, marker="o", ms=3, label=n)
        j = chosen[n]["index"]
        ax.plot([fr[j]], [dr[j]], marker="s", ms=8, mfc="none", color=line.get_color())
    markers = {"shipped policy (Stable)": ("*", "black"), "shipped policy (Fresh)": ("P", "black"),
               "profiler signals only (Stable)": ("*", "magenta"), "profiler signals only (Fresh)": ("P", "magenta")}
    for label, (fr, dr) in gate_points(results).items():
        marker, color = next((m for k, m in markers.items() if label.endswith(k)), ("X", "gray"))
        ax.plot([100 * fr], [100 * dr], marker=marker, ms=15, color=color, ls="none", label=label)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlim(-0.2, 100)
    ax.set_ylim(0, 101)
    ax.set_xlabel("false rollbacks, A/A with 1% pod spread (%)")
    ax.set_ylabel("+5% loop regressions rolled back within maxDuration (%)")
    ax.set_title("Canary rules at the shipped cadence (Stable baseline; squares: tuned setting)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _gate_state() -> str:
    where = Path(gate.__file__).resolve()
    if not where.is_relative_to(ROOT):
        return f"a copy at {where} (not the working tree's)"
    try:
        r = subprocess.run(["git", "diff", "--stat", "--", "operator/vlm_operator/gate", "operator/vlm_operator/analysis/window.py"], cwd=ROOT,
                           capture_output=True, text=True, timeout=10)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        stat = r.stdout.strip().splitlines()
        return f"HEAD {head}" + (f" + uncommitted ({stat[0].strip()})" if stat else " (clean)")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=200, help="trials per scenario and baseline mode")
    ap.add_argument("--seed", type=int, default=20260515)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (at most 2 on the shared box)")
    ap.add_argument("--noise", type=Path, default=NOISE_FILE, help="calibration JSON")
    ap.add_argument("--record-noise", action="store_true", help="re-record the calibration first (~7 min)")
    ap.add_argument("--record-seconds", type=float, default=180.0, help="recording time per stand-in phase")
    ap.add_argument("--record-frontend-noise", action="store_true",
                    help="record the front end's calibration (the `frontend` entry of --noise) first")
    ap.add_argument("--rederive-noise", action="store_true",
                    help="derive the calibration again from the recorded windows next to it (no recording)")
    ap.add_argument("--raw-residuals", action="store_true",
                    help="resample residuals around the phase mean (default: around a running median)")
    ap.add_argument("--phase", help="recorded phase to draw the noise from (default: the quietest cache-off one)")
    ap.add_argument("--noise-scale", type=float, default=1.0, help="multiply the per-window residuals")
    ap.add_argument("--only", nargs="*", help="scenario keys to run (aa1 and up5 are always run)")
    ap.add_argument("--canary-pods", type=int, default=None,
                    help="canary pods in the step (and fresh baseline pods) instead of the API default "
                         "(rollout.steps[].replicas: 1)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where gate_quality.md and the PNG go")
    ap.add_argument("--json", type=Path, default=ROOT / "out" / "gate_quality.json", help="every number, as JSON")
    args = ap.parse_args(argv)
    if args.record_frontend_noise:
        record_frontend_noise(args.noise, args.record_seconds)
    if args.record_noise:
        cal = record_noise(args.noise, args.record_seconds)
        print("recorded:", json.dumps(cal["recorded"], indent=1))
    elif args.rederive_noise:
        rederive_noise(args.noise)
    if args.trials <= 0:
        return 0
    noise = load_noise(args.noise, detrended=not args.raw_residuals, scale=args.noise_scale, phase=args.phase)
    cad = cadence_from_api()
    if args.canary_pods:
        cad = replace(cad, canary_pods=args.canary_pods)
    policy = make_policy()
    only = sorted(set(args.only) | {"aa1", "up5"}) if args.only else None
    gate_state = _gate_state()  # before the run: workers import the gate once, at the start
    t = time.perf_counter()
    results = run_all(noise, cad, args.trials, args.seed, max(1, args.jobs), only)
    seconds = time.perf_counter() - t
    chosen = tune(results)
    cal = json.loads(Path(args.noise).read_text())
    rec = cal.get("recorded", {})
    off = cal["phases"].get("cache_off", {})
    meta = {
        "config": (f"telemetry {cad.window_s:g} s windows every {cad.every_s:g} s (TP 1, {cad.rate_hz} Hz); analysis "
                   f"every {cad.interval_s:g} s, maxDuration {cad.max_duration_s / 60:g} min, one step of "
                   f"{cad.canary_pods} canary pod analysed {cad.step_s / 60:g} min; Stable baseline "
                   f"{cad.stable_pods} pods, Fresh {cad.canary_pods}; pod spread 1% unless the row says"),
        "command": "python bench/gate_quality.py" + (f" --trials {args.trials}" if args.trials != 200 else "")
        + (f" --only {' '.join(args.only)}" if args.only else "")
        + (f" --canary-pods {args.canary_pods}" if args.canary_pods else ""),
        "trials": args.trials, "seed": args.seed, "jobs": args.jobs, "seconds": seconds,
        "gate_state": gate_state,
        "policy": "margins " + ", ".join(f"{k} {v:g}" for k, v in policy.max_regression.items())
        + f", confidence {policy.confidence}, minSamples {policy.min_samples}, onInconclusive {policy.on_inconclusive}",
        "noise": (f"{Path(args.noise).relative_to(ROOT) if Path(args.noise).is_relative_to(ROOT) else args.noise}, "
                  f"recorded {rec.get('date', '?')} at git {rec.get('git', {}).get('head', '?')} "
                  f"({'dirty stand-in/sidecar' if rec.get('git', {}).get('dirty') else 'clean'}): stable loop "
                  f"{noise.loop_s * 1e3:.1f} ms, per-window log sd {noise.loop_sd:.3f} "
                  f"({len(noise.loop_resid)} windows), share concentration {noise.share_conc:.0f}, "
                  f"{off.get('iterations_mean', 0):.0f} iterations/window, IPC cache removes "
                  f"{noise.input_speedup:.1%} of the loop"),
    }
    md = markdown(results, chosen, meta)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gate_quality.md").write_text(md)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(
        {"meta": meta, "chosen": chosen, "results": results, "noise": asdict(noise) | {"loop_resid": len(noise.loop_resid)}},
        indent=1, default=str))
    if plot(results, chosen, args.out / "gate_tradeoff.png"):
        print(f"wrote {args.out / 'gate_tradeoff.png'}")
    print(f"{seconds:.0f} s for the trials")
    return 0


if __name__ == "__main__":
    sys.exit(main())
