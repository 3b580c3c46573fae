"""The operator's own connection to the API server: urllib3 and the credentials kopf logs in with.

The reconcile makes a dozen kinds of REST call (`cluster.client.Kube`). The kubernetes client library's generated
models cost tens of MiB of resident memory at import, a good part of the operator's peak at full scale, for
nothing the reconcile uses (docs/benchmarks.md, "The kubernetes library kept out of the process"); kopf
imports it too when it is installed. So the operator's entry point keeps it out of the process
(`keep_client_library_out`) unless the kubeconfig needs it, and this module speaks HTTP itself with the
credentials kopf's own logins find:

- in a cluster, the pod's service account (token and CA; kopf's `login_with_service_account`);
- else the kubeconfig's current context (`KUBECONFIG` or ~/.kube/config; kopf's `login_with_kubeconfig`):
  a token, a client certificate (path or data) or basic auth, the CA (path or data), or
  `insecure-skip-tls-verify`;
- a kubeconfig user with an `exec` credential plugin or an `auth-provider` (EKS or GKE from outside the
  cluster) needs the kubernetes library to run it: then it stays importable, and kopf and this module log in
  through it (`login_via_client`).

An answer 401 logs in again once and repeats the request (kubelet rotates a projected service-account token
about hourly; the file holds the new one). urllib3 comes with the operator's dependencies (kopf's, and the
kubernetes library's, which stays installed for the case above and for the kubectl plugin).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

import urllib3
import yaml

log = logging.getLogger("vlm_operator.cluster.connection")

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
CLIENT_LIBRARY = "kubernetes"


class ApiError(Exception):
    """An answer outside 2xx: its status, reason and body (what `apply.classify` reads)."""

    def __init__(self, status: int, reason: str = "", body: bytes | str | None = None):
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body


class LoginError(Exception):
    """No credentials: neither a service account nor a kubeconfig."""


def _kubeconfig_user(environ: Mapping[str, str]) -> Mapping[str, Any] | None:
    """The current context's user of the kubeconfig kopf would read (first file naming a value wins)."""
    kubeconfig = environ.get("KUBECONFIG") or ""
    paths = [os.path.expanduser(p.strip()) for p in kubeconfig.split(os.pathsep) if p.strip()]
    if not paths:
        paths = [os.path.expanduser("~/.kube/config")]
    current, contexts, users = None, {}, {}
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f) or {}
        current = current or config.get("current-context")
        for item in config.get("contexts") or []:
            contexts.setdefault(item.get("name"), item.get("context") or {})
        for item in config.get("users") or []:
            users.setdefault(item.get("name"), item.get("user") or {})
    context = contexts.get(current) or {}
    return users.get(context.get("user"))


def needs_client_library(environ: Mapping[str, str] = os.environ) -> bool:
    """The credentials come from a kubeconfig user that only the kubernetes library can run (exec plugin,
    auth-provider). False in a cluster (service account), and when the kubeconfig cannot be read (kopf then
    says what is wrong with it)."""
    if os.path.exists(SERVICE_ACCOUNT_TOKEN):
        return False
    try:
        user = _kubeconfig_user(environ)
    except (OSError, yaml.YAMLError, AttributeError, TypeError):
        return False
    return bool(user and (user.get("exec") or user.get("auth-provider")))


def keep_client_library_out(environ: Mapping[str, str] = os.environ) -> bool:
    """Before kopf is imported: make `import kubernetes` fail in this process (kopf then uses its own logins
    and imports none of the library's models), unless the kubeconfig needs the library. True when kept out."""
    if CLIENT_LIBRARY in sys.modules or needs_client_library(environ):
        return False
    sys.modules[CLIENT_LIBRARY] = None  # type: ignore[assignment]  # Python's documented import block
    return True


def login() -> Any:
    """kopf's ConnectionInfo for this process, found as kopf finds it."""
    import kopf

    settings = kopf.OperatorSettings()
    if os.path.exists(SERVICE_ACCOUNT_TOKEN):
        info = kopf.login_with_service_account(settings=settings)
    elif sys.modules.get(CLIENT_LIBRARY, False) is not None and needs_client_library():
        info = kopf.login_via_client(logger=log, settings=settings)
    else:
        info = kopf.login_with_kubeconfig(settings=settings)
    if info is None or not info.server:
        raise LoginError(
            "no API server credentials: no service account in this pod, and no usable kubeconfig "
            "(KUBECONFIG or ~/.kube/config)"
        )
    return info


class Connection:
    """A pool of HTTP(S) connections to the API server with the process's credentials; thread-safe."""

    def __init__(self, login: Callable[[], Any] = login, *, pool_size: int = 8, timeout_s: float = 30.0):
        self._login = login
        self._pool_size = pool_size
        self._timeout = urllib3.Timeout(connect=min(10.0, timeout_s), read=timeout_s)
        self._lock = threading.Lock()
        self._connect()

    def _connect(self) -> None:
        info = self._login()
        server = str(info.server).rstrip("/")
        kwargs: dict[str, Any] = {}
        if server.startswith("https:"):
            kwargs["ssl_context"] = info.as_ssl_context()
            if info.insecure:
                kwargs.update(cert_reqs="CERT_NONE", assert_hostname=False)
        # Connection errors are retried (an API server restarting); an answered request never is.
        retries = urllib3.Retry(total=3, connect=3, read=0, status=0, other=0, redirect=0, backoff_factor=0.2)
        pool = urllib3.PoolManager(num_pools=2, maxsize=self._pool_size, retries=retries, **kwargs)
        # One tuple, swapped whole: a request never pairs one login's server or token with another's pool.
        self._session = (server, dict(info.as_http_headers()), pool)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> bytes:
        """The answer's body; ApiError for an answer outside 2xx."""
        url = path + (f"?{urlencode(query)}" if query else "")

        def send(session: tuple[str, dict[str, str], urllib3.PoolManager]) -> urllib3.BaseHTTPResponse:
            server, auth, pool = session
            return pool.request(method, server + url, body=body, headers={**auth, **(headers or {})},
                                timeout=self._timeout, preload_content=True)

        session = self._session
        resp = send(session)
        if resp.status == 401:
            with self._lock:
                if self._session is session:  # not renewed meanwhile by another thread
                    log.info("API server answered 401: logging in again")
                    self._connect()
            resp = send(self._session)
        if not 200 <= resp.status < 300:
            raise ApiError(resp.status, resp.reason or "", resp.data)
        return resp.data
