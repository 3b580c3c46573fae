"""The judge endpoint's I/O half: HTTP, the caller's authentication, the pods and their windows (docs/judge.md).

Served by the operator process on `VLM_JUDGE_PORT` (0: off) in a thread of its own, started at the operator's
start-up. Each call: the bearer token is checked with a TokenReview (401 without a valid one), the body is parsed
(`vlm_operator.judge.evaluate`; 400 naming the field), a SubjectAccessReview asks whether the caller may `create`
`judgements.serving.vlmops.dev` in the request's namespace (403 otherwise), the pods of both selectors are listed
through the API server, their windows read from the sidecars (the operator's shared `SidecarReader`, by pod IP)
or Prometheus exactly as a VLMService's look reads them, and `gate.decide` judges them. Every failure to read is
the gate's to decide (an Inconclusive look, onInconclusive at maxDuration), never a crash of the server.

State: none about a caller's analysis (the start is the request's `startedAt` or the canary pods' Ready times,
`judge.JudgeRequest.window`). The sidecar reader's per-pod cache keeps the windows since each `startedAt` asked
for in the last 5 minutes, so an analysis longer than a sidecar's own history still sees all its windows; the
baseline pods' pre-period (their windows in the 5 minutes before the evidence starts) comes from the same read.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from vlm_operator.analysis import sources
from vlm_operator.analysis.window import Window
from vlm_operator.api.names import GROUP, OPERATOR
from vlm_operator.api.units import parse_duration
from vlm_operator.cluster import certs, tls
from vlm_operator.cluster.client import ApiError, Connection, Kube
from vlm_operator.judge import evaluate as judge

log = logging.getLogger("vlm_operator.judge.evaluate")
MAX_BODY = 64 * 1024
TOKEN_CACHE_S = 30.0  # a token's review (either outcome) is reused this long: two API calls saved per call
TOKEN_CACHE_SIZE = 1024
# The permission a caller needs in the request's namespace (a SubjectAccessReview): a resource of the operator's
# group that no object backs, so an admin grants exactly "may ask the judge" (the chart's ClusterRole
# vlm-operator-judge-caller).
SAR_VERB, SAR_RESOURCE = "create", "judgements"
# A Flagger Canary's Warning Event for a Rollback verdict is written at most this often (its checks repeat each
# interval until Flagger's threshold).
EVENT_EVERY_S = 600.0


@dataclass(frozen=True)
class Caller:
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, Sequence[str]] | None = None


class Auth(Protocol):
    def authenticate(self, token: str) -> Caller | None: ...

    def authorize(self, caller: Caller, namespace: str) -> bool: ...


class AuthUnavailable(Exception):
    """The API server could not review the token (503: the caller tries again next interval)."""


class KubeAuth:
    """TokenReview and SubjectAccessReview through the operator's API connection (its ServiceAccount needs
    `create` on tokenreviews and subjectaccessreviews: the chart's ClusterRole has them)."""

    def __init__(self, conn: Connection, audiences: Sequence[str] = (), clock: Callable[[], float] = time.monotonic):
        self.kube = Kube(conn, OPERATOR)  # every API call through the operator's one client
        self.audiences = list(audiences)
        self.clock = clock
        self._lock = threading.Lock()
        self._tokens: OrderedDict[str, tuple[float, Caller | None]] = OrderedDict()

    def _post(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        try:
            out = self.kube.request_json("POST", path, body=body)
        except (ApiError, OSError, ValueError) as e:
            raise AuthUnavailable(f"{path}: {e}") from e
        return out if isinstance(out, dict) else {}

    def authenticate(self, token: str) -> Caller | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        with self._lock:
            hit = self._tokens.get(key)
            if hit is not None and now - hit[0] < TOKEN_CACHE_S:
                return hit[1]
        spec: dict[str, Any] = {"token": token}
        if self.audiences:
            spec["audiences"] = self.audiences
        st = self._post("/apis/authentication.k8s.io/v1/tokenreviews",
                        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
                        ).get("status") or {}
        caller = None
        if st.get("authenticated") is True:
            user = st.get("user") or {}
            caller = Caller(str(user.get("username", "")), str(user.get("uid", "")),
                            tuple(user.get("groups") or ()), user.get("extra") or None)
        with self._lock:
            self._tokens[key] = (now, caller)
            self._tokens.move_to_end(key)
            while len(self._tokens) > TOKEN_CACHE_SIZE:
                self._tokens.popitem(last=False)
        return caller

    def authorize(self, caller: Caller, namespace: str) -> bool:
        spec: dict[str, Any] = {
            "user": caller.username, "groups": list(caller.groups),
            "resourceAttributes": {"namespace": namespace, "verb": SAR_VERB, "group": GROUP,
                                   "resource": SAR_RESOURCE},
        }
        if caller.uid:
            spec["uid"] = caller.uid
        if caller.extra:
            spec["extra"] = {k: list(v) for k, v in caller.extra.items()}
        st = self._post("/apis/authorization.k8s.io/v1/subjectaccessreviews",
                        {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
                        ).get("status") or {}
        return st.get("allowed") is True


@dataclass(frozen=True)
class Read:
    pods: list[judge.PodRef]
    windows: list[Window]
    source: str
    unavailable: str | None


class Judge:
    """One call of the judge: `handle` returns (HTTP status, JSON answer); the HTTP server only frames it."""

    def __init__(self, conn: Connection, reader: sources.SidecarReader, *, auth: Auth,
                 prometheus_url: str | None = None, clock: Callable[[], float] = time.time):
        self.kube = Kube(conn, OPERATOR)
        self.reader = reader
        self.auth = auth
        self.prometheus_url = prometheus_url or None
        self.clock = clock
        self._events_lock = threading.Lock()
        self._evented: OrderedDict[tuple[Any, ...], float] = OrderedDict()  # Events written on Flagger Canaries

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        route = path.split("?", 1)[0].rstrip("/")
        if route == "/healthz":
            return 200, {"status": "ok"}
        if route not in ("/v1/judge", "/v1/flagger"):
            return 404, {"error": f"no such endpoint: {route}", "field": "path"}
        if method != "POST":
            return 405, {"error": "POST only", "field": "method"}
        token = _bearer(headers)
        if not token:
            return 401, {"error": "a ServiceAccount bearer token is required", "field": "Authorization"}
        try:
            caller = self.auth.authenticate(token)
        except AuthUnavailable as e:
            return 503, {"error": f"the token could not be reviewed: {e}", "field": "Authorization"}
        if caller is None:
            return 401, {"error": "the token was not accepted by the API server", "field": "Authorization"}
        try:
            data = json.loads(body or b"null")
        except ValueError as e:
            return 400, {"error": f"not JSON: {e}", "field": "body"}
        now = self.clock()
        try:
            if route == "/v1/flagger":
                return self._flagger(data, caller, now)
            req = judge.parse(data)
        except judge.BadRequest as e:
            return 400, {"error": e.message, "field": e.field}
        denied = self._authorize(caller, req.namespace)
        if denied is not None:
            return denied
        return 200, self.judge(req, now)

    def _authorize(self, caller: Caller, namespace: str) -> tuple[int, dict[str, Any]] | None:
        try:
            ok = self.auth.authorize(caller, namespace)
        except AuthUnavailable as e:
            return 503, {"error": f"the caller's access could not be reviewed: {e}", "field": "Authorization"}
        if not ok:
            return 403, {"error": f"{caller.username} may not {SAR_VERB} {SAR_RESOURCE}.{GROUP} in namespace "
                                  f"{namespace}", "field": "namespace"}
        return None

    def _flagger(self, data: Any, caller: Caller, now: float) -> tuple[int, dict[str, Any]]:
        call = judge.parse_flagger(data)
        denied = self._authorize(caller, call.namespace)
        if denied is not None:
            return denied
        if call.request is None:
            return 200, {"verdict": None, "pass": 1, "message": f"phase {call.phase}: nothing to judge"}
        answer = self.judge(call.request, now)
        if answer["verdict"] == "Rollback":
            self._canary_event(call, answer, now)
        return judge.flagger_status(answer["verdict"]), answer

    def _canary_event(self, call: judge.FlaggerCall, answer: Mapping[str, Any], now: float) -> None:
        """A Warning Event on the Flagger Canary with the verdict's reason and message (the stage and function that
        grew), once per revision and reason. Flagger's own Event for the failed check cannot carry it: its webhook
        client retries a 5xx answer (the load tester's, for a failed command) and then reports only "giving up
        after 1 attempt(s)", without the body. At most once per EVENT_EVERY_S per canary, revision and reason (the
        load tester's command carries no revision checksum). Best effort: a refused write is logged, never the
        caller's error."""
        key = (call.namespace, call.name, call.checksum, answer.get("reason"))
        with self._events_lock:
            last = self._evented.get(key)
            if last is not None and now - last < EVENT_EVERY_S:
                return
            self._evented[key] = now
            self._evented.move_to_end(key)
            while len(self._evented) > TOKEN_CACHE_SIZE:
                self._evented.popitem(last=False)
        obj: dict[str, Any] = {"apiVersion": "flagger.app/v1beta1", "kind": "Canary", "name": call.name,
                               "namespace": call.namespace}
        try:
            canary = self.kube.request_json("GET", f"/apis/flagger.app/v1beta1/namespaces/{call.namespace}/canaries/"
                                                   f"{call.name}") or {}
            obj["uid"] = (canary.get("metadata") or {}).get("uid") or ""
        except (ApiError, OSError, ValueError) as e:  # kubectl describe matches by uid: without it, by name only
            log.debug("judge: Canary %s/%s not read: %s", call.namespace, call.name, e)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        event = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"generateName": f"{call.name}.", "namespace": call.namespace},
                 "involvedObject": obj, "type": "Warning", "reason": str(answer.get("reason") or "Rollback"),
                 "message": str(answer.get("message") or "")[:1024], "source": {"component": "vlm-operator-judge"},
                 "reportingComponent": "vlm-operator-judge", "reportingInstance": "vlm-operator",
                 "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}
        try:
            self.kube.request_json("POST", f"/api/v1/namespaces/{call.namespace}/events", body=event)
        except (ApiError, OSError, ValueError) as e:
            log.warning("judge: Event on Canary %s/%s not written: %s", call.namespace, call.name, e)

    def judge(self, req: judge.JudgeRequest, now: float) -> dict[str, Any]:
        """List the pods, read their windows, decide, answer."""
        got = self.read(req, now)
        lay = judge.layout(req, got.windows, got.pods, now)  # once: the decision and the answer's pre-period pods
        d = judge.decide(req, got.windows, got.pods, now=now, unavailable=got.unavailable, lay=lay)
        return judge.response(req, d, got.windows, got.pods, now=now, source=got.source, lay=lay)

    def read(self, req: judge.JudgeRequest, now: float) -> Read:
        """The request's pods and their windows since `startedAt` (the baseline pods' from gate.PRE_PERIOD_S before
        it: their pre-period), from the source a VLMService with the same
        analysis block would read (Prometheus when asked for, or on Auto with a URL; the sidecars otherwise).
        Any failure to read is returned as `unavailable`: the gate decides on it."""
        pods: list[judge.PodRef] = []
        source = "Sidecars"
        try:
            pods = self._pods(req)
            ready = [p for p in pods if p.ready]
            for side, sel in ((judge.BASELINE, req.baseline), (judge.CANARY, req.canary)):
                if not any(p.side == side for p in ready):
                    raise sources.SignalsUnavailable(f"no Ready pod matches the {side} selector {sel}")
            since = judge.pre_period_since(req, pods, now)  # the baseline pods' pre-period, then the evidence
            url = req.analysis.prometheus_url or self.prometheus_url
            interval = parse_duration(req.telemetry_interval)
            if req.analysis.source == "Prometheus" or (req.analysis.source == "Auto" and url):
                source = "Prometheus"
                windows = sources.from_prometheus(
                    url or "", req.namespace, "", [], since=since, now=now, step=max(1.0, interval / 3),
                    pods={p.name: p.side for p in ready})
            else:
                windows = self.reader.read([(p.name, p.side, p.ip) for p in ready], since,
                                           interval=interval, now=now)
        except sources.SignalsUnavailable as e:
            return Read(pods, [], source, str(e))
        return Read(pods, windows, source, None)

    def _pods(self, req: judge.JudgeRequest) -> list[judge.PodRef]:
        out: list[judge.PodRef] = []
        seen: dict[str, str] = {}
        for side, sel in ((judge.BASELINE, req.baseline), (judge.CANARY, req.canary)):
            try:
                data = self.kube.request_json("GET", f"/api/v1/namespaces/{req.namespace}/pods",
                                              query=[("labelSelector", sel)]) or {}
            except ApiError as e:
                raise sources.SignalsUnavailable(f"pods of the {side} selector not listed: {e}") from e
            except (OSError, ValueError) as e:
                raise sources.SignalsUnavailable(f"pods of the {side} selector not listed: {e}") from e
            for body in (data.get("items") or []) if isinstance(data, dict) else []:
                p = judge.pod_ref(body, side)
                if p.name in seen and seen[p.name] != side:
                    raise sources.SignalsUnavailable(f"pod {p.name} matches both selectors")
                seen[p.name] = side
                out.append(p)
        return out


def _bearer(headers: Mapping[str, str]) -> str | None:
    value = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
    scheme, _, token = value.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class _Handler(BaseHTTPRequestHandler):
    judge: Judge  # set on the subclass `serve` builds
    protocol_version = "HTTP/1.1"
    timeout = 30

    def _answer(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self._send(413 if length > MAX_BODY else 400,
                       {"error": f"a body of at most {MAX_BODY} bytes with a Content-Length", "field": "body"})
            return
        body = self.rfile.read(length) if length else b""
        try:
            status, answer = self.judge.handle(self.command, self.path, dict(self.headers.items()), body)
        except Exception:  # a bug must not take the endpoint down: 500, logged with its traceback
            log.exception("judge: %s %s failed", self.command, self.path)
            status, answer = 500, {"error": "internal error (logged by the operator)", "field": None}
        self._send(status, answer)

    def _send(self, status: int, answer: Mapping[str, Any]) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status, HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="vlm-operator judge"')
        self.end_headers()
        self.wfile.write(data)

    do_POST = _answer
    do_GET = _answer

    def log_message(self, format: str, *args: Any) -> None:  # one debug line per call, no token
        log.debug("judge: %s", format % args)


def serve(j: Judge, port: int, host: str = "", *, cert_file: str = "", key_file: str = "") -> ThreadingHTTPServer:
    """Start the judge's HTTP(S) server in a daemon thread; returns it (`shutdown()` stops it)."""
    handler = type("JudgeHandler", (_Handler,), {"judge": j})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    if cert_file:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert_file, key_file or None)
        # The handshake runs in the handler thread (on its first read), not in the accepting loop.
        server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    threading.Thread(target=server.serve_forever, name="vlm-judge", daemon=True).start()
    log.info("judge endpoint listening on port %d (%s)", server.server_address[1], "https" if cert_file else "http")
    return server


class KeptCert:
    """The judge's certificate kept in a Secret (VLM_JUDGE_TLS: made and renewed by the operator, self-signed, or
    written by cert-manager) and its CA published in a ConfigMap (key `ca.crt`) for callers to trust: Argo
    Rollouts' web metric and Flagger's webhooks verify against the system roots of their controller's pod, which
    can mount that ConfigMap (docs/judge.md, "TLS"). A renewed CA is published beside the previous one until that
    expires, so a caller that mounted either still connects."""

    def __init__(self, conn: Connection, settings: Any, now: Callable[[], dt.datetime] | None = None):
        self.kube = Kube(conn, OPERATOR)  # every API call through the operator's one client
        self.namespace = settings.judge_namespace
        hosts = certs.service_hosts(settings.judge_service, self.namespace)
        self.secret = tls.SecretCert(self.kube, self.namespace, settings.judge_secret, hosts,
                                     managed=settings.judge_tls == "self-signed", now=now)
        self.configmap = settings.judge_ca_configmap
        self.cm_path = f"/api/v1/namespaces/{self.namespace}/configmaps/{self.configmap}"

    def ensure(self) -> certs.Bundle | None:
        """The bundle to serve with (None: cert-manager has not written it yet); the CA published."""
        bundle = self.secret.ensure()
        if bundle is not None and bundle.ca_bundle:
            self.publish(bundle.ca_bundle.decode())
        return bundle

    def publish(self, ca: str) -> bool:
        """Write `ca` into the ConfigMap where it differs (created when missing); True when written."""
        try:
            cm = self.kube.request_json("GET", self.cm_path) or {}
        except ApiError as e:
            if e.status != 404:
                raise
            cm = None
        if cm is not None and (cm.get("data") or {}).get("ca.crt") == ca:
            return False
        if cm is None:
            body = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": self.configmap, "namespace": self.namespace,
                                 "labels": {"app.kubernetes.io/managed-by": "vlm-operator"}},
                    "data": {"ca.crt": ca}}
            try:
                self.kube.request_json("POST", self.cm_path.rsplit("/", 1)[0], body=body)
            except ApiError as e:
                if e.status != 409:  # another replica created it: the next check compares again
                    raise
                return False
        else:
            self.kube.request_json("PATCH", self.cm_path, body={"data": {"ca.crt": ca}},
                                   content_type="application/merge-patch+json")
        log.info("Published the judge's CA in ConfigMap %s/%s", self.namespace, self.configmap)
        return True


