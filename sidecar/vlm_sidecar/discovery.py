"""Finds SGLang scheduler processes by process title in /proc (shareProcessNamespace makes them visible).

SGLang sets titles like `sglang::scheduler`, `sglang::scheduler_TP1`, `sglang::scheduler_DP0_TP1`.
setproctitle writes the title over argv, so /proc/PID/cmdline holds it padded with spaces or NULs;
/proc/PID/comm is cut to 15 characters (`sglang::schedul`) and is only a fallback. The proc root is a
parameter so tests can point it at a fake tree.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from vlm_sidecar.model import Target

_TP_RE = re.compile(r"_TP(\d+)")
_COMM_LEN = 15


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


def discover(proc_root: str, pattern: str, root_pid: int | None = None, self_pid: int | None = None) -> list[Target]:
    """All scheduler processes, one per TP rank, sorted by rank. A rank seen twice keeps the newest."""
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
    parents = {i.pid: i.ppid for i in infos}
    by_rank: dict[int, Target] = {}
    for info in infos:
        if info.pid == self_pid or not title_matches(info, pattern):
            continue
        if root_pid is not None and not is_descendant(info.pid, root_pid, parents):
            continue
        title = info.cmdline.split(" ", 1)[0] or info.comm
        target = Target(pid=info.pid, title=title, tp_rank=tp_rank(title), start_ticks=info.start_ticks)
        old = by_rank.get(target.tp_rank)
        if old is None or target.start_ticks > old.start_ticks:
            by_rank[target.tp_rank] = target
    return [by_rank[r] for r in sorted(by_rank)]
