"""The sidecar's front-end roles (vlm_sidecar.discovery.discover_roles, vlm_sidecar.roles) against the real wheels.

For every supported release the compat tier fetches (0.5.10 ... 0.5.23; hack/fetch-sglang-wheels.sh), read
with zipfile and `ast` (SGLang is never imported or installed):
- the titles discovery matches: `sglang::detokenizer` (detokenizer_manager.py), `sglang::tokenizer_worker:<pid>`
  (multi_tokenizer_mixin.py, the worker's own pid), and every `sglang::` title in srt/ starts with the prefix
  discovery skips when it walks up to the main server process;
- the main server process sets no title (entrypoints/http_server.py, engine.py, launch_server.py), runs as
  `python3 -m sglang.launch_server` (the module exists; the operator's command) or `sglang serve` (the console
  script's subcommand), and spawns its children (`mp.set_start_method("spawn", force=True)` in engine.py), so
  the schedulers and the detokenizer are its children and it is their nearest untitled ancestor;
- the multimodal processor's pools in base_processor.py: an IO ThreadPoolExecutor and a ProcessPoolExecutor
  whose start method is "fork" (0.5.20+: "spawn" only for cuda_vmm), the reason its workers carry their
  parent's command line (or a spawn child's), and `process_mm_data_async` (roles.IMAGE_FUNCTIONS) defined there;
- the frames roles.py reads as idle or as a role's thread: the HTTP server's uvloop (the idle frame
  `run (runners.py)`), the detokenizer's `event_loop` and its receive (`recv_pyobj` up to 0.5.10, `sock_recv`
  in io_struct.py from 0.5.15), each in roles' tables.
A wheel that cannot be downloaded fails the test (never skips).
"""

from __future__ import annotations

import ast
import re
import zipfile
from pathlib import Path

import pytest

from vlm_sidecar import roles
from vlm_sidecar.discovery import (
    _LAUNCHER_RE,
    DETOKENIZER_TITLE,
    TITLE_PREFIX,
    TOKENIZER_WORKER_TITLE,
)
from vlm_testing.wheels import SUPPORTED_VERSIONS, fetch_wheels

pytestmark = pytest.mark.slow

DETOK = "sglang/srt/managers/detokenizer_manager.py"
MULTI = "sglang/srt/managers/multi_tokenizer_mixin.py"
BASE = "sglang/srt/multimodal/processors/base_processor.py"
ENGINE = "sglang/srt/entrypoints/engine.py"
HTTP = "sglang/srt/entrypoints/http_server.py"
IO_STRUCT = "sglang/srt/managers/io_struct.py"


class Src:
    def __init__(self, version: str, path: Path) -> None:
        self.version = version
        with zipfile.ZipFile(path) as zf:
            self.files = {n: zf.read(n).decode() for n in zf.namelist() if n.endswith(".py")}

    def tree(self, name: str) -> ast.Module:
        return ast.parse(self.files[name], name)

    def titles(self, name: str) -> list[ast.expr]:
        return [n.args[0] for n in ast.walk(self.tree(name))
                if isinstance(n, ast.Call) and ast.unparse(n.func) == "setproctitle.setproctitle"]


_SRC: dict[str, Src] = {}


@pytest.fixture(scope="module")
def paths() -> dict[str, Path]:
    return fetch_wheels(SUPPORTED_VERSIONS)


@pytest.fixture(params=SUPPORTED_VERSIONS)
def src(request, paths) -> Src:
    v = request.param
    if v not in _SRC:
        _SRC[v] = Src(v, paths[v])
    return _SRC[v]


def test_supported_range_is_covered():
    assert SUPPORTED_VERSIONS[0] == "0.5.10" and SUPPORTED_VERSIONS[-1] == "0.5.23", SUPPORTED_VERSIONS
    assert len(SUPPORTED_VERSIONS) >= 4


def test_detokenizer_title(src):
    [title] = src.titles(DETOK)
    assert isinstance(title, ast.Constant) and title.value == DETOKENIZER_TITLE, ast.unparse(title)


def test_tokenizer_worker_title_carries_its_own_pid(src):
    titles = [t for t in src.titles(MULTI) if "tokenizer_worker" in ast.unparse(t)]
    assert len(titles) == 1, [ast.unparse(t) for t in src.titles(MULTI)]
    t = titles[0]
    assert isinstance(t, ast.JoinedStr) and isinstance(t.values[0], ast.Constant), ast.unparse(t)
    assert t.values[0].value == TOKENIZER_WORKER_TITLE + ":"
    assert ast.unparse(t.values[1].value) == "os.getpid()", ast.unparse(t)
    # It is set in the worker's own __init__ (TokenizerWorker), i.e. in the worker process.
    cls = next(n for n in ast.walk(src.tree(MULTI)) if isinstance(n, ast.ClassDef) and n.name == "TokenizerWorker")
    assert any(isinstance(n, ast.Call) and ast.unparse(n.func) == "setproctitle.setproctitle" for n in ast.walk(cls))