class KeptServer(tls.Kept):
    """The judge served over HTTPS with a `KeptCert` (cluster.tls.Kept: the server starts once the certificate
    exists, and a renewed certificate serves the next connection)."""

    what = "judge"

    def __init__(self, handler: type[BaseHTTPRequestHandler], port: int, keeper: KeptCert, host: str = ""):
        super().__init__()
        self.handler, self.port, self.host, self.keeper = handler, port, host, keeper
        self._served = b""

    def refresh(self) -> None:
        bundle = self.keeper.ensure()
        if bundle is None:
            log.warning("Secret %s/%s has no certificate yet: the judge waits for it", self.keeper.namespace,
                        self.keeper.secret.name)
            return
        if bundle.tls_crt == self._served:
            return
        ctx = tls.server_context(bundle)
        if self.server is None:
            self.server = tls.TLSServer((self.host, self.port), self.handler, ctx)
            threading.Thread(target=self.server.serve_forever, name="vlm-judge", daemon=True).start()
            log.info("judge endpoint listening on port %d (https, certificate until %s)",
                     self.server.server_address[1], certs.not_after(bundle.tls_crt).isoformat())
        else:
            self.server.context = ctx
            log.info("judge certificate renewed (until %s)", certs.not_after(bundle.tls_crt).isoformat())
        self._served = bundle.tls_crt

    def shutdown(self) -> None:
        self.stop()


def start(conn: Connection, reader: sources.SidecarReader | None, settings: Any) -> ThreadingHTTPServer | KeptServer:
    """The operator's judge, as its settings say (`VLM_JUDGE_*`), on the operator's API connection and sidecar
    reader (one cache of windows for the VLMService looks and the judge's calls)."""
    reader = reader or sources.SidecarReader(timeout_s=settings.sidecar_timeout_seconds,
                                             workers=settings.sidecar_workers)
    j = Judge(conn, reader, auth=KubeAuth(conn), prometheus_url=settings.prometheus_url)
    if settings.judge_tls:
        handler = type("JudgeHandler", (_Handler,), {"judge": j})
        return KeptServer(handler, settings.judge_port, KeptCert(conn, settings)).start()
    return serve(j, settings.judge_port, cert_file=settings.judge_tls_cert_file, key_file=settings.judge_tls_key_file)
