"""Pytest plugin with the fixtures for tests that run against the local control plane.

`cluster` reuses a healthy testbed (``hack/testbed status``) or starts one with ``hack/testbed up``;
a testbed that cannot start fails the test with the component's log tail, it never skips. A
testbed a pytest session started is stopped when the last session using it ends, unless
VLM_TESTBED_KEEP=1; start it by hand (``hack/testbed up``) to keep it between runs.

The testbed runs in its own network namespace (docs/testbed.md), where pod IPs are real addresses.
Once `cluster` is set up, pytest's main thread is in that namespace for the rest of the session, so
the test's clients (the kubernetes client, kubectl, the operator, Prometheus, the pod mapper's
stand-ins and sidecars: everything started from then on) take the same network path: the API server
at 127.0.0.1, pods at their pod IPs. Tests that do not use `cluster` run back in the namespace the
session started in (`_home_network` below), so a unit test never sees the testbed's network.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from vlm_testing import binaries
from vlm_testing.testbed import netns  # the testbed's own helpers, standard library only

REPO = Path(__file__).resolve().parents[2]
TESTBED = REPO / "hack" / "testbed"

UP_TIMEOUT_S = float(os.environ.get("VLM_TESTBED_UP_TIMEOUT", "240"))

T = TypeVar("T")


@dataclass(frozen=True)
class Cluster:
    """A running testbed: where its admin kubeconfig and binaries are."""

    kubeconfig: Path
    bin_dir: Path
    run_dir: Path
    api_url: str
    started_here: bool
    netns: str = ""  # the testbed's network namespace ("" without one: then no pod network)
    pod_cidr: str = ""

    @property
    def pod_network(self) -> bool:
        """Whether pod IPs are reachable addresses (the stand-ins and sidecars can listen on them)."""
        return bool(self.netns)

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 60) -> str:
        """Run the cached kubectl as admin; stdout, or AssertionError with stderr when check fails."""
        proc = subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.2,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll predicate until it returns something truthy and return that; AssertionError on timeout.

    Exceptions listed in `ignore` count as "not yet" (e.g. a 404 before an object exists).
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = predicate()
        except ignore as e:
            last = e
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}")
        time.sleep(interval)


def _testbed(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TESTBED), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def _live_sessions(run_dir: Path) -> list[int]:
    """Pids of pytest sessions registered as using this testbed that are still alive."""
    live = []
    for f in (run_dir / "sessions").glob("*"):
        if f.name.isdigit() and Path(f"/proc/{f.name}").exists():
            live.append(int(f.name))
        else:
            f.unlink(missing_ok=True)
    return live


def _register(session_file: Path) -> None:
    session_file.parent.mkdir(parents=True, exist_ok=True)
    session_file.touch()


class _Network:
    """Where pytest's main thread is: `inside` the testbed namespace it entered, `home` an fd of the one
    it came from (a namespace is per thread; threads and processes started later inherit it)."""

    inside = ""
    home: int | None = None

    @classmethod
    def enter(cls, name: str) -> None:
        if not name or cls.inside == name:
            return
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            netns.enter(name)
        except netns.NetnsError:
            os.close(home)
            raise
        cls.home, cls.inside = home, name

    @classmethod
    def leave(cls) -> None:
        if cls.home is not None:
            netns.setns_path(f"/proc/self/fd/{cls.home}")
            os.close(cls.home)
        cls.inside, cls.home = "", None


@contextlib.contextmanager
def home_network() -> Iterator[None]:
    """Run a block (and what it starts) in the namespace the session started in, outside the testbed's."""
    if not _Network.inside:
        yield
        return
    with netns.entered(f"/proc/self/fd/{_Network.home}"):
        yield


binaries.outside = home_network  # a build a test starts reaches the Go module proxy from the session's namespace


def pytest_collection_finish(session: pytest.Session) -> None:
    """Tests that need the control plane were collected: build its binaries behind the unit tier."""
    if binaries.wanted(any("cluster" in getattr(item, "fixturenames", ()) for item in session.items)):
        binaries.start_background()


def pytest_sessionfinish(session: pytest.Session) -> None:
    binaries.stop_background()


