"""The sidecar's and the operator's assumptions about SGLang's scheduler, checked against the real wheels.

For every wheel the compat tier fetches (hack/fetch-sglang-wheels.sh, DEFAULT_VERSIONS), parsed with `ast`
(SGLang is never imported):
- every function name the sidecar relies on (estimators.LOOP_FUNCTIONS, IDLE_FUNCTIONS, model.LOOP_STAGES,
  and ITERATION_START_FUNCTIONS / WRAPPER_FUNCTIONS when estimators.py has them) and the operator's default
  watch list exists in the release; names that exist only in some releases are stated per version below, and
  the sidecar's sets must cover their union;
- the stage calls of one iteration of event_loop_normal / event_loop_overlap (helpers inlined: ingest_requests,
  pop_and_process) come in the order the estimator assumes: recv_requests or ingest_requests first, then
  process_input_requests, get_next_batch_to_run, run_batch, process_batch_result; the one exception allowed is
  the disable-overlap path, where pop_and_process runs process_batch_result before run_batch;
- the stage methods' decorator and its inner function name (`wrapper`, the py-spy frame name);
- the scheduler process title SGLang sets is one vlm_sidecar.discovery matches, with the TP rank it parses;
- the metric names vlm_sidecar.sglang_metrics and vlm_sidecar.sglang_names read exist, with their labels;
- the CUDA IPC feature transport's frames vlm_sidecar.ipc reads to tell re-opened IPC handles (the cache off)
  from cached ones: the transport file per release, the proxy's feature functions, the inline open in
  reconstruct_on_target_device up to 0.5.17, _open_pooled_storage_uncached / _pool_handle_cache_get_or_open.

A wheel that cannot be downloaded fails the test (never skips): this is the only check of these names
against SGLang, so skipping would hide a rename. Reference notes: /tmp/sglang_shapes.md (working copy).
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
import zipfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pytest

from vlm_operator.api.v1alpha1 import TelemetrySpec
from vlm_sidecar import estimators, sglang_metrics, sglang_names
from vlm_sidecar.config import DEFAULT_PATTERN
from vlm_sidecar.discovery import ProcInfo, title_matches, tp_rank
from vlm_sidecar.model import LOOP_STAGES
from vlm_sidecar.sglang_names import REQUEST_METRICS
from vlm_testing.wheels import (
    SUPPORTED,
    SUPPORTED_VERSIONS,
    VERSIONS,
    _v,
    fetch_wheels,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER = "sglang/srt/managers/scheduler.py"


# ---------------------------------------------------------------- per-version expectations
# Adding a version to DEFAULT_VERSIONS without a row here fails test_tables_cover_every_fetched_version.


@dataclass(frozen=True)
class Shape:
    first_stage: str  # the first stage call of an iteration
    idle: str  # what the loops call when there is no batch
    recv_owner: str  # the class defining recv_requests (what py-spy's frame belongs to)
    decorator: str | None  # the decorator on the stage methods; None: undecorated
    wrapper_frames: int  # `wrapper` frames between the loop and a decorated stage
    stage_counters: bool  # sglang:scheduler_stage_seconds_total / scheduler_idle_seconds_total exist
    # version-dependent names (VERSIONED_NAMES) this release defines
    only_here: frozenset[str] = field(default_factory=frozenset)


_OLD_IDLE = frozenset({"self_check_during_idle", "check_memory"})  # 0.5.9, 0.5.10 (runtime-checker mixin)
_NEW_IDLE = frozenset({"on_idle"})  # 0.5.15+ (scheduler.py)
_INGEST = frozenset({"ingest_requests"})  # 0.5.20+: wraps recv_requests + process_input_requests
_MLX = frozenset({"event_loop_overlap_mlx"})  # 0.5.15+: the Apple-silicon loop
_RECEIVER = "SchedulerRequestReceiver"  # managers/scheduler_components/request_receiver.py
SHAPES = {
    "0.5.9": Shape("recv_requests", "self_check_during_idle", "Scheduler", None, 0, False, _OLD_IDLE),
    "0.5.10": Shape("recv_requests", "self_check_during_idle", "Scheduler", None, 0, False, _OLD_IDLE),
    "0.5.15": Shape("recv_requests", "on_idle", _RECEIVER, "scheduler_nvtx_method", 1, False, _NEW_IDLE | _MLX),
    "0.5.17": Shape("recv_requests", "on_idle", _RECEIVER, "scheduler_nvtx_method", 1, False, _NEW_IDLE | _MLX),
    "0.5.20": Shape(
        "ingest_requests", "on_idle", _RECEIVER, "scheduler_stage_method", 2, True, _NEW_IDLE | _INGEST | _MLX
    ),
    "0.5.23": Shape(
        "ingest_requests", "on_idle", _RECEIVER, "scheduler_stage_method", 2, True, _NEW_IDLE | _INGEST | _MLX
    ),
}
# Version-dependent names: each is defined in exactly the versions whose Shape.only_here lists it.
VERSIONED_NAMES = _OLD_IDLE | _NEW_IDLE | _INGEST | _MLX

# Names in the sidecar's constants that no release defines, with why they are kept (none today); an entry
# must go once the sidecar drops the name.
KNOWN_ABSENT: dict[str, str] = {}

# Metric kind per sglang_names key; the declared name is the family name (+ _total for counters).
METRIC_KINDS = {
    "ttft": "Histogram",
    "itl": "Histogram",
    "e2e": "Histogram",
    "generation_tokens": "Counter",
    "prompt_tokens": "Counter",
    "num_requests": "Counter",
    "gen_throughput": "Gauge",
    "num_running_reqs": "Gauge",
    "num_queue_reqs": "Gauge",
}
GATE_NEEDS = ("ttft", "itl", "generation_tokens")  # what a gate needs for TTFT / ITL / throughput
_STREAMING = {"ttft", "e2e", "generation_tokens", "prompt_tokens", "num_requests"}
# Labels a metric adds to its collector's base labels, per version.
EXTRA_LABELS: dict[str, dict[str, frozenset[str]]] = {
    v: {
        k: frozenset({"is_streaming"} if k in _STREAMING and _v(v) >= (0, 5, 17) else ())
        for k in METRIC_KINDS
    }
    for v in SHAPES
}
STAGE_COUNTER_LABELS = {
    "0.5.20": frozenset({"category"}),
    "0.5.23": frozenset({"category", "forward_overlap"}),
}


def _sidecar_names() -> dict[str, frozenset[str]]:
    out = {
        "estimators.LOOP_FUNCTIONS": frozenset(estimators.LOOP_FUNCTIONS),
        "estimators.IDLE_FUNCTIONS": frozenset(estimators.IDLE_FUNCTIONS),
        "model.LOOP_STAGES": frozenset(LOOP_STAGES),
        "api.TelemetrySpec.watch_functions": frozenset(TelemetrySpec().watch_functions),
    }
    for opt in ("ITERATION_START_FUNCTIONS", "WRAPPER_FUNCTIONS"):  # added by another change, maybe not yet
        if hasattr(estimators, opt):
            out[f"estimators.{opt}"] = frozenset(getattr(estimators, opt))
    return out


# ---------------------------------------------------------------- reading a wheel


@pytest.fixture(scope="module")
def wheel_paths() -> dict[str, Path]:
    return fetch_wheels(VERSIONS)


_WHEELS: dict[str, Wheel] = {}


@pytest.fixture(params=VERSIONS)
def wheel(request, wheel_paths) -> Wheel:
    v = request.param
    if v not in _WHEELS:
        _WHEELS[v] = Wheel.from_zip(v, wheel_paths[v])
    return _WHEELS[v]


class Wheel:
    """The srt sources of one release (path -> text); parsed lazily, one file at a time."""

    def __init__(self, version: str, sources: dict[str, str]):
        self.version = version
        self.sources = sources
        self._trees: dict[str, ast.Module] = {}
        self._index: dict[str, dict[str, list[str | None]]] = {}

    @classmethod
    def from_zip(cls, version: str, path: Path) -> Wheel:
        assert path.name.startswith(f"sglang-{version}-"), path
        with zipfile.ZipFile(path) as zf:
            srcs = {
                n: zf.read(n).decode()
                for n in zf.namelist()
                if n.startswith("sglang/srt/") and n.endswith(".py") and "/test" not in n
            }
        return cls(version, srcs)

    def tree(self, name: str) -> ast.Module:
        if name not in self._trees:
            self._trees[name] = ast.parse(self.sources[name], name)
        return self._trees[name]

    def defs(self, fn: str) -> list[tuple[str, str | None]]:
        """Where `def fn` is: [(file, enclosing class or None)]."""
        needle = f"def {fn}("  # a cheap prefilter; the AST index decides
        return [
            (name, cls)
            for name, src in self.sources.items()
            if needle in src
            for cls in self._def_index(name).get(fn, ())
        ]

    def _def_index(self, name: str) -> dict[str, list[str | None]]:
        if name not in self._index:
            index: dict[str, list[str | None]] = {}
            for cls, node in _functions(self.tree(name)):
                index.setdefault(node.name, []).append(cls)
            self._index[name] = index
        return self._index[name]

    @cached_property
    def scheduler_class(self) -> ast.ClassDef:
        return _class(self.tree(SCHEDULER), "Scheduler")

    def metrics(self) -> dict[str, tuple[str, frozenset[str]]]:
        """Declared name -> (Counter/Gauge/Histogram, extra label names) for every `sglang:` metric."""
        out = {}
        for name, src in self.sources.items():
            if 'name="sglang:' not in src:
                continue
            for node in ast.walk(self.tree(name)):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                    continue
                kw = {k.arg: k.value for k in node.keywords}
                n = kw.get("name")
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("sglang:"):
                    lab = kw.get("labelnames")
                    strs = (
                        [] if lab is None else [c.value for c in ast.walk(lab) if isinstance(c, ast.Constant)]
                    )
                    labels = frozenset(x for x in strs if isinstance(x, str))
                    out[n.value] = (node.func.id, labels)
        return out


def _functions(tree: ast.AST, cls: str | None = None):
    """(enclosing class, FunctionDef) for every def, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef):
            yield from _functions(node, node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield cls, node
            yield from _functions(node, cls)
        else:
            yield from _functions(node, cls)


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    found = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    assert len(found) == 1, f"{len(found)} classes named {name}"
    return found[0]


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


# ---------------------------------------------------------------- one loop iteration, as the estimator sees it


@dataclass(frozen=True)
class StageCall:
    name: str
    via: tuple[str, ...]  # inlined helpers it was reached through (ingest_requests, pop_and_process)
    guards: tuple[tuple[str, bool], ...]  # enclosing `if`s: (test source, in the body (True) or else)

    @property
    def disable_overlap_path(self) -> bool:
        """Under `if <...disable_overlap...>:` (the body, not a negation): overlap is off for this batch."""
        return any(ok and re.fullmatch(r"\w*disable_overlap\w*", test) for test, ok in self.guards)


INLINE_METHODS = ("ingest_requests",)  # Scheduler helpers that hold part of the iteration body


@functools.lru_cache(maxsize=16)
def _parse(src: str) -> ast.Module:
    return ast.parse(src)


def _call_name(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def iteration_calls(scheduler_src: str, loop: str) -> list[StageCall]:
    """Every call of one iteration of Scheduler.<loop>'s `while` body, in source order, helpers inlined."""
    cls = _class(_parse(scheduler_src), "Scheduler")
    fn = _method(cls, loop)
    assert fn is not None, f"Scheduler.{loop} does not exist"
    local_defs = {n.name: n for n in fn.body if isinstance(n, ast.FunctionDef)}
    loops = [n for n in fn.body if isinstance(n, ast.While)]
    assert len(loops) == 1, f"Scheduler.{loop}: expected one top-level `while` loop, found {len(loops)}"
    out: list[StageCall] = []

    def visit(node: ast.AST, via: tuple[str, ...], guards: tuple[tuple[str, bool], ...]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return
        if isinstance(node, ast.If):
            visit(node.test, via, guards)
            test = ast.unparse(node.test)
            for stmt in node.body:
                visit(stmt, via, (*guards, (test, True)))
            for stmt in node.orelse:
                visit(stmt, via, (*guards, (test, False)))
            return
        if isinstance(node, ast.Call):
            for child in (*node.args, *node.keywords):  # arguments run first
                visit(child, via, guards)
            visit(node.func, via, guards)
            name = _call_name(node)
            if name is None:
                return
            target = None
            if isinstance(node.func, ast.Name) and name in local_defs:
                target = local_defs[name]
            elif (
                name in INLINE_METHODS
                and isinstance(node.func, ast.Attribute)
                and ast.unparse(node.func.value) == "self"
            ):
                target = _method(cls, name)
            out.append(StageCall(name, via, guards))
            if target is not None and name not in via:
                for stmt in target.body:
                    visit(stmt, (*via, name), guards)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, via, guards)

    for stmt in loops[0].body:
        visit(stmt, (), ())
    return out


_STAGE_POS = {s: i for i, s in enumerate(LOOP_STAGES)}
_ITERATION_STARTS = ("recv_requests", "ingest_requests")


def loop_order_problems(scheduler_src: str, loop: str, idle: str) -> list[str]:
    """What in Scheduler.<loop> breaks the estimator's stage order; [] when it holds."""
    try:
        calls = iteration_calls(scheduler_src, loop)
    except AssertionError as e:
        return [str(e)]
    problems = []
    top = [c for c in calls if not c.via and c.name in (*_ITERATION_STARTS, *LOOP_STAGES)]
    if not top or top[0].name not in _ITERATION_STARTS:
        problems.append(
            f"{loop}: the first stage of an iteration is {top[0].name if top else 'missing'}, "
            f"not one of {_ITERATION_STARTS}"
        )
    stages = [c for c in calls if c.name in _STAGE_POS]
    main = [c for c in stages if not c.disable_overlap_path]
    seen = [c.name for c in main]
    for stage in LOOP_STAGES:
        if stage not in seen:
            problems.append(f"{loop}: no call of {stage} on the main path (calls: {seen})")
    for a, b in itertools.pairwise(main):
        if _STAGE_POS[b.name] < _STAGE_POS[a.name]:
            problems.append(f"{loop}: {b.name} after {a.name}; the estimator assumes the order {LOOP_STAGES}")
    # The allowed exception: with overlap off for the batch, pop_and_process handles the last batch first.
    for c in stages:
        if c.disable_overlap_path and (c.name != "process_batch_result" or "pop_and_process" not in c.via):
            problems.append(f"{loop}: unexpected {c.name} on the disable-overlap path ({c.via})")
    if not any(c.name == idle and not c.via for c in calls):
        problems.append(f"{loop}: the idle function {idle} is not called")
    return problems


# ---------------------------------------------------------------- the tables themselves


def test_tables_cover_every_fetched_version():
    assert set(SHAPES) == set(VERSIONS), f"SHAPES rows {sorted(SHAPES)} != fetched wheels {VERSIONS}"
    assert set(REQUEST_METRICS) == set(VERSIONS), (
        f"sglang_names.REQUEST_METRICS rows != fetched wheels {VERSIONS}"
    )
    assert SUPPORTED[0] in VERSIONS and SUPPORTED[1] in VERSIONS, "fetch both ends of the supported range"
    for v, row in REQUEST_METRICS.items():
        assert set(row) == set(METRIC_KINDS), f"{v}: REQUEST_METRICS keys {sorted(row)}"
    assert sglang_names.STAGE_COUNTER == sglang_metrics.STAGE_COUNTER
    assert sglang_names.IDLE_COUNTER == sglang_metrics.IDLE_COUNTER
    assert sglang_names.request_metrics(SUPPORTED[1]) == REQUEST_METRICS[SUPPORTED[1]]


def test_sidecar_constants_cover_the_versioned_names():
    names = _sidecar_names()
    idle_needed = {s.idle for s in SHAPES.values()} | {"check_memory"}
    missing = idle_needed - names["estimators.IDLE_FUNCTIONS"]
    assert not missing, f"estimators.IDLE_FUNCTIONS lacks {sorted(missing)} (idle work in some release)"
    if "estimators.ITERATION_START_FUNCTIONS" in names:
        starts = {SHAPES[v].first_stage for v in SUPPORTED_VERSIONS}
        assert starts <= names["estimators.ITERATION_START_FUNCTIONS"], starts
    if "estimators.WRAPPER_FUNCTIONS" in names:
        assert {"wrapper"} <= names["estimators.WRAPPER_FUNCTIONS"]
    for name, why in KNOWN_ABSENT.items():
        assert any(name in s for s in names.values()), f"KNOWN_ABSENT[{name!r}] is stale: drop it ({why})"


# ---------------------------------------------------------------- against each wheel


def name_problems(wheel: Wheel) -> list[str]:
    """Sidecar / operator names whose presence in the release differs from the tables; [] when all hold."""
    shape = SHAPES[wheel.version]
    problems = []
    sidecar = _sidecar_names()
    for const, names in sidecar.items():
        for fn in sorted(names):
            found = bool(wheel.defs(fn))
            if fn in KNOWN_ABSENT:
                if found:
                    problems.append(f"{fn} ({const}) now exists: drop it from KNOWN_ABSENT")
                continue
            expected = fn in shape.only_here or fn not in VERSIONED_NAMES
            if found != expected:
                problems.append(
                    f"{fn} ({const}): {'defined' if found else 'not defined'} in {wheel.version}, "
                    f"the table says {'it is' if expected else 'it is not'}"
                )
    for fn in sorted(VERSIONED_NAMES - set().union(*sidecar.values())):
        if bool(wheel.defs(fn)) != (fn in shape.only_here):
            problems.append(
                f"{fn}: presence in {wheel.version} differs from SHAPES[{wheel.version!r}].only_here"
            )
    return problems


def test_every_name_the_sidecar_relies_on_exists(wheel):
    problems = name_problems(wheel)
    assert not problems, f"SGLang {wheel.version}:\n" + "\n".join(problems)


def test_recv_requests_owner(wheel):
    """py-spy shows the method's own name; from 0.5.15 it belongs to the request receiver, not Scheduler."""
    owners = {cls for _, cls in wheel.defs("recv_requests")}
    assert SHAPES[wheel.version].recv_owner in owners, f"{wheel.version}: recv_requests defined in {owners}"
    on_scheduler = _method(wheel.scheduler_class, "recv_requests") is not None
    assert on_scheduler == (SHAPES[wheel.version].recv_owner == "Scheduler"), wheel.version


@pytest.mark.parametrize("loop", ["event_loop_normal", "event_loop_overlap"])
def test_loop_stage_order(wheel, loop):
    problems = loop_order_problems(wheel.sources[SCHEDULER], loop, SHAPES[wheel.version].idle)
    assert not problems, f"SGLang {wheel.version}:\n" + "\n".join(problems)
    first = next(
        c.name for c in iteration_calls(wheel.sources[SCHEDULER], loop) if c.name in _ITERATION_STARTS
    )
    assert first == SHAPES[wheel.version].first_stage


def test_overlap_loop_has_the_disable_overlap_path(wheel):
    """The estimator's one exception must still be the shape SGLang has (else revisit the estimator)."""
    calls = iteration_calls(wheel.sources[SCHEDULER], "event_loop_overlap")
    early = [c for c in calls if c.disable_overlap_path and c.name == "process_batch_result"]
    assert early and all("pop_and_process" in c.via for c in early), wheel.version
    names = [
        c.name
        for c in calls
        if c.name in ("run_batch", "launch_batch_sample_if_needed", "process_batch_result")
    ]
    assert names[-1] == "launch_batch_sample_if_needed", names


def _returned_def(fn: ast.FunctionDef) -> ast.FunctionDef:
    """The nested def a decorator factory returns (`return wrapper`, `return cast(_F, wrapper)`)."""
    nested = {n.name: n for n in fn.body if isinstance(n, ast.FunctionDef)}
    for ret in (n for n in fn.body if isinstance(n, ast.Return) and n.value is not None):
        for name in (n.id for n in ast.walk(ret.value) if isinstance(n, ast.Name)):
            if name in nested:
                return nested[name]
    raise AssertionError(f"{fn.name} returns none of its nested defs {sorted(nested)}")


def _decorator_inner_names(wheel: Wheel, decorator: str) -> list[str]:
    """Names of the frames the decorator puts above the method, outermost first."""
    (where,) = [f for f, cls in wheel.defs(decorator) if cls is None] or [None]
    if where is None:  # scheduler_nvtx_method = partial(profile_method, ...)
        srcs = [n for n, s in wheel.sources.items() if re.search(rf"^{decorator} = partial\((\w+)", s, re.M)]
        assert len(srcs) == 1, f"{decorator}: defined in {srcs}"
        target = re.search(rf"^{decorator} = partial\((\w+)", wheel.sources[srcs[0]], re.M)[1]
        return _decorator_inner_names(wheel, target)
    factory = next(n for _, n in _functions(wheel.tree(where)) if n.name == decorator)
    inner = _returned_def(_returned_def(factory))
    names = [inner.name]
    calls = {_call_name(c) for c in ast.walk(_returned_def(factory)) if isinstance(c, ast.Call)}
    if "scheduler_nvtx_method" in calls and decorator != "scheduler_nvtx_method":
        names += _decorator_inner_names(wheel, "scheduler_nvtx_method")
    return names


_DECORATED = ("process_input_requests", "get_next_batch_to_run", "run_batch", "process_batch_result")


def test_stage_decorator_and_wrapper_name(wheel):
    shape = SHAPES[wheel.version]
    sched = wheel.scheduler_class
    receiver = (
        None
        if shape.recv_owner == "Scheduler"
        else _class(
            wheel.tree("sglang/srt/managers/scheduler_components/request_receiver.py"), shape.recv_owner
        )
    )
    methods = {m: _method(sched, m) for m in _DECORATED} | {
        "recv_requests": _method(receiver or sched, "recv_requests")
    }
    if shape.idle == "on_idle" and shape.stage_counters:
        methods["on_idle"] = _method(sched, "on_idle")
    for name, fn in methods.items():
        assert fn is not None, f"{wheel.version}: {name} missing"
        decos = [_call_name(d) for d in fn.decorator_list if isinstance(d, ast.Call)]
        if shape.decorator is None:
            assert not fn.decorator_list, f"{wheel.version}: {name} is decorated with {decos}"
        else:
            assert shape.decorator in decos, f"{wheel.version}: {name} carries {decos}, not {shape.decorator}"
    if shape.decorator is not None:
        frames = _decorator_inner_names(wheel, shape.decorator)
        assert frames == ["wrapper"] * shape.wrapper_frames, (
            f"{wheel.version}: {shape.decorator} frames {frames}"
        )


def _title_parts(wheel: Wheel) -> tuple[str, list[str]]:
    """The constant head of the scheduler's setproctitle f-string, and the ` XX{rank}` tags in prefix order."""
    tree = wheel.tree(SCHEDULER)
    heads = [
        n.args[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "setproctitle.setproctitle"
    ]
    assert len(heads) == 1, f"{wheel.version}: {len(heads)} setproctitle calls in scheduler.py"
    s = heads[0]
    assert isinstance(s, ast.JoinedStr) and isinstance(s.values[0], ast.Constant), ast.unparse(s)
    assert ast.unparse(s.values[1].value) == "prefix.replace(' ', '_')", ast.unparse(s)
    tags = []
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.AugAssign)
            and ast.unparse(n.target) == "prefix"
            and isinstance(n.value, ast.JoinedStr)
        ):
            const = n.value.values[0]
            assert isinstance(const, ast.Constant) and const.value.startswith(" "), ast.unparse(n)
            tags.append(const.value[1:])
    return s.values[0].value, tags


def test_scheduler_title_matches_discovery(wheel):
    head, tags = _title_parts(wheel)
    assert head == DEFAULT_PATTERN, (
        f"{wheel.version}: SGLang titles its scheduler {head!r}, not {DEFAULT_PATTERN!r}"
    )
    assert "TP" in tags and tags.index("TP") > tags.index("DP"), tags

    def info(title: str) -> ProcInfo:
        return ProcInfo(1, 0, title + " " * 20, title[:15], 1)

    ranks = {tag: i + 2 for i, tag in enumerate(tags)}
    cases = {head: 0, f"{head}_TP3": 3, head + "".join(f"_{t}{r}" for t, r in ranks.items()): ranks["TP"]}
    cases[f"{head}_DP1"] = 0
    for title, rank in cases.items():
        assert title_matches(info(title), DEFAULT_PATTERN), title
        assert tp_rank(title) == rank, title
    for other in re.findall(r'setproctitle\(\s*f?"(sglang::[a-z_]+)', "\n".join(wheel.sources.values())):
        if other != head:
            assert not title_matches(info(other + ":123"), DEFAULT_PATTERN), other


def test_metric_names_exist(wheel):
    declared = wheel.metrics()
    row = REQUEST_METRICS[wheel.version]
    problems = []
    for key, family in row.items():
        kind = METRIC_KINDS[key]
        name = family + "_total" if kind == "Counter" else family
        got = declared.get(name)
        if got is None:
            problems.append(f"{key}: {name} is not declared")
        elif got[0] != kind:
            problems.append(f"{key}: {name} is a {got[0]}, not a {kind}")
        elif got[1] != EXTRA_LABELS[wheel.version][key]:
            problems.append(
                f"{key}: {name} labels {sorted(got[1])}, table {sorted(EXTRA_LABELS[wheel.version][key])}"
            )
    stage = declared.get(sglang_metrics.STAGE_COUNTER + "_total")
    idle = declared.get(sglang_metrics.IDLE_COUNTER + "_total")
    if SHAPES[wheel.version].stage_counters:
        assert _v(wheel.version) >= _v(sglang_names.STAGE_COUNTERS_SINCE)
        if stage is None or idle is None:
            problems.append(f"stage/idle counters missing: {stage}, {idle}")
        else:
            assert stage[0] == idle[0] == "Counter"
            if stage[1] != STAGE_COUNTER_LABELS[wheel.version]:
                problems.append(f"{sglang_metrics.STAGE_COUNTER}_total labels {sorted(stage[1])}")
    elif stage is not None or idle is not None:
        problems.append("stage/idle counters exist, the table says they do not")
    # The forward passes the gate scales SGLang's stage shares by: every supported release declares the counter.
    passes = declared.get(sglang_names.FORWARD_PASSES + "_total")
    if passes is None or passes[0] != "Counter" or "mode" not in passes[1]:
        problems.append(f"{sglang_names.FORWARD_PASSES}_total: {passes} (a Counter with a mode label expected)")
    assert not problems, f"SGLang {wheel.version}:\n" + "\n".join(problems)


def test_stage_categories_cover_loop_stages(wheel):
    """sglang_metrics.agreement compares per category name: SGLang's categories must be the sidecar's stages."""
    if not SHAPES[wheel.version].stage_counters:
        return
    tree = wheel.tree("sglang/srt/observability/scheduler_stage_metrics.py")
    consts = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    (cats,) = [
        n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "SCHEDULER_STAGE_CATEGORIES"
    ]
    categories = {consts[e.id] for e in cats.elts}
    assert {*LOOP_STAGES, "idle"} <= categories, sorted(categories)


@pytest.mark.parametrize("key", GATE_NEEDS)
def test_gate_metrics_in_every_supported_version(key):
    for v in SUPPORTED_VERSIONS:
        assert REQUEST_METRICS[v].get(key), f"{v}: no {key} metric recorded"


# ---------------------------------------------------------------- the checks can fail

_SYNTHETIC = """
class Scheduler:
    def event_loop_overlap(self):
        def pop_and_process():
            self.process_batch_result(*self.result_queue.popleft())

        while True:
            recv_reqs = self.request_receiver.recv_requests()
            self.process_input_requests(recv_reqs)
            batch = self.get_next_batch_to_run()
            disable_overlap_for_batch = self.is_disable_overlap_for_batch(batch)
            if disable_overlap_for_batch:
                pop_and_process()
            if batch:
                batch_result = self.run_batch(batch)
            if self.last_batch:
                if not disable_overlap_for_batch:
                    pop_and_process()
            elif batch is None:
                self.on_idle()
            self.launch_batch_sample_if_needed(batch_result)

    def process_input_requests(self, recv_reqs): ...
    def get_next_batch_to_run(self): ...
    def run_batch(self, batch): ...
    def process_batch_result(self, batch, result): ...
    def on_idle(self): ...
"""


def test_checker_accepts_the_synthetic_loop():
    assert loop_order_problems(_SYNTHETIC, "event_loop_overlap", "on_idle") == []


def test_checker_fails_on_a_renamed_stage():
    src = _SYNTHETIC.replace("self.run_batch(batch)", "self.run_batch_v2(batch)")
    problems = loop_order_problems(src, "event_loop_overlap", "on_idle")
    assert any("no call of run_batch" in p for p in problems), problems
    src = _SYNTHETIC.replace("self.request_receiver.recv_requests()", "self.request_receiver.poll()")
    problems = loop_order_problems(src, "event_loop_overlap", "on_idle")
    assert any("first stage" in p for p in problems), problems
    # The name check, on a release where run_batch was renamed.
    kept = name_problems(Wheel("0.5.23", {SCHEDULER: _SYNTHETIC}))
    renamed = name_problems(Wheel("0.5.23", {SCHEDULER: _SYNTHETIC.replace("run_batch", "run_batch_v2")}))
    assert not any(p.startswith("run_batch (") for p in kept), kept
    assert any(p.startswith("run_batch (model.LOOP_STAGES): not defined") for p in renamed), renamed


def test_checker_fails_on_reordered_stages():
    src = _SYNTHETIC.replace(
        "            batch = self.get_next_batch_to_run()\n",
        "",
    ).replace(
        "            recv_reqs = self.request_receiver.recv_requests()\n",
        "            recv_reqs = self.request_receiver.recv_requests()\n            batch = self.get_next_batch_to_run()\n",
    )
    problems = loop_order_problems(src, "event_loop_overlap", "on_idle")
    assert any("process_input_requests after get_next_batch_to_run" in p for p in problems), problems
    # process_batch_result before run_batch outside the disable-overlap path
    src = _SYNTHETIC.replace(
        "            if disable_overlap_for_batch:\n                pop_and_process()\n",
        "            pop_and_process()\n",
    )
    problems = loop_order_problems(src, "event_loop_overlap", "on_idle")
    assert any("run_batch after process_batch_result" in p for p in problems), problems


# ---------------------------------------------------------------- the CUDA IPC feature transport (vlm_sidecar.ipc)
# The sidecar tells a cache-off scheduler from a cache-on one by frame names in the consumer side of the
# transport (CudaIpcTensorTransportProxy): the file holding it, whether its reconstruct_on_target_device
# opens a per-feature handle inline (torch's _new_shared_cuda, a C call: py-spy charges the frame itself),
# and the pool's open/cache functions. Checked per release, so a rename fails here, not in a pod's status.


@dataclass(frozen=True)
class IPCShape:
    file: str  # the module holding CudaIpcTensorTransportProxy
    inline_open: bool  # reconstruct_on_target_device calls _new_shared_cuda itself (the cache-off path)
    pooled: bool  # the pool-handle cache exists (_open_pooled_storage_uncached, _pool_handle_cache_get_or_open)
    feature_functions: frozenset[str]  # which of ipc.FEATURE_FUNCTIONS the proxy defines


_IPC_OLD = "sglang/srt/utils/cuda_ipc_transport_utils.py"
_IPC_NEW = "sglang/srt/multimodal/transport/cuda_ipc.py"
_REC = frozenset({"reconstruct_on_target_device"})
_ACK = _REC | {"acknowledge_consumption"}
IPC_SHAPES = {
    "0.5.9": IPCShape(_IPC_OLD, True, False, _REC),
    "0.5.10": IPCShape(_IPC_OLD, True, True, _REC),
    "0.5.15": IPCShape(_IPC_OLD, True, True, _REC),
    "0.5.17": IPCShape(_IPC_OLD, True, True, _ACK),
    "0.5.20": IPCShape(_IPC_NEW, False, True, _ACK | {"borrow_on_target_device"}),
    "0.5.23": IPCShape(_IPC_NEW, False, True, _ACK | {"borrow_on_target_device"}),
}
PROXY = "CudaIpcTensorTransportProxy"


def _calls(fn: ast.AST) -> set[str]:
    return {n for n in (_call_name(c) for c in ast.walk(fn) if isinstance(c, ast.Call)) if n}


def ipc_problems(wheel: Wheel) -> list[str]:
    """Where the release's IPC transport differs from what vlm_sidecar.ipc reads; [] when it holds."""
    from vlm_sidecar import ipc

    shape = IPC_SHAPES[wheel.version]
    base = shape.file.rsplit("/", 1)[-1]
    problems = []
    if base not in ipc.TRANSPORT_FILES:
        problems.append(f"{base} is not in ipc.TRANSPORT_FILES")
    if (base in ipc.INLINE_OPEN_FILES) != shape.inline_open:
        problems.append(f"{base}: ipc.INLINE_OPEN_FILES disagrees with the inline open ({shape.inline_open})")
    if shape.file not in wheel.sources:
        return [*problems, f"{shape.file} does not exist"]
    fns: dict[str, list[tuple[str | None, ast.AST]]] = {}
    for cls, node in _functions(wheel.tree(shape.file)):
        fns.setdefault(node.name, []).append((cls, node))
    defined = {f for f in ipc.FEATURE_FUNCTIONS if any(cls == PROXY for cls, _ in fns.get(f, ()))}
    if defined != shape.feature_functions:
        problems.append(f"{PROXY} defines {sorted(defined)} of ipc.FEATURE_FUNCTIONS, the table says "
                        f"{sorted(shape.feature_functions)}")
    # Any other file with a transport file's base name must not define the feature functions (frames carry base names).
    for name in wheel.sources:
        if name != shape.file and name.rsplit("/", 1)[-1] in ipc.TRANSPORT_FILES:
            clash = set(wheel._def_index(name)) & ipc.FEATURE_FUNCTIONS
            if clash:
                problems.append(f"{name} also defines {sorted(clash)}")
    rec = [n for cls, n in fns.get(ipc.RECONSTRUCT_FUNCTION, ()) if cls == PROXY]
    if len(rec) != 1:
        return [*problems, f"{PROXY}.{ipc.RECONSTRUCT_FUNCTION}: {len(rec)} definitions"]
    if ("_new_shared_cuda" in _calls(rec[0])) != shape.inline_open:
        problems.append(f"{ipc.RECONSTRUCT_FUNCTION} {'does not call' if shape.inline_open else 'calls'} "
                        "_new_shared_cuda itself")
    if not shape.pooled:
        return problems
    for f in (ipc.REOPEN_FUNCTION, ipc.CACHE_FUNCTION):
        if f not in fns:
            problems.append(f"{f} is not defined in {shape.file}")
    if problems:
        return problems
    if "_new_shared_cuda" not in _calls(fns[ipc.REOPEN_FUNCTION][0][1]):
        problems.append(f"{ipc.REOPEN_FUNCTION} no longer opens the handle (_new_shared_cuda)")
    if ipc.REOPEN_FUNCTION not in _calls(fns[ipc.CACHE_FUNCTION][0][1]):
        problems.append(f"{ipc.CACHE_FUNCTION} no longer opens through {ipc.REOPEN_FUNCTION} on a miss")
    # The uncached path: something in the proxy other than the cache calls the open directly ...
    direct = sorted(name for name, ds in fns.items() for cls, n in ds
                    if cls == PROXY and ipc.REOPEN_FUNCTION in _calls(n))
    if not direct:
        problems.append(f"no {PROXY} method calls {ipc.REOPEN_FUNCTION} (the uncached path moved)")
    # ... and reconstruct_on_target_device reaches it and the cache through the proxy's own methods.
    reach, todo = set(), [ipc.RECONSTRUCT_FUNCTION]
    while todo:
        name = todo.pop()
        if name in reach:
            continue
        reach.add(name)
        for cls, n in fns.get(name, ()):
            if cls in (PROXY, None):
                todo.extend(c for c in _calls(n) if c in fns)
    for f in (ipc.REOPEN_FUNCTION, ipc.CACHE_FUNCTION):
        if f not in reach:
            problems.append(f"{ipc.RECONSTRUCT_FUNCTION} no longer reaches {f}")
    return problems


def test_ipc_tables_cover_every_fetched_version_and_the_sidecars_files():
    from vlm_sidecar import ipc

    assert set(IPC_SHAPES) == set(VERSIONS), f"IPC_SHAPES rows {sorted(IPC_SHAPES)} != fetched wheels {VERSIONS}"
    bases = {s.file.rsplit("/", 1)[-1] for v, s in IPC_SHAPES.items() if v in SUPPORTED_VERSIONS}
    assert bases == ipc.TRANSPORT_FILES, "ipc.TRANSPORT_FILES must be exactly the supported releases' files"
    assert set().union(*(s.feature_functions for s in IPC_SHAPES.values())) == ipc.FEATURE_FUNCTIONS
    assert all(s.pooled for v, s in IPC_SHAPES.items() if v in SUPPORTED_VERSIONS)


def test_ipc_transport_frames(wheel):
    problems = ipc_problems(wheel)
    assert not problems, f"SGLang {wheel.version}:\n" + "\n".join(problems)


def test_ipc_checker_fails_on_a_renamed_open():
    src = f'''
def _open_pooled_storage_uncached(pool_handle):
    return torch.UntypedStorage._new_shared_cuda(*pool_handle)

def _pool_handle_cache_get_or_open(cache_key, pool_handle):
    return _open_pooled_storage_uncached(pool_handle)

class {PROXY}:
    def _reconstruct_from_ipc_extra(self, use_cache):
        if use_cache:
            return _pool_handle_cache_get_or_open(1, 2)
        return _open_pooled_storage_uncached(2)

    def _open_pool_slice(self):
        return self._reconstruct_from_ipc_extra(True)

    def acknowledge_consumption(self): ...
    def borrow_on_target_device(self): ...

    def reconstruct_on_target_device(self, idx):
        return self._open_pool_slice()
'''
    assert ipc_problems(Wheel("0.5.23", {_IPC_NEW: src})) == []
    renamed = src.replace("_open_pooled_storage_uncached", "_open_pool_storage")
    assert any("_open_pooled_storage_uncached is not defined" in p
               for p in ipc_problems(Wheel("0.5.23", {_IPC_NEW: renamed})))
    inline = src.replace("return self._open_pool_slice()", "return torch.UntypedStorage._new_shared_cuda(1)")
    assert any("calls _new_shared_cuda itself" in p for p in ipc_problems(Wheel("0.5.23", {_IPC_NEW: inline})))
