"""A real KEDA (v2.21.0: its operator and its external metrics API server, built from the Go module proxy by
hack/build-keda.sh) on the testbed, as plain processes inside the testbed's network namespace, the way a chart
would run them in a cluster:

- its CRDs (hack/fetch-crds.sh), a namespace, and an mTLS certificate set of its own (a CA, one certificate with
  serverAuth and clientAuth: the operator's gRPC metrics service and the metrics server's HTTPS, as KEDA's cert
  rotation would make them; made with openssl, like the testbed's);
- the metrics server listening on a pod-network address (a Service without selector and its Endpoints point
  there: Endpoints may not hold loopback), registered as the APIService v1beta1.external.metrics.k8s.io once it
  serves, so the API server's aggregation layer proxies to it (the testbed's front-proxy client certificate,
  --enable-aggregator-routing) and kube-controller-manager's HPA loop reads KEDA's metrics through it;
- RBAC for the HPA controller's service account to read external metrics.

Stopping deletes the APIService first (an unavailable aggregated API breaks API discovery for everyone), then the
processes and the CRDs. The tests that run it are serial (tests/conftest.py SERIAL)."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from vlm_testing import binaries, fetched
from vlm_testing.cluster import Cluster, wait_for
from vlm_testing.integration import _established
from vlm_testing.testbed import layout

NAMESPACE = "keda"
APISERVICE = "v1beta1.external.metrics.k8s.io"
SERVICE = "keda-metrics-apiserver"
# A pod-network address nothing else takes (kwok hands out pod IPs from the start of the range; the testbed's own
# probe uses the last but one): local inside the testbed's namespace, valid in Endpoints.
ADAPTER_IP = str(ipaddress.ip_network(layout.POD_CIDR)[-3])

_EXT = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = DNS:localhost, DNS:{svc}.{ns}.svc, IP:127.0.0.1, IP:{ip}
"""


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(d: Path) -> None:
    """ca.crt, tls.crt, tls.key in `d`: what KEDA's operator and metrics server read from --cert-dir."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl(d, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=vlm-test-keda-ca", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")
    (d / "tls.ext").write_text(_EXT.format(svc=SERVICE, ns=NAMESPACE, ip=ADAPTER_IP))
    _openssl(d, "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr",
             "-subj", f"/CN={SERVICE}")
    _openssl(d, "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
             "-extfile", "tls.ext", "-out", "tls.crt")


def built(bin_dir: Path) -> tuple[Path, Path]:
    """KEDA's two binaries, waiting for the background build's keda stage (or building it); a test fails, naming
    the build's error, when they cannot be built."""
    binaries.require("keda", "KEDA's operator and metrics server")
    op, adapter = bin_dir / "keda-operator", bin_dir / "keda-adapter"
    missing = [p.name for p in (op, adapter) if not os.access(p, os.X_OK)]
    assert not missing, f"{', '.join(missing)} missing from {bin_dir} after hack/build-binaries.sh --stage keda"
    return op, adapter


