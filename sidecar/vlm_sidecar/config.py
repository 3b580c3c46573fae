"""Sidecar settings: env vars (the pod builder sets these) with a CLI flag for each.

`load_config(argv, environ)` is pure: the caller passes the environment, tests pass a dict.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from vlm_sidecar.names import DEFAULT_PORT, FRONTEND_ROLES

# Defaults, the operator's too (api.TelemetrySpec; docs/sidecar.md): 1000 Hz resolves 20 ms loop
# iterations to ~1 ms per boundary, a 5 s window holds ~250 such iterations, and one window every 15 s
# keeps py-spy's CPU to a third of its in-window cost while the gate gets 4 windows a minute.
DEFAULT_INTERVAL_S = 15.0
DEFAULT_DURATION_S = 5.0
DEFAULT_RATE_HZ = 1000
DEFAULT_TOP_N = 10
DEFAULT_PATTERN = "sglang::scheduler"
DEFAULT_SGLANG_METRICS_URL = "http://127.0.0.1:30000/metrics"
DEFAULT_WATCH = ("process_input_requests", "hash_feature", "reconstruct_on_target_device", "run_batch")
# The front end (vlm_sidecar.roles) is sampled in the same windows at a lower rate: its signals are busy
# shares of runs of milliseconds or more, not loop boundaries, and py-spy's cost grows with the rate.
# Off by default until its cost is within the sidecar's budget (docs/sidecar.md, "Front end"): sampling the
# main server process costs about as much as a scheduler. VLM_FRONTEND_ROLES=tokenizer_manager,... opts in.
DEFAULT_FRONTEND_ROLES: tuple[str, ...] = ()
DEFAULT_FRONTEND_RATE_HZ = 250
# The front end's py-spy runs for the first 2 s of each window: the main server process has a dozen Python
# threads (IO pool, HTTP), each walked on every sample, so its py-spy costs per second what the scheduler's
# does at 1000 Hz; busy shares need no 5 s of samples (docs/sidecar.md, "CPU cost").
DEFAULT_FRONTEND_DURATION_S = 2.0
DEFAULT_MAX_POOL_WORKERS = 4  # mm_processor workers sampled per window (SGLang starts os.cpu_count() of them)

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
    frontend_roles: tuple[str, ...] = DEFAULT_FRONTEND_ROLES  # empty: schedulers only
    frontend_rate_hz: int = DEFAULT_FRONTEND_RATE_HZ
    frontend_duration_s: float = DEFAULT_FRONTEND_DURATION_S
    max_pool_workers: int = DEFAULT_MAX_POOL_WORKERS

    @property
    def labels(self) -> dict[str, str]:
        """Constant labels on every exported series (tp_rank is added per series)."""
        return {"namespace": self.namespace, "vlmservice": self.vlmservice, "pod": self.pod,
                "revision": self.revision}


def _env_default(environ: dict[str, str], name: str, default):
    value = environ.get(name)
    return default if value is None or value == "" else value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line naming the flag (and its env var), not a usage dump and exit 2
        message = message.removeprefix("argument ")
        flag, sep, rest = message.partition(": ")
        raise ConfigError(f"{_name(flag)}: {rest}" if sep and flag in ENV_OF else message)


def _int(text: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"not a valid integer (got {text!r})") from None


# flag -> the env var it overrides; errors name both, since either may have set the value.
ENV_OF = {
    "--port": "VLM_SIDECAR_PORT", "--host": "VLM_SIDECAR_HOST", "--interval": "VLM_PROFILE_INTERVAL",
    "--duration": "VLM_PROFILE_DURATION", "--rate": "VLM_PROFILE_RATE", "--watch-functions": "VLM_WATCH_FUNCTIONS",
    "--top-n": "VLM_TOP_N", "--process-pattern": "VLM_PROCESS_PATTERN", "--sglang-metrics-url": "VLM_SGLANG_METRICS_URL",
    "--pyspy": "VLM_PYSPY", "--discovery-root-pid": "VLM_DISCOVERY_ROOT_PID", "--pod": "POD_NAME",
    "--namespace": "POD_NAMESPACE", "--vlmservice": "VLM_SERVICE_NAME", "--revision": "VLM_REVISION",
    "--history": "VLM_WINDOW_HISTORY", "--blocking": "VLM_PROFILE_BLOCKING",
    "--frontend-roles": "VLM_FRONTEND_ROLES", "--frontend-rate": "VLM_FRONTEND_RATE",
    "--frontend-duration": "VLM_FRONTEND_DURATION",
    "--max-pool-workers": "VLM_MAX_POOL_WORKERS",
}


def _name(flag: str) -> str:
    return f"{flag} ({ENV_OF[flag]})"


def build_parser(environ: dict[str, str]) -> argparse.ArgumentParser:
    e = environ
    p = _Parser(prog="vlm-sidecar", description="py-spy profiler sidecar for SGLang schedulers. Every flag "
                "defaults to its environment variable (named in its help), then to the built-in default.")

    def a(flag: str, help: str, default=None, **kw):
        env = ENV_OF[flag]
        p.add_argument(flag, default=_env_default(e, env, default), help=f"{help} [{env}]", **kw)

    # String defaults go through `type` too (argparse converts them), so a bad env value fails like a bad flag.
    a("--port", "HTTP port for /metrics, /profile/* and /windows.json (default %(default)s)", str(DEFAULT_PORT),
      type=_int)
    a("--host", "address to listen on (default %(default)s)", "0.0.0.0")
    a("--interval", "time between window starts: 30s, 2m, 500ms or seconds (default %(default)s)",
      f"{DEFAULT_INTERVAL_S:g}s")
    a("--duration", "length of one sampling window, at most --interval (default %(default)s)",
      f"{DEFAULT_DURATION_S:g}s")
    a("--rate", "py-spy samples per second, 1-10000 (default %(default)s)", str(DEFAULT_RATE_HZ), type=_int)
    a("--watch-functions", "comma-separated functions whose shares are always exported (default %(default)s)",
      ",".join(DEFAULT_WATCH))
    a("--top-n", "how many of the hottest functions to export besides the watched ones (default %(default)s)",
      str(DEFAULT_TOP_N), type=_int)
    a("--process-pattern", "process title (or command line) that marks an SGLang scheduler (default %(default)s)",
      DEFAULT_PATTERN)
    p.add_argument("--sglang-metrics-url", default=e.get("VLM_SGLANG_METRICS_URL", DEFAULT_SGLANG_METRICS_URL),
                   help="SGLang /metrics for TTFT, ITL and throughput per window; empty disables "
                        "(default %(default)s) [VLM_SGLANG_METRICS_URL]")
    a("--pyspy", "py-spy executable (default: on PATH, then next to this Python)")
    a("--discovery-root-pid", "look for schedulers only among this PID's descendants (default: every process)",
      type=_int)
    a("--pod", "pod name, a label on every series (the downward API sets it)", "")
    a("--namespace", "pod namespace, a label on every series", "")
    a("--vlmservice", "VLMService name, a label on every series", "")
    a("--revision", "the pod template's revision (stable or canary), a label on every series", "")
    a("--history", "windows kept for /windows.json and diffs (default %(default)s)", "64", type=_int)
    p.add_argument("--frontend-roles", default=e.get("VLM_FRONTEND_ROLES", ",".join(DEFAULT_FRONTEND_ROLES)),
                   help="comma-separated front-end roles sampled next to the schedulers; empty: schedulers only "
                        "(default %(default)s) [VLM_FRONTEND_ROLES]")
    a("--frontend-rate", "py-spy samples per second for the front-end processes, 1-10000 (default %(default)s)",
      str(DEFAULT_FRONTEND_RATE_HZ), type=_int)
    a("--frontend-duration", "front-end sampling time at the start of each window, at most --duration "
      "(default %(default)s)", f"{DEFAULT_FRONTEND_DURATION_S:g}s")
    a("--max-pool-workers", "multimodal processor pool workers sampled per window, rotating (default %(default)s)",
      str(DEFAULT_MAX_POOL_WORKERS), type=_int)
    p.add_argument("--blocking", action="store_true",
                   default=_env_default(e, "VLM_PROFILE_BLOCKING", "") in ("1", "true"),
                   help="let py-spy pause the target per sample (benchmark only: it slows the scheduler) "
                        "[VLM_PROFILE_BLOCKING=1]")
    return p


def load_config(argv: list[str], environ: dict[str, str]) -> SidecarConfig:
    """Flags win over env vars, env vars over defaults. Raises ConfigError on nonsense."""
    # Bad flags and bad env values raise ConfigError naming the flag (_Parser.error); --help exits 0.
    ns = build_parser(environ).parse_args(argv)
    durations = {}
    for flag in ("--interval", "--duration", "--frontend-duration"):
        try:
            durations[flag] = parse_duration(getattr(ns, flag[2:].replace("-", "_")))
        except ConfigError as e:
            raise ConfigError(f"{_name(flag)}: {e}") from None
    interval, duration = durations["--interval"], durations["--duration"]
    frontend_duration = min(durations["--frontend-duration"], duration)
    if duration > interval:
        raise ConfigError(f"{_name('--duration')}: window duration {duration:g}s is longer than --interval {interval:g}s")
    if not 1 <= ns.rate <= 10000:
        raise ConfigError(f"{_name('--rate')}: {ns.rate} Hz outside 1..10000")
    if ns.top_n < 0:
        raise ConfigError(f"{_name('--top-n')}: must be >= 0 (got {ns.top_n})")
    if ns.history < 1:
        raise ConfigError(f"{_name('--history')}: must be >= 1 (got {ns.history})")
    if not 0 <= ns.port <= 65535:
        raise ConfigError(f"{_name('--port')}: not a port number (got {ns.port})")
    watch = tuple(w.strip() for w in ns.watch_functions.split(",") if w.strip())
    roles = tuple(r.strip() for r in ns.frontend_roles.split(",") if r.strip())
    unknown = [r for r in roles if r not in FRONTEND_ROLES]
    if unknown:
        raise ConfigError(f"--frontend-roles (VLM_FRONTEND_ROLES): unknown role(s) {', '.join(unknown)} "
                          f"(known: {', '.join(FRONTEND_ROLES)})")
    if not 1 <= ns.frontend_rate <= 10000:
        raise ConfigError(f"{_name('--frontend-rate')}: {ns.frontend_rate} Hz outside 1..10000")
    if ns.max_pool_workers < 0:
        raise ConfigError(f"{_name('--max-pool-workers')}: must be >= 0 (got {ns.max_pool_workers})")
    return SidecarConfig(
        port=ns.port, host=ns.host, interval_s=interval, duration_s=duration, rate_hz=ns.rate,
        watch_functions=watch, top_n=ns.top_n, process_pattern=ns.process_pattern,
        sglang_metrics_url=ns.sglang_metrics_url or None, pyspy=ns.pyspy,
        discovery_root_pid=int(ns.discovery_root_pid) if ns.discovery_root_pid is not None else None,
        pod=ns.pod, namespace=ns.namespace, vlmservice=ns.vlmservice, revision=ns.revision,
        history=ns.history, blocking=ns.blocking, frontend_roles=roles, frontend_rate_hz=ns.frontend_rate,
        frontend_duration_s=frontend_duration,
        max_pool_workers=ns.max_pool_workers,
    )
