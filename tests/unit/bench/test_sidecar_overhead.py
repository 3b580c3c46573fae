"""bench/sidecar_overhead.py at a tiny size: its interleaved segments (none / nonblocking / blocking py-spy on the
stand-in) and its cadence part (the real vlm-sidecar at the operator's telemetry defaults, with the front end
sampled and a second py-spy compared) each run, print their table and write a result whose numbers are plausible.
No overhead is asserted: a loaded 2-core machine moves the loop's speed by more than the sidecar does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vlm_testing import REPO as ROOT
from vlm_testing.benches import load_bench

so = load_bench("sidecar_overhead")


def _run(tmp_path, *args: str, timeout: float) -> tuple[dict, str]:
    out = tmp_path / "sidecar_overhead.json"
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "sidecar_overhead.py"), "--threads", "2",
                          "--json", str(out), *args], capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(out.read_text()), res.stdout


def test_the_interleaved_segments_measure_every_mode(quiet_cpu, tmp_path):
    r, stdout = _run(tmp_path, "--rounds", "1", "--duration", "1", "--cadence-rounds", "0", timeout=120)
    assert [t["mode"] for t in r["modes"]] == list(so.MODES) == ["none", "nonblocking", "blocking"]
    assert r["baseline_iter_per_s"] > 10 and all(t["iter_per_s_median"] > 10 for t in r["modes"])
    none, nonblocking, blocking = r["modes"]
    assert none["in_window_loss"] == 0 and none["pyspy_cpu_cores"] == 0
    assert nonblocking["pyspy_cpu_cores"] > 0 and blocking["pyspy_cpu_cores"] > 0  # py-spy ran in those windows
    assert {s["mode"] for s in r["segments"]} == set(so.MODES) and "cadence" not in r
    assert "in-window loss" in stdout


@pytest.mark.slow
def test_the_cadence_part_runs_the_real_sidecar_with_the_front_end_and_a_second_pyspy(quiet_cpu, tmp_path):
    pyspy = so.default_pyspy()
    assert pyspy, "the sidecar's py-spy is not built (hack/build-binaries.sh)"
    r, stdout = _run(tmp_path, "--rounds", "0", "--cadence-rounds", "1", "--cadence-cycles", "1", "--frontend",
                     "--cadence-interval", "6",  # a smoke test of the mode: 4 periods of 6 s, not 15
                     "--compare-pyspy", pyspy, timeout=400)
    c = r["cadence"]
    assert "modes" not in r and c["rounds"] == 1 and c["frontend"] and c["compare"]
    on = [p for p in c["periods"] if p["mode"] == "on"]
    assert on and all(p["windows_ok"] >= 1 for p in on), c["periods"]
    assert 100 < c["sample_rate_hz_mean"] <= 1100 and 0 < c["sidecar_cpu_cores_mean"] < 2
    assert 5 < c["sidecar_rss_max_mib"] < 1024
    assert c["frontend"]["processes"]["detokenizer"] == 1 and c["compare"]["windows"] == ["ok"]
    assert "with front-end sampling" in stdout and f"with py-spy {pyspy}" in stdout
