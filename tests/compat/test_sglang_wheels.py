"""The IPC-cache table against the real SGLang wheels.

For each released wheel (downloaded once by hack/fetch-sglang-wheels.sh, cached
outside the repo) this checks, from the wheel's own source:
- the table row: the cache env var exists or not, its default, the pool default,
  the `--mm-feature-transport` choices, what an unset transport resolves to, and
  whether TP ranks open the pool on the producer GPU (0.5.10);
- every env var and flag `plan_ipc_cache` sets, for every mode: the env var is
  an Env field that SGLang code actually reads, the flag is derived from a
  ServerArgs field whose Literal choices include the value;
- the wheel's real `sglang/srt/environ.py`, imported in a subprocess with the
  plan's env, reads the cache as on (Auto/On) or off (Off);
- the liveness plan: SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is an EnvBool (default
  on) that the `/health` handler reads to skip its one-token generation, the real
  environ.py reads the plan's value as off, and the two load gauges the preStop
  drain sums (`sglang:num_running_reqs`, `sglang:num_queue_reqs`) are declared.

A wheel that cannot be downloaded fails the test: this is the table's only
check against SGLang, so skipping would hide a stale table.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pytest

from vlm_operator.api.errors import InvalidSpec
from vlm_operator.desired import sglang
from vlm_operator.desired.sglang import ENV_CACHE, ENV_POOL_MB, ENV_TRANSPORT, FLAG_TRANSPORT, plan_ipc_cache
from vlm_testing.wheels import fetch_wheels

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FETCH = ROOT / "hack" / "fetch-sglang-wheels.sh"
VERSIONS = ("0.5.9", "0.5.10", "0.5.15", "0.5.17", "0.5.23")
ENV_VARS = (ENV_TRANSPORT, ENV_CACHE, ENV_POOL_MB)
# The cache module moved in 0.5.18.
CACHE_MODULES = (
    "sglang/srt/multimodal/transport/cuda_ipc.py",
    "sglang/srt/utils/cuda_ipc_transport_utils.py",
)


@pytest.fixture(scope="module")
def wheel_paths() -> dict[str, Path]:
    return fetch_wheels(VERSIONS)


@pytest.fixture(scope="module", params=VERSIONS)
def wheel(request, wheel_paths) -> Wheel:
    return Wheel(request.param, wheel_paths[request.param])


# ---------------------------------------------------------------- reading a wheel


@dataclass
class TransportField:
    choices: tuple[str, ...]
    default: object
    cli_name: str | None  # an Arg(cli_name=...) override; None: derived from the field name
    no_cli: bool


class Wheel:
    """The source of one SGLang wheel, read straight from the zip."""

    def __init__(self, version: str, path: Path):
        self.version = version
        self.path = path
        self.zip = zipfile.ZipFile(path)
        self.names = set(self.zip.namelist())
        assert path.name.startswith(f"sglang-{version}-"), path

    def text(self, name: str) -> str:
        return self.zip.read(name).decode()

    @cached_property
    def srt_sources(self) -> dict[str, str]:
        return {
            n: self.text(n)
            for n in sorted(self.names)
            if n.startswith("sglang/srt/") and n.endswith(".py") and "/test" not in n
        }

    @cached_property
    def env_fields(self) -> dict[str, tuple[str, object]]:
        """Env var -> (Env class name, default) from the `Envs` class of environ.py."""
        tree = ast.parse(self.text("sglang/srt/environ.py"))
        (envs_cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Envs"]
        out = {}
        for stmt in envs_cls.body:
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
            value = getattr(stmt, "value", None)
            if not (isinstance(target, ast.Name) and isinstance(value, ast.Call)):
                continue
            if isinstance(value.func, ast.Name) and value.func.id.startswith("Env"):
                default = _const_expr(value.args[0]) if value.args else None
                out[target.id] = (value.func.id, default)
        return out

    def reads_env(self, name: str) -> bool:
        """Some SGLang module other than environ.py reads the variable."""
        needle = f"envs.{name}.get()"
        return any(needle in src for n, src in self.srt_sources.items() if n != "sglang/srt/environ.py")

    @cached_property
    def transport_field(self) -> TransportField | None:
        """The `mm_feature_transport` dataclass field (ServerArgs, or arg_groups/fields/mm.py from 0.5.23)."""
        found = []
        for name, src in self.srt_sources.items():
            if "mm_feature_transport:" not in src:
                continue
            for node in ast.walk(ast.parse(src)):
                if (
                    isinstance(node, ast.AnnAssign)
                    and isinstance(node.target, ast.Name)
                    and node.target.id == "mm_feature_transport"
                ):
                    found.append((name, node))
        if not found:
            return None
        assert len(found) == 1, f"mm_feature_transport declared in {[n for n, _ in found]}"
        _, node = found[0]
        literals = [
            n
            for n in ast.walk(node.annotation)
            if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == "Literal"
        ]
        assert len(literals) == 1, ast.unparse(node.annotation)
        elts = literals[0].slice.elts if isinstance(literals[0].slice, ast.Tuple) else [literals[0].slice]
        arg_calls = [
            n
            for n in ast.walk(node.annotation)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Arg"
        ]
        kw = {
            k.arg: _const_expr(k.value)
            for c in arg_calls
            for k in c.keywords
            if k.arg in ("cli_name", "no_cli")
        }
        return TransportField(
            choices=tuple(ast.literal_eval(e) for e in elts),
            default=_const_expr(node.value) if node.value is not None else None,
            cli_name=kw.get("cli_name"),
            no_cli=bool(kw.get("no_cli")),
        )

    @cached_property
    def cli_names_from_fields(self) -> bool:
        """The dataclass-to-argparse helper turns `a_b` into `--a-b`."""
        src = self.srt_sources.get("sglang/srt/arg_groups/arg_utils.py", "")
        return '"--" + name.replace("_", "-")' in src and "def add_cli_args_from_dataclass" in src

    @cached_property
    def unset_transport_default(self) -> str:
        """What `--mm-feature-transport` unset resolves to on one CUDA node without disaggregation."""
        if self.transport_field is None:
            return "cuda_ipc" if self.env_fields[ENV_TRANSPORT][1] else "cpu"
        # The resolver: ServerArgs._handle_multimodal_feature_transport, a plain
        # function in arg_groups/serving_hook.py from 0.5.23.
        resolvers = [
            ast.get_source_segment(src, node) or ""
            for src in self.srt_sources.values()
            if "handle_multimodal_feature_transport" in src
            for node in ast.walk(ast.parse(src))
            if isinstance(node, ast.FunctionDef) and node.name.endswith("handle_multimodal_feature_transport")
        ]
        assert len(resolvers) == 1, f"{len(resolvers)} transport resolvers found"
        # Fingerprint: the log line of the branch that picks cuda_ipc when unset (0.5.17 only).
        return "cuda_ipc" if "auto-resolved to cuda_ipc" in resolvers[0] else "cpu"

    @cached_property
    def cache_module(self) -> str:
        return next(m for m in CACHE_MODULES if m in self.names)

    @cached_property
    def has_pool_storage_cache(self) -> bool:
        """The fix itself: a module-level `_pool_storage_cache` dict."""
        tree = ast.parse(self.text(self.cache_module))
        for stmt in tree.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            if any(isinstance(t, ast.Name) and t.id == "_pool_storage_cache" for t in targets):
                return True
        return False

    @cached_property
    def opens_pool_on_producer_gpu(self) -> bool:
        """0.5.10 rebuilds on `pool_device_index`; 0.5.11+ redirects the handle to the consumer's GPU."""
        return "redirected_handle" not in self.text(self.cache_module)


