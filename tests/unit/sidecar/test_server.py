"""HTTP endpoints over a store filled from the golden recordings, via a real socket."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vlm_sidecar.collector import ProfileStore, is_stale
from vlm_sidecar.parser import format_collapsed
from vlm_sidecar.server import SidecarHTTP
from vlm_testing.sidecar import LABELS, fill, get

WINDOW_KEYS = {"id", "tp_rank", "start", "end", "samples", "loop_mean_seconds", "loop_p50_seconds",
               "loop_p95_seconds", "iterations", "stage_shares", "function_shares", "top_function", "stale", "error"}


@pytest.fixture
def server():
    store = ProfileStore(8)
    app = SidecarHTTP(store, LABELS, stale_after_s=60, clock=lambda: 1015.0)
    httpd = app.serve("127.0.0.1", 0)
    yield store, f"http://127.0.0.1:{httpd.server_address[1]}"
    app.shutdown()


def test_empty_sidecar_serves_probes_and_stale_metrics(server):
    _, url = server
    assert get(url + "/healthz")[0] == 200 and get(url + "/readyz")[0] == 200
    assert get(url + "/profile/latest.svg")[0] == 404
    assert json.loads(get(url + "/windows.json")[2]) == []
    text = get(url + "/metrics")[2].decode()
    assert 'vlm_profiler_stale{namespace="ml",pod="qwen-abc",revision="r2",tp_rank="",vlmservice="qwen"} 1.0' in text


def test_metrics_names_labels_and_values(server):
    store, url = server
    windows = fill(store)
    fams = {f.name: f for f in text_string_to_metric_families(get(url + "/metrics")[2].decode())}
    for name in ("vlm_scheduler_loop_seconds", "vlm_scheduler_stage_share_ratio", "vlm_scheduler_function_share_ratio",
                 "vlm_profiler_windows", "vlm_profiler_samples", "vlm_profiler_last_window_timestamp_seconds",
                 "vlm_profiler_errors", "vlm_profiler_effective_rate_hz", "vlm_profiler_stale",
                 "vlm_profiler_sglang_stage_share_abs_diff_ratio", "vlm_profiler_sglang_agreement_max_abs_diff_ratio",
                 "vlm_sglang_stage_share_ratio"):
        assert name in fams, name
    sglang = {s.labels["stage"]: s.value for s in fams["vlm_sglang_stage_share_ratio"].samples}
    assert sglang == pytest.approx(windows[-1].sglang_stage_shares) and sglang["run_batch"] > 0
    stage = {s.labels["stage"]: s.value for s in fams["vlm_scheduler_stage_share_ratio"].samples}
    assert stage == pytest.approx(windows[-1].stage_shares)
    s0 = fams["vlm_scheduler_stage_share_ratio"].samples[0]
    assert {k: s0.labels[k] for k in LABELS} == LABELS and s0.labels["tp_rank"] == "0"
    kinds = {(s.labels["function"], s.labels["kind"]) for s in fams["vlm_scheduler_function_share_ratio"].samples}
    assert ("hash_feature", "inclusive") in kinds and ("hash_feature", "self") in kinds
    hist = {s.name: s.value for s in fams["vlm_scheduler_loop_seconds"].samples if "le" not in s.labels}
    assert hist["vlm_scheduler_loop_seconds_count"] == sum(w.iterations for w in windows)
    assert [s.value for s in fams["vlm_profiler_stale"].samples] == [0.0]
    assert [s.value for s in fams["vlm_profiler_windows"].samples if s.labels["result"] == "ok"] == [2.0]


def test_windows_json_contract(server):
    store, url = server
    fill(store)
    ws = json.loads(get(url + "/windows.json")[2])
    assert len(ws) == 2 and ws[0]["id"] < ws[1]["id"]
    for w in ws:
        assert set(w) >= WINDOW_KEYS
        assert w["stale"] is False and w["error"] is None and w["end"] > w["start"]
        assert set(w["stage_shares"]) >= {"run_batch", "process_input_requests", "idle", "other"}
    assert len(json.loads(get(url + "/windows.json?limit=1")[2])) == 1


def test_profiles_and_diffs(server):
    store, url = server
    w_on, _ = fill(store)
    code, ctype, svg = get(url + "/profile/latest.svg")
    assert code == 200 and ctype == "image/svg+xml" and svg.startswith(b"<svg") and b"run_batch" in svg
    code, _, body = get(url + "/profile/latest.json")
    doc = json.loads(body)
    assert doc["profiles"][0]["type"] == "sampled" and doc["shared"]["frames"]
    code, _, collapsed = get(url + "/profile/latest.json?format=collapsed")
    assert code == 200 and b";" in collapsed
    code, _, diff = get(url + f"/profile/diff.svg?baseline={w_on.id}")
    assert code == 200 and b"vs baseline" in diff and b"rgb(255," in diff  # something grew (cache off)
    assert get(url + "/profile/diff.svg?baseline=999")[0] == 404
    assert get(url + "/profile/diff.svg")[0] == 400
    posted = format_collapsed(store.stacks(w_on.id)).encode()
    code, _, diff2 = get(url + "/profile/diff.svg", data=posted)
    assert code == 200 and b"posted profile" in diff2
    assert get(url + "/profile/diff.svg", data=b"garbage")[0] == 400
    assert get(url + "/nope")[0] == 404


def test_history_bound_and_staleness():
    store = ProfileStore(2)
    fill(store, ("cache_on", "cache_off", "cache_on"))
    assert [w.id for w in store.windows()] == [2, 3] and store.stacks(1) is None
    rs = store.snapshot().ranks[0]
    assert not is_stale(rs, now=1030.0, stale_after_s=60)
    assert is_stale(rs, now=1200.0, stale_after_s=60)
