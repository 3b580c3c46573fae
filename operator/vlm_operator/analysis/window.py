"""One profiler window: the record every signal source builds and the gate reads.

The sidecar's `/windows.json` is the wire contract (docs/sidecar.md lists its fields); `Window.from_sidecar`
reads one entry of it leniently, and the Prometheus source builds the same record from the sidecar's
per-window gauges (`vlm_operator.analysis.sources.prometheus`). Both give the gate the same fields, so a decision
never depends on which source was read (tests/unit/operator/analysis/test_sources_parity.py).

Also here: the one rule for a loop-wide frame (a function around nearly all of the loop's time), which
the gate's attribution and the profiler summary both apply.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vlm_operator.api.names import FRONTEND_ROLES

# A function whose inclusive share is at least this runs around (nearly) the whole loop: the loop function
# itself, a decorator's `wrapper` that every stage goes through. Its growth is the loop's growth and says
# nothing about where it came from, and it is never the news of a profile.
LOOP_WIDE_SHARE = 0.9


def loop_wide(shares: Sequence[Mapping[str, float]]) -> set[str]:
    """The functions whose mean inclusive share (over the maps that have them) is loop-wide."""
    seen: dict[str, list[float]] = {}
    for m in shares:
        for k, v in m.items():
            seen.setdefault(k, []).append(v)
    return {k for k, v in seen.items() if sum(v) / len(v) >= LOOP_WIDE_SHARE}


def _num(v: Any) -> float | None:
    """A finite float from a JSON value, or None (bools are not numbers here)."""
    if type(v) is float:  # the common case, kept cheap: the gate parses every window at every look
        return v if math.isfinite(v) else None
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def _positive(v: Any) -> float | None:
    f = _num(v)
    return f if f is not None and f > 0 else None


def _nonnegative(v: Any) -> float | None:
    f = _num(v)
    return f if f is not None and f >= 0 else None


def _count(v: Any) -> int:
    f = _num(v)
    return int(f) if f is not None and f > 0 else 0


def _flag(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int | float):
        return v != 0
    return isinstance(v, str) and v.strip().lower() in ("true", "1", "yes", "y")


def _share(v: Any) -> float | None:
    """One share (0-1), rounding overshoot clipped; anything else (negative, > 1.01, not a number) is None."""
    f = _num(v)
    return None if f is None or f < 0 or f > 1.01 else min(f, 1.0)


def _nonnegative_int(v: Any) -> int | None:
    f = _num(v)
    return int(f) if f is not None and f >= 0 else None


def _shares(v: Any) -> dict[str, float]:
    """Shares keyed by name; drops non-string keys and non-numbers, clips rounding overshoot to [0, 1]."""
    if not isinstance(v, Mapping):
        return {}
    out: dict[str, float] = {}
    for k, x in v.items():
        f = _num(x)
        if isinstance(k, str) and k and f is not None and f >= 0:
            out[k] = min(f, 1.0)
    return out


# The separator in an `edge_shares` key, "caller;callee" (the sidecar's vlm_sidecar.model.EDGE_SEP: py-spy's
# collapsed-stack frame separator, which no function name holds).
EDGE_SEP = ";"


def _edges(v: Any) -> dict[str, float]:
    """Call-edge shares keyed "caller;callee", as `_shares`; a key without both names is dropped."""
    return {k: x for k, x in _shares(v).items() if all(k.partition(EDGE_SEP)[::2])}


# A pod counts as saturated in a window when this many seconds of its arrivals wait in SGLang's queue at both edges
# of it (Window.saturated_throughput): a backlog, not the requests that arrived since the scheduler's last iteration.
SATURATED_BACKLOG_S = 1.0


@dataclass(frozen=True, slots=True)
class Window:
    """One profiler window of one scheduler process (one TP rank of one pod)."""

    revision: str
    pod: str
    id: str
    end: float
    samples: int
    loop_mean_seconds: float | None
    loop_p95_seconds: float | None
    stage_shares: Mapping[str, float]
    function_shares: Mapping[str, float]
    stale: bool = False
    ttft_seconds: float | None = None
    itl_seconds: float | None = None
    throughput: float | None = None
    tp_rank: int = 0
    # Requests per second that reached their first token in the window (SGLang's TTFT histogram count);
    # 0.0: none did; None: unknown (no SGLang metrics, an older sidecar).
    request_rate: float | None = None
    iterations: int | None = None
    # Forward passes (batches) SGLang's scheduler ran per second in the window (sglang:cuda_graph_passes_total);
    # None: unknown. SGLang's stage shares are compared at the baseline's pass rate (gate.compare).
    forward_pass_rate: float | None = None
    # Requests waiting in SGLang's queue at both edges of the window (the smaller reading of
    # sglang:num_queue_reqs); None: unknown. A backlog of SATURATED_BACKLOG_S of arrivals or more says the pod was
    # saturated: its throughput in the window is what it can do, not what the router sent it, and only such windows
    # carry `saturated_throughput`.
    queued_requests: float | None = None
    # Prompt tokens per request of the requests that finished in the window (SGLang's counters): the request mix,
    # which the router sets and the revision does not; the gate's covariate (gate.covariates). None: unknown.
    prompt_tokens_per_request: float | None = None
    # The CUDA IPC feature transport (sidecar vlm_sidecar.ipc): share of the scheduler's time in it, the
    # share re-opening IPC handles, and the samples in it. None: unknown (an older sidecar, a bad value).
    feature_transport_share: float | None = None
    ipc_handle_reopen_share: float | None = None
    feature_transport_samples: int | None = None
    # Self shares of the exported functions, and the largest self share of any function the sidecar did
    # not export (the bound that lets a function absent on one side still be compared). None: unknown.
    self_shares: Mapping[str, float] = field(default_factory=dict)
    unexported_self_share_max: float | None = None
    # The front end sampled in the same window (the entry's `frontend.roles`), by role; empty: not sampled.
    frontend: Mapping[str, RoleSample] = field(default_factory=dict)
    # Inclusive shares of the call edges into the exported functions, "caller;callee" (the sidecar exports the
    # few largest callers of each): which caller a shared helper's time came from. Empty: unknown (an older
    # sidecar); an edge missing next to others into the same function had at most their smallest share.
    edge_shares: Mapping[str, float] = field(default_factory=dict)
    # SGLang's own stage accounting over the window (`sglang:scheduler_stage_seconds_total{category}` and the idle
    # counter, 0.5.20 on, as the sidecar scraped them at the window's start and end): each category's share of the
    # window's wall time, "idle" included. Empty: SGLang exports no such counter (older versions, metrics off).
    sglang_stage_shares: Mapping[str, float] = field(default_factory=dict)

    @property
    def saturated_throughput(self) -> float | None:
        """Generation tokens/s where the pod was saturated in the window, else None: at both edges of the window at
        least a second's worth of its arrivals (SATURATED_BACKLOG_S x the request rate, and at least one request)
        waited in the queue.

        Below saturation a pod's throughput is the load the router sent it, whatever the revision: compared
        there, a canary that got less traffic reads as slower and one that got more as faster. Saturated, it is
        the pod's capacity, which is what a throughput margin is about: fewer requests fitting in the KV cache,
        slower batches or a slower input path all lower it, and loop latency or ITL alone miss the first.
        A queue of a request or two is no saturation: requests that arrived since the scheduler last looked wait
        until its next iteration (on the testbed, an unchanged canary's windows with such a queue read -15.7%).
        """
        if self.throughput is None or self.queued_requests is None or self.request_rate is None:
            return None
        if self.queued_requests < max(1.0, SATURATED_BACKLOG_S * self.request_rate):
            return None
        return self.throughput

    @classmethod
    def from_sidecar(cls, revision: str, pod: str, d: Any) -> Window:
        """Build from one `/windows.json` entry; never raises, whatever the entry holds.

        Missing or malformed numbers become None (or 0 for counts, 0.0 for `end`, which makes the
        window too old to count); a window that carries an `error` is marked stale, as the sidecar
        contract says partial py-spy output is. SGLang request signals may sit at the top level
        or under an `sglang` key.
        """
        if not isinstance(d, Mapping):
            d = {}
        req = d.get("sglang")
        req = req if isinstance(req, Mapping) else {}

        def pick(key: str) -> Any:
            return d.get(key, req.get(key))

        raw_id = d.get("id")
        ident = str(raw_id) if isinstance(raw_id, str | int) and not isinstance(raw_id, bool) else ""
        err = d.get("error")
        iterations = d.get("iterations")
        return cls(
            revision=str(revision),
            pod=str(pod),
            id=ident,
            end=_num(d.get("end")) or 0.0,
            samples=_count(d.get("samples")),
            loop_mean_seconds=_positive(d.get("loop_mean_seconds")),
            loop_p95_seconds=_positive(d.get("loop_p95_seconds")),
            stage_shares=_shares(d.get("stage_shares")),
            function_shares=_shares(d.get("function_shares")),
            stale=_flag(d.get("stale")) or bool(err),
            ttft_seconds=_positive(pick("ttft_seconds")),
            itl_seconds=_positive(pick("itl_seconds")),
            throughput=_positive(pick("throughput")),
            request_rate=_nonnegative(pick("request_rate")),
            forward_pass_rate=_nonnegative(pick("forward_pass_rate")),
            queued_requests=_nonnegative(pick("queued_requests")),
            prompt_tokens_per_request=_positive(pick("prompt_tokens_per_request")),
            tp_rank=_count(d.get("tp_rank")),
            iterations=None if _num(iterations) is None else _count(iterations),
            feature_transport_share=_share(d.get("feature_transport_share")),
            ipc_handle_reopen_share=_share(d.get("ipc_handle_reopen_share")),
            feature_transport_samples=_nonnegative_int(d.get("feature_transport_samples")),
            self_shares=_shares(d.get("self_shares")),
            unexported_self_share_max=_share(d.get("unexported_self_share_max")),
            frontend=_roles(d.get("frontend")),
            edge_shares=_edges(d.get("edge_shares")),
            sglang_stage_shares=_shares(d.get("sglang_stage_shares")),
        )


@dataclass(frozen=True, slots=True)
class RoleSample:
    """One front-end role in one window: its busy share and its threads' function shares (of their time)."""

    busy_share: float
    function_shares: Mapping[str, float] = field(default_factory=dict)
    self_shares: Mapping[str, float] = field(default_factory=dict)
    unexported_self_share_max: float | None = None


def _roles(v: Any) -> dict[str, RoleSample]:
    """The sampled front-end roles of a `/windows.json` entry's `frontend` object (roles without a busy
    share, unknown roles and malformed values are left out)."""
    roles = v.get("roles") if isinstance(v, Mapping) else None
    if not isinstance(roles, Mapping):
        return {}
    out = {}
    for role in FRONTEND_ROLES:
        r = roles.get(role)
        busy = _share(r.get("busy_share")) if isinstance(r, Mapping) else None
        if busy is not None:
            out[role] = RoleSample(busy, _shares(r.get("function_shares")), _shares(r.get("self_shares")),
                                   _share(r.get("unexported_self_share_max")))
    return out
