"""Shared by tests (moved out of tests/unit/operator/analysis/test_gate.py, so no test imports another test module)."""

import math
import random

STAGES = {
    "recv_requests": 0.04,
    "process_input_requests": 0.13,
    "get_next_batch_to_run": 0.06,
    "run_batch": 0.55,
    "process_batch_result": 0.12,
    "idle": 0.05,
    "other": 0.05,
}


def shares(extra: float) -> tuple[dict, dict]:
    """Stage and inclusive function shares when input processing costs `extra` more loop time."""
    t = dict(STAGES)
    t["process_input_requests"] += extra
    total = sum(t.values())
    stages = {k: v / total for k, v in t.items()}
    pi = stages["process_input_requests"]
    functions = {
        "event_loop_overlap": 1 - stages["idle"],
        "process_input_requests": pi,
        "handle_generate_request": 0.11 / total + extra / total,
        "reconstruct_on_target_device": 0.002 / total + extra / total,
        "hash_feature": 0.05 / total,
        "run_batch": stages["run_batch"],
        "forward_batch_generation": 0.5 / total,
    }
    return stages, functions


T0 = 1_800_000_000.0


EVERY = 15.0


def sidecar_windows(level: float, effect: float, n: int, seed: int, start: float = T0) -> list[dict]:
    """`n` windows of one pod, one per telemetry interval from `start`, as /windows.json serves them."""
    rng = random.Random(seed)
    stages, functions = shares(effect)
    out = []
    for k in range(n):
        loop = level * (1 + effect) * math.exp(rng.gauss(0, 0.01))
        out.append({"id": k, "tp_rank": 0, "start": start + k * EVERY, "end": start + k * EVERY + 5.0,
                    "samples": 5000, "loop_mean_seconds": loop, "loop_p95_seconds": loop * 1.6, "iterations": 250,
                    "stage_shares": stages, "function_shares": functions, "stale": False, "error": None})
    return out


# A scheduler that idles unless fed, 5 requests/s of 2 images each, one pool worker: 25 ms per image keeps the
# pool a quarter busy; 20 ms more in convert_color makes it 45% busy. Two such stand-ins fit on two cores.
SCHED = ["--standin-output-tokens", "2", "--standin-features-per-image", "1", "--standin-prefill-ms", "4",
         "--standin-batch-ms", "2", "--standin-result-ms", "0.3", "--standin-recv-ms", "0.05",
         "--standin-schedule-ms", "0.05", "--standin-idle-ms", "2", "--standin-request-rate", "5",
         "--standin-arrivals", "fixed", "--standin-cpu-workers", "1", "--standin-image-cost-ms", "25"]
