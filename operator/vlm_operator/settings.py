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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from . import __version__
from .api import DEFAULT_SGLANG_IMAGE

PREFIX = "serving.vlmops.dev"


@dataclass(frozen=True)
class Settings:
    namespaces: tuple[str, ...] = ()
    sglang_image: str = DEFAULT_SGLANG_IMAGE
    sidecar_image: str = f"vlmops/vlm-sidecar:{__version__}"
    prometheus_url: str = ""
    log_format: str = "text"
    metrics_port: int = 8080
    resync_seconds: float = 15.0
    field_manager: str = "vlm-operator"
    extra: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        ns = tuple(n.strip() for n in env.get("VLM_NAMESPACES", "").split(",") if n.strip())
        fmt = env.get("VLM_LOG_FORMAT", "text")
        if fmt not in ("text", "json"):
            raise ValueError(f"VLM_LOG_FORMAT must be text or json, not {fmt!r}")
        return cls(
            namespaces=ns,
            sglang_image=env.get("VLM_SGLANG_IMAGE", DEFAULT_SGLANG_IMAGE),
            sidecar_image=env.get("VLM_SIDECAR_IMAGE", cls.sidecar_image),
            prometheus_url=env.get("VLM_PROMETHEUS_URL", "").rstrip("/"),
            log_format=fmt,
            metrics_port=int(env.get("VLM_METRICS_PORT", "8080")),
            resync_seconds=float(env.get("VLM_RESYNC_SECONDS", "15")),
            field_manager=env.get("VLM_FIELD_MANAGER", "vlm-operator"),
        )
