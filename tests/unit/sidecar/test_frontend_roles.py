"""Front-end roles without py-spy: discovery over fake /proc trees shaped like SGLang's process tree, the idle
rules and saturation on synthetic traces, and the runner -> store -> metrics/windows/flamegraph path with a
fake sampler (known busy shares in, the same shares out)."""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from vlm_sidecar import roles
from vlm_sidecar.collector import ProfileStore
from vlm_sidecar.config import FRONTEND_ROLES, SidecarConfig
from vlm_sidecar.discovery import discover, discover_roles
from vlm_sidecar.model import ParsedTrace, Segment, Target
from vlm_sidecar.runner import Runner
from vlm_sidecar.sampler import SampleOutcome
from vlm_sidecar.server import SidecarHTTP
from vlm_testing.sidecar import LABELS, fake_proc, get

LAUNCH = b"python3\x00-m\x00sglang.launch_server\x00--model-path\x00m\x00"
SPAWN = b"python3\x00-c\x00from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)\x00--multiprocessing-fork\x00"


def sglang_tree(root):
    """SGLang 0.5.x with TP 2 and images: what `python3 -m sglang.launch_server` leaves in /proc."""
    fake_proc(root, 1, 0, b"/pause", "pause")
    fake_proc(root, 7, 1, LAUNCH, "python3")  # main: HTTP server + TokenizerManager, no title
    fake_proc(root, 8, 7, b"python3\x00-c\x00from multiprocessing.resource_tracker import main;main(6)\x00", "python3")
    fake_proc(root, 20, 7, b"sglang::scheduler_TP0" + b" " * 30, "sglang::schedul")
    fake_proc(root, 21, 7, b"sglang::scheduler_TP1" + b" " * 30, "sglang::schedul")
    fake_proc(root, 22, 20, b"sglang::scheduler_TP0" + b" " * 30, "sglang::schedul", start=900)  # its fork
    fake_proc(root, 30, 7, b"sglang::detokenizer" + b" " * 30, "sglang::detoken")
    fake_proc(root, 40, 7, LAUNCH, "python3")  # processor pool, forked: the parent's command line
    fake_proc(root, 41, 7, LAUNCH, "python3")
    fake_proc(root, 42, 7, SPAWN, "python3")  # a spawned pool worker (cuda_vmm, 0.5.20+)
    fake_proc(root, 50, 1, b"vlm-sidecar\x00", "vlm-sidecar")


def test_config_knows_the_roles_the_model_defines():
    from vlm_sidecar import config, model, names

    # One definition (vlm_sidecar.names), the same object wherever it is read.
    assert config.FRONTEND_ROLES is model.FRONTEND_ROLES is names.FRONTEND_ROLES
    assert ("scheduler", *names.FRONTEND_ROLES) == names.ROLES


def test_roles_of_an_sglang_pod(tmp_path):
    sglang_tree(tmp_path)
    found = discover_roles(str(tmp_path), "sglang::scheduler", self_pid=50)
    assert [(t.role, t.pid, t.tp_rank) for t in found] == [
        ("scheduler", 20, 0), ("scheduler", 21, 1), ("tokenizer_manager", 7, 0), ("mm_processor", 40, 0),
        ("mm_processor", 41, 0), ("mm_processor", 42, 0), ("detokenizer", 30, 0)]
    # The scheduler's own fork carries its title but is not a scheduler (it used to win rank 0 as "newer").
    assert [t.pid for t in discover(str(tmp_path), "sglang::scheduler")] == [20, 21]
    assert [t.role for t in discover_roles(str(tmp_path), "sglang::scheduler", roles=("detokenizer",))] == [
        "scheduler", "scheduler", "detokenizer"]


def test_tokenizer_workers_data_parallel_and_no_anchor(tmp_path):
    fake_proc(tmp_path, 7, 1, b"/usr/local/bin/sglang\x00serve\x00--model-path\x00m\x00", "sglang")
    fake_proc(tmp_path, 9, 7, b"sglang::data_parallel_controller ", "sglang::data_pa")
    fake_proc(tmp_path, 20, 9, b"sglang::scheduler_DP0_TP0 ", "sglang::schedul")
    fake_proc(tmp_path, 30, 7, b"sglang::detokenizer_router ", "sglang::detoken")  # not the detokenizer
    fake_proc(tmp_path, 60, 7, b"sglang::tokenizer_worker:60 ", "sglang::tokeniz")
    fake_proc(tmp_path, 61, 7, b"sglang::tokenizer_worker:61 ", "sglang::tokeniz")
    fake_proc(tmp_path, 62, 60, b"sglang::tokenizer_worker:60 ", "sglang::tokeniz")  # 60's pool worker (forked)
    got = [(t.role, t.pid) for t in discover_roles(str(tmp_path), "sglang::scheduler")]
    assert got == [("scheduler", 20), ("tokenizer_manager", 7), ("tokenizer_worker", 60), ("tokenizer_worker", 61),
                   ("mm_processor", 62)]
    # Before any scheduler exists (SGLang loading), the launcher's command line still finds the main process.
    other = tmp_path / "early"
    other.mkdir()
    fake_proc(other, 7, 1, LAUNCH, "python3")
    fake_proc(other, 8, 1, b"vim\x00notes-sglang.launch_server_x\x00", "vim")
    assert [(t.role, t.pid) for t in discover_roles(str(other), "sglang::scheduler")] == [("tokenizer_manager", 7)]


