"""bench/autoscaling.py's counting (its run needs the testbed and a real KEDA, for 35 minutes at the shipped
defaults: not in CI; tests/e2e/test_autoscaling.py proves the same loop with short windows): decisions,
reversals and the most reversals in one stabilisation window, and the stand-in sidecars' load model."""

from __future__ import annotations

import pytest

from vlm_testing.autoscaling import BusySidecars
from vlm_testing.benches import load_bench

bench = load_bench("autoscaling")


@pytest.mark.parametrize(("changes", "want"), [
    ([(0, 1), (10, 2), (20, 3)], (2, 0, 0)),  # two steps up: no reversal
    ([(0, 3), (10, 4), (20, 3), (30, 4), (700, 3)], (4, 3, 2)),  # 20 and 30 in one 600 s window, 700 alone
    ([(0, 3), (100, 4), (800, 3), (1500, 4)], (3, 2, 1)),  # one reversal a window
    ([(0, 3)], (0, 0, 0)),  # nothing after `since`
])
def test_reversals_count_changes_against_the_previous_direction(changes, want):
    assert bench.reversals(changes, 5, 600) == want


def test_a_decision_before_the_noise_sets_the_direction_only_after_it():
    # 2 -> 3 before `since` is not counted; 3 -> 2 after it is a decision, not a reversal (no decision before it
    # in the counted span).
    assert bench.reversals([(0, 2), (3, 3), (10, 2)], 5, 600) == (1, 0, 0)


def test_the_load_is_spread_over_the_running_pods_capped_at_one_and_changes_once_a_window():
    running = ["a", "b"]
    side = BusySidecars(None, "ns", "svc", cadence_s=1000.0, pods=lambda: running)
    side.idle, side.load = None, 1.5
    assert side.window() == {"a": 0.25, "b": 0.25}  # 1.5 schedulers over 2 pods: 75% busy each
    running.remove("b")
    assert side.window() == {"a": 0.0}  # capped: one pod cannot be more than 100% busy
    text = side.text()
    side.load = 0.2
    assert side.text() == text  # the same window: the series change only at the next one
    side.noise = 0.1
    shares = [side.window()["a"] for _ in range(200)]
    assert 0.7 < sum(shares) / len(shares) < 0.9 and len(set(shares)) > 50  # 20% busy, noisy around it
