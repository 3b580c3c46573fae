"""Start, find and stop the testbed's processes through pid files under the run dir.

A pid is only trusted when /proc/<pid>/cmdline still mentions this run dir: pids get reused, and
`down` must never signal a process the testbed did not start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from . import netns
from .layout import Layout


def pid_file(layout: Layout, name: str) -> Path:
    return layout.pids / f"{name}.pid"


def log_file(layout: Layout, name: str) -> Path:
    return layout.logs / f"{name}.log"


def running_pid(layout: Layout, name: str) -> int | None:
    """The component's pid if it is alive and really ours, else None."""
    try:
        pid = int(pid_file(layout, name).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    # A zombie (state Z, after the field in parentheses) has exited already.
    if stat.rpartition(")")[2].split()[0] == "Z":
        return None
    return pid if str(layout.run_dir).encode() in cmdline else None


def start(layout: Layout, name: str, argv: list[str], ns: str | None = None) -> int:
    """Launch a component detached from this process, logging to logs/<name>.log.

    ns: the network namespace to start it in (a testbed namespace name or a path); None: the caller's.
    """
    layout.logs.mkdir(parents=True, exist_ok=True)
    layout.pids.mkdir(parents=True, exist_ok=True)
    with open(log_file(layout, name), "ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {' '.join(argv)}\n".encode())
        log.flush()
        # A new session so the component outlives `hack/testbed up` and ignores its ^C.
        # Entered here, not in a preexec_fn: the child inherits the thread's namespace at fork.
        with netns.entered(ns):
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=layout.run_dir,
            )
    pid_file(layout, name).write_text(f"{proc.pid}\n")
    # Popen can return while the kernel still shows the pre-exec cmdline; wait until the pid
    # reads as ours so the next liveness check does not mistake that window for an exit.
    deadline = time.monotonic() + 2.0
    while proc.poll() is None and running_pid(layout, name) != proc.pid and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc.pid


def stop(layout: Layout, name: str, grace_s: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after grace_s. Returns whether a process was running."""
    pid = running_pid(layout, name)
    if pid is None:
        pid_file(layout, name).unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and running_pid(layout, name) == pid:
        time.sleep(0.1)
    if running_pid(layout, name) == pid:
        os.kill(pid, signal.SIGKILL)
        while running_pid(layout, name) == pid:
            time.sleep(0.05)
    pid_file(layout, name).unlink(missing_ok=True)
    return True


def log_tail(layout: Layout, name: str, lines: int = 40) -> str:
    try:
        text = log_file(layout, name).read_text(errors="replace")
    except FileNotFoundError:
        return "(no log file)"
    return "\n".join(text.splitlines()[-lines:])
