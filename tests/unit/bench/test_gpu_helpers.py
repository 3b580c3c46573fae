"""The pure helpers behind the H200 benchmarks: feature sizes, percentiles, Prometheus text parsing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vlm_testing.benches import load_bench

feature_sizes = load_bench("gpu/feature_sizes")
promtext = load_bench("gpu/promtext")
summary = load_bench("gpu/summary")


def test_qwen_tokens_and_bytes_for_720p_and_1080p():
    # 720x1280 -> 728x1288 after rounding to 28: 26 x 46 blocks; 1080x1920 -> 1092x1932: 39 x 69.
    assert feature_sizes.image_tokens(720, 1280) == 26 * 46 == 1196
    assert feature_sizes.image_tokens(1080, 1920) == 39 * 69 == 2691
    assert feature_sizes.feature_bytes(1196) == 1196 * 2048 * 2


def test_smart_resize_keeps_within_pixel_bounds():
    h, w = feature_sizes.smart_resize(10000, 10000)
    assert h * w <= feature_sizes.MAX_PIXELS and h % 28 == 0 and w % 28 == 0
    h, w = feature_sizes.smart_resize(10, 10)
    assert h * w >= feature_sizes.MIN_PIXELS


def test_scenarios_cover_1_3_8_images_at_two_resolutions():
    cells = feature_sizes.build_scenarios()
    assert {(c.resolution, c.n_images) for c in cells} == {(r, n) for r in ("720p", "1080p") for n in (1, 3, 8)}


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    rng = np.random.default_rng(1)
    xs = list(rng.lognormal(size=301))
    assert summary.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_summary_and_ratio_edge_cases():
    assert summary.summarize([])["n"] == 0 and math.isnan(summary.summarize([])["median"])
    assert summary.summarize([1.0, 3.0])["median"] == 2.0
    assert summary.ratio(10.0, 2.0) == 5.0 and math.isnan(summary.ratio(1.0, 0.0))


TEXT = """# HELP sglang:time_to_first_token_seconds x
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1"} 2
sglang:time_to_first_token_seconds_bucket{le="0.2"} 6
sglang:time_to_first_token_seconds_bucket{le="+Inf"} 8
sglang:time_to_first_token_seconds_sum 1.5
sglang:time_to_first_token_seconds_count 8
sglang:gen_throughput 123.5
"""


def test_prometheus_text_histogram_and_quantile():
    s = promtext.parse_samples(TEXT)
    assert promtext.scalar(s, "sglang:gen_throughput") == 123.5
    buckets, total, count = promtext.histogram(s, "sglang:time_to_first_token_seconds")
    assert buckets[-1] == (math.inf, 8.0) and (total, count) == (1.5, 8.0)
    # rank 4 of 8 lies halfway through the (0.1, 0.2] bucket, as Prometheus interpolates it.
    assert promtext.histogram_quantile(0.5, buckets) == pytest.approx(0.15)
    zero = promtext.histogram_delta((buckets, total, count), (buckets, total, count))
    assert math.isnan(promtext.histogram_quantile(0.5, zero[0]))
