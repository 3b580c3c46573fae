"""Operator settings, from environment variables (each documented in docs/settings.md).

| env                         | default                          | meaning                                   |
|-----------------------------|----------------------------------|-------------------------------------------|
| VLM_NAMESPACES              | "" (all)                         | comma-separated namespaces to watch       |
| VLM_SGLANG_IMAGE            | api.DEFAULT_SGLANG_IMAGE         | image when spec.sglang.image is unset     |
| VLM_SIDECAR_IMAGE           | vlmops/vlm-sidecar:<version>     | profiler sidecar image                    |
| VLM_OPERATOR_IMAGE          | vlmops/vlm-operator:<version>    | the operator's image (load hook Jobs)     |
| VLM_PROMETHEUS_URL          | ""                               | Prometheus for canary analysis (Auto)     |
| VLM_PROMETHEUS_BEARER_TOKEN_FILE | ""                          | file with a bearer token for Prometheus   |
| VLM_PROMETHEUS_BASIC_AUTH_USERNAME | ""                        | basic auth user for Prometheus            |
| VLM_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE | ""                   | file with that user's password            |
| VLM_PROMETHEUS_CA_FILE      | "" (system CAs)                  | PEM CA bundle Prometheus' TLS cert chains to |
| VLM_PROMETHEUS_HEADERS      | {} (JSON object)                 | extra request headers (X-Scope-OrgID)     |
| VLM_AUTOSCALING_PROMETHEUS_URL | "" (VLM_PROMETHEUS_URL)       | Prometheus KEDA queries for spec.autoscaling |
| VLM_AUTOSCALING_TRIGGER_AUTH | ""                              | a KEDA ClusterTriggerAuthentication for it |
| VLM_LOG_FORMAT              | text                             | text or json                              |
| VLM_METRICS_PORT            | 8080                             | the operator's own /metrics               |
| VLM_JUDGE_PORT              | 0 (off)                          | the judge endpoint (docs/judge.md)        |
| VLM_JUDGE_TLS_CERT_FILE, VLM_JUDGE_TLS_KEY_FILE | "" (HTTP)    | its HTTPS certificate and key             |
| VLM_JUDGE_TLS               | ""                               | self-signed or cert-manager: its certificate in VLM_JUDGE_SECRET |
| VLM_JUDGE_NAMESPACE         | ""                               | the judge's Secret's and ConfigMap's namespace |
| VLM_JUDGE_SERVICE           | vlm-operator-judge               | the judge's Service (its certificate's names) |
| VLM_JUDGE_SECRET            | vlm-operator-judge-tls           | the Secret with its certificate           |
| VLM_JUDGE_CA_CONFIGMAP      | vlm-operator-judge-ca            | the ConfigMap its CA is published in      |
| VLM_RESYNC_SECONDS          | 15                               | status refresh and drift-repair timer     |
| VLM_FIELD_MANAGER           | vlm-operator                     | server-side apply field manager           |
| VLM_NETWORK_POLICY          | true                             | telemetry.networkPolicy Auto: create one  |
| VLM_PROFILER_PEERS          | DEFAULT_PROFILER_PEERS (JSON)    | NetworkPolicy peers admitted to port 9400 |
| VLM_PROFILER_SCRAPERS       | ""                               | more of them: [namespace/]app.kubernetes.io/name, comma-separated |
| VLM_PROFILER_PEER_CIDRS     | ""                               | more of them: CIDRs (API server proxy, host-network agents) |
| VLM_SIDECAR_IMAGE_PULL_SECRETS | ""                            | pull secrets for the sidecar image, added to every pod's |
| VLM_SIDECAR_TIMEOUT_SECONDS | 1                                | timeout of one sidecar /windows.json read |
| VLM_SIDECAR_WORKERS         | 8                                | concurrent sidecar reads (shared pool)    |
| VLM_HANDLER_THREADS         | 16                               | reconciles running at once                |
| VLM_PROFILER_TOLERANCE      | 0.05                             | status.profiler: relative loop change shown |
| VLM_PROFILER_REFRESH_SECONDS | 1800                            | status.profiler rewritten at least this often |
| VLM_MONITORING_LABELS       | {} (JSON object)                 | extra labels on PodMonitor/PrometheusRule |
| VLM_ALERT_OVERRIDES         | {} (JSON object)                 | per alert: its `for` and/or severity       |
| VLM_PEERING_LIFETIME_SECONDS | 60                              | --peering: a peer unseen this long is dead |
| VLM_MALLOC_TRIM_SECONDS     | 30 (0: off)                      | return glibc's free heap pages this often  |
| VLM_ALLOCATOR               | auto                             | auto/jemalloc: re-exec under jemalloc; pymalloc |
| VLM_INJECTION               | false                            | serve the sidecar injection webhook        |
| VLM_WEBHOOK_PORT            | 9443                             | its HTTPS port                             |
| VLM_WEBHOOK_ADDR            | 0.0.0.0                          | its listen address                         |
| VLM_WEBHOOK_TLS             | self-signed                      | self-signed (the operator's own CA) or cert-manager |
| VLM_WEBHOOK_SECRET          | vlm-operator-webhook-tls         | Secret with its serving certificate        |
| VLM_WEBHOOK_SERVICE         | vlm-operator-webhook             | its Service (the certificate's DNS names)  |
| VLM_WEBHOOK_NAMESPACE       | "" (required with injection)     | the operator's namespace (never injected)  |
| VLM_WEBHOOK_CONFIGURATION   | vlm-operator                     | MutatingWebhookConfiguration whose caBundle it writes |
| VLM_WEBHOOK_CERT_HOSTS      | ""                               | more DNS names / IPs in the certificate    |

Read by pydantic-settings: each field of `Settings` is the variable `VLM_<FIELD>` (empty counts as unset).
`Settings.from_env()` raises `SettingsError` with one line per bad variable, naming it
(`VLM_METRICS_PORT: not a valid integer (got 'abc')`); `vlm-operator` prints that and exits 2.
`Settings(...)` with keywords reads no environment (tests and builders stay pure).

Adding a setting: one annotated field with its default and `description=` below, a row in the table above
and in docs/settings.md (its generated table: `python hack/gen-docs.py`; its Details table by hand); comma lists and JSON values need `NoDecode` plus a `mode="before"` validator (as
`namespaces` and `profiler_peers`), so a bad value fails with the variable's name, never a traceback.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from vlm_operator import __version__
from vlm_operator.api.names import LABEL_APP_NAME, OPERATOR, OPERATOR_LABELS, PREFIX
from vlm_operator.api.v1alpha1 import DEFAULT_SGLANG_IMAGE

ENV_PREFIX = "VLM_"
# Who may reach the sidecar's port: the operator's pods (the chart's selector label) and Prometheus (the
# Prometheus Operator labels its pods app.kubernetes.io/name=prometheus), in any namespace. Narrow them with
# namespaceSelector, or add an ipBlock for the API server (kubectl vlm profile goes through its pod proxy).
DEFAULT_PROFILER_PEERS: tuple[dict, ...] = (
    {"namespaceSelector": {}, "podSelector": {"matchLabels": {LABEL_APP_NAME: OPERATOR}}},
    {"namespaceSelector": {}, "podSelector": {"matchLabels": {LABEL_APP_NAME: "prometheus"}}},
)
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# The label the API server sets on every namespace (its name): a scraper's namespace is selected by it.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
# Kubernetes label keys ([prefix/]name) and values.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")
# HTTP header names (RFC 9110 tokens) and values (no control characters: no header injection).
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_HEADER_VALUE = re.compile(r"^[^\x00-\x1f\x7f]*$")
_RESERVED_HEADERS = frozenset({"authorization", "proxy-authorization", "host", "content-length", "content-type",
                               "connection", "transfer-encoding"})

def _json(v: Any) -> Any:
    """A JSON-valued variable: parsed when it is still text (an environment value), as is otherwise."""
    if not isinstance(v, str):
        return v
    try:
        return json.loads(v)
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None


def _string_map(v: Any, what: str) -> Mapping[str, str]:
    """A JSON object (or a mapping) of strings to strings; anything else is refused naming `what` it maps."""
    v = _json(v)
    if not isinstance(v, Mapping) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        raise ValueError(f"must be a JSON object of {what}")
    return v


def _split(v: Any) -> tuple[Any, ...]:
    """A comma-separated variable: its non-empty, stripped items (a list as is)."""
    if isinstance(v, str):
        v = [x.strip() for x in v.split(",") if x.strip()]
    return tuple(v)


def _scraper_ok(x: Any) -> bool:
    if not isinstance(x, str) or x.count("/") > 1:
        return False
    ns, _, name = x.rpartition("/")
    return bool(name) and bool(_LABEL_VALUE.match(name)) and len(name) <= 63 and (not ns or bool(_NAMESPACE.match(ns)))


def _ip_ok(x: Any) -> bool:
    try:
        ipaddress.ip_address(x)
    except ValueError:
        return False
    return True


def _cidr_ok(x: Any) -> bool:
    if not isinstance(x, str) or "/" not in x:
        return False
    try:
        ipaddress.ip_network(x, strict=False)
    except ValueError:
        return False
    return True


_SELECTOR_KEYS = {"matchLabels", "matchExpressions"}


def _peer_error(peer: dict) -> str:
    """Why a NetworkPolicyPeer would make the API server refuse every NetworkPolicy ("" when it would not)."""
    unknown = set(peer) - {"podSelector", "namespaceSelector", "ipBlock"}
    if unknown:
        return f"unknown field {sorted(unknown)[0]}"
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        if len(peer) > 1:
            return "ipBlock goes alone"
        if not isinstance(block, dict) or not _cidr_ok(block.get("cidr")):
            return "ipBlock needs a cidr"
        if not all(_cidr_ok(c) for c in block.get("except", [])):
            return "ipBlock.except takes CIDRs"
        return ""
    for key in ("podSelector", "namespaceSelector"):
        sel = peer.get(key, {})
        if not isinstance(sel, dict) or set(sel) - _SELECTOR_KEYS:
            return f"{key} must be a label selector (matchLabels, matchExpressions)"
    return ""


class SettingsError(ValueError):
    """Settings the operator cannot start with; the message names each variable, one per line."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True, frozen=True, extra="ignore")

    namespaces: Annotated[tuple[str, ...], NoDecode] = Field((), description="namespaces to watch (comma-separated)")
    sglang_image: str = Field(DEFAULT_SGLANG_IMAGE, min_length=1, description="image when spec.sglang.image is unset")
    sidecar_image: str = Field(f"vlmops/vlm-sidecar:{__version__}", min_length=1, description="profiler sidecar image")
    operator_image: str = Field(f"vlmops/vlm-operator:{__version__}", min_length=1,
                                description="the operator's own image: the load hook's Job runs it")
    prometheus_url: str = Field("", description="Prometheus for canary analysis (source Auto)")
    # Credentials for VLM_PROMETHEUS_URL (Mimir, Thanos, a managed Prometheus): files, re-read at every query so a
    # rotated Secret takes effect; sent to that URL's scheme, host and port only (sources/base.PrometheusAuth).
    prometheus_bearer_token_file: str = Field(
        "", description="file holding a bearer token for VLM_PROMETHEUS_URL (re-read at every query)")
    prometheus_basic_auth_username: str = Field(
        "", description="basic auth user for VLM_PROMETHEUS_URL (with VLM_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE)")
    prometheus_basic_auth_password_file: str = Field(
        "", validate_default=True, description="file holding the basic auth password (re-read at every query)")
    prometheus_ca_file: str = Field(
        "", description="PEM file of the CA(s) Prometheus' TLS certificate chains to (instead of the system CAs)")
    prometheus_headers: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description='extra headers on every request to VLM_PROMETHEUS_URL (JSON object), e.g. {"X-Scope-OrgID": '
                    '"team-a"} for a Mimir/Cortex tenant')
    autoscaling_prometheus_url: str = Field(
        "", description="Prometheus that KEDA's Prometheus scaler queries for spec.autoscaling (default: "
                        "VLM_PROMETHEUS_URL); KEDA's own pods must reach it")
    autoscaling_trigger_auth: str = Field(
        "", pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$", max_length=253,
        description="name of a KEDA ClusterTriggerAuthentication the ScaledObjects' Prometheus triggers use "
                    "(bearer, basic or TLS auth to that Prometheus)")
    log_format: Literal["text", "json"] = Field("text", description="text or json")
    metrics_port: int = Field(8080, ge=0, le=65535, description="the operator's own /metrics port")
    judge_port: int = Field(0, ge=0, le=65535, description="the judge endpoint's port (Argo Rollouts, Flagger; "
                            "docs/judge.md); 0: not served")
    judge_tls_cert_file: str = Field("", description="PEM certificate (chain) the judge endpoint serves HTTPS with; "
                                     "empty: plain HTTP")
    judge_tls_key_file: str = Field("", validate_default=True, description="the certificate's PEM private key")
    judge_tls: Literal["", "self-signed", "cert-manager"] = Field(
        "", description="the judge's certificate kept in VLM_JUDGE_SECRET instead of files: self-signed (the operator "
                        "makes and renews a CA and the serving pair, and publishes the CA in VLM_JUDGE_CA_CONFIGMAP for "
                        "callers to trust) or cert-manager (cert-manager writes the Secret; the operator reads it and "
                        "publishes its ca.crt); empty: the files above, or plain HTTP")
    judge_namespace: str = Field("", validate_default=True,
                                 description="the operator's namespace: the judge's Secret's and ConfigMap's")
    judge_service: str = Field("vlm-operator-judge", min_length=1,
                               description="the judge's Service: its DNS names go in the certificate")
    judge_secret: str = Field("vlm-operator-judge-tls", min_length=1,
                              description="Secret (in VLM_JUDGE_NAMESPACE) with the judge's certificate")
    judge_ca_configmap: str = Field("vlm-operator-judge-ca", min_length=1,
                                    description="ConfigMap (in VLM_JUDGE_NAMESPACE) the judge's CA is published in "
                                                "(key ca.crt), for callers to mount")
    resync_seconds: float = Field(15.0, gt=0, description="status refresh, drift repair and analysis timer")
    field_manager: str = Field(OPERATOR, min_length=1, description="server-side apply field manager")
    network_policy: bool = Field(True, description="telemetry.networkPolicy Auto creates a NetworkPolicy")
    profiler_peers: Annotated[tuple[dict, ...], NoDecode] = Field(
        DEFAULT_PROFILER_PEERS, description="NetworkPolicyPeer objects admitted to the sidecar's port (JSON list)")
    profiler_scrapers: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="scrapers admitted to the sidecar's port besides profiler_peers, comma-separated "
                        "[namespace/]name: pods labelled app.kubernetes.io/name=name, in that namespace or any, e.g. "
                        "monitoring/alloy,vmagent")
    profiler_peer_cidrs: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="CIDRs admitted to the sidecar's port besides profiler_peers, comma-separated: the API "
                        "server's addresses (kubectl vlm profile goes through its pod proxy), scrapers on the host "
                        "network")
    sidecar_image_pull_secrets: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Secrets (names, comma-separated) for pulling the sidecar image, added to each serving pod's "
                        "imagePullSecrets (after spec.pod.imagePullSecrets) while it runs the sidecar")
    sidecar_timeout_seconds: float = Field(
        1.0, gt=0, le=30, description="timeout of one sidecar /windows.json read (a dead pod costs it once per window)")
    sidecar_workers: int = Field(8, ge=1, le=128, description="sidecar reads in flight at once, over all services")
    handler_threads: int = Field(16, ge=1, le=128, description="reconciles running at once (kopf's handler threads; "
                                 "each also holds one API connection)")
    profiler_tolerance: float = Field(
        0.05, ge=0, lt=1, description="status.profiler loopP50/loopP95 are rewritten when they move by more than this")
    profiler_refresh_seconds: float = Field(
        1800.0, gt=0, description="status.profiler is rewritten at least this often while windows arrive")
    peering_lifetime_seconds: int = Field(
        60, ge=15, le=3600,
        description="with --peering: a replica not seen for this long is dead and a standby takes over "
                    "(keep-alives every third of it)")
    allocator: Literal["auto", "jemalloc", "pymalloc"] = Field(
        "auto",
        description="memory allocator: auto runs the operator under jemalloc when libjemalloc.so.2 is installed "
                    "(the operator image has it), else Python's own; jemalloc requires it")
    malloc_trim_seconds: float = Field(
        30.0, ge=0, le=3600,
        description="every this many seconds, glibc's free heap pages are handed back to the kernel "
                    "(malloc_trim); 0: never")
    monitoring_labels: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="extra labels on the PodMonitor and PrometheusRule the operator creates (JSON object), e.g. "
                    '{"release": "kube-prometheus-stack"} for the Prometheus Operator\'s selectors')
    alert_overrides: Annotated[dict[str, dict[str, str]], NoDecode] = Field(
        default_factory=dict,
        description="per shipped alert, its `for` and/or severity in the PrometheusRule the operator creates "
                    '(JSON object), e.g. {"VLMSchedulerLoopLatencyRegression": {"for": "5m"}}; the chart\'s '
                    "monitoring.customRules")

    injection: bool = Field(False, description="serve the profiler sidecar injection webhook (docs/injection.md)")
    webhook_port: int = Field(9443, ge=1, le=65535, description="the injection webhook's HTTPS port")
    webhook_addr: str = Field("0.0.0.0", min_length=1, description="the injection webhook's listen address")
    webhook_tls: Literal["self-signed", "cert-manager"] = Field(
        "self-signed", description="self-signed: the operator keeps a CA and serving certificate in "
                                   "VLM_WEBHOOK_SECRET and writes the CA into the webhook's caBundle; cert-manager: "
                                   "cert-manager does both, the operator only reads the Secret")
    webhook_secret: str = Field("vlm-operator-webhook-tls", min_length=1,
                                description="Secret (in VLM_WEBHOOK_NAMESPACE) with the webhook's certificate")
    webhook_service: str = Field("vlm-operator-webhook", min_length=1,
                                 description="the webhook's Service: its DNS names go in the certificate")
    webhook_namespace: str = Field("", description="the operator's namespace (the chart sets it): its Secret's, "
                                                   "and never injected")
    webhook_configuration: str = Field("vlm-operator", min_length=1,
                                       description="the MutatingWebhookConfiguration whose caBundle it writes")
    webhook_cert_hosts: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="more DNS names or IP addresses in the webhook's certificate (comma-separated)")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   **_: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        # Keywords only: the environment is read by from_env, from the mapping it is given.
        return (init_settings,)

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split_namespaces(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [n.strip() for n in v.split(",") if n.strip()]
        bad = [n for n in v if not isinstance(n, str) or not _NAMESPACE.match(n)]
        if bad:
            raise ValueError(f"not a namespace name: {', '.join(map(repr, bad))}")
        return tuple(v)

    @field_validator("prometheus_url", mode="after")
    @classmethod
    def _strip_slash(cls, v: str) -> str:
        if v and not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"not an http(s) URL: {v!r}")
        return v.rstrip("/")

    @field_validator("prometheus_headers", mode="before")
    @classmethod
    def _prometheus_headers(cls, v: Any) -> Any:
        v = _string_map(v, 'header names to string values, e.g. {"X-Scope-OrgID": "a"}')
        bad = [k for k in v if not _HEADER_NAME.match(k)] + [f"{k}: {x!r}" for k, x in v.items() if not _HEADER_VALUE.match(x)]
        if bad:
            raise ValueError(f"not a valid header: {', '.join(map(repr, bad))}")
        reserved = [k for k in v if k.lower() in _RESERVED_HEADERS]
        if reserved:
            raise ValueError(f"set by the operator itself: {', '.join(reserved)} (credentials go in "
                             "VLM_PROMETHEUS_BEARER_TOKEN_FILE or VLM_PROMETHEUS_BASIC_AUTH_*)")
        return dict(v)

    @field_validator("prometheus_bearer_token_file", "prometheus_basic_auth_username",
                     "prometheus_basic_auth_password_file", "prometheus_ca_file", mode="after")
    @classmethod
    def _prometheus_auth(cls, v: str, info: ValidationInfo) -> str:
        # (a bad VLM_PROMETHEUS_URL is reported on its own: it is then missing from info.data)
        if v and "prometheus_url" in info.data and not info.data["prometheus_url"]:
            raise ValueError("needs VLM_PROMETHEUS_URL (credentials and the CA are used for that URL only)")
        user = info.data.get("prometheus_basic_auth_username")
        if info.field_name == "prometheus_basic_auth_password_file" and bool(v) != bool(user):
            raise ValueError("needs VLM_PROMETHEUS_BASIC_AUTH_USERNAME" if v else
                             "needed with VLM_PROMETHEUS_BASIC_AUTH_USERNAME (basic auth takes both)")
        if v and info.field_name == "prometheus_basic_auth_username" and info.data.get("prometheus_bearer_token_file"):
            raise ValueError("either basic auth or VLM_PROMETHEUS_BEARER_TOKEN_FILE, not both")
        return v

    @field_validator("judge_tls_key_file", mode="after")
    @classmethod
    def _judge_tls(cls, v: str, info: ValidationInfo) -> str:
        if bool(v) != bool(info.data.get("judge_tls_cert_file")):
            raise ValueError("goes with VLM_JUDGE_TLS_CERT_FILE: both or neither")
        return v

    @field_validator("judge_namespace", mode="after")
    @classmethod
    def _judge_namespace(cls, v: str, info: ValidationInfo) -> str:
        if v and not _NAMESPACE.match(v):
            raise ValueError(f"not a namespace name: {v!r}")
        if info.data.get("judge_tls") and info.data.get("judge_tls_cert_file"):
            raise ValueError("VLM_JUDGE_TLS keeps the certificate in a Secret: not with VLM_JUDGE_TLS_CERT_FILE")
        if not v and info.data.get("judge_tls"):
            raise ValueError("needed with VLM_JUDGE_TLS (the chart sets it to the operator's namespace)")
        return v

    @field_validator("profiler_peers", mode="before")
    @classmethod
    def _peers(cls, v: Any) -> Any:
        v = _json(v)
        if not isinstance(v, list | tuple) or not all(isinstance(p, dict) and p for p in v):
            raise ValueError("must be a JSON list of NetworkPolicyPeer objects")
        bad = [json.dumps(p) for p in v if _peer_error(p)]
        if bad:
            raise ValueError(f"not a NetworkPolicyPeer ({_peer_error(json.loads(bad[0]))}): {', '.join(bad)}")
        return tuple(v)

    @field_validator("profiler_scrapers", mode="before")
    @classmethod
    def _scrapers(cls, v: Any) -> Any:
        v = _split(v)
        bad = [x for x in v if not _scraper_ok(x)]
        if bad:
            raise ValueError(f"not [namespace/]name (a namespace and an app.kubernetes.io/name value): "
                             f"{', '.join(map(repr, bad))}")
        return v

    @field_validator("profiler_peer_cidrs", mode="before")
    @classmethod
    def _cidrs(cls, v: Any) -> Any:
        v = _split(v)
        bad = [x for x in v if not _cidr_ok(x)]
        if bad:
            raise ValueError(f"not a CIDR such as 10.0.0.0/24: {', '.join(map(repr, bad))}")
        return v

    @field_validator("sidecar_image_pull_secrets", mode="before")
    @classmethod
    def _pull_secrets(cls, v: Any) -> Any:
        v = _split(v)
        bad = [x for x in v if not (len(x) <= 253 and _SUBDOMAIN.match(x))]
        if bad:
            raise ValueError(f"not a Secret name: {', '.join(map(repr, bad))}")
        return tuple(dict.fromkeys(v))

    @field_validator("webhook_cert_hosts", mode="before")
    @classmethod
    def _cert_hosts(cls, v: Any) -> Any:
        v = _split(v)
        bad = [x for x in v if not (_SUBDOMAIN.match(x) or _ip_ok(x))]
        if bad:
            raise ValueError(f"not a DNS name or IP address: {', '.join(map(repr, bad))}")
        return tuple(dict.fromkeys(v))

    @field_validator("webhook_namespace", mode="after")
    @classmethod
    def _webhook_namespace(cls, v: str, info: ValidationInfo) -> str:
        if v and not _NAMESPACE.match(v):
            raise ValueError(f"not a namespace name: {v!r}")
        if not v and info.data.get("injection"):
            raise ValueError("needed with VLM_INJECTION=true (the chart sets it to the operator's namespace)")
        return v

    @property
    def network_policy_peers(self) -> tuple[dict, ...]:
        """Every NetworkPolicyPeer admitted to the sidecar's port: profiler_peers, then one per scraper, then one
        ipBlock per CIDR."""
        out = list(self.profiler_peers)
        for x in self.profiler_scrapers:
            ns, _, name = x.rpartition("/")
            peer = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: ns}} if ns else {},
                    "podSelector": {"matchLabels": {LABEL_APP_NAME: name}}}
            if peer not in out:
                out.append(peer)
        out += [{"ipBlock": {"cidr": c}} for c in self.profiler_peer_cidrs if {"ipBlock": {"cidr": c}} not in out]
        return tuple(out)

    @field_validator("monitoring_labels", mode="before")
    @classmethod
    def _monitoring_labels(cls, v: Any) -> Any:
        v = _string_map(v, 'label names to string values, e.g. {"release": "prom"}')
        bad = [k for k in v if not _LABEL_KEY.match(k) or len(k.rpartition("/")[2]) > 63]
        bad += [f"{k}={x}" for k, x in v.items() if not _LABEL_VALUE.match(x)]
        if bad:
            raise ValueError(f"not a valid label: {', '.join(map(repr, bad))}")
        reserved = [k for k in v if k in OPERATOR_LABELS or k.startswith(f"{PREFIX}/")]
        if reserved:
            raise ValueError(f"reserved for the operator's own labels: {', '.join(map(repr, reserved))}")
        return dict(v)

    @field_validator("alert_overrides", mode="before")
    @classmethod
    def _alert_overrides(cls, v: Any) -> Any:
        # The shape here; the names and values against the shipped rules by alerts.override_errors (a layer up).
        v = _json(v)
        if not isinstance(v, Mapping) or not all(
                isinstance(o, Mapping) and all(isinstance(x, str) for x in o.values()) for o in v.values()):
            raise ValueError('must be a JSON object of alert names to objects of strings, e.g. '
                             '{"VLMOperatorDown": {"for": "10m", "severity": "critical"}}')
        return {k: dict(o) for k, o in v.items()}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings from `env` (default: os.environ); SettingsError naming every bad variable."""
        source = _MappingEnvSource(cls, env)
        try:
            return cls(**source())
        except ValidationError as e:
            raise SettingsError("\n".join(_message(err) for err in e.errors())) from None


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' env source (prefix, case, empty values as unset) over a given mapping."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str] | None) -> None:
        self._given = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        if self._given is None:
            return super()._load_env_vars()
        return {k.lower(): v for k, v in self._given.items() if v != ""}


def env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


_PLAIN = {
    "int_parsing": "not a valid integer",
    "int_from_float": "not a valid integer",
    "float_parsing": "not a valid number",
    "bool_parsing": "not a valid boolean (true or false)",
}


def _message(err: Mapping[str, Any]) -> str:
    """One pydantic error as `VLM_NAME: what is wrong (got 'value')`."""
    name = env_name(str(err["loc"][0])) if err.get("loc") else "settings"
    text = _PLAIN.get(err["type"]) or str(err["msg"]).removeprefix("Value error, ")
    text = text.replace("Input should be", "must be") if text.startswith("Input should be") else text
    value = err.get("input")
    got = f" (got {value!r})" if isinstance(value, str) and err["type"] != "value_error" else ""
    return f"{name}: {text[0].lower() + text[1:] if text else text}{got}"
