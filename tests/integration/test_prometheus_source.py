"""The gate's Prometheus source against a real Prometheus, at the shipped cadences.

The sidecar's series are written as they would be scraped (promtool backfills them into a real TSDB,
then a real Prometheus serves them), for a sidecar that closes a 5 s window every 15 s (the telemetry
default) scraped every 15 s (the PodMonitor's interval) and every 5 s. `prom_source.from_prometheus` must
return each window exactly once, with its own values, whatever the two intervals: the old source took
one `rate(...[15s])` per step, which returned nothing at a 15 s scrape and counted one window in several
overlapping steps at faster ones.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest
from vlm_operator.sources import prometheus as prom_source

pytestmark = pytest.mark.integration

T0 = 1_750_000_000  # a fixed past instant: backfilled blocks must lie before the head block
WINDOW_EVERY = 15.0
N_WINDOWS = 24
PODS = {"svc-stable-a": "rev1", "svc-canary-b": "rev2"}


def _window_values(pod: str, k: int) -> dict[str, float]:
    """A distinct, checkable value per pod and window."""
    base = 0.020 if PODS[pod] == "rev1" else 0.024
    return {"loop": base + k * 1e-5, "ttft": 0.5 + k / 1000, "share": 0.5 + k / 1000, "rate": 3.0 + k / 100}


FE_POD, FE_LAG = "svc-canary-b", 4.0


def _frontend_values(k: int) -> dict[str, float]:
    """Busy shares per role of front-end window k (the scheduler role is not a front-end role: left out)."""
    return {"mm_processor": 0.3 + k / 1000, "tokenizer_manager": 0.1 + k / 1000, "scheduler": 0.9}


def _openmetrics(scrape_every: float, *, phase: float) -> str:
    """The sidecar's per-window gauges as scraped every `scrape_every` s. Window k ends at
    T0 + k * WINDOW_EVERY; a scrape at time t sees the last window that ended at or before t."""
    fams: dict[str, list[str]] = {}
    t = T0 + phase
    stop = T0 + N_WINDOWS * WINDOW_EVERY
    while t < stop:
        k = int((t - T0) // WINDOW_EVERY)
        for pod, rev in PODS.items():
            lab = f'namespace="ml",vlmservice="svc",pod="{pod}",revision="{rev}",tp_rank="0"'
            if k < 0:
                continue
            v = _window_values(pod, k)
            end = T0 + k * WINDOW_EVERY

            def put(name: str, value: float, extra: str = "", lab=lab, t=t) -> None:
                fams.setdefault(name, []).append(f"{name}{{{lab}{extra}}} {value} {t:.3f}")

            put("vlm_profiler_last_window_timestamp_seconds", end)
            put("vlm_scheduler_window_loop_mean_seconds", v["loop"])
            put("vlm_scheduler_window_loop_p95_seconds", v["loop"] * 1.5)
            put("vlm_scheduler_window_iterations", 250)
            put("vlm_scheduler_window_samples", 5000)
            put("vlm_sglang_window_ttft_seconds", v["ttft"])
            put("vlm_sglang_window_requests_per_second", v["rate"])
            put("vlm_profiler_stale", 0)
            put("vlm_scheduler_stage_share_ratio", v["share"], ',stage="run_batch"')
            put("vlm_scheduler_stage_share_ratio", 1 - v["share"], ',stage="idle"')
            put("vlm_scheduler_function_share_ratio", 0.1, ',function="hash_feature",kind="inclusive"')
            put("vlm_scheduler_function_share_ratio", 0.08, ',function="hash_feature",kind="self"')
            put("vlm_scheduler_unexported_self_share_max_ratio", 0.004)
            # The canary's sidecar samples the front end: its window ends FE_LAG s after the scheduler's, so a
            # scrape in between still shows the previous one (tp_rank="", a role per series).
            kf = k if t >= end + FE_LAG else k - 1
            if pod == FE_POD and kf >= 0:
                fl = f'namespace="ml",vlmservice="svc",pod="{pod}",revision="{rev}",tp_rank=""'
                fe = _frontend_values(kf)

                def putf(name: str, value: float, extra: str, fl=fl, t=t) -> None:
                    fams.setdefault(name, []).append(f"{name}{{{fl}{extra}}} {value} {t:.3f}")

                putf("vlm_frontend_last_window_timestamp_seconds", T0 + kf * WINDOW_EVERY + FE_LAG, ',role="frontend"')
                for role, busy in fe.items():
                    putf("vlm_process_busy_share_ratio", busy, f',role="{role}"')
                putf("vlm_process_function_share_ratio", fe["mm_processor"] / 2,
                     ',role="mm_processor",function="convert_color",kind="inclusive"')
                putf("vlm_process_function_share_ratio", 0.01,
                     ',role="mm_processor",function="convert_color",kind="self"')
                putf("vlm_process_unexported_self_share_max_ratio", 0.002, ',role="mm_processor"')
        t += scrape_every
    lines = []
    for name, samples in fams.items():
        lines.append(f"# TYPE {name} gauge")
        lines.extend(samples)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=[15.0, 5.0], ids=["scrape15s", "scrape5s"])
def prometheus(request, tmp_path):
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: run hack/install-system-deps.sh (Debian package prometheus)")
    scrape = request.param
    data = tmp_path / "data"
    om = tmp_path / "series.om"
    om.write_text(_openmetrics(scrape, phase=3.0))
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
                   check=True, capture_output=True, timeout=120)
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
    port = _free_port()
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={data}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100000d"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"Prometheus did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.3)
    # The backfilled blocks are loaded at start; wait until a query sees them.
    q = f"{base}/api/v1/query?query=count(vlm_scheduler_window_loop_mean_seconds)&time={T0 + 200}"
    while time.time() < deadline:
        with urllib.request.urlopen(q, timeout=5) as r:
            if json.loads(r.read())["data"]["result"]:
                break
        time.sleep(0.5)
    yield base, scrape
    proc.terminate()
    proc.wait(timeout=30)


def test_one_observation_per_window_at_the_shipped_cadence(prometheus):
    base, scrape = prometheus
    since, now = T0, T0 + N_WINDOWS * WINDOW_EVERY + 20
    ws = prom_source.from_prometheus(base, "ml", "svc", ["rev1", "rev2"], since=since, now=now, step=WINDOW_EVERY / 3)
    for pod in PODS:
        mine = sorted((w for w in ws if w.pod == pod), key=lambda w: w.end)
        ends = [w.end for w in mine]
        assert len(ends) == len(set(ends)), f"a window counted twice at a {scrape}s scrape"
        # Every window that was scraped while it was the latest is there exactly once.
        assert len(mine) == N_WINDOWS, (scrape, pod, len(mine))
        for w in mine:
            k = round((w.end - T0) / WINDOW_EVERY)
            v = _window_values(pod, k)
            assert w.loop_mean_seconds == pytest.approx(v["loop"])
            assert w.ttft_seconds == pytest.approx(v["ttft"])
            assert w.request_rate == pytest.approx(v["rate"])
            assert w.stage_shares["run_batch"] == pytest.approx(v["share"])
            assert w.function_shares == {"hash_feature": pytest.approx(0.1)}
            # The self shares and the bound of what the window left out (attribution), and the samples.
            assert w.self_shares == {"hash_feature": pytest.approx(0.08)}
            assert w.unexported_self_share_max == pytest.approx(0.004) and w.samples == 5000
            assert w.revision == PODS[pod] and not w.stale


def test_front_end_windows_join_the_scheduler_windows_they_ran_beside(prometheus):
    """Each canary window gets the front-end window that ended FE_LAG s after it (not the one the scrape showed
    at the same instant, which lags by a window), with its busy shares and inclusive function shares; the
    stable pod's sidecar samples no front end and its windows have none. The role's self shares and the bound
    of what its export left out come along (attribution of a front-end regression)."""
    base, scrape = prometheus
    ws = prom_source.from_prometheus(base, "ml", "svc", ["rev1", "rev2"], since=T0, now=T0 + N_WINDOWS * WINDOW_EVERY + 20,
                                 step=WINDOW_EVERY / 3)
    assert all(w.frontend == {} for w in ws if w.pod != FE_POD)
    mine = [w for w in ws if w.pod == FE_POD]
    assert len(mine) == N_WINDOWS
    last_scrape = max(T0 + 3.0 + j * scrape for j in range(int(N_WINDOWS * WINDOW_EVERY / scrape) + 1)
                      if T0 + 3.0 + j * scrape < T0 + N_WINDOWS * WINDOW_EVERY)
    for w in mine:
        k = round((w.end - T0) / WINDOW_EVERY)
        want = _frontend_values(k)
        if w.end + FE_LAG > last_scrape:  # its front-end window was never scraped
            assert w.frontend == {}, (scrape, k)
            continue
        assert set(w.frontend) == {"mm_processor", "tokenizer_manager"}, (scrape, k)
        assert w.frontend["mm_processor"].busy_share == pytest.approx(want["mm_processor"]), (scrape, k)
        assert w.frontend["tokenizer_manager"].busy_share == pytest.approx(want["tokenizer_manager"]), (scrape, k)
        assert w.frontend["mm_processor"].function_shares == {"convert_color": pytest.approx(want["mm_processor"] / 2)}
        assert w.frontend["mm_processor"].self_shares == {"convert_color": pytest.approx(0.01)}
        assert w.frontend["mm_processor"].unexported_self_share_max == pytest.approx(0.002)
        assert w.frontend["tokenizer_manager"].unexported_self_share_max is None  # not exported for it here


def test_slower_scrape_than_windows_loses_windows_but_never_duplicates(prometheus):
    """Read at a step longer than the window cadence, some windows are never seen; none is seen twice."""
    base, _ = prometheus
    ws = prom_source.from_prometheus(base, "ml", "svc", ["rev1"], since=T0, now=T0 + N_WINDOWS * WINDOW_EVERY + 20,
                                 step=2 * WINDOW_EVERY)
    ends = [w.end for w in ws]
    assert 0 < len(ends) <= N_WINDOWS and len(ends) == len(set(ends))
