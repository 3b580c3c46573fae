"""The names the sidecar shares with the operator, each defined once within the sidecar: its port, the
scheduler stages and the SGLang process roles. No imports: every sidecar module may import it.

The operator has its own copies (vlm_operator.api.names; the two packages are independent):
tests/unit/packaging/test_shared_names.py fails when they disagree.
"""

from __future__ import annotations

# The HTTP port for /metrics, /windows.json and /profile/* (the operator's pod builder sets it too).
DEFAULT_PORT = 9400

# The scheduler stages the sidecar reports, in the order SGLang's event loop runs them.
LOOP_STAGES = (
    "recv_requests",
    "process_input_requests",
    "get_next_batch_to_run",
    "run_batch",
    "process_batch_result",
)
STAGES = (*LOOP_STAGES, "idle", "other")

# The SGLang processes the sidecar tells apart (the `role` label). Schedulers first; the rest make up the
# request path's front end and back end around them (docs/sidecar.md, "Roles").
ROLES = ("scheduler", "tokenizer_manager", "tokenizer_worker", "mm_processor", "detokenizer")
FRONTEND_ROLES = ROLES[1:]