# ---------------------------------------------------------------- idle rules and saturation on synthetic traces

LOOP = ("<module> (launch_server.py)", "run (runners.py)", "BaseEventLoop.run_until_complete (base_events.py)",
        "BaseEventLoop.run_forever (base_events.py)", "BaseEventLoop._run_once (base_events.py)")
SELECT = (*LOOP, "EpollSelector.select (selectors.py)")
TOKENIZE = (*LOOP, "Handle._run (events.py)", "TokenizerManager._tokenize_one_request (tokenizer_manager.py)")
IMAGE = (*LOOP, "Handle._run (events.py)", "BaseMultimodalProcessor.process_mm_data_async (base_processor.py)")
UVLOOP_IDLE = ("<module> (launch_server.py)", "run (runners.py)")
UVLOOP_BUSY = (*UVLOOP_IDLE, "TokenizerManager.generate_request (tokenizer_manager.py)")
WORKER = ("_bootstrap (process.py)", "_process_worker (process.py)")
WORKER_IDLE = (*WORKER, "Queue.get (queues.py)", "Connection._recv_bytes (connection.py)")
WORKER_BUSY = (*WORKER, "preprocess_image (frontend.py)", "resize (frontend.py)")
DETOK_IDLE = ("DetokenizerManager.event_loop (detokenizer_manager.py)", "sock_recv (io_struct.py)")
DETOK_BUSY = ("DetokenizerManager.event_loop (detokenizer_manager.py)",
              "DetokenizerManager.handle_batch_token_id_out (detokenizer_manager.py)")
OTHER_THREAD = ("Thread._bootstrap (threading.py)", "_worker (thread.py)")


def trace(parts: list[tuple[float, tuple[str, ...]]], other_thread: bool = True) -> ParsedTrace:
    segs, t = [], 0.0
    for ms, stack in parts:
        segs.append(Segment(t, t + ms * 1e3, stack))
        t += ms * 1e3
    threads = {1: segs}
    if other_thread:  # a helper thread idle all along (an IO pool thread): never the loop's
        threads[2] = [Segment(0.0, t, OTHER_THREAD)]
    return ParsedTrace(threads=threads)


def test_loop_busy_share_stdlib_and_uvloop():
    w = roles.process_window(trace([(60, SELECT), (25, TOKENIZE), (15, IMAGE)] * 10), "tokenizer_manager", 7)
    assert abs(w.busy_share - 0.40) < 1e-9 and abs(w.image_us / w.observed_us - 0.15) < 1e-9
    u = roles.process_window(trace([(70, UVLOOP_IDLE), (30, UVLOOP_BUSY)] * 5), "tokenizer_manager", 7)
    assert abs(u.busy_share - 0.30) < 1e-9
    # No event loop in the process (not SGLang's server): no busy share rather than a wrong one.
    assert roles.process_window(trace([(10, OTHER_THREAD)], other_thread=False), "tokenizer_manager", 7).busy_share \
        is None


def test_pool_and_detokenizer_busy_shares():
    w = roles.process_window(trace([(30, WORKER_IDLE), (70, WORKER_BUSY)]), "mm_processor", 40)
    assert abs(w.busy_share - 0.70) < 1e-9
    d = roles.process_window(trace([(95, DETOK_IDLE), (5, DETOK_BUSY)]), "detokenizer", 30)
    assert abs(d.busy_share - 0.05) < 1e-9
    pool, stacks = roles.summarize_role("mm_processor", 3, [
        w, roles.process_window(trace([(90, WORKER_IDLE), (10, WORKER_BUSY)]), "mm_processor", 41)], top_n=3)
    assert pool.processes == 3 and pool.sampled == 2 and abs(pool.busy_share - 0.40) < 1e-9
    assert abs(pool.busy_share_max - 0.70) < 1e-9 and pool.image_processing_share is None
    assert abs(pool.self_shares["resize"] - 0.40) < 1e-9 and sum(stacks.values()) == 200e3


