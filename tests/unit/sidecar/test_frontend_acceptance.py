"""Front-end signals with real py-spy on the stand-in's front end (testing/vlm_testing/standin/frontend.py), against its own
accounting of the same window (the intervals its loop, pool and detokenizer recorded):

- discovery finds every role of the stand-in's process tree, the pids it announced;
- the busy shares of the tokenizer loop, the processor pool and the detokenizer, and the loop's image-processing
  share, within 4 points of the truth (median over the windows: one window on a CPU-starved host can lose py-spy
  samples for tens of milliseconds, docs/sidecar.md; within 3 points on a quiet host, while a loaded CI run read
  the quarter-busy pool 2.6-3.4 points low in all three windows);
- the saturation signal is on when the knob makes the front end the bottleneck (the pool with
  --standin-image-cost-ms, the loop with --standin-tokenize-ms) and off when it is not, at the same request rate;
  the truth says the same in each case (the truth's front end busy >= 90% or not).
Three windows of 2 s per case at the sidecar's default rates (1000 Hz schedulers, 250 Hz front end).
"""

from __future__ import annotations

import os
import statistics
import time

import pytest

from vlm_sidecar.collector import ProfileStore
from vlm_sidecar.config import FRONTEND_ROLES, SidecarConfig
from vlm_sidecar.discovery import discover_roles
from vlm_sidecar.runner import Runner
from vlm_sidecar.sampler import PySpySampler

pytestmark = pytest.mark.slow

# A scheduler that idles unless fed: short requests, cheap stages, 2 ms idle sleeps. One pool worker: a
# saturated pool spins its workers' cores, and this host may have only two.
SCHED = ["--standin-output-tokens", "2", "--standin-features-per-image", "1", "--standin-prefill-ms", "4",
         "--standin-batch-ms", "2", "--standin-result-ms", "0.3", "--standin-recv-ms", "0.05",
         "--standin-schedule-ms", "0.05", "--standin-idle-ms", "2", "--standin-request-rate", "10",
         "--standin-arrivals", "fixed", "--standin-cpu-workers", "1"]
CASES = {
    "pool_bottleneck": (["--standin-image-cost-ms", "150"], True, "mm_processor"),
    "loop_bottleneck": (["--standin-image-cost-ms", "2", "--standin-tokenize-ms", "110"], True, "tokenizer_manager"),
    # Images of 25 ms (a megapixel image's preprocessing takes tens of ms) on two workers: the pool a quarter busy.
    "not_bottleneck": (["--standin-image-cost-ms", "25", "--standin-cpu-workers", "2"], False, None),
}
TOL = 0.04


def windows(s, n: int):
    cfg = SidecarConfig(sglang_metrics_url=None, duration_s=2, frontend_roles=FRONTEND_ROLES,
                        frontend_rate_hz=int(os.environ.get("FE_RATE", "250")))
    runner = Runner(cfg, ProfileStore(), PySpySampler(cfg.pyspy, cfg.rate_hz, cfg.duration_s),
                    lambda: discover_roles("/proc", cfg.process_pattern, s.proc.pid),
                    frontend_sampler=PySpySampler(cfg.pyspy, cfg.frontend_rate_hz, cfg.frontend_duration_s))
    out = []
    for _ in range(n):
        [w] = runner.run_window()
        assert w.result == "ok", w.error
        time.sleep(0.2)  # the loop's current wait ends and is recorded
        # Truth per role over the stretch its samples cover: py-spy's start and write are outside it.
        truth = {}
        for role, rs in w.frontend["roles"].items():
            if rs["sampled_until"] is not None:
                end = rs["sampled_until"] - 0.02  # writing the output
                t = s.get(f"/standin/frontend?start={end - rs['observed_seconds']}&end={end}")
                truth[role], truth["complete"] = t[role], t["complete"]
        truth["scheduler_idle"] = s.accounting(w.start, w.end)["stage_shares"]["idle"]
        out.append((w, truth))
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_frontend_busy_shares_and_saturation_match_truth(quiet_cpu, standin, case):
    extra, saturated, busiest = CASES[case]
    s = standin("--standin-frontend", *SCHED, *extra, warmup_s=2.5)
    pids = s.info["frontend_pids"]
    found = {(t.role, t.pid) for t in discover_roles("/proc", "sglang::scheduler", s.proc.pid)}
    assert found == {("scheduler", s.pids[0]), ("tokenizer_manager", pids["tokenizer_manager"]),
                     ("detokenizer", pids["detokenizer"])} | {("mm_processor", p) for p in pids["mm_processor"]}
    errs: dict[str, list[float]] = {"tokenizer_manager": [], "mm_processor": [], "detokenizer": [], "image": []}
    lines = []
    for w, truth in windows(s, 3):
        assert truth["complete"]
        fe = w.frontend["roles"]
        for role in ("tokenizer_manager", "mm_processor", "detokenizer"):
            errs[role].append(fe[role]["busy_share"] - truth[role]["busy_share"])
        errs["image"].append(fe["tokenizer_manager"]["image_processing_share"]
                             - truth["tokenizer_manager"]["image_processing_share"])
        truth_busy = max(truth[r]["busy_share"] for r in ("tokenizer_manager", "mm_processor", "detokenizer"))
        lines.append(f"loop {fe['tokenizer_manager']['busy_share']:.3f}/{truth['tokenizer_manager']['busy_share']:.3f} "
                     f"pool {fe['mm_processor']['busy_share']:.3f}/{truth['mm_processor']['busy_share']:.3f} "
                     f"detok {fe['detokenizer']['busy_share']:.3f}/{truth['detokenizer']['busy_share']:.3f} "
                     f"image {fe['tokenizer_manager']['image_processing_share']:.3f}/"
                     f"{truth['tokenizer_manager']['image_processing_share']:.3f} "
                     f"scheduler idle {w.frontend['scheduler_idle_share']:.2f}/{truth['scheduler_idle']:.2f} "
                     f"saturated {w.frontend_saturated}")
        assert (truth_busy >= 0.9) is saturated, lines  # the case is what it claims
        assert w.frontend_saturated is saturated, lines
        if saturated:
            assert w.frontend["busiest_role"] == busiest, lines
    print(case, "estimate/truth:", *lines, sep="\n  ")
    for k, e in errs.items():
        assert abs(statistics.median(e)) <= TOL, (k, e, lines)
