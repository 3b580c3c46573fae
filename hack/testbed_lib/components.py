"""Command lines of the control-plane components, as pure functions of the layout.

Order matters: etcd, then the apiserver, then the clients of the apiserver (controller-manager,
scheduler, kwok), which may start together once the apiserver answers /readyz.
"""

from __future__ import annotations

import base64
import sys
from dataclasses import dataclass
from pathlib import Path

from .layout import POD_CIDR, SERVICE_CIDR, Layout

ORDER = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
API_CLIENTS = ORDER[2:]
# With a network namespace: relays the API server's port from the caller's namespace into it.
BRIDGE = "apiserver-bridge"
BRIDGE_SCRIPT = Path(__file__).resolve().parent / "bridge.py"


def names(layout: Layout) -> list[str]:
    """Every process the testbed runs, in start order."""
    return [*ORDER, BRIDGE] if layout.netns else list(ORDER)

KWOK_STAGES = ["node-initialize", "node-heartbeat-with-lease", "pod-ready", "pod-complete", "pod-delete"]
# The project's own stages (hack/kwok-stages), loaded instead of kwok's of the same name or next to them:
# pod-ready leaves pods with a container fault to pod-container-fault, pod-complete leaves the operator's Job pods
# to the local runner (docs/testbed.md).
OWN_STAGES_DIR = Path(__file__).resolve().parents[1] / "kwok-stages"
OWN_STAGES = ["pod-ready", "pod-complete", "pod-container-fault"]
FAKE_NODE_SELECTOR = "kwok.x-k8s.io/node=fake"


@dataclass(frozen=True)
class Probe:
    """How to tell a component is healthy: a URL and whether it needs the admin token."""

    url: str
    expect: str  # a substring of a healthy body
    auth: bool = False
    inside: bool = True  # probed in the testbed's namespace; False: from outside (the bridge)


def build_argv(name: str, layout: Layout) -> list[str]:
    """The full command line of one component."""
    if name == BRIDGE:
        api = f"127.0.0.1:{layout.port('kube-apiserver')}"
        return [sys.executable, str(BRIDGE_SCRIPT), f"--run-dir={layout.run_dir}", f"--netns={layout.netns}",
                f"{api}={api}"]
    return [str(layout.binary(name)), *_ARGS[name](layout), *layout.extra_args.get(name, ())]


def build_probe(name: str, layout: Layout) -> Probe:
    if name == BRIDGE:
        return Probe(f"{layout.api_url}/readyz", "ok", auth=True, inside=False)
    port = layout.port(name)
    if name == "etcd":
        return Probe(f"http://127.0.0.1:{port}/health", '"health":"true"')
    if name == "kube-apiserver":
        return Probe(f"{layout.api_url}/readyz", "ok", auth=True)
    if name == "kwok":
        return Probe(f"http://127.0.0.1:{port}/healthz", "ok")
    return Probe(f"https://127.0.0.1:{port}/healthz", "ok")


def _etcd(lo: Layout) -> list[str]:
    client = f"http://127.0.0.1:{lo.port('etcd')}"
    peer = f"http://127.0.0.1:{lo.port('etcd-peer')}"
    return [
        "--name=testbed",
        f"--data-dir={lo.run_dir / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=testbed={peer}",
        # Throwaway test state: fsync per write costs seconds of start time on a shared disk.
        "--unsafe-no-fsync",
        "--quota-backend-bytes=2147483648",
        "--log-level=warn",
    ]


def _apiserver(lo: Layout) -> list[str]:
    pki = lo.pki
    return [
        f"--etcd-servers=http://127.0.0.1:{lo.port('etcd')}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={lo.port('kube-apiserver')}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={pki / 'tokens.csv'}",
        "--authorization-mode=Node,RBAC",
        # The aggregation layer (KEDA's external metrics API): the apiserver proxies to an APIService's endpoint
        # with the front-proxy-client certificate, and the extension server trusts the X-Remote-* headers of
        # that CN only (the requestheader CA is the cluster CA; no other certificate has that CN). Without a
        # front-proxy CA the delegated authenticators of kube-controller-manager and kube-scheduler would also
        # log an error every few seconds. The proxy dials the endpoint's IP (no kube-proxy here).
        f"--requestheader-client-ca-file={pki / 'ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        "--enable-aggregator-routing=true",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        # Defaults stay on; NodeRestriction is what a production cluster adds on top.
        "--enable-admission-plugins=NodeRestriction",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        # The `kubernetes` Endpoints would point at 127.0.0.1, which Endpoints validation
        # rejects; nothing in the testbed dials the in-cluster service, so do not publish it.
        "--endpoint-reconciler-type=none",
        "--profiling=false",
    ]


def _delegated(lo: Layout, name: str) -> list[str]:
    kc = lo.component_kubeconfig(name)
    return [
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={lo.port(name)}",
        f"--cert-dir={lo.run_dir / name}",
        "--leader-elect=false",
    ]


def _controller_manager(lo: Layout) -> list[str]:
    pki = lo.pki
    return [
        *_delegated(lo, "kube-controller-manager"),
        "--controllers=*",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allocate-node-cidrs=false",
    ]


def _scheduler(lo: Layout) -> list[str]:
    return _delegated(lo, "kube-scheduler")


def _kwok(lo: Layout) -> list[str]:
    return [
        f"--kubeconfig={lo.component_kubeconfig('kwok')}",
        f"--manage-nodes-with-annotation-selector={FAKE_NODE_SELECTOR}",
        "--manage-all-nodes=false",
        f"--cidr={POD_CIDR}",
        "--node-ip=127.0.0.1",
        "--node-lease-duration-seconds=40",
        f"--server-address=127.0.0.1:{lo.port('kwok')}",
        *(f"--config={lo.stages_dir / s}.yaml" for s in KWOK_STAGES if s not in OWN_STAGES),
        *(f"--config={OWN_STAGES_DIR / s}.yaml" for s in OWN_STAGES),
    ]


_ARGS = {
    "etcd": _etcd,
    "kube-apiserver": _apiserver,
    "kube-controller-manager": _controller_manager,
    "kube-scheduler": _scheduler,
    "kwok": _kwok,
}


def build_kubeconfig(server: str, ca_pem: bytes, user: str, token: str) -> str:
    """A one-context kubeconfig with the CA embedded, so the file can be copied anywhere."""
    ca = base64.b64encode(ca_pem).decode()
    return f"""\
apiVersion: v1
kind: Config
clusters:
- name: vlm-testbed
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: vlm-testbed
  context:
    cluster: vlm-testbed
    user: {user}
    namespace: default
current-context: vlm-testbed
"""


def write_kubeconfigs(layout: Layout, tokens: dict[str, str]) -> None:
    """Admin kubeconfig plus one per API client, each with its own identity."""
    ca_pem = (layout.pki / "ca.crt").read_bytes()
    _write_private(layout.kubeconfig, build_kubeconfig(layout.api_url, ca_pem, "admin", tokens["admin"]))
    for name in API_CLIENTS:
        path = layout.component_kubeconfig(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_private(path, build_kubeconfig(layout.api_url, ca_pem, name, tokens[name]))


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.write_text(text)
