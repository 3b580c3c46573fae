"""Whether the scheduler re-opens CUDA IPC handles per multimodal feature, from one window's stacks. Pure.

SGLang hands image features to the scheduler through a CUDA IPC pool (`MmItemMemoryPool`) and rebuilds
each one in `CudaIpcTensorTransportProxy.reconstruct_on_target_device`. With the pool-handle cache on
(`SGLANG_USE_IPC_POOL_HANDLE_CACHE`, 0.5.10+) the opened pool storage is kept per handle; with it off
every feature maps an IPC handle again (`torch.UntypedStorage._new_shared_cuda`, then unmaps it). How that
shows in a py-spy stack depends on the release (read from the wheels; tests/compat checks these names):

- 0.5.10-0.5.17 (`sglang/srt/utils/cuda_ipc_transport_utils.py`): cache on, features carry the pool handle
  and go `reconstruct_on_target_device > _reconstruct_from_ipc_extra > _pool_handle_cache_get_or_open`
  (which calls `_open_pooled_storage_uncached` only on a miss). Cache off, features carry a handle of
  their own and `reconstruct_on_target_device` opens it inline (`_new_shared_cuda` is C, so py-spy
  charges it to `reconstruct_on_target_device` itself): time with `reconstruct_on_target_device` of
  that file as the innermost frame is re-opening.
- 0.5.20-0.5.23 (`sglang/srt/multimodal/transport/cuda_ipc.py`): always the pool; cache off goes
  `_open_pool_slice > _reconstruct_from_ipc_extra > _open_pooled_storage_uncached` for every feature.
- every release with the cache: `_open_pooled_storage_uncached` outside `_pool_handle_cache_get_or_open`
  (also the uncached retry after a failed cache hit) is a re-open; inside it, it is the cache's one miss
  per pool and not counted.

The feature-transport path is any frame of those files named in FEATURE_FUNCTIONS; its share says
whether the window saw multimodal feature traffic at all (a text-only window says nothing about the
cache). Shares are of the scheduler thread's sampled time, like the stage shares.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vlm_sidecar.model import Segment
from vlm_sidecar.parser import function_name

# Base names of the files holding SGLang's CUDA IPC feature transport (0.5.9-0.5.17, 0.5.20+).
TRANSPORT_FILES = frozenset({"cuda_ipc_transport_utils.py", "cuda_ipc.py"})
# Files whose reconstruct_on_target_device opens a per-feature IPC handle inline when the cache is off.
INLINE_OPEN_FILES = frozenset({"cuda_ipc_transport_utils.py"})
# Entry points of the consumer side: rebuilding a feature (every release), and 0.5.17+'s release of a
# slice without a copy (acknowledge_consumption), 0.5.20+'s zero-copy view (borrow_on_target_device).
FEATURE_FUNCTIONS = frozenset({"reconstruct_on_target_device", "acknowledge_consumption", "borrow_on_target_device"})
RECONSTRUCT_FUNCTION = "reconstruct_on_target_device"
REOPEN_FUNCTION = "_open_pooled_storage_uncached"  # maps the pool's IPC handle (0.5.10+)
CACHE_FUNCTION = "_pool_handle_cache_get_or_open"  # the cache; its call of REOPEN_FUNCTION is a miss


def _file(label: str) -> str | None:
    """'reconstruct_on_target_device (cuda_ipc.py)' -> 'cuda_ipc.py'."""
    if label.endswith(")") and " (" in label:
        return label.rsplit(" (", 1)[1][:-1]
    return None


def classify(stack: Sequence[str]) -> tuple[bool, bool]:
    """(in the feature-transport path, re-opening an IPC handle) for one stack, root first."""
    start = None
    for i, label in enumerate(stack):
        if function_name(label) in FEATURE_FUNCTIONS and _file(label) in TRANSPORT_FILES:
            start = i
            break
    if start is None:
        return False, False
    below = [function_name(label) for label in stack[start:]]
    if REOPEN_FUNCTION in below and CACHE_FUNCTION not in below:
        return True, True
    leaf = stack[-1]
    inline = function_name(leaf) == RECONSTRUCT_FUNCTION and _file(leaf) in INLINE_OPEN_FILES
    return True, inline


def shares(segments: Iterable[Segment]) -> tuple[float | None, float | None, float]:
    """(feature-transport share, re-open share, feature-transport microseconds) of one thread's time.

    (None, None, 0) when the thread has no sampled time."""
    total = feature = reopen = 0.0
    for s in segments:
        d = s.duration_us
        total += d
        in_feature, reopening = classify(s.stack)
        if in_feature:
            feature += d
            if reopening:
                reopen += d
    if total <= 0:
        return None, None, 0.0
    return feature / total, reopen / total, feature
