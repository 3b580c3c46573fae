"""What every signal source shares: the error that means "no data could be read", and one JSON GET."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

TIMEOUT_S = 5.0  # default of get_json (the Prometheus reads); sidecar reads use SidecarReader.timeout_s


class SignalsUnavailable(Exception):
    """No data could be read (Prometheus down, no sidecar answering): Inconclusive, never "no regression"."""


def get_json(url: str, timeout: float = TIMEOUT_S) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())
