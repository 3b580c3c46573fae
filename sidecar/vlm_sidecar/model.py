"""Plain data the sidecar passes between its layers: parsed traces, targets, window results.

Nothing here does I/O or reads a clock; every other module may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Re-exported (model.STAGES, model.FRONTEND_ROLES, ...): defined in vlm_sidecar.names.
from vlm_sidecar.names import FRONTEND_ROLES as FRONTEND_ROLES
from vlm_sidecar.names import LOOP_STAGES as LOOP_STAGES
from vlm_sidecar.names import ROLES as ROLES
from vlm_sidecar.names import STAGES as STAGES

# Error kinds counted in vlm_profiler_errors_total{kind}; fixed so dashboards can rely on them.
ERROR_KINDS = (
    "pyspy_missing",
    "permission_denied",
    "target_gone",
    "timeout",
    "crash",
    "empty_output",
    "truncated",
    "parse",
    "no_target",
    "sglang_scrape",
)
# Results counted in vlm_profiler_windows_total{result}.
WINDOW_RESULTS = ("ok", "partial", "error", "no_target")
# The separator in an `edge_shares` key, "caller;callee": py-spy's collapsed stacks separate frames with it, so
# no frame's name holds it (a function name is a bare identifier or a `<lambda>`-style name, see
# parser.function_name; `>` would not do: `<genexpr>`).
EDGE_SEP = ";"


@dataclass(frozen=True)
class Segment:
    """One thread's stack, unchanged from start_us to end_us (microseconds since py-spy started)."""

    start_us: float
    end_us: float
    stack: tuple[str, ...]  # frame labels, root first: "name (file)"

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclass
class ParsedTrace:
    """What a parser could make of one py-spy output; errors are counted, never raised."""

    threads: dict[int, list[Segment]] = field(default_factory=dict)
    bad_events: int = 0
    truncated: bool = False
    error: str | None = None  # set when nothing usable came out


@dataclass(frozen=True)
class Target:
    """An SGLang process found in /proc: a scheduler (with its TP rank) or one of the FRONTEND_ROLES."""

    pid: int
    title: str
    tp_rank: int  # schedulers only; 0 for the other roles
    start_ticks: int  # /proc/PID/stat starttime: tells a restarted process from a reused pid
    role: str = "scheduler"


@dataclass(frozen=True)
class LoopEstimate:
    """Loop iterations recovered from stage transitions in one window."""

    iterations: int
    mean_s: float | None
    p50_s: float | None
    p95_s: float | None
    samples_s: tuple[float, ...]  # one per estimated iteration, for the histogram
    boundaries: int  # iteration boundaries seen in the samples, before missed ones are added back


@dataclass(frozen=True)
class WindowSummary:
    """One profiling window of one TP rank, as /windows.json and the collector expose it."""

    id: int
    tp_rank: int
    pid: int | None
    start: float
    end: float
    samples: int
    loop_mean_seconds: float | None
    loop_p50_seconds: float | None
    loop_p95_seconds: float | None
    iterations: int
    stage_shares: dict[str, float]
    function_shares: dict[str, float]
    self_shares: dict[str, float]
    top_function: str | None
    stale: bool
    error: str | None
    result: str = "ok"
    loop_samples: tuple[float, ...] = ()
    sglang_stage_shares: dict[str, float] | None = None
    # From SGLang's /metrics at the window's edges: mean TTFT and ITL (seconds), generation tokens/s, and
    # requests/s (those that reached their first token: the TTFT histogram's count; 0.0 when none did).
    ttft_seconds: float | None = None
    itl_seconds: float | None = None
    throughput: float | None = None
    request_rate: float | None = None
    # SGLang's forward passes per second over the window (sglang:cuda_graph_passes_total, every supported release):
    # the batches its scheduler ran, what the gate scales SGLang's stage shares by. None: not exported.
    forward_pass_rate: float | None = None
    # The smaller of SGLang's waiting-queue length (sglang:num_queue_reqs) at the window's two edges: a backlog of a
    # second's arrivals or more says the pod was saturated and its throughput is its capacity. None: not exported.
    queued_requests: float | None = None
    # Prompt tokens per request of the requests that finished in the window (sglang:prompt_tokens_total over
    # sglang:num_requests_total): the request mix, the gate's covariate. None: none finished, or not exported.
    prompt_tokens_per_request: float | None = None
    # CUDA IPC feature transport (vlm_sidecar.ipc): share of the scheduler thread's time in it, the part
    # of that re-opening IPC handles (both shares of the whole thread), and the samples in it. None: unknown.
    feature_transport_share: float | None = None
    ipc_handle_reopen_share: float | None = None
    feature_transport_samples: int | None = None
    # The front end sampled in the same window (vlm_sidecar.roles.FrontendWindow.to_json()); None when the
    # sidecar did not sample it. Its busiest role's busy share and the saturation signal, flat for the gate.
    frontend: dict | None = None
    frontend_busy_share: float | None = None
    frontend_saturated: bool | None = None
    # The largest self share of any function this window did not export (0.0: none was left out; None:
    # no stack seen). A consumer comparing a function exported on one side only bounds the other side by it.
    unexported_self_share_max: float | None = None
    # Inclusive shares of the call edges into the exported functions, "caller;callee" (EDGE_SEP),
    # the few largest callers of each (estimators.select_edges): which caller a shared helper's time came from.
    edge_shares: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        """The /windows.json shape (keys are a contract with the canary gate)."""
        return {
            "id": self.id,
            "tp_rank": self.tp_rank,
            "pid": self.pid,
            "start": self.start,
            "end": self.end,
            "samples": self.samples,
            "loop_mean_seconds": self.loop_mean_seconds,
            "loop_p50_seconds": self.loop_p50_seconds,
            "loop_p95_seconds": self.loop_p95_seconds,
            "iterations": self.iterations,
            "stage_shares": dict(self.stage_shares),
            "function_shares": dict(self.function_shares),
            "self_shares": dict(self.self_shares),
            "top_function": self.top_function,
            "stale": self.stale,
            "error": self.error,
            "result": self.result,
            "sglang_stage_shares": self.sglang_stage_shares,
            "ttft_seconds": self.ttft_seconds,
            "itl_seconds": self.itl_seconds,
            "throughput": self.throughput,
            "request_rate": self.request_rate,
            "forward_pass_rate": self.forward_pass_rate,
            "queued_requests": self.queued_requests,
            "prompt_tokens_per_request": self.prompt_tokens_per_request,
            "feature_transport_share": self.feature_transport_share,
            "ipc_handle_reopen_share": self.ipc_handle_reopen_share,
            "feature_transport_samples": self.feature_transport_samples,
            # The functions this window exported (the watch list plus its top N by self time): a function
            # missing here is unknown for this window, not 0.
            "exported_functions": sorted(self.function_shares),
            "unexported_self_share_max": self.unexported_self_share_max,
            "edge_shares": dict(self.edge_shares),
            # Only where the front end was sampled in this window: older consumers see the old keys alone.
            **({"role": "scheduler", "frontend": self.frontend, "frontend_busy_share": self.frontend_busy_share,
                "frontend_saturated": self.frontend_saturated} if self.frontend is not None else {}),
        }
