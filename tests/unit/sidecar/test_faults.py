"""Faults with real processes: py-spy missing, denied, crashing, hanging, writing garbage or half a file;
the target exiting mid-window, restarting, or absent. The sidecar counts each, marks data stale, keeps going.

The "broken py-spy" cases wrap the real py-spy binary in a small script that breaks it the way it breaks
in the field (killed by a signal, output cut, permission dropped)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vlm_sidecar.collector import ProfileStore, build_families
from vlm_sidecar.config import SidecarConfig
from vlm_sidecar.discovery import discover
from vlm_sidecar.runner import Runner, judge
from vlm_sidecar.sampler import PySpySampler, SampleOutcome, classify_failure

PYTHON = shlex.quote(sys.executable)  # the wrappers run this interpreter, not whatever python3 is on PATH

pytestmark = pytest.mark.slow


def wrapper(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def out_arg() -> str:
    # bash: find the value after -o in "$@"
    return 'out=""; prev=""; for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done'


def metrics(store: ProfileStore, now: float | None = None) -> dict:
    from prometheus_client import CollectorRegistry, generate_latest

    class C:
        def collect(self):
            yield from build_families(store.snapshot(), {"namespace": "ns", "vlmservice": "s", "pod": "p",
                                                         "revision": "r"}, now or time.time(), 60)

    reg = CollectorRegistry(auto_describe=False)
    reg.register(C())
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k in ("tp_rank", "result", "kind"))))] = \
                s.value
    return out


def make_runner(pyspy: str, standin_proc, duration: float = 1.0, slack: float = 10.0):
    cfg = SidecarConfig(interval_s=2, duration_s=duration, rate_hz=200, sglang_metrics_url=None,
                        timeout_slack_s=slack)
    store = ProfileStore(16)
    sampler = PySpySampler(pyspy, cfg.rate_hz, cfg.duration_s, timeout_slack_s=slack, grace_s=2)
    root = standin_proc.proc.pid if standin_proc is not None else -1
    runner = Runner(cfg, store, sampler, lambda: discover("/proc", "sglang::scheduler", root), scrape=None)
    return runner, store


def test_classify_failure_messages():
    assert classify_failure(1, "Permission Denied: Try running again", True)[0] == "permission_denied"
    assert classify_failure(1, "Error: Failed to get process executable name. Check that the process is running.",
                            True)[0] == "target_gone"
    assert classify_failure(0, "py-spy> Stopped sampling because process exited", False)[0] == "target_gone"
    assert classify_failure(-11, "", True)[0] == "crash"
    assert classify_failure(None, "", True)[0] == "timeout"
    assert classify_failure(0, "Samples: 10 Errors: 0", True) is None


def test_judge_pure():
    base = dict(pid=1, started=0.0, ended=1.0, returncode=0, stderr="", samples=5, pyspy_errors=0)
    assert judge(SampleOutcome(output=None, error_kind="pyspy_missing", error="x", **base), None)[0] == "error"
    assert judge(SampleOutcome(output=b"", error_kind=None, error=None, **base), None) == (
        "error", ["empty_output"], "no samples")


def test_pyspy_missing(standin):
    s = standin()
    runner, store = make_runner("/nonexistent/py-spy", s)
    [w] = runner.run_window()
    assert w.result == "error" and w.stale and "py-spy" in w.error
    m = metrics(store)
    assert m[("vlm_profiler_errors_total", (("kind", "pyspy_missing"), ("tp_rank", "0")))] == 1
    assert m[("vlm_profiler_windows_total", (("result", "error"), ("tp_rank", "0")))] == 1
    assert m[("vlm_profiler_stale", (("tp_rank", "0"),))] == 1


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to drop privileges")
def test_permission_denied(standin, pyspy, tmp_path):
    s = standin()
    denied = wrapper(tmp_path, "py-spy", f'exec setpriv --reuid=65534 --regid=65534 --clear-groups {pyspy} "$@"')
    runner, store = make_runner(denied, s)
    [w] = runner.run_window()
    assert w.result == "error"
    assert metrics(store)[("vlm_profiler_errors_total", (("kind", "permission_denied"), ("tp_rank", "0")))] == 1


def test_pyspy_killed_mid_window(standin, pyspy, tmp_path):
    # OOM-killer style: SIGKILL, nothing written.
    s = standin()
    crash = wrapper(tmp_path, "py-spy", f'{pyspy} "$@" & p=$!; sleep 0.5; kill -KILL $p; wait $p')
    runner, store = make_runner(crash, s, duration=3)
    [w] = runner.run_window()
    assert w.result == "error" and "py-spy" in w.error, w.error
    assert metrics(store)[("vlm_profiler_errors_total", (("kind", "crash"), ("tp_rank", "0")))] == 1


def test_pyspy_hangs_then_is_killed(standin, tmp_path):
    s = standin()
    hang = wrapper(tmp_path, "py-spy",
                   f'exec {PYTHON} -c "import signal,time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"')
    runner, store = make_runner(hang, s, duration=1, slack=1)
    t0 = time.time()
    [w] = runner.run_window()
    assert time.time() - t0 < 20
    assert w.result == "error"
    assert metrics(store)[("vlm_profiler_errors_total", (("kind", "timeout"), ("tp_rank", "0")))] == 1


def test_pyspy_overruns_and_sigint_keeps_its_data(standin, pyspy, tmp_path):
    """py-spy still running at the deadline gets SIGINT, writes what it has: a partial, stale window."""
    s = standin()
    slow = wrapper(tmp_path, "py-spy", f'args=(); for a in "$@"; do args+=("$a"); done; '
                   f'for i in "${{!args[@]}}"; do [ "${{args[$i]}}" = "-d" ] && args[$((i+1))]=30; done; '
                   f'exec {pyspy} "${{args[@]}}"')
    runner, store = make_runner(slow, s, duration=1, slack=1)
    [w] = runner.run_window()
    assert w.result == "partial" and w.stale and w.samples > 0
    assert store.latest_with_stacks(0) is not None  # the flamegraph still has something to show


def test_a_window_that_starts_after_shutdown_began_stops_at_once(standin, pyspy):
    """SIGTERM can reach the sidecar between a window's discovery and its py-spy's start: stop_all finds no process
    then, and the window must not run its whole duration (the sidecar's exit would wait for it)."""
    s = standin()
    runner, _ = make_runner(pyspy, s, duration=20)
    runner.sampler.stop_all()
    t0 = time.time()
    runner.run_window()
    assert time.time() - t0 < 10  # a 20 s window, stopped as it started


def test_truncated_output(standin, pyspy, tmp_path):
    s = standin()
    cut = wrapper(tmp_path, "py-spy", f'{out_arg()}; {pyspy} "$@"; rc=$?; {PYTHON} -c "import sys; p = sys.argv[1]; d = open(p, \'rb\').read(); open(p, \'wb\').write(d[: len(d) // 2])" "$out"; exit $rc')
    runner, store = make_runner(cut, s)
    [w] = runner.run_window()
    assert w.result == "partial" and w.stale
    assert metrics(store)[("vlm_profiler_errors_total", (("kind", "truncated"), ("tp_rank", "0")))] == 1


def test_garbage_output(standin, tmp_path):
    s = standin()
    junk = wrapper(tmp_path, "py-spy", f'{out_arg()}; head -c 3000 /dev/urandom > "$out"; echo "Samples: 9 Errors: 0"')
    runner, store = make_runner(junk, s)
    [w] = runner.run_window()
    assert w.result == "error"
    assert metrics(store)[("vlm_profiler_errors_total", (("kind", "parse"), ("tp_rank", "0")))] == 1


def test_target_exits_mid_window_then_restarts(standin, pyspy):
    """Kill the scheduler during a window: counted as target_gone, partial; the respawned one is found next."""
    s = standin("--standin-restart")
    runner, store = make_runner(pyspy, s, duration=3)
    old = s.pids[0]
    threading.Timer(1.0, os.kill, (old, signal.SIGKILL)).start()
    [w] = runner.run_window()
    assert w.pid == old and w.stale and w.result in ("partial", "error")
    assert metrics(store)[("vlm_profiler_errors_total", (("kind", "target_gone"), ("tp_rank", "0")))] == 1
    deadline = time.time() + 20
    while time.time() < deadline and s.current_pids()[0] == old:
        time.sleep(0.2)
    time.sleep(1.0)
    [w2] = runner.run_window()
    assert w2.pid != old and w2.result == "ok" and not w2.stale
    m = metrics(store)
    assert m[("vlm_profiler_stale", (("tp_rank", "0"),))] == 0


def test_no_target_and_loop_survives(pyspy):
    cfg = SidecarConfig(interval_s=0.2, duration_s=0.1, rate_hz=100, sglang_metrics_url=None)
    store = ProfileStore(4)
    runner = Runner(cfg, store, PySpySampler(pyspy, 100, 1), lambda: [], scrape=None)
    t = threading.Thread(target=runner.run_forever)
    t.start()
    time.sleep(1.0)
    assert t.is_alive()
    runner.stop()
    t.join(5)
    m = metrics(store)
    assert m[("vlm_profiler_windows_total", (("result", "no_target"), ("tp_rank", "")))] >= 2
    assert m[("vlm_profiler_stale", (("tp_rank", ""),))] == 1


def test_sampler_targets_gone_pid(pyspy):
    p = subprocess.Popen(["true"])
    p.wait()
    out = PySpySampler(pyspy, 100, 1).record(p.pid)
    assert out.error_kind == "target_gone" and out.output is None


def test_effective_rate_counts_rounds_not_thread_stacks():
    """py-spy's "Samples" is one stack per thread per round (checked with py-spy 0.4 on an 11-thread process:
    2189 samples in 2 s at 100 Hz): the rate is per round, whatever the thread count."""
    from vlm_sidecar.model import ParsedTrace, Segment
    from vlm_sidecar.runner import effective_rate

    seg = [Segment(0.0, 2e6, ("main (x.py)",))]
    one = ParsedTrace(threads={1: seg})
    many = ParsedTrace(threads={i: seg for i in range(11)})
    assert effective_rate(one, 200) == 100.0
    assert effective_rate(many, 2200) == 100.0


def test_a_renamed_scheduler_is_not_found_and_the_profile_is_stale(standin, pyspy):
    """A release that titles its schedulers differently (the stand-in's --standin-scheduler-title): the sidecar,
    matching SGLang's titles, finds no scheduler in a live server, counts a no_target window and exports
    vlm_profiler_stale 1 (the VLMProfilerStale alert's condition); the same stand-in with SGLang's title is found."""
    s = standin("--standin-scheduler-title", "sglang::sched_v2", "--standin-request-rate", "0")
    assert s.proc.poll() is None  # the server is up, only its scheduler is unrecognised
    runner, store = make_runner(pyspy, s, duration=0.5)
    assert runner.run_window() == []
    m = metrics(store)
    assert m[("vlm_profiler_windows_total", (("result", "no_target"), ("tp_rank", "")))] == 1
    assert m[("vlm_profiler_stale", (("tp_rank", ""),))] == 1
    found = standin("--standin-request-rate", "0")
    assert [t.pid for t in discover("/proc", "sglang::scheduler", found.proc.pid)] == found.pids[:1]


def _hot_window(standin, pyspy, model: str):
    """One 2 s sidecar window of a stand-in on cost model `model` with a hot hash_feature (per request, 8 features x
    6 ms against one ~45 ms prefill batch: ~50% of the loop), and the cores its scheduler used meanwhile. Fixed
    arrivals: ~20 Poisson arrivals in a 2 s window would move the share by +-22% (sd) on their own; a CI run read
    28% that way."""
    s = standin("--standin-cost-model", model, "--standin-hash-feature-ms", "6", "--standin-request-rate", "10",
                "--standin-arrivals", "fixed")
    pid = s.pids[0]

    def cpu() -> float:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    runner, _ = make_runner(pyspy, s, duration=2.0)
    c0, t0 = cpu(), time.monotonic()
    windows = runner.run_window()
    cores = (cpu() - c0) / (time.monotonic() - t0)
    assert len(windows) == 1, windows
    return windows[0], cores


def test_a_hot_function_on_a_sleeping_scheduler_is_sampled_at_its_share(standin, pyspy):
    """The stand-in's "sleep" cost model (stages sleep their time: a GPU-bound scheduler's shape, nearly no CPU)
    with a hot hash_feature: the sidecar (py-spy --idle) still samples the stage in its frame, so the watched
    function's inclusive share is what VLMSchedulerHotFunctionShareHigh reads (> 25%) while the scheduler uses
    a fraction of a core (the e2e monitoring test produces that alert this way, at no cost to the host)."""
    w, cores = _hot_window(standin, pyspy, "sleep")
    assert 0.3 < w.function_shares.get("hash_feature", 0.0) < 0.7, w.function_shares
    assert cores < 0.2, f"the sleeping scheduler used {cores:.2f} cores"


def test_the_hybrid_cost_model_keeps_a_stage_self_time_in_its_own_frame_at_a_fraction_of_a_core(standin, pyspy):
    """The testbed's pods run the stand-in's "hybrid" cost model (testing/vlm_testing/standin/podmap.py): each stage
    naps in its own frame (time.sleep, a C call: py-spy shows the stage's line on top) and spins its last 0.2 ms. So
    the hot hash_feature holds its share as self time in its own frame, as the spinning "wall" model gives (the
    gate names a regressed function by self-time growth), not in a helper frame below it (the "sleep" model's
    `_sleep`), while the scheduler uses a fraction of a core."""
    w, cores = _hot_window(standin, pyspy, "hybrid")
    assert 0.3 < w.function_shares.get("hash_feature", 0.0) < 0.7, w.function_shares
    assert 0.3 < w.self_shares.get("hash_feature", 0.0) < 0.7, w.self_shares  # its own frame, not a helper's
    assert "_sleep" not in w.function_shares, w.function_shares
    assert cores < 0.25, f"the napping scheduler used {cores:.2f} cores"


def test_a_pyspy_that_ignores_sigint_is_killed_at_shutdown(standin, tmp_path):
    """The sidecar's exit waits for its py-spy windows: one that does not exit on SIGINT is killed after the grace
    period (`Runner.kill`), so the exit is bounded."""
    import threading

    s = standin()
    deaf = wrapper(tmp_path, "py-spy",
                   f'exec {PYTHON} -c "import signal,time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"')
    runner, _ = make_runner(deaf, s, duration=30, slack=30)
    done = threading.Event()
    t = threading.Thread(target=lambda: (runner.run_window(), done.set()), daemon=True)
    t.start()
    time.sleep(1.0)  # the window's py-spy runs
    runner.stop()
    assert not done.wait(1.0)  # SIGINT ignored: the window still waits
    t0 = time.time()
    runner.kill()
    assert done.wait(10), "the window did not end after its py-spy was killed"
    assert time.time() - t0 < 10
