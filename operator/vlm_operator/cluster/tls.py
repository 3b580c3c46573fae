"""TLS for the endpoints the operator serves (the injection webhook, the judge): a serving certificate kept in a
Secret, and an HTTPS server whose certificate can be swapped while it serves.

- `SecretCert`: reads the Secret; in self-signed mode makes and renews the CA and the serving pair in it
  (`certs.plan` decides), in cert-manager mode only reads what cert-manager wrote. Several operator replicas may
  race to write it: a write carries the resourceVersion it read, and the loser reads again.
- `server_context`: an `ssl.SSLContext` with a bundle's pair.
- `TLSServer`: a threading HTTP server that wraps each accepted connection with its current `context` (a renewed
  certificate serves the next connection) and runs the handshake in the connection's own thread.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import ssl
import tempfile
import threading
from collections.abc import Callable, Sequence
from http.server import ThreadingHTTPServer
from typing import Any, Self

from vlm_operator.cluster import certs
from vlm_operator.cluster.client import ApiError, Kube

log = logging.getLogger("vlm_operator.cluster.tls")


def server_context(bundle: certs.Bundle) -> ssl.SSLContext:
    """A server TLS context with the bundle's pair (ssl loads keys from files only: a private temp dir)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="vlm-tls-") as d:
        crt, key = os.path.join(d, "tls.crt"), os.path.join(d, "tls.key")
        for path, data in ((crt, bundle.tls_crt), (key, bundle.tls_key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(crt, key)
    return ctx


class TLSServer(ThreadingHTTPServer):
    """HTTPS with a context that can be swapped (a renewed certificate serves the next connection). The TLS
    handshake runs in the connection's own thread, not in the accept loop: one slow client delays nobody."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], handler: Any, context: ssl.SSLContext):
        self.context = context
        super().__init__(addr, handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(10)
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            request.do_handshake()
        except (ssl.SSLError, OSError) as e:
            log.debug("TLS handshake with %s failed: %s", client_address, e)
            return
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("Connection from %s ended: %s", client_address, "error", exc_info=True)


class SecretCert:
    """A serving certificate for `hosts`, kept in Secret `namespace/name`: made and renewed here when `managed`
    (self-signed), only read when not (cert-manager writes it)."""

    def __init__(self, kube: Kube, namespace: str, name: str, hosts: Sequence[str], *, managed: bool,
                 now: Callable[[], dt.datetime] | None = None):
        self.kube = kube
        self.namespace, self.name, self.hosts, self.managed = namespace, name, tuple(hosts), managed
        self.now = now or (lambda: dt.datetime.now(dt.UTC))
        self.path = f"/api/v1/namespaces/{namespace}/secrets/{name}"

    def _read(self) -> tuple[certs.Bundle | None, dict[str, Any] | None]:
        try:
            secret = self.kube.request_json("GET", self.path) or {}
        except ApiError as e:
            if e.status == 404:
                return None, None
            raise
        return certs.Bundle.from_secret_data(secret.get("data")), secret

    def ensure(self) -> certs.Bundle | None:
        """The bundle to serve with (None: none yet, cert-manager has not written it); writes what is due."""
        bundle: certs.Bundle | None = None
        for _ in range(3):  # another replica may write the same Secret at the same moment: read again
            bundle, secret = self._read()
            if not self.managed:
                return bundle
            new, why = certs.plan(bundle, self.hosts, self.now())
            if new is None:
                return bundle
            body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                    "metadata": {"name": self.name, "namespace": self.namespace,
                                 "labels": {"app.kubernetes.io/managed-by": "vlm-operator"}},
                    "data": new.secret_data()}
            try:
                if secret is None:
                    self.kube.request_json("POST", self.path.rsplit("/", 1)[0], body=body)
                    log.info("Created Secret %s/%s (%s)", self.namespace, self.name, why)
                else:
                    # A merge patch carrying the resourceVersion read: 409 when another replica wrote first.
                    patch = {"metadata": {"resourceVersion": secret["metadata"]["resourceVersion"]},
                             "data": {**dict.fromkeys(secret.get("data") or {}), **body["data"]}}
                    self.kube.request_json("PATCH", self.path, body=patch,
                                           content_type="application/merge-patch+json")
                    log.info("Updated Secret %s/%s (%s)", self.namespace, self.name, why)
            except ApiError as e:
                if e.status in (409, 422):  # someone else wrote it first (422: a create racing a create)
                    continue
                raise
            return new
        return bundle


class Kept:
    """An HTTPS endpoint whose certificate a thread keeps current: `refresh` (the subclass's) checks the Secret and
    starts the server or swaps its context; `start` runs it every `check_s` (every 5 s until a server serves), and
    a failed check is logged and retried, never the end of the thread (renewals would stop unseen)."""

    what = "endpoint"
    check_s = 60.0

    def __init__(self) -> None:
        self.server: TLSServer | None = None
        self.stopped = threading.Event()

    def refresh(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self.stopped.is_set():
            try:
                self.refresh()
            except (ApiError, OSError, ValueError) as e:
                log.warning("%s certificate check failed (retried in %.0f s): %s", self.what, self.check_s, e)
            except Exception:  # logged with its traceback: this thread must outlive a bug
                log.exception("%s certificate check failed (retried in %.0f s)", self.what, self.check_s)
            self.stopped.wait(self.check_s if self.server is not None else 5.0)

    def start(self) -> Self:
        threading.Thread(target=self._loop, name=f"vlm-{self.what.split()[-1]}-certs", daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
