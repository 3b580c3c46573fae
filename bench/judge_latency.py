"""How long the judge endpoint takes to answer (docs/judge.md): a canary of `--pods` pods against a baseline of as
many, each with a sidecar stand-in serving 5 minutes of recorded windows (bench/data/gate_noise_windows.json: real
sidecar output of the stand-in scheduler, cache on for the baseline, cache off for the canary in `--case rollback`,
the same cache-on recording for both in `--case unchanged` (an A/A: each pod starts at another window)), re-timed to end now, one window per 15 s telemetry interval.

The stand-ins run in a child process (one HTTP server per pod on 127.0.0.1, found through VLM_SIDECAR_ENDPOINTS as
the testbed does), the judge in this one behind its real HTTP server (`judge_server.serve`), called over HTTP with a
JSON body as Argo's web provider sends it. What it leaves out: the pod list and the TokenReview are answered
in-process (a fake API server: the pod list is one API call per selector, a few ms in a cluster; the token's
review is cached 30 s, so at Argo's 1-minute interval every call pays one TokenReview round trip).

Each call builds a fresh SidecarReader (`--reader fresh`, the default): every pod's sidecar is read at every call,
which is what an Argo or Flagger interval of 1 minute gets at a 15 s telemetry interval (each pod's next window is
due by then). `--reader shared` keeps one reader, as the operator does, whose cache answers calls within a window.

    python bench/judge_latency.py [--pods 16] [--calls 50] [--case rollback|unchanged] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "bench" / "data" / "gate_noise_windows.json"
INTERVAL = 15.0
SPAN_S = 300.0  # 5 minutes of windows per pod


def windows_for(recorded: list[dict], now: float, offset: int) -> list[dict]:
    """SPAN_S / INTERVAL windows of one pod, ending now (the newest) back to SPAN_S ago, taken from the recording
    from `offset` on (so pods differ), with the recording's start-to-end length kept."""
    n = int(SPAN_S / INTERVAL)
    out = []
    for k in range(n):
        w = dict(recorded[(offset + k) % len(recorded)])
        length = float(w["end"]) - float(w["start"])
        end = now - (n - 1 - k) * INTERVAL
        w.update(id=k, end=end, start=end - length)
        out.append(w)
    return out


