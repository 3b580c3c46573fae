"""The two signal sources give the gate the same windows, field by field, and so the same decision.

The windows are made by the sidecar's own code: its `Runner` samples a recorded py-spy window (the stand-in's
cache_off chrometrace, tests/golden/sidecar) through a fake sampler, reshaped a little per window (each stage
a few percent longer or shorter, the IPC transport frames named as SGLang's), with the front end
(tokenizer_manager and two mm_processor workers) sampled beside it and SGLang's /metrics counters moving under
it (its stage counters included); its store keeps them and its HTTP handler serves `/windows.json` and `/metrics`.

- The sidecar source reads `/windows.json` through a `SidecarReader` whose fetch calls that handler.
- The Prometheus source reads a fake Prometheus: every pod's `/metrics` scraped every 7.5 s (the PodMonitor's
  interval) into a per-target store, and an evaluator of the `max by (...) (metric{...})` range queries the
  source sends (at each step the target's latest scrape within the 5 min lookback; a series missing from it
  is stale, as Prometheus' staleness markers make it), monkeypatched into the module's `get_json`.

The two lists of windows must be equal in every field but `id` (which differs by construction), and
`gate.decide` must give the same Decision on each. Two canaries regress in a function the baseline's
sidecars never exported, one in the scheduler and one in the mm_processor pool: the gate names that function
only through the bound the baseline states for what it left out (`unexported_self_share_max`), so windows
without the self shares and bounds (what the Prometheus source read before) name another function.
"""

from __future__ import annotations

import json
import math
import random
import re
import threading
import urllib.parse
from bisect import bisect_right
from dataclasses import fields, replace
from decimal import Decimal

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vlm_operator.analysis import gate, sources
from vlm_operator.analysis.sources import prometheus as prometheus_source
from vlm_sidecar.collector import ProfileStore
from vlm_sidecar.config import SidecarConfig
from vlm_sidecar.estimators import classify, pick_scheduler_thread
from vlm_sidecar.model import ParsedTrace, Segment, Target
from vlm_sidecar.parser import function_name, parse_chrometrace
from vlm_sidecar.runner import Runner
from vlm_sidecar.sampler import SampleOutcome
from vlm_sidecar.server import SidecarHTTP
from vlm_testing.sidecar import GOLDEN

T0 = 1_750_000_000.0
INTERVAL, DURATION, FRONTEND_DURATION, SCRAPE = 15.0, 5.0, 2.0, 7.5
N_WINDOWS = 12
NOW = T0 + N_WINDOWS * INTERVAL + 12
SGLANG_STAGES = {"recv_requests": 0.04, "process_input_requests": 0.14, "get_next_batch_to_run": 0.06,
                 "run_batch": 0.58, "process_batch_result": 0.13, "idle": 0.05}  # SGLang's counters' shares
PODS = {"svc-stable-0": ("stable", 2), "svc-stable-1": ("stable", 1),  # pod -> (revision, TP ranks)
        "svc-canary-0": ("canary", 2), "svc-canary-1": ("canary", 1)}
POLICY = gate.GatePolicy(
    max_regression={"loop_latency": 0.03, "stage_time": 0.05, "sglang_stage_time": 0.05, "ttft": 0.10, "itl": 0.10,
                    "throughput": 0.10, "frontend_busy": 0.10},
    min_samples=5, interval_s=60.0, max_duration_s=900.0, stale_after_s=60.0, pair_s=INTERVAL)

# The scheduler's new work on the first canary (inside process_input_requests) and the mm_processor's on the
# second: functions no baseline window has.
GROWN = "ImageProcessor.convert_rgb (image_processor.py)"
MM_GROWN = "ImageProcessor.slow_convert_color (image_utils.py)"
# The stand-in's CUDA IPC transport, named as SGLang 0.5.10-0.5.17's (vlm_sidecar.ipc), so the IPC fields carry
# values: the cache is off and every feature re-opens its handle.
RENAME = {
    "Scheduler.reconstruct_on_target_device (sglang_standin.py)":
        "CudaIpcTensorTransportProxy.reconstruct_on_target_device (cuda_ipc_transport_utils.py)",
    "SimTransport.reconstruct (sglang_standin.py)":
        "CudaIpcTensorTransportProxy._open_pooled_storage_uncached (cuda_ipc_transport_utils.py)",
}
RECORDED = parse_chrometrace((GOLDEN / "cache_off.chrometrace.json").read_bytes())
# mm_processor work: more functions than the sidecar exports (top 10 by self time), so its bound is > 0.
MM_FUNCTIONS = [(f"ImageProcessor.step_{i:02d} (image_utils.py)", 1.0 / (i + 1)) for i in range(14)]
TOKENIZER_FUNCTIONS = [(f"TokenizerManager.{n} (tokenizer_manager.py)", w) for n, w in
                       (("_tokenize_one_request", 3.0), ("_handle_batch_output", 2.0), ("_send_one_request", 1.0))]


