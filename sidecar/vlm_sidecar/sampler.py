"""Runs one py-spy window against one pid and classifies what went wrong.

`py-spy record --nonblocking --idle --nolineno -f chrometrace -d DURATION -r RATE -p PID -o FILE`:
nonblocking so the scheduler is never paused (blocking mode costs loop throughput, see
bench/sidecar_overhead.py); idle so a sleeping scheduler is sampled as idle instead of its last busy
stack being stretched over the gap; chrometrace because it is the only format that keeps time;
`--main-thread` where the py-spy has it (the sidecar image's build: `supports_main_thread`), so py-spy's
cost does not grow with the target's other threads.
py-spy writes its output only at the end: SIGINT makes it write, SIGTERM would lose it, so a window
that overruns gets SIGINT first and SIGKILL only after a grace period.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_SAMPLES_RE = re.compile(r"Samples:\s*(\d+)\s+Errors:\s*(\d+)")


def find_pyspy(configured: str | None) -> str | None:
    """The configured binary, else py-spy on PATH, else the one pip put next to this interpreter."""
    if configured:
        return configured
    found = shutil.which("py-spy")
    if found:
        return found
    candidate = Path(sysconfig.get_path("scripts")) / "py-spy"
    return str(candidate) if candidate.exists() else None


def process_alive(pid: int) -> bool:
    """True while /proc/PID exists and is not a zombie (a dead child its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("utf-8", "replace")
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[:1]
    return state != ["Z"] and state != ["X"]


@dataclass(frozen=True)
class SampleOutcome:
    """What one py-spy run produced; `error_kind` is one of model.ERROR_KINDS or None."""

    pid: int
    started: float
    ended: float
    output: bytes | None
    returncode: int | None
    stderr: str
    error_kind: str | None
    error: str | None
    samples: int | None
    pyspy_errors: int | None


def classify_failure(returncode: int | None, stderr: str, target_alive: bool) -> tuple[str, str] | None:
    """(kind, message) for a py-spy run that did not end cleanly, None if it did. Pure."""
    low = stderr.lower()
    first = next((ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.startswith("py-spy>")), "")
    if "permission denied" in low or "operation not permitted" in low:
        return "permission_denied", first or "permission denied"
    if (not target_alive or "check that the process is running" in low or "no such process" in low
            or "process exited" in low):
        return "target_gone", first or "target process exited"
    if returncode is None:
        return "timeout", "py-spy did not finish"
    if returncode != 0:
        how = f"signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        return "crash", f"py-spy {how}: {first}"[:300]
    return None


@functools.cache
def supports_main_thread(pyspy: str) -> bool:
    """True when this py-spy has `record --main-thread` (the sidecar image's build, hack/build-pyspy.sh): it
    then reads only each process's main thread, where SGLang runs every loop the sidecar measures (the
    scheduler's, the TokenizerManager's uvloop, a pool worker's, the detokenizer's), instead of walking every
    Python thread on every sample. A py-spy without it (the PyPI wheel) samples every thread, as before.
    `--help` answers in milliseconds; one that has not in 5 s is a hung binary, read as without it (the windows
    then report its failures), so a sidecar does not wait half a minute before its first window."""
    try:
        out = subprocess.run([pyspy, "record", "--help"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return "--main-thread" in out.stdout


class PySpySampler:
    """One window per call to `record`; safe to call from several threads (one per TP rank)."""

    def __init__(self, pyspy: str | None, rate_hz: int, duration_s: float, *, blocking: bool = False,
                 idle: bool = True, timeout_slack_s: float = 10.0, grace_s: float = 5.0,
                 clock: Callable[[], float] = time.time, pid_alive: Callable[[int], bool] | None = None,
                 main_thread: bool | None = None) -> None:
        self.pyspy = find_pyspy(pyspy)
        # None: whenever the binary supports it.
        self.main_thread = (supports_main_thread(self.pyspy) if self.pyspy else False) if main_thread is None \
            else main_thread
        self.rate_hz = rate_hz
        self.duration_s = duration_s
        self.blocking = blocking
        self.idle = idle
        self.timeout_slack_s = timeout_slack_s
        self.grace_s = grace_s
        self.clock = clock
        self.pid_alive = pid_alive or process_alive
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._stopping = False  # set by stop_all: a py-spy started after it is stopped at once

    def command(self, pid: int, out: str) -> list[str]:
        # py-spy's -d takes whole seconds; a window shorter than 1 s is rounded up.
        # --nolineno: the sidecar reads function and file names only; line numbers cost py-spy a read of the
        # code object's line table per frame per sample, a noticeable part of its CPU (docs/benchmarks.md,
        # "py-spy without line numbers").
        cmd = [self.pyspy or "py-spy", "record", "-p", str(pid), "-o", out, "-f", "chrometrace",
               "-r", str(self.rate_hz), "-d", str(max(1, round(self.duration_s))), "--nolineno"]
        if not self.blocking:
            cmd.append("--nonblocking")
        if self.idle:
            cmd.append("--idle")
        if self.main_thread:
            cmd.append("--main-thread")
        return cmd

    def record(self, pid: int) -> SampleOutcome:
        started = self.clock()
        if self.pyspy is None:
            return self._outcome(pid, started, None, None, "", ("pyspy_missing", "py-spy not found"))
        with self._lock:
            stopping = self._stopping
        if stopping:  # shutdown began before this window's py-spy started: none is started (no samples)
            return self._outcome(pid, started, None, None, "", None)
        with tempfile.TemporaryDirectory(prefix="vlm-sidecar-") as tmp:
            out = os.path.join(tmp, "window.json")
            try:
                proc = subprocess.Popen(self.command(pid, out), stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            except (FileNotFoundError, PermissionError, OSError) as e:
                return self._outcome(pid, started, None, None, "", ("pyspy_missing", f"cannot run py-spy: {e}"))
            with self._lock:
                self._procs.add(proc)
                stopping = self._stopping
            # Shutdown began while this window's py-spy started: it writes what it has at once. (SIGINT can be lost
            # here: a py-spy that has not yet set its handler and inherited SIGINT ignored, as a background job of
            # a non-interactive shell does; the check above and the shutdown's kill_all bound it then.)
            if stopping:
                proc.send_signal(signal.SIGINT)
            timed_out = False
            try:
                try:
                    text, _ = proc.communicate(timeout=self.duration_s + self.timeout_slack_s)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    proc.send_signal(signal.SIGINT)  # makes py-spy write what it has
                    try:
                        text, _ = proc.communicate(timeout=self.grace_s)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        text, _ = proc.communicate()
            finally:
                with self._lock:
                    self._procs.discard(proc)
            stderr = text.decode("utf-8", "replace") if text else ""
            output = None
            try:
                with open(out, "rb") as f:
                    output = f.read()
            except OSError:
                pass
            failure = classify_failure(None if timed_out else proc.returncode, stderr, self.pid_alive(pid))
            if timed_out:
                failure = ("timeout", f"py-spy ran past {self.duration_s + self.timeout_slack_s:.0f}s")
            if failure is None and not output:
                failure = ("empty_output", "py-spy exited cleanly but wrote nothing")
            return self._outcome(pid, started, output or None, proc.returncode, stderr, failure)

    def _outcome(self, pid, started, output, rc, stderr, failure) -> SampleOutcome:
        m = _SAMPLES_RE.search(stderr)
        return SampleOutcome(
            pid=pid, started=started, ended=self.clock(), output=output, returncode=rc, stderr=stderr[-2000:],
            error_kind=failure[0] if failure else None, error=failure[1] if failure else None,
            samples=int(m[1]) if m else None, pyspy_errors=int(m[2]) if m else None,
        )

    def kill_all(self) -> None:
        """Shutdown's last step: SIGKILL any py-spy still running (one that did not exit on SIGINT would otherwise
        hold the sidecar's exit: its pool thread waits for it)."""
        with self._lock:
            procs = list(self._procs)
        for p in procs:
            if p.poll() is None:
                p.kill()

    def stop_all(self) -> None:
        """Shutdown: ask running py-spy processes to write and exit, and any started after this call at once (a
        window that was starting when the sidecar got SIGTERM would otherwise run its whole duration)."""
        with self._lock:
            self._stopping = True
            procs = list(self._procs)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