@pytest.fixture(autouse=True)
def _home_network(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test without `cluster` runs in the session's own namespace, even after a cluster test moved it."""
    if _Network.inside and "cluster" not in request.fixturenames:
        with home_network():
            yield
    else:
        yield


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The local control plane, reused when already healthy, else started (and later stopped).

    A testbed that a pytest session started is stopped by the last session using it (unless
    VLM_TESTBED_KEEP=1); one started by hand with `hack/testbed up` is left running.
    """
    built = binaries.ensure()
    if built.returncode != 0:
        pytest.fail("the control-plane binaries are missing and could not be built (hack/build-binaries.sh "
                    f"--stage cluster; integration tests need them and are not skipped):\n{built.stderr[-6000:]}",
                    pytrace=False)
    info = json.loads(_testbed("env", "--json").stdout)
    run_dir = Path(info["VLM_TESTBED_DIR"])
    # Register before looking: a session ending now then sees us and leaves the testbed up.
    me = run_dir / "sessions" / str(os.getpid())
    _register(me)
    started_here = False
    if _testbed("status").returncode != 0:
        try:
            res = _testbed("up", "--timeout", str(UP_TIMEOUT_S), timeout=UP_TIMEOUT_S + 30)
        except subprocess.TimeoutExpired as e:
            res = subprocess.CompletedProcess(e.cmd, 124, "", f"{e.stderr or ''}\nhack/testbed up hung")
        if res.returncode != 0:
            me.unlink(missing_ok=True)
            _testbed("down", "--keep")  # stop what did start; keep the logs for a look
            pytest.fail(
                "the local control plane did not start (integration tests need it and are not skipped; "
                f"build binaries with hack/build-binaries.sh):\n{res.stderr}",
                pytrace=False,
            )
        # A fresh etcd means a fresh testbed; restarting one crashed component of a testbed
        # somebody started by hand does not make it ours to stop.
        started_here = "etcd: started" in res.stderr
        _register(me)  # a `down` racing with us may have removed the run dir
        if started_here:
            (run_dir / "started-by-pytest").touch()
    ns = "" if info.get("VLM_TESTBED_NETNS", "0") == "0" else info["VLM_TESTBED_NETNS"]
    try:
        _Network.enter(ns)
    except netns.NetnsError as e:
        me.unlink(missing_ok=True)
        pytest.fail(f"cannot enter the testbed's network namespace {ns}: {e}", pytrace=False)
    yield Cluster(
        kubeconfig=Path(info["KUBECONFIG"]),
        bin_dir=Path(info["VLM_TESTBED_BIN"]),
        run_dir=run_dir,
        api_url=info["VLM_TESTBED_API"],
        started_here=started_here,
        netns=ns,
        pod_cidr=info.get("VLM_TESTBED_POD_CIDR", ""),
    )
    _Network.leave()  # before `down`, which removes the namespace
    me.unlink(missing_ok=True)
    last_out = not _live_sessions(run_dir)
    if last_out and (run_dir / "started-by-pytest").exists() and os.environ.get("VLM_TESTBED_KEEP") != "1":
        _testbed("down")


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Iterator[client.ApiClient]:
    """kubernetes ApiClient authenticated as the testbed admin (system:masters)."""
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield api
    api.close()


@pytest.fixture
def kubectl(cluster: Cluster) -> Callable[..., str]:
    return cluster.kubectl


def _namespace_prefix(test_name: str) -> str:
    """A DNS-label prefix from the test name; the API server appends 5 random characters."""
    slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower().removeprefix("test_")).strip("-")
    return f"t-{slug[:40].rstrip('-')}-"


@pytest.fixture
def namespace(kube: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace, ready for pods (its default ServiceAccount exists); deleted afterwards."""
    core = client.CoreV1Api(kube)
    ns = core.create_namespace(
        {
            "metadata": {
                "generateName": _namespace_prefix(request.node.name),
                "labels": {"vlm-testbed/test": "true"},
            }
        }
    )
    name = ns.metadata.name
    # The ServiceAccount admission plugin rejects pods until kube-controller-manager made it.
    wait_for(
        lambda: core.read_namespaced_service_account("default", name),
        30,
        f"ServiceAccount {name}/default",
        ignore=(ApiException,),
    )
    yield name
    try:
        core.delete_namespace(name, propagation_policy="Background")
    except ApiException as e:
        if e.status != 404:
            raise


KWOK_NODES = REPO / "hack" / "kwok-nodes.yaml"


def fake_gpu_node(name: str, product: str, zone: str | None = None) -> dict[str, Any]:
    """A kwok node shaped as the testbed's gpu-node-0 (hack/kwok-nodes.yaml: 8 GPUs), named `name`, of its own
    GPU product. A VLMService with `gpu.product: <product>` runs only there, and the operator's capacity reads
    (nodes by product label) see only these nodes: a test that fills its nodes can run beside other tests.

    Tainted `nvidia.com/gpu=present:NoSchedule`, as cloud GPU node pools are (the operator's pods tolerate it):
    a pod without that toleration (another test's Alertmanager or operator pod, a weights Job's pod) is never
    scheduled here, so it is not deleted with the node when the test that made it ends. Untainted, the monitoring
    proof's Alertmanager pod landed on the node pairs' node beside it, went with it, and its last alert had no
    Alertmanager to reach (2026-12-08). The testbed's own gpu-node-0/1 stay untainted: they hold those pods."""
    node = copy.deepcopy(next(d for d in yaml.safe_load_all(KWOK_NODES.read_text()) if d and d["kind"] == "Node"))
    labels = node["metadata"]["labels"]
    node["metadata"]["name"] = labels["kubernetes.io/hostname"] = name
    labels["nvidia.com/gpu.product"] = product
    node["spec"] = {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}
    if zone:
        labels["topology.kubernetes.io/zone"] = zone
    # kwok reports the node's info itself; the client's model of a Node asks for every nodeInfo field.
    node["status"].pop("nodeInfo", None)
    return node


@contextlib.contextmanager
def gpu_nodes(kube: client.ApiClient, names: list[str], product: str) -> Iterator[list[str]]:
    """Fake GPU nodes of a product of their own (`fake_gpu_node`), Ready; deleted afterwards."""
    core = client.CoreV1Api(kube)
    for name in names:
        try:
            core.create_node(fake_gpu_node(name, product))
        except ApiException as e:
            if e.status != 409:
                raise
    try:
        wait_for(lambda: all(any(c.type == "Ready" and c.status == "True"
                                 for c in (core.read_node(n).status.conditions or [])) for n in names),
                 60, f"the nodes {names} Ready", interval=0.5)
        yield names
    finally:
        for name in names:
            with contextlib.suppress(ApiException):
                core.delete_node(name)
