"""The gate's Prometheus source against a real Prometheus, at the shipped cadences.

The sidecar's series are written as they would be scraped (promtool backfills them into a real TSDB,
then a real Prometheus serves them), for a sidecar that closes a 5 s window every 15 s (the telemetry
default) scraped every 15 s (the PodMonitor's interval) and every 5 s. `prom_source.from_prometheus` must
return each window exactly once, with its own values, whatever the two intervals: the old source took
one `rate(...[15s])` per step, which returned nothing at a 15 s scrape and counted one window in several
overlapping steps at faster ones.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from vlm_operator.analysis.sources import prometheus as prom_source
from vlm_operator.analysis.sources.base import PrometheusAuth, SignalsUnavailable, get_json

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


# --- Prometheus behind TLS and basic auth (Mimir, Thanos and managed services put one in front) ----------------

USER, PASSWORD = "vlm-operator", "s3cret-for-the-gate"


def _tls_files(d) -> tuple[str, str, str]:
    """A CA and a server certificate it signed for 127.0.0.1 (openssl, as cert-manager would issue one)."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    ca_key, ca, key, csr, crt, ext = (str(d / n) for n in ("ca.key", "ca.crt", "tls.key", "tls.csr", "tls.crt", "san.ext"))
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", ca_key,
            "-out", ca, "-days", "2", "-subj", "/CN=vlm-test-ca")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", csr,
            "-subj", "/CN=prometheus")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", crt, "-days", "2",
            "-extfile", ext)
    return ca, crt, key


@pytest.fixture
def secured_prometheus(tmp_path):
    """A real Prometheus serving the backfilled series only over TLS (a test CA's certificate) and only to
    USER with PASSWORD (its --web.config.file: a bcrypt hash, as Prometheus requires)."""
    import bcrypt

    for tool in ("prometheus", "promtool", "openssl"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: run hack/install-system-deps.sh")
    data = tmp_path / "data"
    om = tmp_path / "series.om"
    om.write_text(_openmetrics(15.0, phase=3.0))
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
                   check=True, capture_output=True, timeout=120)
    ca, crt, key = _tls_files(tmp_path)
    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=6)).decode()
    web.write_text(f"tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n"
                   f"basic_auth_users:\n  {USER}: '{hashed}'\n")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
    port = _free_port()
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={data}", f"--web.config.file={web}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100000d"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    base = f"https://127.0.0.1:{port}"
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD + "\n")  # as `echo ... > file` or a Secret written with a newline leaves it
    auth = PrometheusAuth(url=base, basic_auth_username=USER, basic_auth_password_file=str(password_file), ca_file=ca,
                          headers=(("X-Scope-OrgID", "team-a"),))
    deadline = time.time() + 60
    q = f"{base}/api/v1/query?query=count(vlm_scheduler_window_loop_mean_seconds)&time={T0 + 200}"
    while True:
        try:
            if get_json(q, headers=auth.request_headers(q), context=auth.ssl_context(q))["data"]["result"]:
                break  # up, and the backfilled blocks are loaded
        except (OSError, SignalsUnavailable):
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"Prometheus did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.3)
    yield base, auth
    proc.terminate()
    proc.wait(timeout=30)


def _read(base: str, auth: PrometheusAuth | None):
    return prom_source.from_prometheus(base, "ml", "svc", ["rev1", "rev2"], since=T0,
                                       now=T0 + N_WINDOWS * WINDOW_EVERY + 20, step=WINDOW_EVERY / 3, auth=auth)


def test_prometheus_behind_tls_and_basic_auth(secured_prometheus):
    """With the user, the password file and the CA, the range queries succeed and return every window; without
    any of them the source raises SignalsUnavailable (the gate's Inconclusive), naming why."""
    base, auth = secured_prometheus
    ws = _read(base, auth)
    assert sorted({w.pod for w in ws}) == sorted(PODS)
    assert all(len([w for w in ws if w.pod == pod]) == N_WINDOWS for pod in PODS)

    # The operator's settings reach it the same way (VLM_PROMETHEUS_*, validated as at start).
    env = {"VLM_PROMETHEUS_URL": base, "VLM_PROMETHEUS_BASIC_AUTH_USERNAME": USER,
           "VLM_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE": auth.basic_auth_password_file,
           "VLM_PROMETHEUS_CA_FILE": auth.ca_file, "VLM_PROMETHEUS_HEADERS": '{"X-Scope-OrgID": "team-a"}'}
    assert len(_read(base, PrometheusAuth.from_env(env))) == len(ws)

    failures = {
        "nothing (the system CAs do not know the test CA)": (PrometheusAuth(), "CERTIFICATE_VERIFY_FAILED"),
        "the CA, no credentials": (PrometheusAuth(url=base, ca_file=auth.ca_file), "401"),
        "credentials, no CA": (dataclasses.replace(auth, ca_file=""), "CERTIFICATE_VERIFY_FAILED"),
        # Credentials go to VLM_PROMETHEUS_URL's origin only: for another URL (a spec's own), none are sent.
        "credentials for another origin": (dataclasses.replace(auth, url="https://127.0.0.1:1"), "CERTIFICATE_VERIFY"),
    }
    for what, (a, reason) in failures.items():
        with pytest.raises(SignalsUnavailable) as e:
            _read(base, a)
        assert reason in str(e.value) and f"Prometheus at {base}" in str(e.value), (what, str(e.value))

    # A wrong password, then the Secret rotated to the right one: the file is read at every query, so the same
    # auth object (as the running operator holds it) works again without a restart.
    password = Path(auth.basic_auth_password_file)
    password.write_text("not-the-password")
    with pytest.raises(SignalsUnavailable, match="401"):
        _read(base, auth)
    password.write_text(PASSWORD)
    assert len(_read(base, auth)) == len(ws)
    password.unlink()
    with pytest.raises(SignalsUnavailable, match="VLM_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE"):
        _read(base, auth)
