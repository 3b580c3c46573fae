"""`vlm-sidecar`: wire config, discovery, sampler, runner and HTTP together and run until SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from vlm_sidecar.collector import ProfileStore
from vlm_sidecar.config import ConfigError, load_config
from vlm_sidecar.discovery import discover
from vlm_sidecar.runner import Runner, event
from vlm_sidecar.sampler import PySpySampler
from vlm_sidecar.server import SidecarHTTP


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        cfg = load_config(sys.argv[1:] if argv is None else argv, dict(os.environ))
    except ConfigError as e:
        print(f"vlm-sidecar: {e}", file=sys.stderr)
        return 2
    store = ProfileStore(cfg.history)
    sampler = PySpySampler(cfg.pyspy, cfg.rate_hz, cfg.duration_s, blocking=cfg.blocking,
                           timeout_slack_s=cfg.timeout_slack_s)
    me = os.getpid()
    runner = Runner(cfg, store, sampler,
                    lambda: discover(cfg.proc_root, cfg.process_pattern, cfg.discovery_root_pid, me))
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
    http.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
