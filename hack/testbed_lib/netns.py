"""The testbed's network namespace: a pod network on loopback, with nothing reaching outside it.

`hack/testbed up` creates a named namespace (`ip netns add`, so it lives in /run/netns/NAME), brings
its `lo` up and routes the kwok pod CIDR to it as local (`ip route add local CIDR dev lo`): every pod
IP kwok hands out is then an address of that namespace, bindable and reachable there, with no
interface, veth or kernel module. Every component runs inside it; only the API-server bridge
(`bridge.py`) listens outside, so kubectl in the caller's namespace still works.

A network namespace is per thread: `setns` moves the calling thread only, threads and processes it
starts afterwards inherit it, and a socket stays in the namespace it was created in. `entered()`
moves the calling thread in and back; `enter()` moves it for good (pytest's main thread, the demo's
agent). Standard library only (ctypes for setns: os.setns is Python 3.12+).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import ipaddress
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
INIT_NETNS = "/proc/1/ns/net"

_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(Exception):
    """The namespace cannot be made or entered (not root, no `ip`, ...)."""


def path(name: str) -> Path:
    return NETNS_DIR / name


def exists(name: str) -> bool:
    return path(name).exists()


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise NetnsError(f"setns: {os.strerror(e)}" + (" (needs root: CAP_SYS_ADMIN)" if e == errno.EPERM else ""))


def setns_path(ns_path: str | Path) -> None:
    """Move the calling thread into the network namespace at ns_path (for good)."""
    try:
        fd = os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise NetnsError(f"cannot open {ns_path}: {e.strerror}") from e
    try:
        _setns(fd)
    finally:
        os.close(fd)


def enter(name: str) -> None:
    """Move the calling thread into the testbed namespace `name` (for good)."""
    if not exists(name):
        raise NetnsError(f"network namespace {name} does not exist (is the testbed up?)")
    setns_path(path(name))


def current_inode() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


def inode(name: str) -> int | None:
    try:
        return os.stat(path(name)).st_ino
    except OSError:
        return None


def inside(name: str) -> bool:
    """Whether the calling thread is in namespace `name` now."""
    ino = inode(name)
    return ino is not None and ino == current_inode()


def outside(name: str) -> str | None:
    """Where "outside the testbed" is for the caller: its own namespace (None), or init's when the caller
    already is inside the testbed's (e.g. `hack/testbed` run under `hack/testbed exec`)."""
    return INIT_NETNS if name and inside(name) else None


@contextlib.contextmanager
def entered(ns: str | Path | None) -> Iterator[None]:
    """Run the block's network calls (and the processes it starts) in a namespace, then come back.

    `ns`: a testbed namespace name, a namespace path (e.g. /proc/1/ns/net), or None (stay put).
    """
    if ns is None:
        yield
        return
    target = path(ns) if isinstance(ns, str) and "/" not in ns else Path(ns)
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns_path(target)
        try:
            yield
        finally:
            _setns(back)
    finally:
        os.close(back)


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("ip") or "/usr/sbin/ip"
    try:
        return subprocess.run([binary, *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError as e:
        raise NetnsError("`ip` (iproute2) not found: apt-get install iproute2") from e


def ensure(name: str, pod_cidr: str) -> str:
    """Create the namespace if missing, bring lo up, route pod_cidr locally; idempotent. Returns what it did."""
    how = "reused"
    if not exists(name):
        if os.geteuid() != 0:
            raise NetnsError(
                f"creating network namespace {name} needs root; run as root or set VLM_TESTBED_NETNS=0 "
                "(no pod network: the e2e tier and the demo need it)"
            )
        res = _ip("netns", "add", name)
        if res.returncode != 0 and not exists(name):
            raise NetnsError(f"ip netns add {name}: {res.stderr.strip()}")
        how = "created"
    for args in (("link", "set", "lo", "up"), ("route", "replace", "local", pod_cidr, "dev", "lo")):
        res = _ip("-n", name, *args)
        if res.returncode != 0:
            raise NetnsError(f"ip -n {name} {' '.join(args)}: {res.stderr.strip()}")
    return how


def delete(name: str) -> bool:
    """Remove the namespace's name; processes still inside keep it alive until they exit."""
    if not exists(name):
        return False
    res = _ip("netns", "del", name)
    if res.returncode != 0 and exists(name):
        raise NetnsError(f"ip netns del {name}: {res.stderr.strip()}")
    return True


def pids_inside(name: str) -> list[int]:
    """Processes whose network namespace is `name` (to report leftovers; never signalled here)."""
    ino = inode(name)
    if ino is None:
        return []
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.stat(d / "ns" / "net").st_ino == ino:
                    out.append(int(d.name))
            except OSError:
                continue
    return sorted(out)


def pid_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def bindable(ip: str) -> bool:
    """Whether `ip` is an address of the calling thread's namespace (a pod IP is, inside the testbed's)."""
    family = socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, 0))
        except OSError:
            return False
    return True
