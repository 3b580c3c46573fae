"""bench/request_mix.py at a tiny size: the stand-in's windows carry the request mix the gate adjusts for, and the
fit finds a slope where loop latency follows the mix and leaves a constant mix out. No cut is asserted on the
stand-in run: a loaded 2-core machine moves its loop by more than a few seconds of bursts do."""

from __future__ import annotations

import math

from vlm_operator.analysis.gate import Window
from vlm_testing.benches import load_bench

rm = load_bench("request_mix")


def test_the_stand_in_windows_carry_loop_latency_and_the_request_mix(tmp_path):
    ws = rm.windows(mix_period=1.0, seconds=6.0, window=1.0, rate=20.0)
    assert len(ws) >= 4, ws
    assert all(w.loop_mean_seconds and w.iterations for w in ws), ws
    mixes = [w.prompt_tokens_per_request for w in ws if w.prompt_tokens_per_request]
    assert mixes and all(32 <= m <= 32 + 4 * 256 for m in mixes), mixes  # text plus 0-4 images of 256 tokens


def test_the_measure_finds_the_slope_and_the_table_says_what_was_left_out(tmp_path):
    def win(k: int, x: float, slope: float) -> Window:
        return Window(revision="r", pod="p", id=str(k), end=float(k), samples=1, loop_mean_seconds=0.02 * math.exp(
            slope * x + 0.01 * math.sin(7 * k)), loop_p95_seconds=None, stage_shares={}, function_shares={},
            iterations=10, prompt_tokens_per_request=500 * math.exp(x))
    xs = [0.3 * math.sin(k) for k in range(40)]
    follows = rm.measure([win(k, x, 0.5) for k, x in enumerate(xs)])
    assert abs(float(follows["fit"].split()[1]) - 0.5) < 0.02 and follows["cut"] > 0.9 and follows["var_after"] < follows[
        "var_before"] / 5, follows
    flat = rm.measure([win(k, 0.0, 0.5) for k in range(40)])
    assert (flat["fit"], flat["cut"], flat["var_after"]) == ("left out", 0.0, flat["var_before"])
    args = rm.argparse.Namespace(seconds=1.0, window=1.0, rate=20.0, mix_period=20.0)
    text = rm.markdown({"bursts": follows, "constant": flat}, args)
    assert "| constant | 40 | 0% | left out | 0% |" in text and "| bursts | 40 |" in text
