"""`vlm-operator`: run the operator (kopf) and serve its /metrics.

    vlm-operator [--namespace NS ...] [--peering NAME] [--liveness URL]

Settings come from the environment (see vlm_operator.api.settings); flags override
the namespaces. Without --peering the operator runs standalone (one replica);
with it, kopf peering lets several replicas run with one active. A setting it
cannot use is one line naming the variable (or flag) on stderr, exit code 2.

Logs: VLM_LOG_FORMAT=text is kopf's full format (time, logger, level, object);
json is one object per line with `time` (UTC, ISO 8601), `level`, `logger`,
`msg` and, for a VLMService's own lines, `object` (kind, namespace, name, uid).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import random
import sys
import time
from typing import Any

from vlm_operator import __version__
from vlm_operator.api.names import OPERATOR

PROG = OPERATOR


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, msg (the sidecar writes the same keys)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        ref = getattr(record, "k8s_ref", None)  # kopf's per-object loggers attach the object
        if ref:
            line["object"] = ref
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


M_ARENA_MAX = -8  # glibc mallopt parameter
# Where Debian/Ubuntu (libjemalloc2), Fedora/RHEL (jemalloc) and source builds put jemalloc.
JEMALLOC_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
)
_UNDER_JEMALLOC = "VLM_ALLOCATOR_ACTIVE"  # set for the re-executed process


def find_jemalloc(paths: tuple[str, ...] | None = None) -> str | None:
    return next((p for p in (JEMALLOC_PATHS if paths is None else paths) if os.path.exists(p)), None)


def allocator_exec(mode: str, argv: list[str], environ: dict[str, str] | None = None,
                   paths: tuple[str, ...] | None = None) -> tuple[list[str], dict[str, str]] | None:
    """The command and environment to re-execute the operator under jemalloc with, or None to go on as is.

    Why: a thousand services created at once leave pymalloc's arenas fragmented, and CPython never hands an
    arena with one live object back, so the operator kept several times its live objects after the burst. With
    every allocation in jemalloc (PYTHONMALLOC=malloc, preloaded) the same bench keeps much less at the same CPU
    (docs/benchmarks.md, "jemalloc under the operator"). LD_PRELOAD only works from the start of a process,
    hence the exec (same PID: nothing watching it notices). `mode`: VLM_ALLOCATOR (auto, jemalloc, pymalloc)."""
    env = dict(os.environ if environ is None else environ)
    if mode == "pymalloc" or env.get(_UNDER_JEMALLOC) or not sys.platform.startswith("linux"):
        return None
    lib = find_jemalloc(paths)
    if lib is None:
        return None
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{lib}:{preload}" if preload else lib
    env["PYTHONMALLOC"] = "malloc"
    # jemalloc's own defaults (a user's MALLOC_CONF passes through): one arena with decay and a background thread
    # kept more, not less, in the same bench (docs/benchmarks.md, "jemalloc under the operator").
    env[_UNDER_JEMALLOC] = lib
    return [sys.executable, "-m", "vlm_operator", *argv], env


def _glibc(symbol: str):
    """glibc's `symbol` (a ctypes function), or None where there is none (not Linux, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL("libc.so.6"), symbol)
    except (OSError, AttributeError):
        return None


def _limit_malloc_arenas(arenas: int = 2) -> bool:
    """glibc gives threads malloc arenas of their own (up to 8 per core); the JSON bodies the handler
    threads decode and free then leave memory spread over many arenas that the process keeps. Two arenas
    keep the RSS near what is live. MALLOC_ARENA_MAX in the environment wins (glibc read it at start)."""
    mallopt = _glibc("mallopt")
    if "MALLOC_ARENA_MAX" in os.environ or mallopt is None:
        return False
    return bool(mallopt(M_ARENA_MAX, arenas))