@dataclass
class Keda:
    cluster: Cluster
    workdir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    grpc_port: int = 0
    adapter_port: int = 0

    def log(self, name: str, n: int = 40) -> str:
        try:
            return "\n".join((self.workdir / f"{name}.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def logs(self) -> str:
        return "\n".join(f"--- {n}:\n{self.log(n)}" for n in ("keda-operator", "keda-adapter"))

    def _start(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        out = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                            cwd=self.workdir, start_new_session=True)

    def start(self) -> Keda:
        try:
            return self._start_all()
        except BaseException:
            self.stop()  # what did start goes (a process left running would hold its ports and watch on)
            raise

    def _start_all(self) -> Keda:
        op, adapter = built(self.cluster.bin_dir)
        k = self.cluster.kubectl
        import yaml

        for f in fetched.crds(fetched.KEDA):
            k("apply", "--server-side", "--force-conflicts", "-f", str(f), timeout=120)
        for f in fetched.crds(fetched.KEDA):  # KEDA's operator watches every one of its kinds from the start
            crd = yaml.safe_load(f.read_text())["metadata"]["name"]
            wait_for(lambda crd=crd: _established(json.loads(k("get", f"crd/{crd}", "-o", "json"))), 120,
                     f"CRD {crd} Established")
        k("create", "namespace", NAMESPACE, check=False)
        certs = self.workdir / "certs"
        make_certs(certs)
        kc = str(self.cluster.kubeconfig)
        env = {"KUBECONFIG": kc, "WATCH_NAMESPACE": "", "POD_NAMESPACE": NAMESPACE,
               "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE}
        self.grpc_port = _free_port()
        self._start("keda-operator", [
            str(op), f"--cert-dir={certs}", "--enable-cert-rotation=false", "--enable-webhook-patching=false",
            "--enable-apiservice-patching=false", f"--metrics-service-bind-address=127.0.0.1:{self.grpc_port}",
            f"--metrics-bind-address=127.0.0.1:{_free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{_free_port()}", "--zap-log-level=info"], env)
        self.adapter_port = _free_port(ADAPTER_IP)
        self._start("keda-adapter", [
            str(adapter), f"--secure-port={self.adapter_port}", f"--bind-address={ADAPTER_IP}",
            f"--cert-dir={certs}", f"--tls-cert-file={certs / 'tls.crt'}",
            f"--tls-private-key-file={certs / 'tls.key'}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}", f"--lister-kubeconfig={kc}", f"--kubeconfig={kc}",
            f"--metrics-service-address=127.0.0.1:{self.grpc_port}", f"--port={_free_port()}"], env)
        self._wait_serving(certs / "ca.crt")
        self._register((certs / "ca.crt").read_bytes())
        return self

    def _wait_serving(self, ca: Path) -> None:
        ctx = ssl.create_default_context(cafile=str(ca))

        def up() -> bool:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise AssertionError(f"{name} exited {p.returncode}:\n{self.logs()}")
            try:  # any HTTP answer (401 without credentials) means it serves
                urllib.request.urlopen(f"https://{ADAPTER_IP}:{self.adapter_port}/healthz", timeout=2, context=ctx)
            except urllib.error.HTTPError:
                return True
            except OSError:
                return False
            return True
        try:
            wait_for(up, 180, "KEDA's metrics server serving")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.logs()}") from None

    def _register(self, ca: bytes) -> None:
        import base64

        objs = [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
             "spec": {"ports": [{"name": "https", "port": 443, "targetPort": self.adapter_port}]}},
            {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
             "subsets": [{"addresses": [{"ip": ADAPTER_IP}],
                          "ports": [{"name": "https", "port": self.adapter_port}]}]},
            # KEDA's chart: the HPA controller reads external metrics
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "keda-external-metrics-reader"},
             "rules": [{"apiGroups": ["external.metrics.k8s.io"], "resources": ["*"], "verbs": ["get", "list"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "keda-hpa-controller-external-metrics"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": "keda-external-metrics-reader"},
             "subjects": [{"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}]},
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": APISERVICE},
             "spec": {"service": {"name": SERVICE, "namespace": NAMESPACE, "port": 443},
                      "group": "external.metrics.k8s.io", "version": "v1beta1",
                      "caBundle": base64.b64encode(ca).decode(), "groupPriorityMinimum": 100,
                      "versionPriority": 100}},
        ]
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                             stdin="\n---\n".join(json.dumps(o) for o in objs))

        def available() -> bool:
            got = json.loads(self.cluster.kubectl("get", "apiservice", APISERVICE, "-o", "json"))
            return any(c.get("type") == "Available" and c.get("status") == "True"
                       for c in (got.get("status") or {}).get("conditions") or [])
        try:
            wait_for(available, 120, f"APIService {APISERVICE} Available")
        except AssertionError as e:
            got = self.cluster.kubectl("get", "apiservice", APISERVICE, "-o", "yaml", check=False)
            raise AssertionError(f"{e}\n{got}\n{self.logs()}") from None

    def stop(self) -> None:
        k = self.cluster.kubectl
        # ScaledObjects first, while KEDA's operator runs: it removes their finalizer (and its HPA); stopped first,
        # they would keep their namespace and KEDA's CRD Terminating for good.
        k("delete", "scaledobjects.keda.sh", "--all", "-A", "--ignore-not-found", "--timeout=60s", check=False,
          timeout=90)
        k("delete", "apiservice", APISERVICE, "--ignore-not-found", "--wait=false", check=False)
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        k("delete", "clusterrolebinding", "keda-hpa-controller-external-metrics", "--ignore-not-found", check=False)
        k("delete", "clusterrole", "keda-external-metrics-reader", "--ignore-not-found", check=False)
        k("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        for f in fetched.crds(fetched.KEDA):
            k("delete", "--ignore-not-found", "--wait=false", "-f", str(f), check=False, timeout=120)


def wait_http(url: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer in {timeout:.0f} s")