def summ(role: str, busy: float | None) -> roles.RoleSummary:
    return roles.RoleSummary(role, 1, 1, (1,), busy, busy, None)


def test_saturation_needs_a_busy_front_end_and_an_idle_scheduler():
    def sat(busy: dict, idle: list[float]):
        fw = roles.frontend_window(1, 0.0, 5.0, {r: summ(r, b) for r, b in busy.items()}, idle)
        return fw.saturated, fw.busiest_role

    assert sat({"tokenizer_manager": 0.30, "mm_processor": 0.97}, [0.6, 0.7]) == (True, "mm_processor")
    assert sat({"tokenizer_manager": 0.92, "mm_processor": 0.10}, [0.5]) == (True, "tokenizer_manager")
    assert sat({"tokenizer_manager": 0.92}, [0.2]) == (False, "tokenizer_manager")  # the scheduler is busy too
    assert sat({"tokenizer_manager": 0.85, "detokenizer": 0.2}, [0.9]) == (False, "tokenizer_manager")
    assert sat({"tokenizer_manager": None}, [0.9]) == (None, None)
    assert sat({"mm_processor": 0.99}, []) == (None, "mm_processor")


# ---------------------------------------------------------------- runner -> store -> HTTP, fake sampler


def chrometrace(parts: list[tuple[float, tuple[str, ...]]]) -> bytes:
    """py-spy's format: B/E events on each stack change (tid 1)."""
    events, t, prev = [], 0.0, ()
    for ms, stack in parts:
        common = 0
        while common < min(len(prev), len(stack)) and prev[common] == stack[common]:
            common += 1
        for f in reversed(prev[common:]):
            events.append({"ph": "E", "name": f.split(" (")[0], "ts": t, "tid": 1,
                           "args": {"filename": f.split(" (")[1][:-1]}})
        for f in stack[common:]:
            events.append({"ph": "B", "name": f.split(" (")[0], "ts": t, "tid": 1,
                           "args": {"filename": f.split(" (")[1][:-1]}})
        prev, t = stack, t + ms * 1e3
    for f in reversed(prev):
        events.append({"ph": "E", "name": f.split(" (")[0], "ts": t, "tid": 1, "args": {"filename": f.split(" (")[1][:-1]}})
    return json.dumps(events).encode()


SCHED = ("Scheduler.event_loop_overlap (scheduler.py)",)
SCHED_IDLE = (*SCHED, "Scheduler.on_idle (scheduler.py)")
SCHED_BUSY = (*SCHED, "Scheduler.run_batch (scheduler.py)")


class FakeSampler:
    pyspy = "fake"

    def __init__(self, by_pid: dict[int, bytes]) -> None:
        self.by_pid = by_pid
        self.calls: list[int] = []

    def record(self, pid: int) -> SampleOutcome:
        self.calls.append(pid)
        out = self.by_pid.get(pid)
        return SampleOutcome(pid, 100.0, 105.0, out, 0 if out else 1, "Samples: 5000 Errors: 0", None if out else
                             "crash", None if out else "py-spy exit code 1", 5000, 0)

    def stop_all(self) -> None:
        return None


def targets(n_pool: int) -> list[Target]:
    out = [Target(20, "sglang::scheduler", 0, 1), Target(7, "python3", 0, 1, "tokenizer_manager"),
           Target(30, "sglang::detokenizer", 0, 1, "detokenizer")]
    return out + [Target(40 + i, "python3", 0, 1, "mm_processor") for i in range(n_pool)]


