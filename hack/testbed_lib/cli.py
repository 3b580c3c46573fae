"""`hack/testbed up|down|restart|status|env|exec`: bring the local control plane up, report on it, restart parts of it, tear it down."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from . import components, netns, procs
from .health import api_get, probe
from .layout import HACK_DIR, POD_CIDR, Layout, layout_from_env
from .pki import ensure_pki, read_tokens

NODES_FILE = HACK_DIR / "kwok-nodes.yaml"
FAKE_NODES = ["gpu-node-0", "gpu-node-1"]
BINARIES = [*components.ORDER, "kubectl"]


class TestbedError(Exception):
    """A component did not come up; carries its name so the message can point at its log."""

    def __init__(self, component: str, message: str):
        super().__init__(f"{component}: {message}")
        self.component = component


def _wait(what: str, check, deadline: float, component: str, layout: Layout) -> None:
    """Poll check() -> (ok, detail) until ok, the component's process dies, or the deadline."""
    detail = ""
    while True:
        if component in components.names(layout) and procs.running_pid(layout, component) is None:
            raise TestbedError(component, f"process exited while waiting for {what}")
        ok, detail = check()
        if ok:
            return
        if time.monotonic() > deadline:
            raise TestbedError(component, f"timed out waiting for {what} ({detail})")
        time.sleep(0.2)


def _where(layout: Layout, name: str) -> str | None:
    """The network namespace a component runs in: the testbed's, or (the bridge) outside it."""
    if name == components.BRIDGE:
        return netns.outside(layout.netns)
    return layout.netns or None


def _ensure_running(layout: Layout, name: str) -> str:
    pid = procs.running_pid(layout, name)
    if pid is not None:
        # A component left by a testbed run with another VLM_TESTBED_NETNS listens where nobody looks.
        if layout.netns and name != components.BRIDGE and netns.pid_inode(pid) != netns.inode(layout.netns):
            raise TestbedError(
                name,
                f"pid {pid} runs outside network namespace {layout.netns} (started with another "
                "VLM_TESTBED_NETNS?); run `hack/testbed down --keep` first",
            )
        return "reused"
    procs.start(layout, name, components.build_argv(name, layout), ns=_where(layout, name))
    return "started"


def _wait_healthy(layout: Layout, name: str, deadline: float) -> None:
    p = components.build_probe(name, layout)
    _wait(f"{p.url}", lambda: probe(layout, p), deadline, name, layout)


def _node_state(layout: Layout) -> dict[str, str]:
    """Fake node name -> Ready condition status ('True', 'False', 'Unknown' or 'missing')."""
    code, body = api_get(layout, "/api/v1/nodes")
    state = dict.fromkeys(FAKE_NODES, "missing")
    for node in (body or {}).get("items", []) if code == 200 else []:
        name = node["metadata"]["name"]
        if name in state:
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            state[name] = conds.get("Ready", "Unknown")
    return state