# ------------------------------------------------------------------------------------ py-spy output

def _event(ph: str, label: str, ts: float, tid: int) -> dict:
    name, _, file = label.rpartition(" (") if label.endswith(")") else (label, "", "")
    return {"ph": ph, "name": name, "ts": ts, "tid": tid, "pid": 1, "cat": "py-spy",
            "args": {"filename": f"/app/{file[:-1]}", "line": 1} if file else {}}


def chrometrace(trace: ParsedTrace) -> bytes:
    """py-spy's `-f chrometrace` for the given segments (begin/end events per frame, as py-spy writes)."""
    events = []
    for tid, segs in trace.threads.items():
        stack: tuple[str, ...] = ()
        last = segs[0].start_us
        for s in segs:
            if s.start_us > last:  # nothing sampled in between: the stack was empty
                events += [_event("E", f, last, tid) for f in reversed(stack)]
                stack = ()
            same = 0
            while same < min(len(stack), len(s.stack)) and stack[same] == s.stack[same]:
                same += 1
            events += [_event("E", f, s.start_us, tid) for f in reversed(stack[same:])]
            events += [_event("B", f, s.start_us, tid) for f in s.stack[same:]]
            stack, last = s.stack, s.end_us
        events += [_event("E", f, last, tid) for f in reversed(stack)]
    return json.dumps(events).encode()


def scheduler_trace(rng: random.Random, grown: bool) -> ParsedTrace:
    """The recorded window with every stage a few percent longer or shorter; `grown`: each stretch of
    process_input_requests followed by as long again in GROWN, called from it."""
    tid = pick_scheduler_thread(RECORDED)
    scale = {st: rng.uniform(0.92, 1.08) for st in gate.STAGES}
    segs: list[Segment] = []
    cursor = prev = RECORDED.threads[tid][0].start_us
    for s in RECORDED.threads[tid]:
        stack = tuple(RENAME.get(f, f) for f in s.stack)
        cursor += s.start_us - prev
        prev = s.end_us
        stage = classify(stack)
        d = s.duration_us * scale[stage]
        segs.append(Segment(cursor, cursor + d, stack))
        cursor += d
        if grown and stage == "process_input_requests":
            at = next(i for i, f in enumerate(stack) if function_name(f) == "process_input_requests")
            segs.append(Segment(cursor, cursor + d, (*stack[:at + 1], GROWN)))
            cursor += d
    return ParsedTrace(threads={**RECORDED.threads, tid: segs})


def role_trace(rng: random.Random, busy_in: tuple[str, ...], idle: tuple[str, ...], busy: float,
               work: list[tuple[str, float]]) -> ParsedTrace:
    """One front-end process's role thread over FRONTEND_DURATION: waiting (`idle`), or busy in one of `work`
    called from `busy_in`, `busy` of the time."""
    segs, t = [], 0.0
    while t < FRONTEND_DURATION * 1e6:
        d = rng.uniform(2e3, 12e3)
        if rng.random() < busy:
            stack = (*busy_in, rng.choices([f for f, _ in work], [w for _, w in work])[0])
        else:
            stack = idle
        if segs and segs[-1].stack == stack:  # py-spy shows an unchanged stack as one stretch
            segs[-1] = Segment(segs[-1].start_us, t + d, stack)
        else:
            segs.append(Segment(t, t + d, stack))
        t += d
    return ParsedTrace(threads={7: segs})


# ------------------------------------------------------------------------------------ the sidecars

