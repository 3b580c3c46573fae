"""Profiler sidecar stand-ins for the judge's tests against real delivery controllers (Argo Rollouts, Flagger): one
local HTTP server per pod, serving `/windows.json`-shaped windows, and the endpoints file that points the
operator's sidecar reader at them (VLM_SIDECAR_ENDPOINTS). Pods run on kwok, so nothing else could answer."""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any

from vlm_testing.jsonhttp import start_json
from vlm_testing.signals import shares


class StandIns:
    """A profiler sidecar stand-in per pod, started as the pod appears: windows every 5 s over the last 5 minutes,
    made up at each read (deterministic per pod and window), the canary's loop 20% slower. The endpoints file
    points the operator's reader at them (VLM_SIDECAR_ENDPOINTS; re-read when it changes)."""

    def __init__(self, path: Path, slower: float = 0.20):
        self.path = path
        self.slower = slower
        self.servers: dict[str, Any] = {}
        self.canary_hash = ""
        path.write_text("{}")

    def add(self, pod: str, canary: bool, slower: float | None = None) -> None:
        """`slower`: this canary pod's slowdown, instead of the current `self.slower`."""
        slow = (self.slower if slower is None else slower) if canary else 0.0
        level = 0.02 * (1 + slow) * (1 + 0.004 * (len(self.servers) % 3))
        stages, functions = shares(slow)

        def windows(_path: str, _peer: str) -> tuple[int, Any]:
            last = math.floor(time.time() / 5) * 5
            out = []
            for end in range(int(last) - 300, int(last) + 1, 5):
                rng = random.Random(f"{pod}/{end}")
                loop = level * math.exp(rng.gauss(0, 0.01))
                out.append({"id": end // 5, "tp_rank": 0, "start": end - 4.0, "end": float(end), "samples": 4000,
                            "loop_mean_seconds": loop, "loop_p95_seconds": loop * 1.6, "iterations": 200,
                            "stage_shares": stages, "function_shares": functions, "stale": False, "error": None})
            return 200, out

        s = start_json(windows)
        self.servers[pod] = s
        self.path.write_text(json.dumps({p: f"127.0.0.1:{x.server_address[1]}" for p, x in self.servers.items()}))

    def close(self) -> None:
        for s in self.servers.values():
            s.shutdown()


def configmap(core: Any, namespace: str, name: str) -> Any:
    """The ConfigMap (the judge's published CA), or None while it does not exist."""
    from kubernetes.client.exceptions import ApiException

    try:
        return core.read_namespaced_config_map(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
