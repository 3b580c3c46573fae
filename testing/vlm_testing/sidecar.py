"""Helpers for the sidecar tests: golden paths, the SGLang stand-in run as a real process."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from vlm_sidecar.collector import ProfileStore
from vlm_sidecar.estimators import summarize
from vlm_sidecar.parser import parse_chrometrace

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "sidecar"
STANDIN = ROOT / "testing" / "vlm_testing" / "standin" / "sglang_standin.py"


def load_standin():
    """The stand-in is a script under bench/, not a package: import it by path."""
    spec = importlib.util.spec_from_file_location("sglang_standin", STANDIN)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sglang_standin", mod)
    spec.loader.exec_module(mod)
    return mod


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Standin:
    """A running stand-in: its process, port, scheduler pids and true accounting."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
        full_env.update(env or {})
        self.proc = subprocess.Popen([sys.executable, str(STANDIN), "--port", str(self.port), "--enable-metrics",
                                      *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"stand-in did not start: {self.proc.stderr.read().decode()[-2000:]}")
        self.info = json.loads(line)
        self.pids = self.info["pids"]

    def get(self, path: str):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
            return json.loads(r.read())

    def accounting(self, start: float, end: float, rank: int = 0) -> dict:
        return self.get(f"/standin/accounting?start={start}&end={end}")["ranks"][rank]

    def current_pids(self) -> list[int]:
        return self.get("/standin/info")["pids"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def fake_proc(root, pid, ppid, cmdline: bytes, comm: str, start: int = 100):
    d = root / str(pid)
    d.mkdir()
    (d / "cmdline").write_bytes(cmdline)
    (d / "comm").write_text(comm + "\n")
    (d / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0\n")


LABELS = {"namespace": "ml", "vlmservice": "qwen", "pod": "qwen-abc", "revision": "r2"}


def fill(store: ProfileStore, names=("cache_on", "cache_off"), rank: int = 0) -> list:
    out = []
    for i, name in enumerate(names):
        trace = parse_chrometrace((GOLDEN / f"{name}.chrometrace.json").read_bytes())
        w, stacks = summarize(trace, window_id=store.new_id(), tp_rank=rank, pid=100, start=1000.0 + 10 * i,
                              end=1001.0 + 10 * i, samples=500, watch=("hash_feature",), top_n=3)
        if i:  # SGLang's own stage counters read over the second window (0.5.20 on): its shares, 1 point apart
            w = dataclasses.replace(w, sglang_stage_shares={k: v + (0.01 if k == "run_batch" else 0.0)
                                                            for k, v in w.stage_shares.items()})
        store.add_window(w, stacks, 500.0, {"run_batch": 0.01} if i else None)
        out.append(w)
    return out


def get(url: str, data: bytes | None = None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=5) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read()
