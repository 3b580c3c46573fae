"""The GPU benchmarks' scripts (bench/gpu) without a GPU: each Python entry point imports and parses its flags
(`--help`), the shell drivers parse (`bash -n`), and the loop benchmark runs end to end on the stand-in's CPU
transport (`--transport sim`) into report.py's tables. What needs CUDA (ipc_reconstruct.py's measurement,
standin_loop.py's `--transport cuda`, the SGLang wheels of part1.sh) only runs on a GPU machine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vlm_testing import REPO as ROOT

GPU = ROOT / "bench" / "gpu"


@pytest.mark.parametrize(("script", "flags"), [
    ("ipc_reconstruct.py", ("--impl", "--site", "--requests", "--pool-mb")),
    ("standin_loop.py", ("--part", "--rounds", "--window", "--transport", "--saturated-rate")),
    ("report.py", ("part1", "loop", "--out")),
])
def test_the_entry_points_import_and_parse_their_flags(script, flags):
    res = subprocess.run([sys.executable, str(GPU / script), "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-3000:]
    for flag in flags:
        assert flag in res.stdout


@pytest.mark.parametrize("script", ["run_all.sh", "part1.sh", "loop.sh"])
def test_the_shell_drivers_parse(script):
    res = subprocess.run(["bash", "-n", str(GPU / script)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


@pytest.mark.slow
def test_the_loop_benchmark_runs_on_the_cpu_transport_into_its_report(tmp_path):
    out = tmp_path / "loop.json"
    res = subprocess.run([sys.executable, str(GPU / "standin_loop.py"), "--transport", "sim", "--out", str(out),
                          "--log", str(tmp_path / "loop.log"), "--rounds", "1", "--window", "1", "--warmup", "0.5",
                          "--sidecar-settle", "0.5", "--saturated-rate", "0", "--rate", "5"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    result = json.loads(out.read_text())
    assert "SIM" in result["loop"] and "part2_saturated" not in result  # --saturated-rate 0 skips it
    modes2 = [w["mode"] for w in result["part2_steady"]["windows"]]
    modes3 = [w["mode"] for w in result["part3"]["windows"]]
    assert sorted(set(modes2)) == ["cache off", "cache on"]
    assert sorted(set(modes3)) == ["none", "sidecar blocking", "sidecar nonblocking"]
    for w in result["part2_steady"]["windows"] + result["part3"]["windows"]:
        assert w["iter_per_s"] > 1, w
    rep = subprocess.run([sys.executable, str(GPU / "report.py"), "loop", "--out", str(tmp_path / "rep"), str(out)],
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr[-3000:]
    for row in ("| cache off |", "| cache on |", "| none |", "| sidecar nonblocking |", "| sidecar blocking |"):
        assert rep.stdout.count(row) == 1, rep.stdout