def _const_expr(node: ast.expr) -> object:
    """A literal or simple arithmetic on literals (`4 * 1024`), evaluated without names."""
    allowed = (ast.Expression, ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop)
    expr = ast.Expression(node)
    if not all(isinstance(n, allowed) for n in ast.walk(expr)):
        return ast.unparse(node)
    return eval(compile(expr, "<default>", "eval"), {"__builtins__": {}})


def _row(version: str) -> sglang.SGLangRow:
    return sglang.row_for(sglang.parse_version(version))


# ---------------------------------------------------------------- the table row


def test_row_matches_wheel(wheel):
    row = _row(wheel.version)
    fields = wheel.env_fields
    assert (ENV_CACHE in fields) == row.cache_available, f"{wheel.version}: {ENV_CACHE} presence"
    assert wheel.has_pool_storage_cache == row.cache_available, f"{wheel.version}: _pool_storage_cache"
    if row.cache_available:
        assert fields[ENV_CACHE] == ("EnvBool", row.cache_default_on)
        assert wheel.opens_pool_on_producer_gpu == row.extra_context_per_tp_rank
    assert fields[ENV_TRANSPORT] == ("EnvBool", False)
    assert fields[ENV_POOL_MB] == ("EnvInt", row.pool_default_mb)
    field = wheel.transport_field
    if row.transport_choices is None:
        assert field is None, f"{wheel.version} has {FLAG_TRANSPORT}; the table says it does not"
    else:
        assert field is not None, f"{wheel.version} has no {FLAG_TRANSPORT}"
        assert field.choices == row.transport_choices
        assert field.default is None  # unset: SGLang resolves it, see unset_transport_default
    assert wheel.unset_transport_default == row.transport_default


