"""Finds SGLang's processes in /proc (shareProcessNamespace makes them visible), each with its role.

SGLang sets titles like `sglang::scheduler`, `sglang::scheduler_TP1`, `sglang::scheduler_DP0_TP1`.
setproctitle writes the title over argv, so /proc/PID/cmdline holds it padded with spaces or NULs;
/proc/PID/comm is cut to 15 characters (`sglang::schedul`) and is only a fallback. The proc root is a
parameter so tests can point it at a fake tree.

The other roles (`discover_roles`; the titles are checked against every supported wheel in
tests/compat/test_sglang_frontend.py):
- `detokenizer`: titled `sglang::detokenizer` (not `sglang::detokenizer_router`, the multi-tokenizer router);
- `tokenizer_worker`: titled `sglang::tokenizer_worker:<its own pid>` (`--tokenizer-worker-num` > 1);
- `tokenizer_manager`: the main server process (HTTP server and TokenizerManager on one asyncio loop). It sets
  no title: its command line is the launcher's (`python3 -m sglang.launch_server ...`, `sglang serve ...`).
  It is found as the nearest untitled ancestor of the schedulers, detokenizer and tokenizer workers (SGLang
  spawns them; with data parallelism the schedulers sit under `sglang::data_parallel_controller`), else by
  that command line;
- `mm_processor`: the multimodal processor's ProcessPoolExecutor workers
  (`multimodal/processors/base_processor.py`), children of a tokenizer_manager or tokenizer_worker. They
  are forked (spawned with `cuda_vmm` from 0.5.20), set no title and so carry their parent's command line
  (a forked tokenizer worker's child shows the worker's title with the worker's pid), or a multiprocessing
  spawn child's (`--multiprocessing-fork`). The multiprocessing resource tracker is neither.
A forked child of a titled process carries the same command line as its parent: it is not that process.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from vlm_sidecar.model import FRONTEND_ROLES, Target

_TP_RE = re.compile(r"_TP(\d+)")
_COMM_LEN = 15
DETOKENIZER_TITLE = "sglang::detokenizer"
TOKENIZER_WORKER_TITLE = "sglang::tokenizer_worker"  # + ":<pid>"
TITLE_PREFIX = "sglang::"
# The launcher's command line (the main server process sets no title): `python3 -m sglang.launch_server`
# (what the operator runs), `sglang serve` (the console script from 0.5.10).
_LAUNCHER_RE = re.compile(r"(?:^|[\s/])(?:sglang\.launch_server(?:\s|$)|sglang\s+serve(?:\s|$))")
_SPAWN_CHILD = "--multiprocessing-fork"


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    cmdline: str
    comm: str
    start_ticks: int


def read_proc(proc_root: str, pid: int) -> ProcInfo | None:
    """One process's title data, or None if it vanished or cannot be read."""
    base = os.path.join(proc_root, str(pid))
    try:
        with open(os.path.join(base, "cmdline"), "rb") as f:
            raw = f.read()
        with open(os.path.join(base, "comm"), "rb") as f:
            comm = f.read().decode("utf-8", "replace").strip()
        with open(os.path.join(base, "stat"), "rb") as f:
            stat = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    # stat: "pid (comm) state ppid ... starttime(22nd)"; comm may hold spaces and parens.
    rest = stat.rsplit(")", 1)[-1].split()
    try:
        ppid, start = int(rest[1]), int(rest[19])
    except (IndexError, ValueError):
        return None
    cmdline = raw.replace(b"\x00", b" ").decode("utf-8", "replace").strip()
    return ProcInfo(pid, ppid, cmdline, comm, start)


def title_matches(info: ProcInfo, pattern: str) -> bool:
    """`sglang::scheduler` matches the title itself and `_TP<n>`-style suffixes, not other programs."""
    title = info.cmdline.split(" ", 1)[0] if info.cmdline else ""
    if title == pattern or (title.startswith(pattern) and title[len(pattern)] == "_"):
        return True
    # Without a readable cmdline (zombie, permissions) the truncated comm is all there is.
    return not info.cmdline and info.comm == pattern[:_COMM_LEN]


def tp_rank(title: str) -> int:
    m = _TP_RE.search(title)
    return int(m[1]) if m else 0


def is_descendant(pid: int, root: int, parents: dict[int, int]) -> bool:
    seen = set()
    while pid not in seen and pid > 1:
        if pid == root:
            return True
        seen.add(pid)
        pid = parents.get(pid, 0)
    return pid == root


