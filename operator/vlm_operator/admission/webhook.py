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
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from vlm_operator.admission import inject
from vlm_operator.api import metrics
from vlm_operator.api.names import OPERATOR
from vlm_operator.api.settings import Settings
from vlm_operator.api.v1alpha1 import TelemetrySpec
from vlm_operator.cluster import certs, tls
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


# The server's TLS context (cluster.tls); kept under this name for the webhook's callers.
server_context = tls.server_context


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


class Server(tls.TLSServer):
    """The webhook's HTTPS server (cluster.tls.TLSServer: a swappable context, the handshake in the connection's
    thread), with what its handler reads."""

    def __init__(self, addr: tuple[str, int], config: inject.InjectionConfig, context: ssl.SSLContext,
                 observe: Callable[[float, inject.Decision], None] | None = None):
        self.config = config
        self.observe = observe
        super().__init__(addr, _Handler, context)


class CertKeeper:
    """Keeps the webhook's certificate in its Secret (cluster.tls.SecretCert), the CA in the
    MutatingWebhookConfiguration's caBundle (self-signed mode). cert-manager mode only reads the Secret."""

    def __init__(self, conn: Connection, settings: Settings, now: Callable[[], dt.datetime] | None = None):
        self.kube = Kube(conn, OPERATOR)  # every API call through the operator's one client
        self.s = settings
        hosts = certs.service_hosts(settings.webhook_service, settings.webhook_namespace, settings.webhook_cert_hosts)
        self.secret = tls.SecretCert(self.kube, settings.webhook_namespace, settings.webhook_secret, hosts,
                                     managed=settings.webhook_tls == "self-signed", now=now)
        self.mwc_path = ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                         f"{settings.webhook_configuration}")

    def ensure(self) -> certs.Bundle | None:
        """The bundle to serve with (None: none yet, cert-manager has not written it); writes what is due."""
        bundle = self.secret.ensure()
        if bundle is not None and self.secret.managed:
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


class Webhook(tls.Kept):
    """The running webhook: its server thread and its certificate thread (cluster.tls.Kept)."""

    what = "Injection webhook"
    check_s = CHECK_SECONDS

    def __init__(self, settings: Settings, conn: Connection,
                 observe: Callable[[float, inject.Decision], None] | None = None):
        super().__init__()
        self.settings = settings
        self.keeper = CertKeeper(conn, settings)
        self.observe = observe
        self._served: bytes = b""

    def refresh(self) -> None:
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


def start(settings: Settings, conn: Connection) -> Webhook | None:
    """Start the webhook when VLM_INJECTION is on (else None)."""
    return Webhook(settings, conn).start() if settings.injection else None