def _trim_malloc_periodically(every_s: float) -> bool:
    """Every `every_s` seconds, hand the free pages inside glibc's heaps back to the kernel (malloc_trim):
    free() returns only the top of a heap, so the watch events decoded and dropped all the time would
    otherwise keep the RSS at what was once in flight. Only with glibc; 0 turns it off."""
    trim = _glibc("malloc_trim") if every_s > 0 else None
    if trim is None:
        return False
    import threading

    def loop() -> None:
        while True:
            time.sleep(every_s)
            trim(0)

    threading.Thread(target=loop, name="vlm-malloc-trim", daemon=True).start()
    return True


def _census(f: Any, top: int = 40) -> None:
    """Live objects by type (count and shallow bytes) and pymalloc's arena statistics: cheap enough to take
    at the operator's full scale, where tracing every allocation is not."""
    import gc
    from collections import Counter

    count: Counter[str] = Counter()
    size: Counter[str] = Counter()
    for o in gc.get_objects():
        t = type(o)
        name = f"{t.__module__}.{t.__qualname__}"
        count[name] += 1
        size[name] += sys.getsizeof(o)
    f.write(f"gc_objects {sum(count.values())} shallow_mib {sum(size.values()) / 2**20:.1f}\n")
    for name, b in size.most_common(top):
        f.write(f"{b / 1024:10.1f} KiB {count[name]:8d} {name}\n")
    f.flush()
    saved = os.dup(2)  # sys._debugmallocstats writes to the C stderr
    try:
        os.dup2(f.fileno(), 2)
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _memory_dumps(path: str | None) -> bool:
    """VLM_TRACEMALLOC_DUMP=PATH, a diagnostic for benchmarks: on SIGUSR1, write the RSS, a census of live
    objects by type, pymalloc's statistics and, while tracing, the largest allocation sites (size, count,
    file:line; then the largest tracebacks when VLM_TRACEMALLOC_FRAMES > 1) to PATH.<n>. Tracing costs
    memory and several times the CPU (docs/benchmarks.md, "Memory census instead of tracing"):
    VLM_TRACEMALLOC_FRAMES=0 takes the census only."""
    if not path:
        return False
    import signal
    import tracemalloc

    frames = os.environ.get("VLM_TRACEMALLOC_FRAMES", "").strip()
    if frames != "0":
        tracemalloc.start(max(1, int(frames)) if frames.isdigit() else 1)  # anything else: one frame
    count = [0]

    def dump(*_: object) -> None:
        count[0] += 1
        with open("/proc/self/status") as st:
            rss = next((ln.split()[1] for ln in st if ln.startswith("VmRSS:")), "?")
        with open(f"{path}.{count[0]}", "w") as f:
            f.write(f"rss_kib {rss}\n")
            if tracemalloc.is_tracing():
                snap = tracemalloc.take_snapshot()
                by_line = snap.statistics("lineno")
                by_trace = snap.statistics("traceback") if tracemalloc.get_traceback_limit() > 1 else []
                f.write(f"traced_mib {sum(s.size for s in by_line) / 2**20:.1f} "
                        f"tracemalloc_overhead_mib {tracemalloc.get_tracemalloc_memory() / 2**20:.1f}\n")
                for s in by_line[:60]:
                    f.write(f"{s.size / 1024:10.1f} KiB {s.count:8d} {s.traceback[0]}\n")
                for s in by_trace[:25]:
                    f.write(f"\n{s.size / 1024:.1f} KiB {s.count} blocks\n  " + "\n  ".join(s.traceback.format()) + "\n")
            _census(f)

    signal.signal(signal.SIGUSR1, dump)
    return True