class Sidecar:
    """One pod's sidecar, its real Runner and HTTP handler, fed by fake samplers and a fake SGLang /metrics."""

    def __init__(self, pod: str, revision: str, ranks: int, ip: str, case: str, clock: list[float]) -> None:
        self.pod, self.revision, self.ip, self.case, self.clock = pod, revision, ip, case, clock
        self.canary = revision == "canary"
        self.k = -1  # the window being sampled
        self.lock = threading.Lock()
        self.sglang_calls = 0
        cfg = SidecarConfig(pod=pod, namespace="ml", vlmservice="svc", revision=revision,
                            frontend_roles=("tokenizer_manager", "mm_processor"))
        self.targets = [Target(100 + r, f"sglang::scheduler_TP{r}", r, 1, "scheduler") for r in range(ranks)]
        self.targets += [Target(200, "sglang::tokenizer", 0, 1, "tokenizer_manager"),
                         Target(300, "python", 0, 1, "mm_processor"), Target(301, "python", 0, 1, "mm_processor")]
        self.runner = Runner(cfg, store := ProfileStore(), self, lambda: list(self.targets), scrape=self.sglang_metrics,
                             clock=lambda: self.clock[0], frontend_sampler=self)
        stale_after = 2 * cfg.interval_s + cfg.duration_s + cfg.timeout_slack_s  # as vlm_sidecar.__main__
        self.http = SidecarHTTP(store, cfg.labels, stale_after, lambda: self.clock[0])
        self.pyspy = "py-spy"

    def rng(self, what: object) -> random.Random:
        return random.Random(f"{self.pod}/{self.k}/{what}")  # the same whatever the threads' order

    def record(self, pid: int) -> SampleOutcome:
        """A fake py-spy run of `pid` over this window (the Runner's sampler and frontend_sampler)."""
        rng, start = self.rng(pid), T0 + self.k * INTERVAL
        if pid < 200:
            trace = scheduler_trace(rng, grown=self.canary and self.case == "scheduler")
            end = start + DURATION + rng.uniform(0.0, 0.3)
            with self.lock:
                self.clock[0] = max(self.clock[0], end + 0.2)
        elif pid < 300:  # the tokenizer's event loop (uvloop: waiting shows as `run (runners.py)` innermost)
            trace = role_trace(rng, ("run (runners.py)", "BaseEventLoop._run_once (base_events.py)"),
                               ("run (runners.py)",), 0.3, TOKENIZER_FUNCTIONS)
            end = start + FRONTEND_DURATION
        else:  # a multimodal pool worker, waiting for its next call item
            grown = self.canary and self.case == "frontend"
            trace = role_trace(rng, ("_process_worker (process.py)", "ImageProcessor.process (image_utils.py)"),
                               ("_process_worker (process.py)", "Queue.get (queues.py)"), 0.75 if grown else 0.45,
                               MM_FUNCTIONS + ([(MM_GROWN, 4.0)] if grown else []))
            end = start + FRONTEND_DURATION
        span = max(ss[-1].end_us - ss[0].start_us for ss in trace.threads.values()) / 1e6
        return SampleOutcome(pid=pid, started=start, ended=end, output=chrometrace(trace), returncode=0, stderr="",
                             error_kind=None, error=None, samples=round(span * 1000) * len(trace.threads),
                             pyspy_errors=0)

    def stop_all(self) -> None:
        pass

    def sglang_metrics(self, url: str) -> str:
        """SGLang's /metrics: the counters at the window's start on the first call of a window, at its end after."""
        with self.lock:
            self.sglang_calls += 1
            first = self.sglang_calls == 1
        k = self.k + (0 if first else 1)
        n, ttft, itl, itl_n, tokens = 0, 0.0, 0.0, 0, 0
        stage = dict.fromkeys(SGLANG_STAGES, 0.0)  # SGLang's own stage counters (0.5.20 on), idle included
        passes = 0  # decode passes (sglang:cuda_graph_passes_total; the prefill ones are k)
        for j in range(k):
            r = random.Random(f"{self.pod}/sglang/{j}")
            dn = r.randint(15, 30)
            n, ttft = n + dn, ttft + dn * r.uniform(0.3, 0.5)
            di = r.randint(2000, 3000)
            itl_n, itl, tokens = itl_n + di, itl + di * r.uniform(0.018, 0.022), tokens + di + dn
            passes += r.randint(150, 250)
            for st, share in SGLANG_STAGES.items():
                stage[st] += DURATION * share * r.uniform(0.9, 1.1)
        lab = 'model_name="m"'
        # The waiting queue at this scrape, one gauge per scheduler (TP rank): about half the windows start
        # and end with requests waiting (saturated: their throughput is compared), the others do not.
        queued = random.Random(f"{self.pod}/queue/{k}").choice([0, 0, 2, 60])
        prompt = sum(random.Random(f"{self.pod}/prompt/{j}").randint(300, 2000) for j in range(k))
        counters = "".join(f'sglang:scheduler_stage_seconds_total{{{lab},category="{st}"}} {v!r}\n'
                           for st, v in stage.items() if st != "idle")
        return (f"# TYPE sglang:scheduler_stage_seconds_total counter\n{counters}"  # as SGLang writes them
                f"# TYPE sglang:cuda_graph_passes_total counter\n"
                f'sglang:cuda_graph_passes_total{{{lab},mode="decode_cuda_graph"}} {passes}\n'
                f'sglang:cuda_graph_passes_total{{{lab},mode="prefill_none"}} {k}\n'
                f"# TYPE sglang:scheduler_idle_seconds_total counter\n"
                f"sglang:scheduler_idle_seconds_total{{{lab}}} {stage['idle']!r}\n"
                f"# TYPE sglang:time_to_first_token_seconds histogram\n"
                f"sglang:time_to_first_token_seconds_bucket{{{lab},le=\"+Inf\"}} {n}\n"
                f"sglang:time_to_first_token_seconds_sum{{{lab}}} {ttft!r}\n"
                f"sglang:time_to_first_token_seconds_count{{{lab}}} {n}\n"
                f"# TYPE sglang:inter_token_latency_seconds histogram\n"
                f"sglang:inter_token_latency_seconds_bucket{{{lab},le=\"+Inf\"}} {itl_n}\n"
                f"sglang:inter_token_latency_seconds_sum{{{lab}}} {itl!r}\n"
                f"sglang:inter_token_latency_seconds_count{{{lab}}} {itl_n}\n"
                f"# TYPE sglang:prompt_tokens counter\n"
                f"sglang:prompt_tokens_total{{{lab}}} {prompt}\n"
                f"# TYPE sglang:num_requests counter\n"
                f"sglang:num_requests_total{{{lab}}} {k}\n"
                f"# TYPE sglang:num_queue_reqs gauge\n"
                f'sglang:num_queue_reqs{{{lab},tp_rank="0"}} {queued}\n'
                f'sglang:num_queue_reqs{{{lab},tp_rank="1"}} {queued}\n'
                f"# TYPE sglang:generation_tokens counter\n"
                f"sglang:generation_tokens_total{{{lab}}} {tokens}\n")

    def run_window(self, k: int) -> None:
        self.k, self.sglang_calls = k, 0
        self.clock[0] = T0 + k * INTERVAL
        self.runner.run_window()

    def get(self, path: str) -> bytes:
        status, _, body = self.http.get(path, {})
        assert status == 200, (path, status)
        return body


