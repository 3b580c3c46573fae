"""The injection webhook's effects: the HTTPS server that answers AdmissionReviews (`inject.review` decides), and
the keeper of its certificate (`certs.plan` decides; here the Secret and the caBundle are read and written).

Both run in threads of the operator process, started by `start` from kopf's startup handler when VLM_INJECTION
is on; every replica serves (the Service spreads reviews over them), whichever one peering made active.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import os
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from vlm_operator.admission import certs, inject
from vlm_operator.api import metrics
from vlm_operator.api.names import OPERATOR
from vlm_operator.api.settings import Settings
from vlm_operator.api.v1alpha1 import TelemetrySpec
from vlm_operator.cluster.client import ApiError, Connection, Kube

log = logging.getLogger("vlm_operator.admission.webhook")
PATH = "/mutate"
# The API server's own timeout for the call (the chart's timeoutSeconds) is 5 s; a body larger than a pod can be
# is refused before it is read.
MAX_BODY = 3 * 1024 * 1024
# How often the certificate is checked (renewal is due months ahead) and the caBundle compared (a `helm
# upgrade` that rendered it empty is repaired within this).
CHECK_SECONDS = 60.0


def injection_config(settings: Settings) -> inject.InjectionConfig:
    excluded = inject.SYSTEM_NAMESPACES | ({settings.webhook_namespace} if settings.webhook_namespace else set())
    return inject.InjectionConfig(image=settings.sidecar_image, telemetry=TelemetrySpec(),
                                  pull_secrets=settings.sidecar_image_pull_secrets,
                                  excluded_namespaces=frozenset(excluded))


def server_context(bundle: certs.Bundle) -> ssl.SSLContext:
    """A server TLS context with the bundle's pair (ssl loads keys from files only: a private temp dir)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="vlm-webhook-") as d:
        crt, key = os.path.join(d, "tls.crt"), os.path.join(d, "tls.key")
        for path, data in ((crt, bundle.tls_crt), (key, bundle.tls_key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(crt, key)
    return ctx


class _Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"  # the API server keeps connections open between reviews
    # Headers and body leave in one write (flushed after each request): written apart, the second small TLS
    # record waited for the API server's delayed ACK (Nagle), and every review spent far longer on the wire
    # than in here (docs/benchmarks.md, "The webhook's answer in one write").
    wbufsize = -1

    def do_POST(self) -> None:
        start = time.perf_counter()
        if self.path.split("?", 1)[0] != PATH:
            self._send(404, b"")
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self._send(413, b"")
            return
        body = self.rfile.read(length)
        response, decision = inject.review(body, self.server.config)
        payload = json.dumps(response, separators=(",", ":")).encode()
        self._send(200, payload, "application/json")
        elapsed = time.perf_counter() - start
        metrics.WEBHOOK_REVIEWS.labels(decision.outcome).observe(elapsed)
        if decision.outcome == "error":
            log.warning("Admission review not understood: %s", "; ".join(decision.warnings))
        if self.server.observe is not None:
            self.server.observe(elapsed, decision)

    def do_GET(self) -> None:
        self._send(200 if self.path == "/healthz" else 404, b"ok" if self.path == "/healthz" else b"")

    def _send(self, code: int, payload: bytes, content_type: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()  # within the handling time the review is measured by

    def log_message(self, format: str, *args: Any) -> None:  # one line per review would flood the log
        pass


class Server(ThreadingHTTPServer):
    """HTTPS with a context that can be swapped (a renewed certificate serves the next connection). The TLS
    handshake runs in the connection's own thread, not in the accept loop: one slow client delays nobody."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], config: inject.InjectionConfig, context: ssl.SSLContext,
                 observe: Callable[[float, inject.Decision], None] | None = None):
        self.config = config
        self.context = context
        self.observe = observe
        super().__init__(addr, _Handler)

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


class CertKeeper:
    """Keeps the webhook's certificate in its Secret, the CA in the MutatingWebhookConfiguration's caBundle
    (self-signed mode), and the server's context current. cert-manager mode only reads the Secret."""

    def __init__(self, conn: Connection, settings: Settings, now: Callable[[], dt.datetime] | None = None):
        self.kube = Kube(conn, OPERATOR)  # every API call through the operator's one client
        self.s = settings
        self.now = now or (lambda: dt.datetime.now(dt.UTC))
        self.hosts = certs.service_hosts(settings.webhook_service, settings.webhook_namespace,
                                         settings.webhook_cert_hosts)
        self.secret_path = f"/api/v1/namespaces/{settings.webhook_namespace}/secrets/{settings.webhook_secret}"
        self.mwc_path = ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                         f"{settings.webhook_configuration}")

    def _read(self) -> tuple[certs.Bundle | None, dict[str, Any] | None]:
        try:
            secret = self.kube.request_json("GET", self.secret_path) or {}
        except ApiError as e:
            if e.status == 404:
                return None, None
            raise
        return certs.Bundle.from_secret_data(secret.get("data")), secret

    def ensure(self) -> certs.Bundle | None:
        """The bundle to serve with (None: none yet, cert-manager has not written it); writes what is due."""
        for _ in range(3):  # another replica may write the same Secret at the same moment: read again
            bundle, secret = self._read()
            if self.s.webhook_tls == "cert-manager":
                return bundle
            new, why = certs.plan(bundle, self.hosts, self.now())
            if new is None:
                break
            body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                    "metadata": {"name": self.s.webhook_secret, "namespace": self.s.webhook_namespace,
                                 "labels": {"app.kubernetes.io/managed-by": "vlm-operator"}},
                    "data": new.secret_data()}
            try:
                if secret is None:
                    path = self.secret_path.rsplit("/", 1)[0]
                    self.kube.request_json("POST", path, body=body)
                    log.info("Created Secret %s/%s (%s)", self.s.webhook_namespace, self.s.webhook_secret, why)
                else:
                    # A merge patch carrying the resourceVersion read: 409 when another replica wrote first.
                    patch = {"metadata": {"resourceVersion": secret["metadata"]["resourceVersion"]},
                             "data": {**dict.fromkeys(secret.get("data") or {}), **body["data"]}}
                    self.kube.request_json("PATCH", self.secret_path, body=patch,
                                           content_type="application/merge-patch+json")
                    log.info("Updated Secret %s/%s (%s)", self.s.webhook_namespace, self.s.webhook_secret, why)
            except ApiError as e:
                if e.status in (409, 422):  # someone else wrote it first (422: a create racing a create)
                    continue
                raise
            bundle = new
            break
        if bundle is not None:
            self.patch_ca_bundle(bundle.ca_bundle)
        return bundle

    def patch_ca_bundle(self, ca: bytes) -> bool:
        """Write `ca` into every webhook of our MutatingWebhookConfiguration whose caBundle differs; True when
        written. A configuration not there (yet) is left to the next check."""
        want = base64.b64encode(ca).decode()
        try:
            mwc = self.kube.request_json("GET", self.mwc_path) or {}
        except ApiError as e:
            if e.status == 404:
                log.warning("MutatingWebhookConfiguration %s not found: caBundle not written",
                            self.s.webhook_configuration)
                return False
            raise
        ops: list[dict[str, Any]] = []
        for i, hook in enumerate(mwc.get("webhooks") or []):
            if (hook.get("clientConfig") or {}).get("caBundle") != want:
                ops += [{"op": "test", "path": f"/webhooks/{i}/name", "value": hook["name"]},
                        {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": want}]
        if not ops:
            return False
        self.kube.request_json("PATCH", self.mwc_path, body=ops, content_type="application/json-patch+json")
        log.info("Patched MutatingWebhookConfiguration %s caBundle", self.s.webhook_configuration)
        return True


class Webhook:
    """The running webhook: its server thread and its certificate thread."""

    def __init__(self, settings: Settings, conn: Connection,
                 observe: Callable[[float, inject.Decision], None] | None = None):
        self.settings = settings
        self.keeper = CertKeeper(conn, settings)
        self.observe = observe
        self.server: Server | None = None
        self.stopped = threading.Event()
        self._served: bytes = b""

    def _refresh(self) -> None:
        bundle = self.keeper.ensure()
        if bundle is None:
            log.warning("Secret %s/%s has no certificate yet: the injection webhook waits for it",
                        self.settings.webhook_namespace, self.settings.webhook_secret)
            return
        if bundle.tls_crt == self._served:
            return
        ctx = server_context(bundle)
        if self.server is None:
            self.server = Server((self.settings.webhook_addr, self.settings.webhook_port),
                                 injection_config(self.settings), ctx, self.observe)
            threading.Thread(target=self.server.serve_forever, name="vlm-webhook", daemon=True).start()
            log.info("Injection webhook serving on %s:%d (certificate until %s)", self.settings.webhook_addr,
                     self.settings.webhook_port, certs.not_after(bundle.tls_crt).isoformat())
        else:
            self.server.context = ctx
            log.info("Injection webhook certificate renewed (until %s)", certs.not_after(bundle.tls_crt).isoformat())
        self._served = bundle.tls_crt

    def _loop(self) -> None:
        while not self.stopped.is_set():
            try:
                self._refresh()
            except (ApiError, OSError, ValueError) as e:
                log.warning("Injection webhook certificate check failed (retried in %.0f s): %s", CHECK_SECONDS, e)
            except Exception:  # logged with its traceback: this thread must outlive a bug, or renewals stop unseen
                log.exception("Injection webhook certificate check failed (retried in %.0f s)", CHECK_SECONDS)
            self.stopped.wait(CHECK_SECONDS if self.server is not None else 5.0)

    def start(self) -> Webhook:
        threading.Thread(target=self._loop, name="vlm-webhook-certs", daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def start(settings: Settings, conn: Connection) -> Webhook | None:
    """Start the webhook when VLM_INJECTION is on (else None)."""
    return Webhook(settings, conn).start() if settings.injection else None