def test_every_title_has_the_prefix_discovery_walks_past(src):
    heads = []
    for name, text in src.files.items():
        if not name.startswith("sglang/srt/") or "setproctitle" not in text:
            continue
        for t in src.titles(name):
            head = t.value if isinstance(t, ast.Constant) else t.values[0].value
            heads.append(head)
    assert heads and all(h.startswith(TITLE_PREFIX) for h in heads), heads
    assert {DETOKENIZER_TITLE, "sglang::scheduler"} <= set(heads)


def test_main_server_process_sets_no_title_and_spawns_its_children(src):
    for name in (HTTP, ENGINE, "sglang/launch_server.py"):
        assert name in src.files, name
        assert not src.titles(name), (name, [ast.unparse(t) for t in src.titles(name)])
    assert 'mp.set_start_method("spawn", force=True)' in src.files[ENGINE]
    # How the operator launches it (builders: python3 -m sglang.launch_server) and the console script.
    assert _LAUNCHER_RE.search("python3 -m sglang.launch_server --model-path m --port 30000")
    assert re.search(r"""["']serve["']""", src.files["sglang/cli/main.py"])
    assert _LAUNCHER_RE.search("/usr/local/bin/sglang serve --model-path m")
    assert not _LAUNCHER_RE.search("python3 -m sglang.launch_server_x")


def _executor_calls(tree: ast.Module) -> dict[str, list[ast.Call]]:
    out: dict[str, list[ast.Call]] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            f = ast.unparse(n.func)
            for kind in ("ThreadPoolExecutor", "ProcessPoolExecutor"):
                if f.endswith(kind):
                    out.setdefault(kind, []).append(n)
    return out


def test_processor_pools_fork_their_workers(src):
    calls = _executor_calls(src.tree(BASE))
    assert calls.get("ThreadPoolExecutor") and calls.get("ProcessPoolExecutor"), calls
    [pool] = calls["ProcessPoolExecutor"]
    ctx = next(kw.value for kw in pool.keywords if kw.arg == "mp_context")
    text = ast.unparse(ctx)
    if text == "mp.get_context('fork')":
        return
    # 0.5.20+: start_method = "spawn" if self.mm_feature_transport == "cuda_vmm" else "fork"
    assert text == "mp.get_context(start_method)", text
    assign = next(n for n in ast.walk(src.tree(BASE)) if isinstance(n, ast.Assign)
                  and ast.unparse(n.targets[0]) == "start_method")
    assert ast.unparse(assign.value) == "'spawn' if self.mm_feature_transport == 'cuda_vmm' else 'fork'"


def test_image_processing_frames_exist(src):
    defs = {n.name for n in ast.walk(src.tree(BASE)) if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)}
    assert defs >= roles.IMAGE_FUNCTIONS, roles.IMAGE_FUNCTIONS - defs
    assert BASE.rsplit("/", 1)[-1] in roles.IMAGE_FILES


def test_http_server_loop_is_uvloop(src):
    """uvloop is C: a waiting loop shows as the frame that entered it, which roles reads as idle."""
    assert "uvloop.EventLoopPolicy()" in src.files[HTTP]
    assert ("run", "runners.py") in roles.IDLE_INNERMOST and ("select", "selectors.py") in roles.IDLE_ANYWHERE


def test_detokenizer_loop_and_its_receive(src):
    tree = src.tree(DETOK)
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "DetokenizerManager")
    loop = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "event_loop")
    assert ("event_loop", DETOK.rsplit("/", 1)[-1]) in roles.DETOKENIZER_FRAMES
    recv = [ast.unparse(n.func) for n in ast.walk(loop) if isinstance(n, ast.Call)
            and "recv" in ast.unparse(n.func)]
    assert recv, ast.unparse(loop)
    if recv[0] == "self.recv_from_scheduler.recv_pyobj":
        assert ("recv_pyobj", "socket.py") in roles.IDLE_INNERMOST  # pyzmq's sugar/socket.py
    else:
        assert recv[0] == "sock_recv", recv
        helper = next(n for n in ast.walk(src.tree(IO_STRUCT)) if isinstance(n, ast.FunctionDef)
                      and n.name == "sock_recv")
        assert ("sock_recv", IO_STRUCT.rsplit("/", 1)[-1]) in roles.IDLE_INNERMOST
        # It calls pyzmq's receive directly (Cython: no frame above sock_recv while it waits).
        calls = {ast.unparse(n.func) for n in ast.walk(helper) if isinstance(n, ast.Call)}
        assert calls & {"socket.recv", "socket.recv_pyobj"}, calls
