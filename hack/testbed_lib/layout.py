"""Where the testbed keeps its state and which ports it listens on, derived from the environment.

Everything the other modules need to know about paths and ports lives in one frozen ``Layout`` so
that argument builders stay pure functions of it.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

HACK_DIR = Path(__file__).resolve().parent.parent

# Suffixes echo the upstream defaults (2379 etcd, 6443 apiserver, 10257/10259 kcm/scheduler)
# under a base far from them, so a real cluster or kind on this machine does not collide.
DEFAULT_PORT_BASE = 46000
PORT_SUFFIXES = {
    "etcd": 379,
    "etcd-peer": 380,
    "kube-apiserver": 443,
    "kwok": 247,
    "kube-controller-manager": 257,
    "kube-scheduler": 259,
}

SERVICE_CIDR = "10.96.0.0/16"  # room for a Service per VLMService of the 1000-service bench
SERVICE_IP = "10.96.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
# kwok's --cidr: with no spec.podCIDR on the nodes, kwok hands every pod the next free address of this
# one pool (from 10.244.0.1; a deleted pod's address goes back to the pool). Inside the testbed's network
# namespace the whole range is routed to lo as local, so every pod IP is bindable there.
POD_CIDR = "10.244.0.0/16"
NETNS_OFF = {"0", "off", "false", "no"}


@dataclass(frozen=True)
class Layout:
    """Paths and ports of one testbed instance."""

    cache: Path
    run_dir: Path
    port_base: int
    # The network namespace everything runs in ("" = none: the caller's namespace, no pod network).
    netns: str = ""
    # Extra flags per component, appended last so they override ours (pflag: last one wins).
    extra_args: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def bin_dir(self) -> Path:
        return self.cache / "bin"

    @property
    def stages_dir(self) -> Path:
        return self.cache / "kwok-stages"

    @property
    def pki(self) -> Path:
        return self.run_dir / "pki"

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    @property
    def pids(self) -> Path:
        return self.run_dir / "pids"

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (system:masters) for people and tests."""
        return self.run_dir / "kubeconfig"

    def component_kubeconfig(self, component: str) -> Path:
        return self.run_dir / "kubeconfigs" / f"{component}.kubeconfig"

    def port(self, name: str) -> int:
        return self.port_base + PORT_SUFFIXES[name]

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    @property
    def api_url(self) -> str:
        return f"https://127.0.0.1:{self.port('kube-apiserver')}"


def default_netns(run_dir: Path) -> str:
    """One namespace per run dir, so two testbeds never share one: vlmtb-<10 hex of the run dir's hash>."""
    return "vlmtb-" + hashlib.sha1(str(run_dir).encode()).hexdigest()[:10]


def layout_from_env(env: dict[str, str] | None = None) -> Layout:
    """Build the layout from VLM_CACHE, VLM_TESTBED_DIR, VLM_TESTBED_PORT_BASE, VLM_TESTBED_NETNS (unset
    or 1: a namespace named after the run dir; 0/off: none; anything else: that name) and
    VLM_TESTBED_ARGS_<COMPONENT> (e.g. VLM_TESTBED_ARGS_KUBE_APISERVER="--feature-gates=X=true")."""
    env = dict(os.environ) if env is None else env
    cache = Path(env.get("VLM_CACHE") or Path.home() / ".cache" / "vlm-operator")
    run_dir = Path(env.get("VLM_TESTBED_DIR") or cache / "testbed")
    base = int(env.get("VLM_TESTBED_PORT_BASE") or DEFAULT_PORT_BASE)
    extra = {}
    for name in PORT_SUFFIXES:
        value = env.get("VLM_TESTBED_ARGS_" + name.upper().replace("-", "_"))
        if value:
            extra[name] = tuple(shlex.split(value))
    run_dir = run_dir.resolve()
    ns = (env.get("VLM_TESTBED_NETNS") or "1").strip()
    if ns.lower() in NETNS_OFF:
        ns = ""
    elif ns.lower() in {"1", "on", "true", "yes"}:
        ns = default_netns(run_dir)
    return Layout(cache=cache.resolve(), run_dir=run_dir, port_base=base, netns=ns, extra_args=extra)