def test_runner_exports_roles_and_saturation():
    data = {20: chrometrace([(70, SCHED_IDLE), (30, SCHED_BUSY)] * 20),
            7: chrometrace([(60, SELECT), (25, TOKENIZE), (15, IMAGE)] * 20),
            30: chrometrace([(95, DETOK_IDLE), (5, DETOK_BUSY)] * 20)}
    for i in range(6):
        data[40 + i] = chrometrace([(2, WORKER_IDLE), (98, WORKER_BUSY)] * 20)
    sampler, front = FakeSampler(data), FakeSampler(data)
    store = ProfileStore()
    cfg = SidecarConfig(sglang_metrics_url=None, max_pool_workers=4, frontend_roles=FRONTEND_ROLES)
    runner = Runner(cfg, store, sampler, lambda: targets(6), scrape=None, frontend_sampler=front)
    [w] = runner.run_window()
    assert sampler.calls == [20] and sorted(front.calls) == [7, 30, 40, 41, 42, 43]
    [w2] = runner.run_window()  # the next window rotates through the pool
    assert sorted(front.calls[6:]) == [7, 30, 40, 41, 44, 45]
    fe = w.frontend
    assert w.frontend_saturated is True and fe["busiest_role"] == "mm_processor"
    assert abs(fe["roles"]["mm_processor"]["busy_share"] - 0.98) < 1e-6 and fe["roles"]["mm_processor"]["processes"] == 6
    assert abs(fe["roles"]["tokenizer_manager"]["busy_share"] - 0.40) < 1e-6
    assert abs(fe["roles"]["tokenizer_manager"]["image_processing_share"] - 0.15) < 1e-6
    assert abs(fe["roles"]["detokenizer"]["busy_share"] - 0.05) < 1e-6
    assert fe["roles"]["tokenizer_worker"]["processes"] == 0 and fe["roles"]["tokenizer_worker"]["busy_share"] is None
    assert [x.id for x in store.windows()] == [w.id, w2.id] and store.windows()[0].frontend == fe

    app = SidecarHTTP(store, LABELS, stale_after_s=1e9, clock=lambda: 106.0)
    httpd = app.serve("127.0.0.1", 0)
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        ws = json.loads(get(url + "/windows.json")[2])
        assert ws[-1]["role"] == "scheduler" and ws[-1]["frontend_saturated"] is True
        assert ws[-1]["frontend_busy_share"] == ws[-1]["frontend"]["busy_share"]
        text = get(url + "/metrics")[2].decode()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        busy = {s.labels["role"]: s.value for s in fams["vlm_process_busy_share_ratio"].samples}
        assert busy.keys() == {"scheduler", "tokenizer_manager", "mm_processor", "detokenizer"}
        assert abs(busy["scheduler"] - 0.30) < 1e-6 and abs(busy["mm_processor"] - 0.98) < 1e-6
        assert all(s.labels["tp_rank"] == "" for s in fams["vlm_process_busy_share_ratio"].samples)
        [sat] = fams["vlm_frontend_saturated"].samples
        assert sat.value == 1.0 and sat.labels["role"] == "frontend"
        procs = {s.labels["role"]: s.value for s in fams["vlm_processes"].samples}
        assert procs["mm_processor"] == 6 and procs["tokenizer_worker"] == 0
        fn = {(s.labels["role"], s.labels["function"], s.labels["kind"]): s.value
              for s in fams["vlm_process_function_share_ratio"].samples}
        assert abs(fn[("mm_processor", "resize", "self")] - 0.98) < 1e-6
        # The scheduler's series are unchanged: no role label on the old families.
        assert "role" not in fams["vlm_scheduler_stage_share_ratio"].samples[0].labels
        status, ctype, svg = get(url + "/profile/latest.svg?role=mm_processor")
        assert status == 200 and ctype == "image/svg+xml" and b"resize" in svg and b"on_idle" not in svg
        status, _, collapsed = get(url + "/profile/latest.json?role=tokenizer_manager&format=collapsed")
        assert status == 200 and b"_tokenize_one_request" in collapsed and b"run_batch" not in collapsed
        assert b"run_batch" in get(url + "/profile/latest.json?format=collapsed")[2]
        assert get(url + "/profile/latest.svg?role=tokenizer_worker")[0] == 404
        assert get(url + "/profile/latest.svg?role=bogus")[0] == 400
    finally:
        app.shutdown()


def test_front_end_faults_stay_out_of_the_scheduler_window():
    data = {20: chrometrace([(70, SCHED_IDLE), (30, SCHED_BUSY)] * 5)}  # every front-end process fails
    store = ProfileStore()
    runner = Runner(SidecarConfig(sglang_metrics_url=None, frontend_roles=FRONTEND_ROLES), store, FakeSampler(data), lambda: targets(1), scrape=None)
    [w] = runner.run_window()
    assert w.result == "ok" and w.frontend_saturated is None and w.frontend["busy_share"] is None
    snap = store.snapshot()
    assert snap.frontend_errors_total == {("tokenizer_manager", "crash"): 1, ("detokenizer", "crash"): 1,
                                          ("mm_processor", "crash"): 1}
    assert snap.errors_total == {}
    # Without front-end targets (front-end sampling off) the windows keep their old shape exactly.
    plain = Runner(SidecarConfig(sglang_metrics_url=None, frontend_roles=()), ProfileStore(), FakeSampler(data),
                   lambda: targets(1), scrape=None)
    [p] = plain.run_window()
    assert p.frontend is None and "role" not in p.to_json() and "frontend" not in p.to_json()