def test_0_5_9_has_no_cache(wheel_paths):
    old = Wheel("0.5.9", wheel_paths["0.5.9"])
    assert ENV_CACHE not in old.env_fields
    assert not old.has_pool_storage_cache
    assert not any("pool_handle_cache" in src.lower() for src in old.srt_sources.values())
    assert plan_ipc_cache("0.5.9", "Auto", 1).reason == "SGLangTooOld"
    with pytest.raises(InvalidSpec):
        plan_ipc_cache("0.5.9", "On", 1)


# ---------------------------------------------------------------- what the plan sets exists


def _plans(version: str):
    for mode in ("Auto", "On", "Off"):
        for tp in (1, 2, 8):
            for pool in (None, 2048):
                try:
                    yield mode, tp, plan_ipc_cache(version, mode, tp, pool)
                except InvalidSpec:
                    assert mode == "On" and not _row(version).cache_available


def test_every_env_var_and_flag_exists(wheel):
    fields = wheel.env_fields
    for mode, tp, plan in _plans(wheel.version):
        for name, value in plan.env.items():
            assert name in fields, f"{wheel.version} {mode} tp{tp}: {name} is not an SGLang env var"
            kind = fields[name][0]
            assert kind in ("EnvBool", "EnvInt"), (name, kind)
            assert value in ("0", "1") if kind == "EnvBool" else value.isdigit(), (name, value)
            assert wheel.reads_env(name), f"{wheel.version}: nothing reads {name}"
        if plan.args:
            flag, value = plan.args
            assert flag == FLAG_TRANSPORT
            field = wheel.transport_field
            assert field is not None, f"{wheel.version} {mode}: {flag} does not exist"
            assert not field.no_cli and field.cli_name in (None, flag), field
            assert wheel.cli_names_from_fields, f"{wheel.version}: flag names no longer derived from fields"
            assert value in field.choices, (value, field.choices)


# ---------------------------------------------------------------- the real environ.py reads the plan

