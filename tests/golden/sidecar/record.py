"""Re-record the py-spy golden files from the SGLang stand-in (needs py-spy and ptrace rights).

    python tests/golden/sidecar/record.py

Writes <name>.chrometrace.json / <name>.raw.txt (1 s each, to stay small). Then regenerate the expected estimator outputs:

    VLM_REGEN_GOLDEN=1 pytest tests/unit/sidecar/test_golden.py
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
STANDIN = ROOT / "bench" / "standin" / "sglang_standin.py"
PYSPY = shutil.which("py-spy") or str(Path(sysconfig.get_path("scripts")) / "py-spy")

CASES = [
    # name, stand-in args, py-spy format, rate, seconds
    ("cache_off", ["--standin-version", "0.5.10", "--standin-batch-ms", "12"], "chrometrace", 500, 1),
    ("cache_on", ["--standin-version", "0.5.17", "--standin-batch-ms", "12"], "chrometrace", 500, 1),
    ("cache_off", ["--standin-version", "0.5.10"], "raw", 200, 1),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record(name: str, args: list[str], fmt: str, rate: int, seconds: int) -> None:
    port = free_port()
    env = dict(os.environ, SGLANG_USE_CUDA_IPC_TRANSPORT="1", SGLANG_USE_IPC_POOL_HANDLE_CACHE="0")
    if "0.5.17" in args:
        env.pop("SGLANG_USE_IPC_POOL_HANDLE_CACHE")
    proc = subprocess.Popen([sys.executable, str(STANDIN), "--port", str(port), *args], stdout=subprocess.PIPE,
                            env=env)
    try:
        pid = json.loads(proc.stdout.readline())["pids"][0]
        time.sleep(2)
        ext = "chrometrace.json" if fmt == "chrometrace" else "raw.txt"
        out = HERE / f"{name}.{ext}"
        subprocess.run([PYSPY, "record", "-p", str(pid), "-o", str(out), "-f", fmt, "-r", str(rate), "-d",
                        str(seconds), "--nonblocking", "--idle"], check=True, capture_output=True)
        if fmt == "chrometrace":
            # One event per line keeps diffs of re-recordings readable.
            events = json.loads(out.read_text())
            out.write_text("[\n" + ",\n".join(json.dumps(e, sort_keys=True) for e in events) + "\n]\n")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    for case in CASES:
        record(*case)
