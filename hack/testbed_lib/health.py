"""Health probes and small admin-token API reads over HTTP(S), standard library only."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from . import netns
from .components import Probe
from .layout import Layout
from .pki import read_tokens


def _context(layout: Layout, url: str) -> ssl.SSLContext | None:
    if not url.startswith("https://"):
        return None
    if url.startswith(layout.api_url):
        return ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    # kube-controller-manager and kube-scheduler serve /healthz with a self-signed cert of their
    # own; the probe only asks whether they answer, so it does not verify it.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _get(layout: Layout, url: str, auth: bool, timeout: float, inside: bool = True) -> tuple[int, str]:
    """GET in the testbed's namespace (inside) or outside it (the API-server bridge's side)."""
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", f"Bearer {read_tokens(layout)['admin']}")
    where = (layout.netns or None) if inside else netns.outside(layout.netns)
    with netns.entered(where):
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=_context(layout, url)) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")


def probe(layout: Layout, p: Probe, timeout: float = 2.0) -> tuple[bool, str]:
    """(healthy, short detail). Connection errors count as unhealthy, never raise."""
    try:
        code, body = _get(layout, p.url, p.auth, timeout, p.inside)
    except (OSError, urllib.error.URLError, netns.NetnsError) as e:
        return False, f"{p.url}: {getattr(e, 'reason', e)}"
    ok = code == 200 and p.expect in body
    return ok, f"{p.url}: HTTP {code} {body.strip()[:120]!r}" if not ok else f"{p.url}: ok"


def api_get(layout: Layout, path: str, timeout: float = 5.0) -> tuple[int, Any]:
    """GET an API path as admin; (status, parsed JSON or None)."""
    try:
        code, body = _get(layout, layout.api_url + path, True, timeout)
    except (OSError, urllib.error.URLError, netns.NetnsError):
        return 0, None
    try:
        return code, json.loads(body)
    except ValueError:
        return code, None