_READ_ENVS = """
import json, sys
from sglang.srt.environ import envs
out = {}
for name in sys.argv[1:]:
    field = getattr(envs, name, None)
    out[name] = None if field is None else field.get()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def environ_dirs(wheel_paths, tmp_path_factory) -> dict[str, Path]:
    """Each wheel's environ.py (and the stdlib-only module it may import), under empty packages:
    the real `sglang/__init__.py` would pull in torch."""
    out = {}
    for version, path in wheel_paths.items():
        root = tmp_path_factory.mktemp(f"sglang-{version}")
        with zipfile.ZipFile(path) as zf:
            for name in ("sglang/srt/environ.py", "sglang/srt/debug_utils/cuda_coredump.py"):
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_bytes(zf.read(name))
        for pkg in ("sglang", "sglang/srt", "sglang/srt/debug_utils"):
            (root / pkg / "__init__.py").touch()
        out[version] = root
    return out


def _read_envs(root: Path, env: dict[str, str], names: tuple[str, ...] = ENV_VARS) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "SGL_"))}
    proc = subprocess.run(
        [sys.executable, "-c", _READ_ENVS, *names],
        env={**clean, **env, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_real_environ_reads_the_plan(wheel, environ_dirs):
    root = environ_dirs[wheel.version]
    row = _row(wheel.version)
    defaults = _read_envs(root, {})
    assert defaults[ENV_CACHE] == (row.cache_default_on if row.cache_available else None)
    assert defaults[ENV_TRANSPORT] is False
    assert defaults[ENV_POOL_MB] == row.pool_default_mb
    for mode in ("Auto", "On", "Off"):
        try:
            plan = plan_ipc_cache(wheel.version, mode, 2, 2048)
        except InvalidSpec:
            continue
        got = _read_envs(root, plan.env)
        if row.cache_available:
            assert got[ENV_CACHE] is plan.active, (mode, got)
            assert got[ENV_POOL_MB] == 2048
            # Up to 0.5.15 the env var is the transport switch; from 0.5.16 the flag is.
            assert got[ENV_TRANSPORT] is (plan.active and row.transport_choices is None), (mode, got)
        else:
            assert got == defaults, (mode, got)


def test_unknown_version_off_is_harmless_on_every_wheel(wheel, environ_dirs):
    """Off with an unknown version sets the cache var to 0: releases without it must not mind."""
    plan = plan_ipc_cache(None, "Off", 1)
    got = _read_envs(environ_dirs[wheel.version], plan.env)
    assert got[ENV_CACHE] in (False, None)


# ---------------------------------------------------------------- liveness and the preStop drain


def _route_handlers(wheel: Wheel, path: str) -> list[str]:
    """Source of every function of the HTTP server decorated with `@app.get(path)`."""
    name = "sglang/srt/entrypoints/http_server.py"
    src = wheel.text(name)
    out = []
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for d in node.decorator_list:
            if (isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "get"
                    and d.args and isinstance(d.args[0], ast.Constant) and d.args[0].value == path):
                out.append(ast.get_source_segment(src, node) or "")
    return out


def test_health_can_skip_its_generation(wheel):
    """The liveness plan's switch exists with the default the plan assumes, and `/health` reads it: when it is
    false the handler answers without a generation (only `/health_generate` still generates)."""
    assert sglang.parse_version(wheel.version) >= (*sglang.HEALTH_ENV_FIRST, 0, 0)
    assert wheel.env_fields[sglang.ENV_HEALTH_GENERATION] == ("EnvBool", True)
    (handler,) = _route_handlers(wheel, "/health")
    assert f"envs.{sglang.ENV_HEALTH_GENERATION}.get()" in handler, handler[:400]
    assert 'request.url.path == "/health"' in handler
    plan = sglang.plan_liveness(wheel.version, {})
    assert plan.probe == "http" and plan.env == {sglang.ENV_HEALTH_GENERATION: "0"}


def test_real_environ_reads_the_liveness_switch_as_off(wheel, environ_dirs):
    root, name = environ_dirs[wheel.version], sglang.ENV_HEALTH_GENERATION
    assert _read_envs(root, {}, (name,))[name] is True
    assert _read_envs(root, sglang.plan_liveness(wheel.version, {}).env, (name,))[name] is False


def test_the_drain_gauges_are_declared(wheel):
    """The preStop drain (builders.DRAIN_SCRIPT) sums these two gauges from SGLang's /metrics."""
    declared = {}
    for src in wheel.srt_sources.values():
        if 'name="sglang:' not in src:
            continue
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                kw = {k.arg: k.value for k in node.keywords}
                n = kw.get("name")
                if isinstance(n, ast.Constant) and isinstance(n.value, str):
                    declared[n.value] = node.func.id
    for metric in (sglang.METRIC_RUNNING, sglang.METRIC_QUEUED):
        assert declared.get(metric) == "Gauge", f"{wheel.version}: {metric} is {declared.get(metric)}"
    assert "add_prometheus_middleware(app)" in wheel.text("sglang/srt/entrypoints/http_server.py")