# ------------------------------------------------------------------------------------ a fake Prometheus

QUERY = re.compile(r"max by \((?P<by>[^)]*)\) \((?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<sel>.*)\}\)")
MATCHER = re.compile(r'\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
LOOKBACK_S = 300.0


def _go_float(v: float) -> str:
    """A sample value as Prometheus' JSON writes it (strconv.FormatFloat(v, 'f', -1, 64))."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return format(Decimal(repr(v)), "f")


class FakePrometheus:
    """Scrapes stored per target; `max by` range queries over them, with Prometheus' lookback and staleness."""

    def __init__(self) -> None:
        self.targets: dict[str, tuple[list[float], list[list[dict[str, str] | float]]]] = {}
        self.queries: list[str] = []

    def scrape(self, instance: str, t: float, text: str) -> None:
        series = []
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                labels = {k: v for k, v in s.labels.items() if v != ""}  # an empty label is no label
                series.append(({**labels, "__name__": s.name, "instance": instance, "job": "ml/svc"}, s.value))
        times, scrapes = self.targets.setdefault(instance, ([], []))
        times.append(t)
        scrapes.append(series)

    def get_json(self, url: str, timeout: float = 5.0):
        u = urllib.parse.urlsplit(url)
        assert u.path == "/api/v1/query_range", url
        q = {k: v[0] for k, v in urllib.parse.parse_qs(u.query).items()}
        self.queries.append(q["query"])
        m = QUERY.fullmatch(q["query"])
        assert m, q["query"]
        by = [b.strip() for b in m["by"].split(",")]
        matchers = MATCHER.findall(m["sel"])
        assert "".join(MATCHER.sub("", m["sel"])) == "", m["sel"]
        start, end = float(q["start"]), float(q["end"])
        step = float(q["step"].removesuffix("s"))
        groups: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
        i = 0
        while (t := start + i * step) <= end:
            i += 1
            for times, scrapes in self.targets.values():
                j = bisect_right(times, t) - 1
                if j < 0 or t - times[j] > LOOKBACK_S:
                    continue
                for labels, v in scrapes[j]:  # only the latest scrape: a series gone from it is stale
                    if labels["__name__"] != m["name"] or not all(_match(labels, *mt) for mt in matchers):
                        continue
                    key = tuple((b, labels[b]) for b in by if b in labels)
                    at = groups.setdefault(key, {})
                    at[t] = max(at.get(t, -math.inf), v)
        result = [{"metric": dict(key), "values": [[round(t, 3), _go_float(v)] for t, v in sorted(vals.items())]}
                  for key, vals in groups.items()]
        return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def _match(labels: dict[str, str], name: str, op: str, value: str) -> bool:
    have = labels.get(name, "")
    if op in ("=", "!="):
        return (have == value) == (op == "=")
    return (re.fullmatch(value, have) is not None) == (op == "=~")


# ------------------------------------------------------------------------------------ the run

def run(case: str, monkeypatch) -> tuple[list[gate.Window], list[gate.Window], FakePrometheus]:
    """Every pod's sidecar over N_WINDOWS windows, scraped every SCRAPE s; (Prometheus windows, sidecar
    windows, the fake Prometheus)."""
    clock = [T0]
    cars = {pod: Sidecar(pod, rev, ranks, f"10.0.0.{i + 1}", case, clock)
            for i, (pod, (rev, ranks)) in enumerate(PODS.items())}
    prom = FakePrometheus()
    # A window is stored when its samplers return (about DURATION + 0.5 s after it starts); the scrapes
    # start 3 s after the first window.
    events = [(T0 + k * INTERVAL + DURATION + 1.0, 0, k) for k in range(N_WINDOWS)]
    s = T0 + 3.0
    while s < NOW:
        events.append((s, 1, s))
        s += SCRAPE
    for _, kind, arg in sorted(events):
        for car in cars.values():
            if kind == 0:
                car.run_window(arg)
            else:
                clock[0] = arg
                prom.scrape(f"{car.ip}:9400", arg, car.get("/metrics").decode())
    clock[0] = NOW
    monkeypatch.setattr(prometheus_source, "get_json", prom.get_json)
    revisions = ["stable", "canary"]
    from_prom = sources.Prometheus("http://prometheus.test", "ml", "svc", INTERVAL).read(revisions, T0, NOW)
    by_ip = {car.ip: car for car in cars.values()}

    def fetch(url: str, timeout: float):
        u = urllib.parse.urlsplit(url)
        return json.loads(by_ip[u.hostname].get(u.path))

    monkeypatch.delenv("VLM_SIDECAR_ENDPOINTS", raising=False)
    reader = sources.SidecarReader(fetch=fetch)
    pods = [(pod, car.revision, car.ip) for pod, car in cars.items()]
    from_side = sources.Sidecars(reader, pods, INTERVAL).read(revisions, T0, NOW)
    return from_prom, from_side, prom


def identity(w: gate.Window) -> tuple:
    return w.pod, w.tp_rank, w.end


def decide(ws: list[gate.Window]) -> gate.Decision:
    return gate.decide([w for w in ws if w.revision == "stable"], [w for w in ws if w.revision == "canary"],
                       POLICY, started_at=T0, now=NOW, step_duration_s=120.0)


def without_self_shares(ws: list[gate.Window]) -> list[gate.Window]:
    """The windows as the Prometheus source read them before: no self shares, no bounds (scheduler or role)."""
    return [replace(w, self_shares={}, unexported_self_share_max=None,
                    frontend={r: replace(x, self_shares={}, unexported_self_share_max=None)
                              for r, x in w.frontend.items()}) for w in ws]


@pytest.mark.parametrize(("case", "fn"), [("scheduler", "convert_rgb"), ("frontend", "slow_convert_color")])
def test_both_sources_give_the_same_windows_and_the_same_decision(case, fn, monkeypatch):
    from_prom, from_side, prom = run(case, monkeypatch)
    ranks = sum(r for _, r in PODS.values())
    assert len(from_side) == N_WINDOWS * ranks
    prom_by, side_by = {identity(w): w for w in from_prom}, {identity(w): w for w in from_side}
    assert len(prom_by) == len(from_prom) and len(side_by) == len(from_side)
    assert sorted(prom_by) == sorted(side_by), "the sources read different windows"
    for k, s in side_by.items():
        p = prom_by[k]
        diff = {f.name: (getattr(p, f.name), getattr(s, f.name)) for f in fields(gate.Window)
                if f.name != "id" and getattr(p, f.name) != getattr(s, f.name)}
        assert not diff, (k, diff)
    # What the windows carry, so the parity above is not the parity of empty fields.
    for w in from_side:
        assert w.self_shares and w.function_shares and w.unexported_self_share_max is not None, w
        assert w.feature_transport_share and w.ipc_handle_reopen_share and w.feature_transport_samples, w
        assert w.request_rate and w.ttft_seconds and w.itl_seconds and w.throughput and w.iterations, w
        assert set(w.sglang_stage_shares) == set(SGLANG_STAGES) and w.forward_pass_rate, w
        assert w.queued_requests is not None and w.prompt_tokens_per_request, w
        assert w.samples > 1 and not w.stale and w.loop_mean_seconds and w.loop_p95_seconds, w
        assert set(w.frontend) == {"tokenizer_manager", "mm_processor"}, w
        mm = w.frontend["mm_processor"]
        assert mm.self_shares and mm.unexported_self_share_max and mm.unexported_self_share_max > 0, mm
    assert {w.tp_rank for w in from_side} == {0, 1}
    saturated = sum(1 for w in from_side if w.saturated_throughput is not None)
    assert 0 < saturated < len(from_side), saturated  # throughput compared in some windows, not in all
    # Every series the source asked for was the sidecar's own (a renamed gauge shows up as an empty answer).
    asked = {QUERY.fullmatch(q)["name"] for q in prom.queries}
    scraped = {labels["__name__"] for _, scrapes in prom.targets.values() for labels, _ in scrapes[-1]}
    assert asked <= scraped, asked - scraped

    dp, ds = decide(from_prom), decide(from_side)
    assert (dp.verdict, dp.reason, dp.regressed_function, dp.regressed_stage) == \
        (ds.verdict, ds.reason, ds.regressed_function, ds.regressed_stage)
    assert dp.signals == ds.signals
    assert dp == ds
    assert dp.verdict == "Rollback", dp
    # The function is named only through the bound of what the baseline's sidecars left out.
    assert dp.regressed_function == fn, dp
    assert all(fn not in w.function_shares and fn not in w.frontend["mm_processor"].function_shares
               for w in from_prom if w.revision == "stable")
    if case == "frontend":
        assert dp.reason == gate.SIGNALS["frontend_busy"].reason and dp.regressed_stage is None, dp
    else:
        assert dp.regressed_stage == "process_input_requests", dp
    old = decide(without_self_shares(from_prom))
    assert old.verdict == "Rollback" and old.regressed_function != fn, old


def test_the_chrometrace_writer_round_trips():
    """The fake py-spy output parses back into the segments it was written from."""
    trace = scheduler_trace(random.Random(1), grown=True)
    back = parse_chrometrace(chrometrace(trace))
    assert back.error is None and back.bad_events == 0
    tid = pick_scheduler_thread(trace)
    assert back.threads[tid] == trace.threads[tid]
