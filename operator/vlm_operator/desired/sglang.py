"""SGLang version -> how to switch the CUDA IPC pool-handle cache on or off, and how to probe liveness.

The pool-handle cache (SGLang PR #21418, first released in 0.5.10) keeps the
opened CUDA IPC pool storage per handle instead of re-opening it per image
feature. How to switch it on changed from release to release; `TABLE` records
that, one row per range of releases, and `plan_ipc_cache` turns a row plus the
user's `ipcCache` settings into env vars and launch args for the SGLang
container. `plan_liveness` picks, per version, a liveness check that never waits
on the scheduler (/health without its one-token generation, or a TCP check).

Every fact in `TABLE` was read from the released wheels, and
tests/compat/test_sglang_wheels.py re-reads them: when SGLang moves, that test
fails before a pod does. Pure: no I/O, no clock, no Kubernetes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from vlm_operator.api.errors import InvalidSpec

Mode = Literal["Auto", "On", "Off"]
MODES: tuple[Mode, ...] = ("Auto", "On", "Off")

# Env var and flag names, exactly as the wheels spell them.
ENV_TRANSPORT = "SGLANG_USE_CUDA_IPC_TRANSPORT"  # EnvBool; the switch up to 0.5.15, deprecated from 0.5.16
ENV_CACHE = "SGLANG_USE_IPC_POOL_HANDLE_CACHE"  # EnvBool; the cache itself, from 0.5.10
ENV_POOL_MB = "SGLANG_MM_FEATURE_CACHE_MB"  # EnvInt; size of the IPC feature pool on the base GPU
FLAG_TRANSPORT = "--mm-feature-transport"  # from 0.5.16
TRANSPORT_CUDA_IPC = "cuda_ipc"

MODE_FIELD = "spec.sglang.ipcCache.mode"
VERSION_FIELD = "spec.sglang.version"

# SGLang's EnvBool accepts true/1/yes/y and false/0/no/n and refuses to start on
# anything else; "1"/"0" are accepted by every release.
_ON, _OFF = "1", "0"

# 0.5.10 opens the pool on the producer GPU from every TP rank (a CUDA context each).
EXTRA_CONTEXT_MIB = 500

Release = tuple[int, int, int]


@dataclass(frozen=True)
class SGLangRow:
    """What one range of SGLang releases does with the IPC feature transport and its cache."""

    first: Release  # first release this row describes
    last: Release  # last release checked against its wheel (rows are contiguous)
    cache_available: bool  # does SGLANG_USE_IPC_POOL_HANDLE_CACHE exist
    cache_default_on: bool  # its EnvBool default
    transport_choices: tuple[str, ...] | None  # choices of --mm-feature-transport; None: no flag, env only
    transport_default: str  # what an unset transport resolves to on one CUDA node, no disaggregation
    pool_default_mb: int  # SGLANG_MM_FEATURE_CACHE_MB default
    extra_context_per_tp_rank: bool  # TP ranks open the pool on the producer GPU (~500 MiB each)

    @property
    def label(self) -> str:
        first, last = _fmt(self.first), _fmt(self.last)
        return first if first == last else f"{first}-{last}"


TABLE: tuple[SGLangRow, ...] = (
    # The transport env var and the pool already exist here, the cache does not.
    SGLangRow((0, 0, 0), (0, 5, 9), False, False, None, "cpu", 4096, False),
    SGLangRow((0, 5, 10), (0, 5, 10), True, False, None, "cpu", 4096, True),
    SGLangRow((0, 5, 11), (0, 5, 15), True, False, None, "cpu", 1024, False),
    SGLangRow((0, 5, 16), (0, 5, 16), True, False, ("cpu", "cuda_ipc"), "cpu", 1024, False),
    SGLangRow((0, 5, 17), (0, 5, 17), True, True, ("cpu", "cuda_ipc"), "cuda_ipc", 1024, False),
    SGLangRow((0, 5, 18), (0, 5, 23), True, True, ("cpu", "cuda_ipc", "cuda_vmm"), "cpu", 1024, False),
)
LAST_CHECKED: Release = TABLE[-1].last


@dataclass(frozen=True)
class IPCPlan:
    """Env and args for the SGLang container, and what to report in the IPCCacheActive condition."""

    env: dict[str, str]
    args: tuple[str, ...]
    active: bool
    reason: str
    message: str
    warnings: tuple[str, ...] = ()


# ---------------------------------------------------------------- versions

# PEP 440 subset that SGLang releases and image tags use: X.Y.Z, then an
# optional pre-release (a/b/rc), .postN, .devN and a +local part.
_VERSION_RE = re.compile(
    r"""^v?(?P<rel>\d+\.\d+\.\d+)
        (?:[-_.]?(?P<pre>a|alpha|b|beta|rc|c)[-_.]?(?P<pre_n>\d*))?
        (?:[-_.]?post[-_.]?(?P<post>\d*))?
        (?:[-_.]?dev[-_.]?(?P<dev>\d*))?
        (?:\+[a-z0-9.]+)?$""",
    re.IGNORECASE | re.VERBOSE,
)
_PRE_ORDER = {"a": -3, "alpha": -3, "b": -2, "beta": -2, "rc": -1, "c": -1}


def parse_version(text: str) -> tuple[int, ...] | None:
    """Parse an SGLang version into a tuple that sorts like PEP 440, or None.

    Returns (major, minor, patch, stage, n): stage 0 for a final release, 1 with
    n = N for .postN, -1/-2/-3 for rcN/bN/aN, -4 for a bare .devN. So
    "0.5.10rc1" < "0.5.10" < "0.5.10.post1" < "0.5.11". Only full X.Y.Z versions:
    "0.5" could be any patch release, and patch releases differ here.
    """
    m = _VERSION_RE.match(text.strip()) if isinstance(text, str) else None
    if not m:
        return None
    release = tuple(int(p) for p in m["rel"].split("."))
    if m["pre"]:
        stage = (_PRE_ORDER[m["pre"].lower()], int(m["pre_n"] or 0))
    elif m["post"] is not None:
        stage = (1, int(m["post"] or 0))
    elif m["dev"] is not None:
        stage = (-4, int(m["dev"] or 0))
    else:
        stage = (0, 0)
    return release + stage


# A tag that starts with a version: v0.5.10, 0.5.10.post1-cu130, v0.5.10rc0-cu126-runtime.
_TAG_VERSION_RE = re.compile(
    r"^v?(\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?)(?:-[A-Za-z0-9][A-Za-z0-9._-]*)?$"
)


def version_from_image(image: str) -> str | None:
    """The SGLang version an image tag names, or None when the tag does not name one.

    "lmsysorg/sglang:v0.5.10.post1-cu130" -> "0.5.10.post1". None for a digest-only
    reference, no tag, "latest", "dev", nightlies. A tag pinned with a digest
    ("...:v0.5.10@sha256:...") still names its version: the digest pins the bytes,
    the tag says what they are.
    """
    if not isinstance(image, str):
        return None
    ref = image.strip().split("@", 1)[0]
    # The tag is after the last ':' of the last path segment; a ':' before the
    # last '/' is a registry port (registry:5000/lmsysorg/sglang).
    last_segment = ref.rsplit("/", 1)[-1]
    if ":" not in last_segment:
        return None
    tag = last_segment.rsplit(":", 1)[1]
    m = _TAG_VERSION_RE.match(tag)
    return m.group(1) if m else None


def resolve_version(spec_version: str | None, image: str) -> str | None:
    """spec.sglang.version wins; the image tag is the fallback."""
    if spec_version and spec_version.strip():
        return spec_version.strip()
    return version_from_image(image)


def row_for(parsed: tuple[int, ...]) -> SGLangRow:
    """The table row for a parsed version. A pre-release sorts before its final
    release, so "0.5.10rc0" gets the 0.5.9 row: it may predate the cache."""
    chosen = TABLE[0]
    for row in TABLE:
        if parsed >= (*row.first, 0, 0):
            chosen = row
    return chosen


def _fmt(release: Iterable[int]) -> str:
    return ".".join(str(p) for p in release)


# ---------------------------------------------------------------- the plan


def plan_ipc_cache(
    version: str | None,
    mode: Mode,
    tensor_parallel: int,
    feature_cache_mb: int | None = None,
) -> IPCPlan:
    """Env and args that put the pool-handle cache in `mode` on SGLang `version`.

    Auto turns the cache on where SGLang has it and does nothing where it does
    not (or where the version is unknown: a flag an older SGLang lacks would
    crash it at start). On is Auto that refuses (InvalidSpec) instead of
    doing nothing. Off pins the cache env var to 0 wherever it may exist, so an
    image ENV or a release that defaults it on cannot switch it on.
    """
    if mode not in MODES:
        raise InvalidSpec(f"ipcCache mode must be one of {', '.join(MODES)}, not {mode!r}", field=MODE_FIELD)
    if not isinstance(tensor_parallel, int) or tensor_parallel < 1:
        raise InvalidSpec(
            f"tensorParallel must be at least 1, not {tensor_parallel!r}", field="spec.sglang.tensorParallel"
        )
    if feature_cache_mb is not None and (not isinstance(feature_cache_mb, int) or feature_cache_mb < 1):
        raise InvalidSpec(
            f"featureCacheMB must be a positive number of MiB, not {feature_cache_mb!r}",
            field="spec.sglang.ipcCache.featureCacheMB",
        )

    parsed = parse_version(version) if version else None
    if parsed is None:
        return _plan_unknown(version, mode, feature_cache_mb)
    row = row_for(parsed)
    if not row.cache_available:
        return _plan_too_old(version, mode, row, feature_cache_mb)
    return _plan_known(version, mode, tensor_parallel, feature_cache_mb, row, newer=parsed[:3] > LAST_CHECKED)


def _plan_unknown(version: str | None, mode: Mode, feature_cache_mb: int | None) -> IPCPlan:
    what = f"SGLang version {version!r} is not a version" if version else "the SGLang version is unknown"
    fix = "set spec.sglang.version or use an image tag like v0.5.10"
    if mode == "On":
        raise InvalidSpec(
            f"ipcCache mode On needs a known SGLang version: {what}; {fix}", field=VERSION_FIELD
        )
    warnings = _ignored_pool_size(feature_cache_mb, "the SGLang version is unknown")
    if mode == "Off":
        # Safe on any release: releases without the variable never read it.
        return IPCPlan(
            env={ENV_CACHE: _OFF},
            args=(),
            active=False,
            reason="DisabledBySpec",
            message=f"IPC pool-handle cache switched off by spec ({ENV_CACHE}=0); {what}.",
            warnings=warnings,
        )
    return IPCPlan(
        env={},
        args=(),
        active=False,
        reason="VersionUnknown",
        message=f"IPC pool-handle cache not switched on: {what}; {fix} to let the operator switch it on.",
        warnings=warnings,
    )


def _plan_too_old(version: str, mode: Mode, row: SGLangRow, feature_cache_mb: int | None) -> IPCPlan:
    if mode == "On":
        raise InvalidSpec(
            f"ipcCache mode On needs SGLang 0.5.10 or newer (the IPC pool-handle cache is not in {version}); "
            "upgrade SGLang or use mode Auto",
            field=MODE_FIELD,
        )
    warnings = _ignored_pool_size(feature_cache_mb, f"SGLang {version} has no IPC pool-handle cache")
    if mode == "Off":
        return IPCPlan(
            env={},
            args=(),
            active=False,
            reason="DisabledBySpec",
            message=f"IPC pool-handle cache switched off by spec (SGLang {version} does not have it anyway).",
            warnings=warnings,
        )
    return IPCPlan(
        env={},
        args=(),
        active=False,
        reason="SGLangTooOld",
        message=f"SGLang {version} predates the IPC pool-handle cache (first in 0.5.10); upgrade to get it.",
        warnings=warnings,
    )


def _plan_known(
    version: str,
    mode: Mode,
    tp: int,
    feature_cache_mb: int | None,
    row: SGLangRow,
    *,
    newer: bool,
) -> IPCPlan:
    env: dict[str, str] = {}
    args: tuple[str, ...] = ()
    warnings: list[str] = []
    as_row = f"SGLang {version} (table row {row.label})"
    if newer:
        as_row = (
            f"SGLang {version}, newer than the last checked {_fmt(LAST_CHECKED)}, assumed to behave like it"
        )
        warnings.append(
            f"SGLang {version} is newer than {_fmt(LAST_CHECKED)}, the last version whose wheel was checked; "
            f"the operator assumes it behaves like {row.label}"
        )
    if feature_cache_mb is not None:
        env[ENV_POOL_MB] = str(feature_cache_mb)
    pool_mb = feature_cache_mb if feature_cache_mb is not None else row.pool_default_mb
    pool_note = f"{pool_mb} MiB" + (" (SGLang default)" if feature_cache_mb is None else "")

    if mode == "Off":
        env[ENV_CACHE] = _OFF
        transport_note = (
            "; SGLang still picks cuda_ipc transport by itself here, so features re-open the IPC pool"
            if row.transport_default == TRANSPORT_CUDA_IPC
            else "; the feature transport is left at SGLang's default"
        )
        return IPCPlan(
            env=env,
            args=args,
            active=False,
            reason="DisabledBySpec",
            message=f"IPC pool-handle cache switched off by spec on {as_row}: {ENV_CACHE}=0{transport_note}.",
            warnings=tuple(warnings),
        )

    # Auto and On: switch the cuda_ipc transport on (the cache only acts on it) and the cache itself.
    # Explicit even where both are SGLang's default (0.5.17): the default depends on
    # the deployment (disaggregation, node count) and flips between releases, and
    # an explicit value is idempotent.
    env[ENV_CACHE] = _ON
    if row.transport_choices is None:
        env[ENV_TRANSPORT] = _ON
        how = f"{ENV_TRANSPORT}=1, {ENV_CACHE}=1"
    else:
        # Not the env var: from 0.5.16 it is deprecated and only logs a warning.
        args = (FLAG_TRANSPORT, TRANSPORT_CUDA_IPC)
        how = f"{FLAG_TRANSPORT} {TRANSPORT_CUDA_IPC}, {ENV_CACHE}=1"
    if row.extra_context_per_tp_rank and tp > 1:
        extra = tp - 1
        warnings.append(
            f"SGLang {version} opens the IPC pool on the producer GPU from every other TP rank: "
            f"{extra} extra CUDA context(s) of about {EXTRA_CONTEXT_MIB} MiB each "
            f"(~{extra * EXTRA_CONTEXT_MIB} MiB) on the base GPU; 0.5.11+ does not"
        )
    return IPCPlan(
        env=env,
        args=args,
        active=True,
        reason="Enabled",
        message=f"IPC pool-handle cache on for {as_row}: {how}; feature pool {pool_note} on the base GPU.",
        warnings=tuple(warnings),
    )


def _ignored_pool_size(feature_cache_mb: int | None, why: str) -> tuple[str, ...]:
    if feature_cache_mb is None:
        return ()
    return (f"featureCacheMB={feature_cache_mb} not applied: {why}",)


# ---------------------------------------------------------------- liveness

# SGLang serves /health and /health_generate from one handler: /health runs a one-token generation too unless
# this EnvBool is false (default true in every wheel the compat tier reads, 0.5.9 - 0.5.23; the compat tier
# checks the variable, its default and that the handler reads it). A probe that generates waits on the
# scheduler, so a liveness probe on it can time out on a server busy with long prefills and have the kubelet
# restart it with requests in flight. With it false /health answers from the HTTP server's event loop: 200, or
# 503 while SGLang starts or drains after SIGTERM.
ENV_HEALTH_GENERATION = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"
HEALTH_ENV_FIRST: Release = (0, 5, 9)  # the oldest release checked to have it (older ones are not known to)
# SGLang's load gauges, per scheduler (the preStop drain waits while their sum is above 0); with --enable-metrics.
METRIC_RUNNING = "sglang:num_running_reqs"
METRIC_QUEUED = "sglang:num_queue_reqs"

Probe = Literal["http", "tcp"]


@dataclass(frozen=True)
class LivenessPlan:
    """The liveness probe of the SGLang container and the env it needs."""

    env: dict[str, str]
    probe: Probe  # http: GET /health; tcp: a TCP connect to SGLang's port
    reason: str


def plan_liveness(version: str | None, user_env: Mapping[str, str | None]) -> LivenessPlan:
    """A liveness check that cannot kill a busy server, for SGLang `version`.

    Where the release has the switch, it is set false and the probe GETs /health (the HTTP server answers,
    nothing waits on the scheduler). Releases not known to have it, unknown versions, and a spec that sets the
    variable true itself (or from a Secret or ConfigMap, its value unknown here) get a TCP check of the port:
    weaker (a wedged event loop may still accept connections) but never one generation behind a busy batch.
    `user_env`: the spec's env, name -> value (None for valueFrom).
    """
    if ENV_HEALTH_GENERATION in user_env:
        if _env_bool(user_env[ENV_HEALTH_GENERATION]) is False:
            return LivenessPlan({}, "http", f"{ENV_HEALTH_GENERATION} is false in spec.sglang.env")
        return LivenessPlan({}, "tcp", f"spec.sglang.env sets {ENV_HEALTH_GENERATION}: /health may generate")
    parsed = parse_version(version) if version else None
    if parsed is None:
        return LivenessPlan({}, "tcp", "the SGLang version is unknown")
    if parsed < (*HEALTH_ENV_FIRST, 0, 0):
        return LivenessPlan({}, "tcp", f"SGLang {version} is older than {_fmt(HEALTH_ENV_FIRST)}")
    return LivenessPlan({ENV_HEALTH_GENERATION: _OFF}, "http", f"{ENV_HEALTH_GENERATION}=0")


# ---------------------------------------------------------------- user overrides


def check_user_overrides(plan: IPCPlan, user_args: Iterable[str], user_env: Mapping[str, str]) -> None:
    """Refuse spec.sglang.args/env that contradict the plan (InvalidSpec).

    The same setting twice is fine; a different value would make SGLang's
    behaviour and the IPCCacheActive condition disagree, so the user is told
    to use ipcCache.mode instead.
    """
    for name, want in plan.env.items():
        have = user_env.get(name)
        same = _env_bool(have) == _env_bool(want) if name in _BOOL_VARS else str(have).strip() == want
        if have is not None and not same:
            raise InvalidSpec(
                f"env {name}={have!r} contradicts ipcCache ({name}={want}); set spec.sglang.ipcCache instead",
                field="spec.sglang.env",
            )
    # A matching user flag only repeats ours (argparse keeps the last); Off and
    # unknown versions plan no transport, so the user's choice stands there.
    user_transport = _flag_value(list(user_args), FLAG_TRANSPORT)
    if user_transport is not None and plan.active and user_transport != TRANSPORT_CUDA_IPC:
        raise InvalidSpec(
            f"{FLAG_TRANSPORT} {user_transport} turns the IPC transport off, and with it the pool-handle cache "
            "that ipcCache asks for; drop the arg or set spec.sglang.ipcCache.mode Off",
            field="spec.sglang.args",
        )


_BOOL_VARS = frozenset({ENV_TRANSPORT, ENV_CACHE})


def _env_bool(value: str | None) -> bool | None:
    if value is None:
        return None
    v = value.strip().lower()
    if v in ("true", "1", "yes", "y"):
        return True
    if v in ("false", "0", "no", "n"):
        return False
    return None


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
