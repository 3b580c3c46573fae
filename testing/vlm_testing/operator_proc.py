"""Running the real operator as a subprocess against the testbed (integration and e2e tiers)."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client

from vlm_testing.testbed import layout, netns

POD_CIDR = layout.POD_CIDR

REPO = Path(__file__).resolve().parents[2]

CRD = REPO / "crds" / "serving.vlmops.dev_vlmservices.yaml"
GROUP, VERSION, PLURAL = "serving.vlmops.dev", "v1alpha1", "vlmservices"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pod_network_here() -> bool:
    """Whether this thread is where pod IPs are addresses (inside the testbed's network namespace)."""
    return netns.bindable(str(ipaddress.ip_network(POD_CIDR)[-2]))


def install_crd(kubectl) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    # Polled, not `kubectl wait --for=condition`: that fails at once ("<nil> is of the type <nil>") when it
    # reads the CRD before the API server has given it any condition, and so does a jsonpath filter over the
    # conditions (one run: "<nil> is not array or slice and cannot be filtered"). The whole object is read.
    deadline = time.time() + 60
    while not _established(json.loads(kubectl("get", "crd/vlmservices.serving.vlmops.dev", "-o", "json"))):
        if time.time() > deadline:
            raise AssertionError("CRD vlmservices.serving.vlmops.dev not Established within 60 s")
        time.sleep(0.5)


def _established(crd: dict) -> bool:
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


@dataclass
class OperatorProcess:
    kubeconfig: Path
    namespace: str
    log_path: Path
    env_extra: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    metrics_port: int = 0
    args: list[str] = field(default_factory=list)  # extra command-line flags, e.g. ["--peering", "NAME"]

    def start(self) -> OperatorProcess:
        self.metrics_port = int(self.env_extra.get("VLM_METRICS_PORT") or free_port())
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "VLM_METRICS_ADDR": "127.0.0.1",
            "VLM_RESYNC_SECONDS": "2",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("VLM_SIDECAR_ENDPOINTS", None)
        if not pod_network_here():
            # A testbed without its network namespace (VLM_TESTBED_NETNS=0): pod IPs are kwok's made-up
            # addresses on the host's network, never to be dialled; an empty override file scrapes none.
            endpoints = self.log_path.with_suffix(".endpoints.json")
            endpoints.write_text("{}")
            env["VLM_SIDECAR_ENDPOINTS"] = str(endpoints)
        # Inside the namespace the operator reads every sidecar at <pod IP>:9400, as in a cluster.
        env.update({**self.env_extra, "VLM_METRICS_PORT": str(self.metrics_port)})
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vlm_operator", "--namespace", self.namespace,
             "--liveness", f"http://127.0.0.1:{free_port()}/healthz", *self.args],
            # Not the checkout's root: `-m` puts the working directory first on sys.path, where the root's
            # vlm_operator link would shadow PYTHONPATH (a bench running another worktree's operator).
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.log_path.parent,
        )
        deadline = time.time() + 120  # the import alone took 56 s on a loaded 2-core machine
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.metrics()
                return self
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"operator did not serve /metrics in 120 s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def metric_sum(self, name: str) -> float:
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total


def run_operator(kubeconfig: Path, namespace: str, tmp: Path, **env: str) -> Iterator[OperatorProcess]:
    op = OperatorProcess(kubeconfig, namespace, tmp / f"operator-{namespace}.log", dict(env)).start()
    try:
        yield op
    finally:
        op.stop()


def vlms(kube: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube)


def get_vlms(kube, namespace: str, name: str) -> dict:
    return vlms(kube).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def condition(obj: dict, type_: str) -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def dump(obj) -> str:
    return json.dumps(obj, indent=1, default=str)[:3000]
