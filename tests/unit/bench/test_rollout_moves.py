"""bench/rollout_moves.py counts what it says: a promotion at the shipped defaults starts one pod per replica,
drops no warm pod and keeps N-1 Ready; a 1-replica service with no free GPU waits; the previous release's
numbers follow its code (a fresh-baseline step, the canary pod dropped at promotion). No timing assertions."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlm_testing.benches import load_bench

ROOT = Path(__file__).resolve().parents[3]


rm = load_bench("rollout_moves")


@pytest.mark.parametrize(("n", "gpus"), [(2, 1), (4, 1), (4, 2)])
def test_a_promotion_starts_n_pods_drops_none_and_keeps_n_minus_one_ready(n, gpus):
    got = rm.walk(n, gpus, "Promote")
    assert got["verdict"] == "Promoted" and got["final_rev"] == "new"
    assert got["pods started"] == n and got["warm pods dropped"] == 0
    assert got["least Ready"] >= n - 1
    assert got["paired"] == got["pairs"] == n  # every promoted pod on the node of the pod it paired with


def test_a_rollback_ends_at_the_old_revision_on_its_nodes():
    got = rm.walk(4, 1, "Rollback", [1])
    assert got["verdict"] == "RolledBack" and got["final_rev"] == "old"
    assert got["least Ready"] >= 3 and got["paired"] == got["pairs"] >= 1


def test_one_replica_without_a_free_gpu_waits_and_never_goes_dark():
    got = rm.walk(1, 1, "Promote")
    assert got["verdict"] == "waits (no free GPU)" and got["pods started"] == 0 and got["least Ready"] == 1


def test_the_previous_release_from_its_code():
    assert rm.old_release(1, 1, "Promote") == {"pods started": 2, "warm pods dropped": 1, "least Ready": 0}
    assert rm.old_release(4, 2, "Promote") == {"pods started": 6, "warm pods dropped": 1, "least Ready": 3}


def test_the_table_it_writes(tmp_path, capsys):
    out = tmp_path / "rollout_moves.md"
    rm.main(["--out", str(out)])
    rows = [line for line in out.read_text().splitlines() if line.startswith("| Promote") or line.startswith("| Rollback")]
    assert len(rows) == 2 * 2 * 4 * 2  # verdict x schedule x replicas x GPUs per node
    assert all(line.count("|") == 10 for line in rows)
    assert "| Promote: Promoted | default | 4 | 1 | 4 (6) | 0 (1) | 3 (2) | 4/4 |" in out.read_text()
    assert capsys.readouterr().out.count("\n| ") >= len(rows)
