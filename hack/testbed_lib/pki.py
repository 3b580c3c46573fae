"""Certificates, service-account keys and static tokens for the testbed, made once per run dir.

openssl (always on Debian) rather than Python `cryptography`, so the testbed needs no pip install.
Files are only created when missing: a restart keeps the CA, so kubeconfigs and issued
service-account tokens stay valid across `down --keep` / `up`.
"""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

from .layout import SERVICE_IP, Layout

# The users the components authenticate as. kube-controller-manager and kube-scheduler get the
# identities the bootstrap RBAC policy already grants; kwok rewrites node and pod status across
# the cluster, so it gets admin rights like kwokctl gives it.
TOKEN_USERS = {
    "admin": ("admin", "system:masters"),
    "kube-controller-manager": ("system:kube-controller-manager", ""),
    "kube-scheduler": ("system:kube-scheduler", ""),
    "kwok": ("system:kwok-controller", "system:masters"),
}

_CA_CNF = """\
[req]
distinguished_name = dn
prompt = no
x509_extensions = v3_ca
[dn]
CN = vlm-testbed-ca
[v3_ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectKeyIdentifier = hash
"""

_SERVING_EXT = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = {sans}
"""


# The apiserver's client certificate toward aggregated APIs (KEDA's external metrics server): the front proxy's
# identity, which the extension server checks against the requestheader CA and allowed names.
_FRONT_PROXY_EXT = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
"""
FRONT_PROXY_CN = "front-proxy-client"


def build_serving_sans(service_ip: str = SERVICE_IP) -> str:
    """subjectAltName for the apiserver: loopback plus the in-cluster names a pod would use."""
    names = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    return ", ".join([*(f"DNS:{n}" for n in names), "IP:127.0.0.1", f"IP:{service_ip}"])


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def ensure_pki(layout: Layout) -> None:
    """Create CA, apiserver serving cert, service-account key pair and token file if missing."""
    pki = layout.pki
    pki.mkdir(parents=True, exist_ok=True)
    pki.chmod(0o700)
    if not (pki / "ca.crt").exists():
        (pki / "ca.cnf").write_text(_CA_CNF)
        _openssl("genrsa", "-out", "ca.key", "2048", cwd=pki)
        _openssl(
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-days",
            "3650",
            "-config",
            "ca.cnf",
            "-out",
            "ca.crt",
            cwd=pki,
        )
        # A new CA invalidates the old serving and front-proxy certs.
        (pki / "apiserver.crt").unlink(missing_ok=True)
        (pki / "front-proxy-client.crt").unlink(missing_ok=True)
    if not (pki / "apiserver.crt").exists():
        (pki / "apiserver.ext").write_text(_SERVING_EXT.format(sans=build_serving_sans()))
        _openssl("genrsa", "-out", "apiserver.key", "2048", cwd=pki)
        _openssl(
            "req",
            "-new",
            "-key",
            "apiserver.key",
            "-subj",
            "/CN=kube-apiserver",
            "-out",
            "apiserver.csr",
            cwd=pki,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            "apiserver.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "3650",
            "-extfile",
            "apiserver.ext",
            "-out",
            "apiserver.crt",
            cwd=pki,
        )
    if not (pki / "front-proxy-client.crt").exists():
        (pki / "front-proxy-client.ext").write_text(_FRONT_PROXY_EXT)
        _openssl("genrsa", "-out", "front-proxy-client.key", "2048", cwd=pki)
        _openssl("req", "-new", "-key", "front-proxy-client.key", "-subj", f"/CN={FRONT_PROXY_CN}",
                 "-out", "front-proxy-client.csr", cwd=pki)
        _openssl("x509", "-req", "-in", "front-proxy-client.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "3650", "-extfile", "front-proxy-client.ext",
                 "-out", "front-proxy-client.crt", cwd=pki)
    if not (pki / "sa.key").exists():
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    if not (pki / "tokens.csv").exists():
        (pki / "tokens.csv").write_text(build_token_csv({n: secrets.token_hex(24) for n in TOKEN_USERS}))
    for f in pki.iterdir():
        if f.suffix in {".key", ".csv"}:
            f.chmod(0o600)


def build_token_csv(tokens: dict[str, str]) -> str:
    """The apiserver's --token-auth-file: token,user,uid,"group,...", one line per component."""
    lines = []
    for name, token in tokens.items():
        user, groups = TOKEN_USERS[name]
        line = f"{token},{user},{name}-uid"
        lines.append(f'{line},"{groups}"' if groups else line)
    return "\n".join(lines) + "\n"


def read_tokens(layout: Layout) -> dict[str, str]:
    """Component name -> bearer token, from the token file."""
    by_user = {user: name for name, (user, _) in TOKEN_USERS.items()}
    tokens = {}
    for line in (layout.pki / "tokens.csv").read_text().splitlines():
        token, user = line.split(",")[:2]
        tokens[by_user[user]] = token
    return tokens
