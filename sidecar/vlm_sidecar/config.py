"""Sidecar settings: env vars (the pod builder sets these) with a CLI flag for each.

`load_config(argv, environ)` is pure: the caller passes the environment, tests pass a dict.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

# Defaults, chosen in docs/sidecar.md: 1000 Hz resolves 20 ms loop iterations to ~1 ms per boundary,
# a 5 s window holds ~250 such iterations, and one window every 30 s keeps py-spy's CPU to a
# sixth of its in-window cost.
DEFAULT_PORT = 9400
DEFAULT_INTERVAL_S = 30.0
DEFAULT_DURATION_S = 5.0
DEFAULT_RATE_HZ = 1000
DEFAULT_TOP_N = 10
DEFAULT_PATTERN = "sglang::scheduler"
DEFAULT_SGLANG_METRICS_URL = "http://127.0.0.1:30000/metrics"
DEFAULT_WATCH = ("process_input_requests", "hash_feature", "reconstruct_on_target_device", "run_batch")

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class ConfigError(ValueError):
    """A setting the sidecar cannot run with."""


def parse_duration(text: str | float | int) -> float:
    """'30s', '2m', '500ms', '1.5' (seconds) -> seconds."""
    if isinstance(text, int | float):
        value = float(text)
    else:
        m = _DURATION_RE.match(text)
        if not m:
            raise ConfigError(f"not a duration: {text!r} (use e.g. 30s, 2m, 500ms or seconds)")
        value = float(m[1]) * _UNIT_S[m[2]]
    if value <= 0:
        raise ConfigError(f"duration must be positive: {text!r}")
    return value


@dataclass(frozen=True)
class SidecarConfig:
    port: int = DEFAULT_PORT
    host: str = "0.0.0.0"
    interval_s: float = DEFAULT_INTERVAL_S
    duration_s: float = DEFAULT_DURATION_S
    rate_hz: int = DEFAULT_RATE_HZ
    watch_functions: tuple[str, ...] = DEFAULT_WATCH
    top_n: int = DEFAULT_TOP_N
    process_pattern: str = DEFAULT_PATTERN
    sglang_metrics_url: str | None = DEFAULT_SGLANG_METRICS_URL
    pyspy: str | None = None  # None: look on PATH, then next to the Python interpreter
    discovery_root_pid: int | None = None
    pod: str = ""
    namespace: str = ""
    vlmservice: str = ""
    revision: str = ""
    history: int = 64
    blocking: bool = False  # py-spy's default pausing mode; only for the overhead benchmark
    timeout_slack_s: float = 10.0
    proc_root: str = "/proc"

    @property
    def labels(self) -> dict[str, str]:
        """Constant labels on every exported series (tp_rank is added per series)."""
        return {"namespace": self.namespace, "vlmservice": self.vlmservice, "pod": self.pod,
                "revision": self.revision}


def _env_default(environ: dict[str, str], name: str, default):
    value = environ.get(name)
    return default if value is None or value == "" else value


def build_parser(environ: dict[str, str]) -> argparse.ArgumentParser:
    e = environ
    p = argparse.ArgumentParser(prog="vlm-sidecar", description="py-spy profiler sidecar for SGLang schedulers")
    a = p.add_argument
    a("--port", type=int, default=int(_env_default(e, "VLM_SIDECAR_PORT", DEFAULT_PORT)))
    a("--host", default=_env_default(e, "VLM_SIDECAR_HOST", "0.0.0.0"))
    a("--interval", default=_env_default(e, "VLM_PROFILE_INTERVAL", f"{DEFAULT_INTERVAL_S:g}s"),
      help="time between window starts (30s, 2m, or seconds)")
    a("--duration", default=_env_default(e, "VLM_PROFILE_DURATION", f"{DEFAULT_DURATION_S:g}s"),
      help="window length")
    a("--rate", type=int, default=int(_env_default(e, "VLM_PROFILE_RATE", DEFAULT_RATE_HZ)), help="samples/s")
    a("--watch-functions", default=_env_default(e, "VLM_WATCH_FUNCTIONS", ",".join(DEFAULT_WATCH)))
    a("--top-n", type=int, default=int(_env_default(e, "VLM_TOP_N", DEFAULT_TOP_N)))
    a("--process-pattern", default=_env_default(e, "VLM_PROCESS_PATTERN", DEFAULT_PATTERN))
    a("--sglang-metrics-url", default=e.get("VLM_SGLANG_METRICS_URL", DEFAULT_SGLANG_METRICS_URL),
      help="SGLang /metrics to cross-check stage shares; empty disables")
    a("--pyspy", default=_env_default(e, "VLM_PYSPY", None))
    a("--discovery-root-pid", type=int, default=_env_default(e, "VLM_DISCOVERY_ROOT_PID", None))
    a("--pod", default=_env_default(e, "POD_NAME", ""))
    a("--namespace", default=_env_default(e, "POD_NAMESPACE", ""))
    a("--vlmservice", default=_env_default(e, "VLM_SERVICE_NAME", ""))
    a("--revision", default=_env_default(e, "VLM_REVISION", ""))
    a("--history", type=int, default=int(_env_default(e, "VLM_WINDOW_HISTORY", 64)))
    a("--blocking", action="store_true", default=_env_default(e, "VLM_PROFILE_BLOCKING", "") in ("1", "true"),
      help="let py-spy pause the target per sample (benchmark only: it slows the scheduler)")
    return p


def load_config(argv: list[str], environ: dict[str, str]) -> SidecarConfig:
    """Flags win over env vars, env vars over defaults. Raises ConfigError on nonsense."""
    try:
        ns = build_parser(environ).parse_args(argv)
    except SystemExit as e:  # argparse exits on bad flags; turn it into our error for tests and main
        if e.code == 0:  # --help and --version: argparse printed what was asked, exit cleanly
            raise
        raise ConfigError(f"bad arguments: {argv}") from e
    interval = parse_duration(ns.interval)
    duration = parse_duration(ns.duration)
    if duration > interval:
        raise ConfigError(f"window duration {duration}s is longer than the interval {interval}s")
    if not 1 <= ns.rate <= 10000:
        raise ConfigError(f"rate {ns.rate} Hz outside 1..10000")
    if ns.top_n < 0 or ns.history < 1:
        raise ConfigError("top-n must be >= 0 and history >= 1")
    watch = tuple(w.strip() for w in ns.watch_functions.split(",") if w.strip())
    return SidecarConfig(
        port=ns.port, host=ns.host, interval_s=interval, duration_s=duration, rate_hz=ns.rate,
        watch_functions=watch, top_n=ns.top_n, process_pattern=ns.process_pattern,
        sglang_metrics_url=ns.sglang_metrics_url or None, pyspy=ns.pyspy,
        discovery_root_pid=int(ns.discovery_root_pid) if ns.discovery_root_pid is not None else None,
        pod=ns.pod, namespace=ns.namespace, vlmservice=ns.vlmservice, revision=ns.revision,
        history=ns.history, blocking=ns.blocking,
    )
