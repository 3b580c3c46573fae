"""Operator settings, from environment variables (each documented in the README).

| env                         | default                          | meaning                                   |
|-----------------------------|----------------------------------|-------------------------------------------|
| VLM_NAMESPACES              | "" (all)                         | comma-separated namespaces to watch       |
| VLM_SGLANG_IMAGE            | api.DEFAULT_SGLANG_IMAGE         | image when spec.sglang.image is unset     |
| VLM_SIDECAR_IMAGE           | vlmops/vlm-sidecar:<version>     | profiler sidecar image                    |
| VLM_PROMETHEUS_URL          | ""                               | Prometheus for canary analysis (Auto)     |
| VLM_LOG_FORMAT              | text                             | text or json                              |
| VLM_METRICS_PORT            | 8080                             | the operator's own /metrics               |
| VLM_RESYNC_SECONDS          | 15                               | status refresh and drift-repair timer     |
| VLM_FIELD_MANAGER           | vlm-operator                     | server-side apply field manager           |
| VLM_NETWORK_POLICY          | true                             | telemetry.networkPolicy Auto: create one  |
| VLM_PROFILER_PEERS          | DEFAULT_PROFILER_PEERS (JSON)    | NetworkPolicy peers admitted to port 9400 |
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

Read by pydantic-settings: each field of `Settings` is the variable `VLM_<FIELD>` (empty counts as unset).
`Settings.from_env()` raises `SettingsError` with one line per bad variable, naming it
(`VLM_METRICS_PORT: not a valid integer (got 'abc')`); `vlm-operator` prints that and exits 2.
`Settings(...)` with keywords reads no environment (tests and builders stay pure).

Adding a setting: one annotated field with its default and `description=` below, a row in the table above
and the README's; comma lists and JSON values need `NoDecode` plus a `mode="before"` validator (as
`namespaces` and `profiler_peers`), so a bad value fails with the variable's name, never a traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from . import __version__
from .api import DEFAULT_SGLANG_IMAGE
from .names import LABEL_APP_NAME, OPERATOR, OPERATOR_LABELS, PREFIX

ENV_PREFIX = "VLM_"
# Who may reach the sidecar's port: the operator's pods (the chart's selector label) and Prometheus (the
# Prometheus Operator labels its pods app.kubernetes.io/name=prometheus), in any namespace. Narrow them with
# namespaceSelector, or add an ipBlock for the API server (kubectl vlm profile goes through its pod proxy).
DEFAULT_PROFILER_PEERS: tuple[dict, ...] = (
    {"namespaceSelector": {}, "podSelector": {"matchLabels": {LABEL_APP_NAME: OPERATOR}}},
    {"namespaceSelector": {}, "podSelector": {"matchLabels": {LABEL_APP_NAME: "prometheus"}}},
)
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# Kubernetes label keys ([prefix/]name) and values.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")

def _json(v: Any) -> Any:
    """A JSON-valued variable: parsed when it is still text (an environment value), as is otherwise."""
    if not isinstance(v, str):
        return v
    try:
        return json.loads(v)
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None


class SettingsError(ValueError):
    """Settings the operator cannot start with; the message names each variable, one per line."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True, frozen=True, extra="ignore")

    namespaces: Annotated[tuple[str, ...], NoDecode] = Field((), description="namespaces to watch (comma-separated)")
    sglang_image: str = Field(DEFAULT_SGLANG_IMAGE, min_length=1, description="image when spec.sglang.image is unset")
    sidecar_image: str = Field(f"vlmops/vlm-sidecar:{__version__}", min_length=1, description="profiler sidecar image")
    prometheus_url: str = Field("", description="Prometheus for canary analysis (source Auto)")
    log_format: Literal["text", "json"] = Field("text", description="text or json")
    metrics_port: int = Field(8080, ge=0, le=65535, description="the operator's own /metrics port")
    resync_seconds: float = Field(15.0, gt=0, description="status refresh, drift repair and analysis timer")
    field_manager: str = Field(OPERATOR, min_length=1, description="server-side apply field manager")
    network_policy: bool = Field(True, description="telemetry.networkPolicy Auto creates a NetworkPolicy")
    profiler_peers: Annotated[tuple[dict, ...], NoDecode] = Field(
        DEFAULT_PROFILER_PEERS, description="NetworkPolicyPeer objects admitted to the sidecar's port (JSON list)")
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

    @field_validator("profiler_peers", mode="before")
    @classmethod
    def _peers(cls, v: Any) -> Any:
        v = _json(v)
        if not isinstance(v, list | tuple) or not all(isinstance(p, dict) and p for p in v):
            raise ValueError("must be a JSON list of NetworkPolicyPeer objects")
        return tuple(v)

    @field_validator("monitoring_labels", mode="before")
    @classmethod
    def _monitoring_labels(cls, v: Any) -> Any:
        v = _json(v)
        if not isinstance(v, Mapping) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
            raise ValueError('must be a JSON object of label names to string values, e.g. {"release": "prom"}')
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