def title_of(info: ProcInfo) -> str:
    return info.cmdline.split(" ", 1)[0] if info.cmdline else ""


def _scan(proc_root: str) -> list[ProcInfo]:
    infos: list[ProcInfo] = []
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        info = read_proc(proc_root, int(name))
        if info is not None:
            infos.append(info)
    return infos


def _forked_copy(info: ProcInfo, by_pid: dict[int, ProcInfo]) -> bool:
    """A child that carries its parent's command line unchanged: forked, not titled by itself."""
    parent = by_pid.get(info.ppid)
    return bool(info.cmdline) and parent is not None and parent.cmdline == info.cmdline


def discover(proc_root: str, pattern: str, root_pid: int | None = None, self_pid: int | None = None) -> list[Target]:
    """All scheduler processes, one per TP rank, sorted by rank. A rank seen twice keeps the newest."""
    return _schedulers(_scan(proc_root), pattern, root_pid, self_pid)


def _schedulers(infos: list[ProcInfo], pattern: str, root_pid: int | None, self_pid: int | None) -> list[Target]:
    parents = {i.pid: i.ppid for i in infos}
    by_pid = {i.pid: i for i in infos}
    by_rank: dict[int, Target] = {}
    for info in infos:
        if info.pid == self_pid or not title_matches(info, pattern) or _forked_copy(info, by_pid):
            continue
        if root_pid is not None and not is_descendant(info.pid, root_pid, parents):
            continue
        title = info.cmdline.split(" ", 1)[0] or info.comm
        target = Target(pid=info.pid, title=title, tp_rank=tp_rank(title), start_ticks=info.start_ticks)
        old = by_rank.get(target.tp_rank)
        if old is None or target.start_ticks > old.start_ticks:
            by_rank[target.tp_rank] = target
    return [by_rank[r] for r in sorted(by_rank)]


def discover_roles(proc_root: str, pattern: str, root_pid: int | None = None, self_pid: int | None = None,
                   roles: tuple[str, ...] = FRONTEND_ROLES) -> list[Target]:
    """Schedulers (as `discover`) and the processes of the other `roles`, schedulers first, then by role and pid."""
    infos = _scan(proc_root)
    schedulers = _schedulers(infos, pattern, root_pid, self_pid)
    parents = {i.pid: i.ppid for i in infos}
    by_pid = {i.pid: i for i in infos}

    def scoped(i: ProcInfo) -> bool:
        return i.pid != self_pid and (root_pid is None or is_descendant(i.pid, root_pid, parents))

    def own_title(i: ProcInfo) -> str:
        return "" if _forked_copy(i, by_pid) else title_of(i)

    detok = [i for i in infos if scoped(i) and own_title(i) == DETOKENIZER_TITLE]
    workers = [i for i in infos if scoped(i) and own_title(i) == f"{TOKENIZER_WORKER_TITLE}:{i.pid}"]
    # The main server: nearest untitled ancestor of what SGLang spawned; else the launcher's command line.
    servers: dict[int, ProcInfo] = {}
    for anchor in [*(by_pid[t.pid] for t in schedulers if t.pid in by_pid), *detok, *workers]:
        seen: set[int] = set()
        parent = by_pid.get(anchor.ppid)
        while parent is not None and parent.pid not in seen and title_of(parent).startswith(TITLE_PREFIX):
            seen.add(parent.pid)
            parent = by_pid.get(parent.ppid)
        if parent is not None and scoped(parent) and parent.cmdline:
            servers[parent.pid] = parent
    if not servers:
        servers = {i.pid: i for i in infos if scoped(i) and _LAUNCHER_RE.search(i.cmdline)
                   and not _forked_copy(i, by_pid)}
    front = {**servers, **{w.pid: w for w in workers}}
    pool = [i for i in infos if scoped(i) and i.ppid in front and i.pid not in front
            and (_forked_copy(i, by_pid)
                 or (_SPAWN_CHILD in i.cmdline and not title_of(i).startswith(TITLE_PREFIX)))]
    found = {"tokenizer_manager": list(servers.values()), "tokenizer_worker": workers, "mm_processor": pool,
             "detokenizer": detok}
    out = list(schedulers)
    for role in FRONTEND_ROLES:
        if role in roles:
            out += [Target(pid=i.pid, title=title_of(i) or i.comm, tp_rank=0, start_ticks=i.start_ticks, role=role)
                    for i in sorted(found[role], key=lambda i: i.pid)]
    return out
