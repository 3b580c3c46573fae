"""`vlm-sidecar`: wire config, discovery, sampler, runner and HTTP together and run until SIGTERM.

A bad flag or environment value is one line naming both (`vlm-sidecar: --port (VLM_SIDECAR_PORT): not a
valid integer (got 'x')`) and exit code 2; logs are JSON lines with time and level (vlm_sidecar.log)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from vlm_sidecar.collector import ProfileStore
from vlm_sidecar.config import ConfigError, load_config
from vlm_sidecar.discovery import discover, discover_roles
from vlm_sidecar.log import configure as configure_logging
from vlm_sidecar.log import event
from vlm_sidecar.runner import Runner
from vlm_sidecar.sampler import PySpySampler
from vlm_sidecar.server import SidecarHTTP


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    try:
        cfg = load_config(sys.argv[1:] if argv is None else argv, dict(os.environ))
    except ConfigError as e:
        print(f"vlm-sidecar: {e}", file=sys.stderr)
        return 2
    store = ProfileStore(cfg.history)
    sampler = PySpySampler(cfg.pyspy, cfg.rate_hz, cfg.duration_s, blocking=cfg.blocking,
                           timeout_slack_s=cfg.timeout_slack_s)
    frontend_sampler = PySpySampler(cfg.pyspy, cfg.frontend_rate_hz, cfg.frontend_duration_s, blocking=cfg.blocking,
                                    timeout_slack_s=cfg.timeout_slack_s)
    me = os.getpid()

    def find():
        if cfg.frontend_roles:
            return discover_roles(cfg.proc_root, cfg.process_pattern, cfg.discovery_root_pid, me, cfg.frontend_roles)
        return discover(cfg.proc_root, cfg.process_pattern, cfg.discovery_root_pid, me)

    runner = Runner(cfg, store, sampler, find, frontend_sampler=frontend_sampler)
    loop = threading.Thread(target=runner.run_forever, name="profiler", daemon=True)
    # A window can take interval + duration + timeout slack; past two intervals the data is stale.
    stale_after = 2 * cfg.interval_s + cfg.duration_s + cfg.timeout_slack_s
    http = SidecarHTTP(store, cfg.labels, stale_after, time.time, alive=loop.is_alive)
    try:
        httpd = http.serve(cfg.host, cfg.port)
    except OSError as e:
        print(f"vlm-sidecar: cannot listen on {cfg.host}:{cfg.port}: {e}", file=sys.stderr)
        return 1
    loop.start()
    event("Serving", port=httpd.server_address[1])
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    event("Stopping")
    runner.stop()
    loop.join(timeout=cfg.duration_s + 5)
    # A py-spy that has not exited on SIGINT by now is killed: the exit would otherwise wait for it (CI, 2026-12-07:
    # py-spy processes of a front-end window still ran 60 s after SIGTERM on a loaded machine).
    runner.kill()
    loop.join(timeout=5)
    http.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
