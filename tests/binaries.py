"""The control-plane binaries for the integration and e2e tiers, built while the unit tier runs.

`make test` builds only the tools stage in front (py-spy and helm, which the unit tier uses). When the
collected tests include integration or e2e ones, the session starts `hack/build-binaries.sh --stage
cluster` in the background at the lowest CPU priority (nice 19: the unit tier's measurements keep the
CPU; the build takes what they leave idle), and the first test that needs the control plane waits for
it. On a machine where everything is cached the background run finishes in a second. On a cold one it
overlaps the 15-20 minute Go build with the unit tier instead of running them one after the other.

`ensure()` then runs the cluster stage once more in the foreground: a no-op after a good background run
(the script serialises on a lock in the cache and skips what is built), the real build if none ran (a
plain `pytest tests/integration`), and the build's own error when the background run failed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "hack" / "build-binaries.sh"
CACHE = Path(os.environ.get("VLM_CACHE") or Path.home() / ".cache" / "vlm-operator")
LOG = CACHE / "build-cluster.log"

_lock = threading.Lock()
_background: subprocess.Popen[bytes] | None = None
_ensured: subprocess.CompletedProcess[str] | None = None


def start_background() -> None:
    """Start the cluster stage behind the tests (once per session)."""
    global _background
    with _lock:
        if _background is not None:
            return
        CACHE.mkdir(parents=True, exist_ok=True)
        with LOG.open("wb") as out:
            _background = subprocess.Popen(["nice", "-n", "19", "bash", str(SCRIPT), "--stage", "cluster"],
                                           stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True)


def ensure(timeout_s: float = 3600) -> subprocess.CompletedProcess[str]:
    """Wait for the background build, then make sure the cluster stage is complete (building it if not).
    Returns the foreground run; its returncode is non-zero, with the script's stderr, when a binary is
    missing and cannot be built."""
    global _ensured
    with _lock:
        if _ensured is not None and _ensured.returncode == 0:
            return _ensured
        if _background is not None and _background.poll() is None:
            # On a timeout the foreground run below waits on the script's lock and reports what it finds.
            with contextlib.suppress(subprocess.TimeoutExpired):
                _background.wait(timeout_s)
        try:
            _ensured = subprocess.run(["bash", str(SCRIPT), "--stage", "cluster"], capture_output=True, text=True,
                                      timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            _ensured = subprocess.CompletedProcess(e.cmd, 124, "", f"hack/build-binaries.sh --stage cluster did not "
                                                   f"finish in {timeout_s:.0f} s")
        if _ensured.returncode != 0 and LOG.exists():
            _ensured.stderr += f"\n(background build log, {LOG}):\n" + LOG.read_text(errors="replace")[-4000:]
        return _ensured


def stop_background() -> None:
    """At the session's end: a build still running (the session stopped early) is stopped; the Go build cache
    keeps what it compiled, and the script rebuilds only what has no finished binary."""
    with _lock:
        if _background is not None and _background.poll() is None:
            try:
                os.killpg(_background.pid, signal.SIGTERM)
                _background.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