def kubectl(layout: Layout, *args: str) -> subprocess.CompletedProcess[str]:
    with netns.entered(layout.netns or None):
        return subprocess.run(
            [str(layout.binary("kubectl")), f"--kubeconfig={layout.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )


def up(layout: Layout, timeout: float) -> float:
    """Start whatever is not running and wait for the whole testbed; returns seconds taken."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    missing = [b for b in BINARIES if not layout.binary(b).exists()]
    if missing or not layout.stages_dir.is_dir():
        raise TestbedError(
            "binaries",
            f"missing {missing or [str(layout.stages_dir)]} under "
            f"{layout.cache}; run hack/build-binaries.sh first",
        )
    layout.run_dir.mkdir(parents=True, exist_ok=True)
    if layout.netns:
        try:
            how = netns.ensure(layout.netns, POD_CIDR)
        except netns.NetnsError as e:
            raise TestbedError("netns", str(e)) from None
        _say(f"network namespace {layout.netns}: {how}, pod CIDR {POD_CIDR} local on lo")
    ensure_pki(layout)
    components.write_kubeconfigs(layout, read_tokens(layout))

    def took() -> str:
        return f"{time.monotonic() - t0:.1f}s"

    first = ["etcd", "kube-apiserver"] + ([components.BRIDGE] if layout.netns else [])
    for name in first:
        how = _ensure_running(layout, name)
        _wait_healthy(layout, name, deadline)
        _say(f"{name}: {how}, healthy at {took()}")
    # The apiserver's clients only need it ready, not each other: start them together.
    hows = {name: _ensure_running(layout, name) for name in components.API_CLIENTS}
    for name in components.API_CLIENTS:
        _wait_healthy(layout, name, deadline)
        _say(f"{name}: {hows[name]}, healthy at {took()}")

    if "missing" in _node_state(layout).values():
        res = kubectl(layout, "apply", "-f", str(NODES_FILE))
        if res.returncode != 0:
            raise TestbedError("nodes", f"kubectl apply -f {NODES_FILE} failed: {res.stderr.strip()}")

    def nodes_ready() -> tuple[bool, str]:
        state = _node_state(layout)
        return all(v == "True" for v in state.values()), f"Ready: {state}"

    # kwok marks the fake nodes Ready; kube-controller-manager creates the default ServiceAccount,
    # without which the ServiceAccount admission plugin rejects every pod in `default`.
    _wait("fake GPU nodes Ready", nodes_ready, deadline, "kwok", layout)
    _say(f"nodes {', '.join(FAKE_NODES)}: Ready at {took()}")
    sa = "/api/v1/namespaces/default/serviceaccounts/default"
    _wait(
        "ServiceAccount default/default",
        lambda: (api_get(layout, sa)[0] == 200, sa),
        deadline,
        "kube-controller-manager",
        layout,
    )
    _say(f"ServiceAccount default/default: present at {took()}")
    return time.monotonic() - t0


def down(layout: Layout, keep: bool) -> None:
    for name in reversed(components.names(layout)):
        if procs.stop(layout, name):
            _say(f"{name}: stopped")
    if layout.netns and netns.exists(layout.netns):
        # Processes the testbed did not start (stand-ins, a pytest session) keep an unnamed namespace
        # alive until they exit; name them rather than signal them.
        left = [p for p in netns.pids_inside(layout.netns) if p != os.getpid()]
        try:
            netns.delete(layout.netns)
        except netns.NetnsError as e:
            raise TestbedError("netns", str(e)) from None
        _say(f"network namespace {layout.netns}: removed"
             + (f" (pids {left} still in it; it goes when they exit)" if left else ""))
    if keep or not layout.run_dir.exists():
        return
    # Refuse to rm -rf a directory that does not look like a testbed (VLM_TESTBED_DIR typo).
    marks = {"pki", "pids", "logs", "etcd", "kubeconfig", "sessions"}
    if not marks & {p.name for p in layout.run_dir.iterdir()} and any(layout.run_dir.iterdir()):
        raise TestbedError("down", f"{layout.run_dir} does not look like a testbed dir; not removing it")
    shutil.rmtree(layout.run_dir)
    _say(f"removed {layout.run_dir}")


def restart(layout: Layout, names: list[str], timeout: float) -> float:
    """Stop the named components (SIGTERM, as a node's kubelet or systemd would), then `up`: they start
    again on the same state (etcd's data dir, the certificates) and everything is waited for. Returns
    seconds taken. For fault-injection tests: an API server or etcd restart under a running operator."""
    unknown = [n for n in names if n not in components.names(layout)]
    if unknown or not names:
        raise TestbedError("restart", f"name components to restart, of {', '.join(components.names(layout))}"
                           + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    t0 = time.monotonic()
    # Clients of the API server first, etcd last, as `down` does.
    for name in reversed(components.names(layout)):
        if name in names and procs.stop(layout, name):
            _say(f"{name}: stopped")
    up(layout, timeout)
    return time.monotonic() - t0


def status(layout: Layout) -> bool:
    healthy = True
    if layout.netns:
        ok = netns.exists(layout.netns)
        healthy &= ok
        print(f"{'netns':24} {'ok' if ok else 'DOWN':5} {layout.netns} (pod CIDR {POD_CIDR} local on lo)")
    for name in components.names(layout):
        pid = procs.running_pid(layout, name)
        ok, detail = probe(layout, components.build_probe(name, layout)) if pid else (False, "not running")
        healthy &= ok
        print(f"{name:24} {'ok' if ok else 'DOWN':5} pid={pid or '-':<8} {detail}")
    state = _node_state(layout) if healthy else dict.fromkeys(FAKE_NODES, "unknown")
    for node, ready in state.items():
        healthy &= ready == "True"
        print(f"{'node/' + node:24} {'ok' if ready == 'True' else 'DOWN':5} Ready={ready}")
    return healthy


def env_info(layout: Layout) -> dict[str, str]:
    return {
        "KUBECONFIG": str(layout.kubeconfig),
        "VLM_TESTBED_DIR": str(layout.run_dir),
        "VLM_TESTBED_BIN": str(layout.bin_dir),
        "VLM_TESTBED_API": layout.api_url,
        # The namespace everything runs in ("0": none); `hack/testbed exec -- CMD` runs CMD there.
        "VLM_TESTBED_NETNS": layout.netns or "0",
        "VLM_TESTBED_POD_CIDR": POD_CIDR if layout.netns else "",
    }


def exec_in(layout: Layout, argv: list[str]) -> int:
    """Replace this process with argv, inside the testbed's namespace (pod IPs, Prometheus, the API)."""
    if not argv:
        raise TestbedError("exec", "nothing to run: hack/testbed exec -- CMD [ARGS...]")
    if layout.netns:
        try:
            netns.enter(layout.netns)
        except netns.NetnsError as e:
            raise TestbedError("netns", str(e)) from None
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        raise TestbedError("exec", f"{argv[0]}: {e.strerror}") from None


@contextlib.contextmanager
def _locked(layout: Layout):
    """Serialise up/down on one run dir: two pytest sessions starting at once must not race."""
    # Beside the run dir, not in it: `down` deletes the run dir while holding the lock.
    lock = layout.run_dir.parent / f".{layout.run_dir.name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _say(msg: str) -> None:
    print(f"[testbed] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/testbed", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="start (or reuse) the control plane and wait until it is ready")
    p_up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    p_down = sub.add_parser("down", help="stop every component and remove the run dir")
    p_down.add_argument("--keep", action="store_true", help="keep state (etcd data, certs, logs)")
    p_restart = sub.add_parser("restart", help="stop the named components, then start them again (up)")
    p_restart.add_argument("components", nargs="+", help=f"of {', '.join([*components.ORDER, components.BRIDGE])}")
    p_restart.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    sub.add_parser("status", help="health of each component; exit 1 unless all are healthy")
    p_env = sub.add_parser("env", help="print `export KUBECONFIG=...` lines (or --json)")
    p_env.add_argument("--json", action="store_true")
    p_exec = sub.add_parser("exec", help="run a command inside the testbed's network namespace")
    p_exec.add_argument("argv", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `hack/testbed status | head` exits quietly
    layout = layout_from_env()

    try:
        if args.cmd == "up":
            with _locked(layout):
                took = up(layout, args.timeout)
            _say(f'ready in {took:.1f}s; run: eval "$(hack/testbed env)"')
        elif args.cmd == "down":
            with _locked(layout):
                down(layout, args.keep)
        elif args.cmd == "restart":
            with _locked(layout):
                took = restart(layout, args.components, args.timeout)
            _say(f"restarted {', '.join(args.components)}; ready in {took:.1f}s")
        elif args.cmd == "status":
            return 0 if status(layout) else 1
        elif args.cmd == "env":
            info = env_info(layout)
            print(
                json.dumps(info, indent=2)
                if args.json
                else "\n".join(f"export {k}={v}" for k, v in info.items())
            )
        elif args.cmd == "exec":
            return exec_in(layout, args.argv[1:] if args.argv[:1] == ["--"] else args.argv)
    except TestbedError as e:
        _say(f"FAILED {e}")
        if e.component in components.names(layout):
            log = procs.log_file(layout, e.component)
            print(f"--- last lines of {log} ---\n{procs.log_tail(layout, e.component)}", file=sys.stderr)
        return 1
    return 0
