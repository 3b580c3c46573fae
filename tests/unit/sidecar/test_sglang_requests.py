"""Request signals per window from SGLang's /metrics (TTFT, ITL, throughput): the stand-in's real text."""

from __future__ import annotations

import pytest
from vlm_sidecar import sglang_metrics, sglang_names

TEXT = """\
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{{model_name="m",is_streaming="true",le="0.5"}} {tc}
sglang:time_to_first_token_seconds_bucket{{model_name="m",is_streaming="true",le="+Inf"}} {tc}
sglang:time_to_first_token_seconds_sum{{model_name="m",is_streaming="true"}} {ts}
sglang:time_to_first_token_seconds_count{{model_name="m",is_streaming="true"}} {tc}
sglang:time_to_first_token_seconds_sum{{model_name="m",is_streaming="false"}} 1.0
sglang:time_to_first_token_seconds_count{{model_name="m",is_streaming="false"}} 2
# TYPE sglang:inter_token_latency_seconds histogram
sglang:inter_token_latency_seconds_sum{{model_name="m"}} {is_}
sglang:inter_token_latency_seconds_count{{model_name="m"}} {ic}
# TYPE sglang:generation_tokens counter
sglang:generation_tokens_total{{model_name="m"}} {gt}
"""


def scrape(tc, ts, ic, is_, gt):
    return sglang_metrics.parse(TEXT.format(tc=tc, ts=ts, ic=ic, is_=is_, gt=gt))


def test_window_means_and_throughput_from_two_scrapes():
    before = scrape(10, 5.0, 1000, 20.0, 5000)
    after = scrape(14, 7.4, 1500, 32.5, 5600)
    sig = sglang_metrics.request_signals(before, after, 5.0)
    assert sig["ttft_seconds"] == pytest.approx(2.4 / 4)  # labels summed: the non-streaming series did not move
    assert sig["itl_seconds"] == pytest.approx(12.5 / 500)
    assert sig["throughput"] == pytest.approx(600 / 5.0)


def test_nothing_moved_or_restart_gives_nothing():
    a = scrape(10, 5.0, 1000, 20.0, 5000)
    assert sglang_metrics.request_signals(a, a, 5.0) == {"throughput": 0.0}
    restarted = scrape(1, 0.2, 10, 0.1, 30)
    assert sglang_metrics.request_signals(a, restarted, 5.0) == {}
    assert sglang_metrics.request_signals({}, {}, 5.0) == {}


def test_names_are_the_checked_table():
    names = sglang_names.request_metrics("0.5.23")
    assert names["ttft"] == "sglang:time_to_first_token_seconds"
    assert sglang_metrics.parse("# nothing\n") == {}
    with pytest.raises(sglang_metrics.ScrapeError):
        sglang_metrics.parse("sglang:x{ 1\n")
