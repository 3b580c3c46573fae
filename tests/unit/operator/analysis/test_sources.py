"""Reading sidecar windows: the endpoints file is obeyed, and pod IPs are never dialled when it is set."""

from __future__ import annotations

import json

import pytest

from vlm_operator.analysis import sources
from vlm_operator.analysis.sources import sidecars
from vlm_testing.jsonhttp import serve_json

WINDOWS = [
    {"id": 1, "end": 1000.0, "samples": 500, "loop_mean_seconds": 0.02, "stage_shares": {"run_batch": 0.5}},
    {"id": 2, "end": 2000.0, "samples": 500, "loop_mean_seconds": 0.03, "stage_shares": {"run_batch": 0.4}},
]


@pytest.fixture
def sidecar():
    with serve_json(lambda path, _peer: (200 if path == "/windows.json" else 404, WINDOWS)) as srv:
        yield f"127.0.0.1:{srv.server_address[1]}"


def test_endpoints_file_names_the_sidecars(tmp_path, monkeypatch, sidecar):
    f = tmp_path / "endpoints.json"
    f.write_text(json.dumps({"pod-a": sidecar}))
    monkeypatch.setenv("VLM_SIDECAR_ENDPOINTS", str(f))
    ws = sources.from_sidecars([("pod-a", "rev1", "10.0.0.9")], since=1500.0)
    assert [(w.pod, w.revision, w.loop_mean_seconds) for w in ws] == [("pod-a", "rev1", 0.03)]


def test_pod_ips_are_never_dialled_when_an_endpoints_file_is_set(tmp_path, monkeypatch):
    f = tmp_path / "endpoints.json"
    f.write_text("{}")
    monkeypatch.setenv("VLM_SIDECAR_ENDPOINTS", str(f))

    def no_network(url):
        raise AssertionError(f"dialled {url}")

    monkeypatch.setattr(sidecars, "get_json", no_network)
    with pytest.raises(sources.SignalsUnavailable):
        sources.from_sidecars([("pod-a", "rev1", "10.0.0.9")], since=0.0)


def test_prometheus_down_is_signals_unavailable():
    with pytest.raises(sources.SignalsUnavailable):
        sources.from_prometheus("http://127.0.0.1:9", "ns", "svc", ["r"], since=0.0, now=100.0, step=10.0)
