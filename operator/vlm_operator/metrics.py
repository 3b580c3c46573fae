"""The operator's own Prometheus metrics (served on VLM_METRICS_PORT at /metrics).

    vlm_operator_reconcile_duration_seconds{result}   histogram
    vlm_operator_errors_total{reason}                 counter
    vlm_operator_api_writes_total{verb}               counter (every write request we send)
    vlm_operator_managed_services                     gauge
    vlm_operator_rollout_phase{namespace,vlmservice,phase}  1 for the current phase
    vlm_operator_rollouts_total{result}               counter: promoted, rolled_back, aborted
    vlm_operator_signal_delta{namespace,vlmservice,signal}  last relative delta canary vs baseline
    vlm_operator_ipc_cache_active{namespace,vlmservice}     1/0
    vlm_operator_canary_rollback_info{namespace,vlmservice,revision,signal,function}  1 while rolled back

Series of a deleted VLMService are removed by `forget`.
"""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

RECONCILE = Histogram(
    "vlm_operator_reconcile_duration_seconds",
    "Time spent in one reconcile of a VLMService.",
    ["result"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
ERRORS = Counter("vlm_operator_errors_total", "Errors by reason.", ["reason"])
API_WRITES = Counter("vlm_operator_api_writes_total", "Write requests sent to the API server.", ["verb"])
MANAGED = Gauge("vlm_operator_managed_services", "VLMServices this operator manages.")
ROLLOUT_PHASE = Gauge(
    "vlm_operator_rollout_phase", "1 for the rollout's current phase.", ["namespace", "vlmservice", "phase"]
)
ROLLOUTS = Counter("vlm_operator_rollouts_total", "Finished canary rollouts by result.", ["result"])
SIGNAL_DELTA = Gauge(
    "vlm_operator_signal_delta",
    "Last relative change of a signal, canary vs baseline.",
    ["namespace", "vlmservice", "signal"],
)
IPC_ACTIVE = Gauge(
    "vlm_operator_ipc_cache_active", "1 when the pods run with the CUDA IPC pool-handle cache.", ["namespace", "vlmservice"]
)
ROLLBACK_INFO = Gauge(
    "vlm_operator_canary_rollback_info",
    "1 while a VLMService holds a rolled-back canary: the revision, the signal and the function that grew most.",
    ["namespace", "vlmservice", "revision", "signal", "function"],
)
PHASES = ("Idle", "Progressing", "Analysing", "Paused", "Promoted", "RolledBack", "Inconclusive", "Aborted")


def set_phase(namespace: str, name: str, phase: str) -> None:
    for p in PHASES:
        ROLLOUT_PHASE.labels(namespace, name, p).set(1.0 if p == phase else 0.0)


def _drop(gauge: Gauge, namespace: str, name: str) -> None:
    for labels in list(gauge._metrics):  # prometheus_client has no public prefix removal
        if labels[:2] == (namespace, name):
            gauge.remove(*labels)


def set_rollback(namespace: str, name: str, revision: str | None, signal: str | None, function: str | None) -> None:
    """One series while rolled back; none otherwise."""
    _drop(ROLLBACK_INFO, namespace, name)
    if revision:
        ROLLBACK_INFO.labels(namespace, name, revision, signal or "unknown", function or "unknown").set(1)


def forget(namespace: str, name: str) -> None:
    for p in PHASES:
        with contextlib.suppress(KeyError):
            ROLLOUT_PHASE.remove(namespace, name, p)
    for g in (SIGNAL_DELTA, IPC_ACTIVE, ROLLBACK_INFO):
        _drop(g, namespace, name)
