"""What every signal source shares: the error that means "no data could be read", one JSON GET, and how the
operator authenticates to Prometheus (`PrometheusAuth`)."""

from __future__ import annotations

import base64
import json
import os
import ssl
import threading
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TIMEOUT_S = 5.0  # default of get_json (the Prometheus reads); sidecar reads use SidecarReader.timeout_s


class SignalsUnavailable(Exception):
    """No data could be read (Prometheus down, no sidecar answering): Inconclusive, never "no regression"."""


def get_json(url: str, timeout: float = TIMEOUT_S, *, headers: Mapping[str, str] | None = None,
             context: ssl.SSLContext | None = None) -> Any:
    """GET `url` and parse its JSON. `headers` are not carried over a redirect (credentials stay with the
    host they were meant for); `context` verifies an https URL's certificate (None: the system's CAs)."""
    req = urllib.request.Request(url)
    for k, v in (headers or {}).items():
        req.add_unredirected_header(k, v)
    with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
        return json.loads(r.read())


def _origin(url: str) -> tuple[str, str, int | None]:
    u = urllib.parse.urlsplit(url)
    scheme = u.scheme.lower()
    return scheme, (u.hostname or "").lower(), u.port or {"http": 80, "https": 443}.get(scheme)


@dataclass(frozen=True)
class PrometheusAuth:
    """Credentials, extra headers and the CA for the operator's Prometheus (VLM_PROMETHEUS_URL): Mimir, Thanos or
    a managed Prometheus behind authentication.

    The files are read at every request (`request_headers`, `ssl_context`), so a rotated token, password or CA
    (a Secret the kubelet updates in place) takes effect without a restart. Everything is sent to the scheme,
    host and port of `url` only: a VLMService's own `rollout.analysis.prometheusURL` elsewhere gets nothing, so
    whoever may edit a VLMService cannot make the operator send its Prometheus credentials to a host they pick.
    A file that cannot be read raises SignalsUnavailable naming its variable (the look is Inconclusive)."""

    url: str = ""
    bearer_token_file: str = ""
    basic_auth_username: str = ""
    basic_auth_password_file: str = ""
    ca_file: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    _contexts: dict[tuple[str, int, int], ssl.SSLContext] = field(default_factory=dict, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    # The variables, as settings.Settings reads them.
    ENV = ("VLM_PROMETHEUS_URL", "VLM_PROMETHEUS_BEARER_TOKEN_FILE", "VLM_PROMETHEUS_BASIC_AUTH_USERNAME",
           "VLM_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE", "VLM_PROMETHEUS_CA_FILE", "VLM_PROMETHEUS_HEADERS")

    @classmethod
    def from_settings(cls, s: Any) -> PrometheusAuth:
        """From a `settings.Settings` (validated: a bad combination already stopped the operator at start)."""
        return cls(url=s.prometheus_url, bearer_token_file=s.prometheus_bearer_token_file,
                   basic_auth_username=s.prometheus_basic_auth_username,
                   basic_auth_password_file=s.prometheus_basic_auth_password_file, ca_file=s.prometheus_ca_file,
                   headers=tuple(sorted(s.prometheus_headers.items())))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PrometheusAuth:
        """From the VLM_PROMETHEUS_* variables of `env` (default: os.environ), validated as the operator's
        settings validate them (SettingsError on a bad value)."""
        from vlm_operator.api.settings import Settings

        env = os.environ if env is None else env
        return cls.from_settings(Settings.from_env({k: env[k] for k in cls.ENV if k in env}))

    @property
    def configured(self) -> bool:
        return bool(self.bearer_token_file or self.basic_auth_username or self.ca_file or self.headers)

    def applies_to(self, url: str) -> bool:
        return bool(self.url) and _origin(url) == _origin(self.url)

    def _read(self, path: str, variable: str) -> str:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise SignalsUnavailable(f"Prometheus credentials not readable: {variable} {path}: {e}") from e

    def request_headers(self, url: str) -> dict[str, str]:
        """The headers of one request to `url`: none unless it goes to VLM_PROMETHEUS_URL's origin."""
        if not self.applies_to(url):
            return {}
        out = dict(self.headers)
        if self.bearer_token_file:
            token = self._read(self.bearer_token_file, "VLM_PROMETHEUS_BEARER_TOKEN_FILE").strip()
            if not token:
                raise SignalsUnavailable(f"Prometheus credentials: VLM_PROMETHEUS_BEARER_TOKEN_FILE "
                                         f"{self.bearer_token_file} is empty")
            out["Authorization"] = f"Bearer {token}"
        elif self.basic_auth_username:
            password = self._read(self.basic_auth_password_file, "VLM_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE")
            pair = f"{self.basic_auth_username}:{password.rstrip(chr(13) + chr(10))}".encode()
            out["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        return out

    def ssl_context(self, url: str) -> ssl.SSLContext | None:
        """The context verifying `url`'s certificate against VLM_PROMETHEUS_CA_FILE (only that CA; rebuilt when
        the file changes), or None (the system's CAs) for other URLs or without a CA file."""
        if not self.ca_file or not self.applies_to(url) or not url.lower().startswith("https:"):
            return None
        try:
            st = os.stat(self.ca_file)
        except OSError as e:
            raise SignalsUnavailable(f"Prometheus CA not readable: VLM_PROMETHEUS_CA_FILE {self.ca_file}: {e}") from e
        key = (self.ca_file, st.st_mtime_ns, st.st_size)
        with self._lock:
            ctx = self._contexts.get(key)
            if ctx is None:
                try:
                    ctx = ssl.create_default_context(cafile=self.ca_file)
                except (OSError, ssl.SSLError) as e:
                    raise SignalsUnavailable(
                        f"Prometheus CA not usable: VLM_PROMETHEUS_CA_FILE {self.ca_file}: {e}") from e
                self._contexts.clear()
                self._contexts[key] = ctx
        return ctx


_auth: PrometheusAuth | None = None
_auth_lock = threading.Lock()


def configure_prometheus_auth(auth: PrometheusAuth | None) -> None:
    """Set the operator-wide Prometheus auth (None: read the environment again at the next request)."""
    global _auth
    with _auth_lock:
        _auth = auth


def prometheus_auth() -> PrometheusAuth:
    """The operator-wide Prometheus auth: `configure_prometheus_auth`'s, else the VLM_PROMETHEUS_* variables,
    read once (their files are read at every request)."""
    global _auth
    with _auth_lock:
        if _auth is None:
            _auth = PrometheusAuth.from_env()
        return _auth
