"""bench/paired_gate.py: one simulated rollout per case through the real gate, checked for what the world holds
(a canary whose node is what differs is promoted when paired; a +10% one is stopped in its first step)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlm_testing.benches import load_bench

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def bench():
    return load_bench("paired_gate", "gate_quality")


def test_the_world_and_the_designs_run_through_the_real_gate(bench):
    # Pods differ only by their node (f = 1), at a tight 0.5% spread: paired on the node an unchanged canary is
    # promoted on evidence; +10% is rolled back in the first step by the gate and by every competitor.
    same = bench.simulate(bench.World(4, 1.0, 0.0, "iid", spread=0.005), 3, bench.GATES)
    assert same["gate"].verdict == "Promoted" and same["gate"].by == "evidence", same
    # The judge (its own request, pods and decide, on what it can read) promotes it too, a little later: its clock
    # starts at the canary pods' Ready times.
    assert same[bench.JUDGE].verdict == "Promoted" and same[bench.JUDGE].minutes >= same["gate"].minutes, same
    slow = bench.simulate(bench.World(4, 1.0, 0.10, "iid", spread=0.005), 3, ("gate", bench.JUDGE))
    assert (slow["gate"].verdict, slow["gate"].step, slow["gate"].pods) == ("RolledBack", 0, 1), slow
    assert (slow[bench.JUDGE].verdict, slow[bench.JUDGE].step, slow[bench.JUDGE].reason) == (
        "RolledBack", 0, "LoopLatencyRegressed"), slow
    assert all(slow[c].verdict == "RolledBack" for c in bench.COMPETITORS), slow


def test_the_table_counts_each_design(bench):
    w = bench.World(4, 1.0, 0.0, "iid")
    res = {w: [{d: bench.Result("Promoted", 1, 2, 10.0, "evidence") for d in bench.DESIGNS}]}
    text = bench.markdown(res, 1, 0.0, "")
    assert text.count("| 4 | 2% | 1.0 | iid | +0% |") == len(bench.DESIGNS)
    assert "| gate | 0.0% | 0.0% | 100.0% | 0.0% | 0.0% | 0.0% | 10 |" in text


def test_the_quick_run_writes_its_table(bench, tmp_path, capsys):
    out = tmp_path / "paired_gate.md"
    assert bench.main(["--quick", "--trials", "1", "--jobs", "1", "--out", str(out)]) == 0
    text = out.read_text()
    assert text == capsys.readouterr().out.rstrip("\n") + "\n"
    rows = [line for line in text.splitlines() if line.startswith("| 8 | 2% | 0.8 | iid |")]
    assert len(rows) == 2 * (len(bench.GATES) + len(bench.COMPETITORS))  # A/A and +10%, every design run
    assert "| 8 | 2% | 0.8 | iid | +10% | gate | 100.0% |" in text  # a +10% canary is stopped
    assert "| 8 | 2% | 0.8 | iid | +0% | gate | 0.0% |" in text


def test_effects_keep_only_those_rows_and_none_is_refused(bench, tmp_path, capsys):
    out = tmp_path / "paired_gate.md"
    assert bench.main(["--quick", "--effects", "0", "--gates", "gate", "--trials", "1", "--jobs", "1",
                       "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| 8 |")]
    assert rows and all("| +0% |" in r for r in rows) and len(rows) == 1 + len(bench.COMPETITORS), rows  # no +10% row
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--effects", "7", "--out", str(out)])
    assert "no row of --worlds" in capsys.readouterr().err
    assert bench.main(["--worlds", "core", "--spreads", "2", "--fs", "0.8", "--effects", "0", "--gates", "gate",
                       "--trials", "1", "--jobs", "1", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| 8 |")]
    assert rows and all(r.startswith("| 8 | 2% | 0.8 | autocorrelated | +0% |") for r in rows), rows


def test_throughput_rows_tell_the_router_from_the_pod(bench):
    # Pods below saturation, each canary pod sent 10% less traffic: the gate leaves throughput out and promotes;
    # the raw form (every window) reads the router's share as a slower pod and rolls back on it.
    light = bench.simulate(bench.World(4, 1.0, 0.0, "iid", spread=0.005, load="below", router=0.10), 3,
                           bench.THROUGHPUT_GATES)
    assert light["gate"].verdict == "Promoted", light
    assert (light[bench.RAW_THROUGHPUT].verdict, light[bench.RAW_THROUGHPUT].reason) == (
        "RolledBack", "ThroughputRegressed"), light
    assert not set(light) & set(bench.COMPETITORS)  # they judge loop latency only: not run on these rows
    # Saturated pods, the canary's capacity 15% lower and its loop no slower: rolled back on throughput.
    small = bench.simulate(bench.World(4, 1.0, 0.0, "iid", spread=0.005, load="saturated", capacity=0.15), 3,
                           ("gate",))
    assert (small["gate"].verdict, small["gate"].reason) == ("RolledBack", "ThroughputRegressed"), small


def test_history_rows_give_the_gate_what_finished_rollouts_measured(bench, monkeypatch):
    seen = []
    real = bench.decide

    def spy(*a, **k):
        seen.append(k["calibration"])
        return real(*a, **k)

    monkeypatch.setattr(bench, "decide", spy)
    bench.simulate(bench.World(4, 0.5, 0.0, "iid", history=True), 3, ("gate",))
    cal = seen[0]
    assert (cal.pod_df, cal.restart_df) == (bench.HISTORY_DF_CAP, bench.HISTORY_DF_CAP)
    assert cal.pod_ss / cal.pod_df == pytest.approx(0.02**2) and cal.node_bound_share == pytest.approx(0.5)
    seen.clear()
    bench.simulate(bench.World(4, 0.5, 0.0, "iid"), 3, ("gate",))
    assert seen[0].pod_df == 0  # a first rollout: nothing known


def test_coverage_rows_read_the_gates_interval_at_each_steps_end(bench, tmp_path):
    out = tmp_path / "coverage.md"
    assert bench.main(["--worlds", "coverage", "--spreads", "2", "--fs", "0.8", "--effects", "0", "--trials", "1",
                       "--jobs", "1", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| 2% | 0.8 |")]
    assert [r.split("|")[5].strip() for r in rows] == ["1", "2", "4"], rows  # one row per step: 1, 2, 4 canary pods
    assert all(r.rstrip(" |").endswith("%") for r in rows), rows