class QuietSuccess(logging.Filter):
    """Drops kopf's INFO line for every handler and timer run that succeeded ("Timer 'reconcile_vlmservice'
    succeeded.", "Creation is processed: 1 succeeded; 0 failed."): with many services that is a steady stream of
    lines in a steady state where nothing happens, and most of the lines of a burst (docs/benchmarks.md, "kopf's
    success lines left out"). The operator's own lines say what it changed (objects created, conditions); kopf's
    failures and retries (WARNING and above) stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        msg = record.getMessage()
        return not (msg.endswith(" succeeded.") or msg.endswith(" succeeded; 0 failed."))


def _configure_logging(kopf, log_format: str) -> None:
    kopf.configure(verbose=False, log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.FULL)
    if log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("kopf.objects").addFilter(QuietSuccess())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--namespace", "-n", action="append", default=None,
                   help="namespace to watch (repeatable; default: VLM_NAMESPACES, else all)")
    p.add_argument("--peering", default=None, help="kopf peering name (for more than one replica)")
    p.add_argument(
        "--priority",
        type=int,
        default=None,
        help="kopf peering priority; the highest active replica works, the others stand by "
        "(default with --peering: random, so equal priorities never pause every replica)",
    )
    p.add_argument("--liveness", default="http://0.0.0.0:8081/healthz",
                   help="kopf liveness endpoint (default %(default)s)")
    p.add_argument("--version", action="version", version=__version__, help="print the version and exit")
    args = p.parse_args(argv)
    if args.namespace:
        os.environ["VLM_NAMESPACES"] = ",".join(args.namespace)

    try:
        from vlm_operator.cluster.connection import keep_client_library_out

        # kopf imports the kubernetes library when it is installed (tens of MiB of generated models); the operator
        # does not use it (docs/benchmarks.md, "The kubernetes library kept out of the process").
        keep_client_library_out()
        import kopf
        from prometheus_client import start_http_server

        from vlm_operator.api.settings import Settings, SettingsError
    except ImportError as e:  # a base install (the sidecar's) has no operator dependencies
        print(f"{PROG}: {e}; install the operator extra: pip install 'vlm-operator[operator]'", file=sys.stderr)
        return 2

    try:
        # Checked before kopf and the handlers load (handlers read the same environment at import).
        settings = Settings.from_env()
    except SettingsError as e:
        for line in str(e).splitlines():
            flag = " (--namespace)" if line.startswith("VLM_NAMESPACES:") and args.namespace else ""
            print(f"{PROG}: {line.replace(':', flag + ':', 1)}", file=sys.stderr)
        return 2
    # the names and values against the shipped rules
    from vlm_operator.desired.alerts import override_errors

    bad = override_errors(settings.alert_overrides)
    if bad:
        for line in bad:
            print(f"{PROG}: VLM_ALERT_OVERRIDES: {line}", file=sys.stderr)
        return 2

    again = allocator_exec(settings.allocator, sys.argv[1:] if argv is None else argv)
    if again is None and settings.allocator == "jemalloc" and not os.environ.get(_UNDER_JEMALLOC):
        print(f"{PROG}: VLM_ALLOCATOR: jemalloc asked for, but no libjemalloc.so.2 in {', '.join(JEMALLOC_PATHS)}",
              file=sys.stderr)
        return 2
    if again is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        command, env = again
        os.execve(command[0], command, env)
    if not os.environ.get(_UNDER_JEMALLOC):
        _limit_malloc_arenas()  # before kopf starts its threads
        _trim_malloc_periodically(settings.malloc_trim_seconds)
    _memory_dumps(os.environ.get("VLM_TRACEMALLOC_DUMP"))
    from vlm_operator.controller import handlers  # noqa: F401  (registers the handlers)

    _configure_logging(kopf, settings.log_format)
    try:
        start_http_server(settings.metrics_port, addr=os.environ.get("VLM_METRICS_ADDR", "0.0.0.0"))
    except OSError as e:
        print(f"{PROG}: VLM_METRICS_PORT: cannot listen on {settings.metrics_port}: {e.strerror or e}", file=sys.stderr)
        return 1
    kopf.run(
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=args.priority if args.priority is not None else (random.randint(1, 2**31) if args.peering else 0),
        namespaces=list(settings.namespaces),
        clusterwide=not settings.namespaces,
        liveness_endpoint=args.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