def serve_standins(bodies: list[bytes], ports: Any, ready: Any) -> None:
    """Child process: one HTTP server per pod serving its /windows.json."""
    servers = []
    for body in bodies:
        def handler(data: bytes = body) -> type[BaseHTTPRequestHandler]:
            class H(BaseHTTPRequestHandler):
                protocol_version = "HTTP/1.0"

                def do_GET(self) -> None:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

                def log_message(self, *a: Any) -> None:
                    pass
            return H

        s = ThreadingHTTPServer(("127.0.0.1", 0), handler())
        s.daemon_threads = True
        servers.append(s)
        threading.Thread(target=s.serve_forever, daemon=True).start()
    for i, s in enumerate(servers):
        ports[i] = s.server_address[1]
    ready.set()
    while True:
        time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=16, help="pods per side")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--case", choices=["rollback", "unchanged"], default="rollback")
    ap.add_argument("--reader", choices=["fresh", "shared"], default="fresh")
    ap.add_argument("--out", type=Path, help="append a markdown result row here")
    a = ap.parse_args(argv)

    sys.path[:0] = [str(REPO / "operator"), str(REPO / "sidecar")]
    from vlm_operator.analysis import sources
    from vlm_operator.api.settings import Settings
    from vlm_operator.judge import server as judge_server

    settings = Settings()  # the shipped defaults: sidecar timeout, workers
    rec = json.loads(DATA.read_text())
    base_rec, can_rec = rec["cache_on"], rec["cache_off" if a.case == "rollback" else "cache_on"]
    now = time.time()
    names = [f"qwen-vl-stable-{i}" for i in range(a.pods)] + [f"qwen-vl-canary-{i}" for i in range(a.pods)]
    bodies = [json.dumps(windows_for(base_rec if n.startswith("qwen-vl-stable") else can_rec, now, 3 * i)).encode()
              for i, n in enumerate(names)]
    ports = multiprocessing.Array("i", len(names))
    ready = multiprocessing.Event()
    child = multiprocessing.Process(target=serve_standins, args=(bodies, ports, ready), daemon=True)
    child.start()
    ready.wait(30)
    endpoints = Path(tempfile.mkdtemp()) / "endpoints.json"
    endpoints.write_text(json.dumps({n: f"127.0.0.1:{ports[i]}" for i, n in enumerate(names)}))
    os.environ["VLM_SIDECAR_ENDPOINTS"] = str(endpoints)

    pods = [{"metadata": {"name": n, "labels": {"app": "qwen-vl", "hash": "stable" if "stable" in n else "canary"}},
             "spec": {"nodeName": f"node-{i % a.pods}"},
             "status": {"podIP": f"10.0.0.{i + 1}", "conditions": [
                 {"type": "Ready", "status": "True", "lastTransitionTime": time.strftime(
                     "%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - SPAN_S - 60))}]}}
            for i, n in enumerate(names)]

    class Conn:
        def request(self, method: str, path: str, *, query: Any = None, headers: Any = None, body: Any = None) -> bytes:
            want = dict(t.split("=", 1) for t in dict(query)["labelSelector"].split(","))
            return json.dumps({"items": [p for p in pods if all(
                p["metadata"]["labels"].get(k) == v for k, v in want.items())]}).encode()

    class Auth:
        def authenticate(self, token: str) -> judge_server.Caller | None:
            return judge_server.Caller("system:serviceaccount:serving:argo") if token == "t" else None

        def authorize(self, caller: judge_server.Caller, namespace: str) -> bool:
            return True

    def reader() -> sources.SidecarReader:
        return sources.SidecarReader(timeout_s=settings.sidecar_timeout_seconds, workers=settings.sidecar_workers)

    j = judge_server.Judge(Conn(), reader(), auth=Auth())
    server = judge_server.serve(j, 0, host="127.0.0.1")
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/judge"
    body = json.dumps({"namespace": "serving", "baseline": "app=qwen-vl,hash=stable", "canary": "app=qwen-vl,hash=canary",
                       "analysis": {"maxDuration": "30m"}}).encode()
    times, answers = [], []
    for _ in range(a.calls + 3):
        if a.reader == "fresh":
            j.reader = reader()
        req = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Authorization": "Bearer t", "Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=30) as r:
            answers.append(json.loads(r.read()))
        times.append(time.perf_counter() - t0)
        if a.reader == "fresh":
            j.reader.close()
    times = times[3:]  # the first calls warm imports and connections
    # Where the time goes (in-process, no HTTP): reading the pods' windows, and the gate's decision.
    from vlm_operator.judge import evaluate as judge

    req = judge.parse(json.loads(body))
    split: dict[str, list[float]] = {"read": [], "decide": []}
    for _ in range(min(10, a.calls)):
        j.reader = reader()
        t0 = time.perf_counter()
        got = j.read(req, time.time())
        t1 = time.perf_counter()
        judge.decide(req, got.windows, got.pods, now=time.time(), unavailable=got.unavailable)
        split["read"].append(t1 - t0)
        split["decide"].append(time.perf_counter() - t1)
        j.reader.close()
    server.shutdown()
    child.terminate()
    last = answers[-1]
    q = statistics.quantiles(times, n=100, method="inclusive")
    row = {
        "case": a.case, "reader": a.reader, "pods": f"{a.pods}+{a.pods}", "calls": a.calls,
        "windows": last["analysis"]["windows"], "verdict": f"{last['verdict']} ({last['reason']})",
        "grew": f"{last['regressedStage']} / {last['regressedFunction']}" if last["regressedFunction"] else "-",
        "p50_ms": round(1000 * statistics.median(times), 1), "p99_ms": round(1000 * q[98], 1),
        "max_ms": round(1000 * max(times), 1),
        "read_p50_ms": round(1000 * statistics.median(split["read"]), 1),
        "decide_p50_ms": round(1000 * statistics.median(split["decide"]), 1),
    }
    print(json.dumps(row))
    if a.out:
        new = not a.out.exists()
        with a.out.open("a") as f:
            if new:
                f.write("| date | case | reader | pods | calls | windows read (base/canary) | verdict | grew | p50 ms | p99 ms | max ms | read / decide p50 ms |\n"
                        "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
            w = row["windows"]
            f.write(f"| {time.strftime('%Y-%m-%d')} | {row['case']} | {row['reader']} | {row['pods']} | {row['calls']} | "
                    f"{w['baseline']}/{w['canary']} | {row['verdict']} | {row['grew']} | {row['p50_ms']} | "
                    f"{row['p99_ms']} | {row['max_ms']} | {row['read_p50_ms']} / {row['decide_p50_ms']} |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
