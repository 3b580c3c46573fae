"""Helpers for the sidecar tests: golden paths, the SGLang stand-in run as a real process."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "golden" / "sidecar"
STANDIN = ROOT / "bench" / "standin" / "sglang_standin.py"


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


