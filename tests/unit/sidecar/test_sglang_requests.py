"""Request signals per window from SGLang's /metrics (TTFT, ITL, throughput, request rate): the stand-in's real text."""

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


def family(name: str, kind: str, series: dict[str, float]) -> str:
    """One metric family in the exposition format, model_name="m" plus each series' own labels."""
    return f"# TYPE {name} {kind}\n" + "".join(f'{name}{{model_name="m",{labels}}} {v}\n' for labels, v in series.items())


def scrape(tc, ts, ic, is_, gt):
    return sglang_metrics.parse(TEXT.format(tc=tc, ts=ts, ic=ic, is_=is_, gt=gt))


def test_window_means_and_throughput_from_two_scrapes():
    before = scrape(10, 5.0, 1000, 20.0, 5000)
    after = scrape(14, 7.4, 1500, 32.5, 5600)
    sig = sglang_metrics.request_signals(before, after, 5.0)
    assert sig["ttft_seconds"] == pytest.approx(2.4 / 4)  # labels summed: the non-streaming series did not move
    assert sig["itl_seconds"] == pytest.approx(12.5 / 500)
    assert sig["throughput"] == pytest.approx(600 / 5.0)
    assert sig["request_rate"] == pytest.approx(4 / 5.0)  # requests that reached their first token, per second


def test_nothing_moved_or_restart_gives_nothing():
    a = scrape(10, 5.0, 1000, 20.0, 5000)
    # No request in the window: a request rate of 0 (an observation), no TTFT (nothing to average).
    assert sglang_metrics.request_signals(a, a, 5.0) == {"throughput": 0.0, "request_rate": 0.0}
    restarted = scrape(1, 0.2, 10, 0.1, 30)
    assert sglang_metrics.request_signals(a, restarted, 5.0) == {}
    assert sglang_metrics.request_signals({}, {}, 5.0) == {}


def test_forward_passes_are_summed_over_modes_and_read_as_a_rate():
    """sglang:cuda_graph_passes_total{mode}: every batch the scheduler ran, with or without a CUDA graph, decode and
    prefill alike; the window's rate is what the gate scales SGLang's stage shares by."""
    def text(decode: int, prefill: int) -> str:
        return family("sglang:cuda_graph_passes_total", "counter", {'mode="decode_cuda_graph"': decode,
                                                                    'mode="prefill_none"': prefill})
    before, after = sglang_metrics.parse(text(100, 10)), sglang_metrics.parse(text(280, 30))
    assert before["forward_passes"] == 110
    assert sglang_metrics.request_signals(before, after, 5.0)["forward_pass_rate"] == pytest.approx(200 / 5.0)
    assert "forward_pass_rate" not in sglang_metrics.request_signals(after, before, 5.0)  # restarted: nothing


def test_the_queue_at_both_edges_says_whether_the_pod_was_saturated():
    """sglang:num_queue_reqs, one gauge per scheduler of the same queue: the largest is read, not the sum; the
    window's `queued_requests` is the smaller reading of its two edges (the gate counts a backlog of a second's
    arrivals there as saturation: analysis.window.Window.saturated_throughput)."""
    def text(n: int) -> str:
        return family("sglang:num_queue_reqs", "gauge", {'tp_rank="0"': n, 'tp_rank="1"': n})
    busy, idle = sglang_metrics.parse(text(3)), sglang_metrics.parse(text(0))
    assert busy["queued"] == 3
    assert sglang_metrics.request_signals(busy, sglang_metrics.parse(text(5)), 5.0) == {
        "queued_requests": 3.0}
    # Drained at either edge: not saturated throughout.
    assert sglang_metrics.request_signals(busy, idle, 5.0)["queued_requests"] == 0.0
    assert sglang_metrics.request_signals(idle, busy, 5.0)["queued_requests"] == 0.0
    # Not exported (or a scrape without it): unknown, not 0.
    assert "queued_requests" not in sglang_metrics.request_signals(busy, scrape(1, 1.0, 1, 1.0, 1), 5.0)


def test_prompt_tokens_per_finished_request_is_the_request_mix():
    """sglang:prompt_tokens_total and sglang:num_requests_total grow in the same call when a request finishes
    (summed over is_streaming): their deltas give the window's prompt tokens per request."""
    def text(prompt: int, requests: int) -> str:
        return (family("sglang:prompt_tokens_total", "counter", {'is_streaming="true"': prompt,
                                                                 'is_streaming="false"': 1000})
                + family("sglang:num_requests_total", "counter", {'is_streaming="true"': requests,
                                                                  'is_streaming="false"': 1}))
    before = sglang_metrics.parse(text(9000, 11))
    after = sglang_metrics.parse(text(12000, 15))
    assert (before["prompt_tokens"], before["finished_requests"]) == (10000, 12)
    assert sglang_metrics.request_signals(before, after, 5.0)["prompt_tokens_per_request"] == pytest.approx(750.0)
    # Nothing finished in the window: unknown, not 0.
    assert "prompt_tokens_per_request" not in sglang_metrics.request_signals(after, after, 5.0)


def test_names_are_the_checked_table():
    names = sglang_names.request_metrics("0.5.23")
    assert names["ttft"] == "sglang:time_to_first_token_seconds"
    assert sglang_metrics.parse("# nothing\n") == {}
    with pytest.raises(sglang_metrics.ScrapeError):
        sglang_metrics.parse("sglang:x{ 1\n")


def test_every_per_window_gauge_is_read_by_the_gates_prometheus_source():
    """The request rate (and every other per-window value) the sidecar exports is one the operator's
    Prometheus source reads into the same Window field: a renamed gauge on either side fails here."""
    from vlm_operator.analysis.sources import prometheus
    from vlm_sidecar.collector import ProfileStore, build_families
    from vlm_sidecar.model import WindowSummary

    store = ProfileStore()
    w = WindowSummary(id=1, tp_rank=0, pid=1, start=0.0, end=5.0, samples=5000, loop_mean_seconds=0.02,
                      loop_p50_seconds=0.02, loop_p95_seconds=0.03, iterations=250, stage_shares={},
                      function_shares={}, self_shares={}, top_function=None, stale=False, error=None,
                      ttft_seconds=0.4, itl_seconds=0.02, throughput=900.0, request_rate=3.5, forward_pass_rate=41.0,
                      queued_requests=2.0, prompt_tokens_per_request=850.0, feature_transport_share=0.08, ipc_handle_reopen_share=0.07, feature_transport_samples=400,
                      unexported_self_share_max=0.012)
    store.add_window(w, None, 1000.0)
    fams = {f.name: f for f in build_families(store.snapshot(), {"pod": "p"}, 6.0, 60.0)}
    assert [s.value for s in fams["vlm_sglang_window_requests_per_second"].samples] == [3.5]
    exported = {n for n in fams if n.startswith(("vlm_scheduler_window_", "vlm_sglang_window_"))
                or n in ("vlm_scheduler_feature_transport_share_ratio", "vlm_scheduler_ipc_handle_reopen_share_ratio",
                         "vlm_scheduler_unexported_self_share_max_ratio")}
    read = set(prometheus._WINDOW_GAUGES) - {"vlm_profiler_stale"}
    assert exported == read, (exported ^ read)
    for name, field in prometheus._WINDOW_GAUGES.items():
        if name != "vlm_profiler_stale":
            assert [s.value for s in fams[name].samples] == [pytest.approx(float(getattr(w, field)))], name
