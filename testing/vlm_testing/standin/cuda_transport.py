"""Real CUDA IPC feature transport for the scheduler stand-in (GPU machines only).

`sglang_standin.py --standin-transport cuda` loads `CudaIpcTransport`. It reproduces the shape of
SGLang's multimodal feature transport: a producer process (the tokenizer side) holds one GPU memory
pool and shares its CUDA IPC handle once, like `MmItemMemoryPool._pool_ipc_handle`; the consumer
(the scheduler loop that owns this object) rebuilds every image feature from a slice of that pool, either
here (`reconstruct`) or through the stand-in's SGLang-shaped proxy (`ipc_open`/`ipc_handle`, `copy_feature`),
which is what the scheduler stand-in uses so that a profile shows SGLang's frames.
With `cache=False` each feature re-opens the pool handle through `torch.UntypedStorage._new_shared_cuda`
(what SGLang <= 0.5.9 always did, and 0.5.10 with `SGLANG_USE_IPC_POOL_HANDLE_CACHE` off); with
`cache=True` opened storages live in a dict keyed by handle, like SGLang's `_pool_storage_cache`.

`step()` is a small real GPU step (bf16 matrix products, then a synchronize) standing in for the
forward pass of one scheduler iteration. torch is imported lazily so CPU-only runs never need it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import subprocess
import sys
from typing import Any

_ALIGN = 256


def _align_up(value: int, alignment: int = _ALIGN) -> int:
    return (value + alignment - 1) // alignment * alignment


def pool_cache_key(handle: tuple) -> tuple:
    """Key of an opened pool: device index plus the raw IPC handle bytes (as SGLang keys it)."""
    return (handle[0], tuple(handle))


def open_pool_storage(handle: tuple, cache: dict | None) -> Any:
    """Open the producer's pool storage, through `cache` when one is given.

    Without a cache every call maps the IPC handle again: torch opens the memory handle, the
    ref-counter file and the IPC event, and on release synchronizes the stream and unmaps it.
    """
    import torch

    if cache is None:
        return torch.UntypedStorage._new_shared_cuda(*handle)
    key = pool_cache_key(handle)
    storage = cache.get(key)
    if storage is None:
        storage = torch.UntypedStorage._new_shared_cuda(*handle)
        cache[key] = storage
    return storage


def rebuild_from_pool(storage: Any, offset: int, nbytes: int, device: int, shape: Any = None,
                      dtype: Any = None) -> Any:
    """Copy `nbytes` at `offset` of an opened pool into a fresh tensor on `device`.

    Same steps as SGLang's `reconstruct_on_target_device`: slice the storage, view it as a tensor,
    allocate the target and copy (asynchronously, on the current stream).
    """
    import torch

    target = torch.device("cuda", device)
    with torch.cuda.device(target):
        src = torch.empty(0, dtype=torch.uint8, device=target).set_(
            storage[offset: offset + nbytes], storage_offset=0, size=(nbytes,), stride=(1,))
        if shape is None:
            out = torch.empty(nbytes, dtype=torch.uint8, device=target)
            out.copy_(src)
            return out
        out = torch.empty(shape, dtype=dtype, device=target)
        out.view(torch.uint8).view(-1).copy_(src)
        return out


def _producer_main(pool_bytes: int, device: int, seed: int) -> None:
    """Producer process: allocate and fill the pool, share its handle, hold it until stdin closes.

    A plain subprocess, not multiprocessing: the stand-in's scheduler is a daemonic process, and
    those may not start multiprocessing children.
    """
    import torch

    torch.cuda.set_device(device)
    gen = torch.Generator(device=f"cuda:{device}").manual_seed(seed)
    # Random bytes, not zeros: zeros would hide a rebuild that reads the wrong place.
    pool = torch.randint(0, 256, (pool_bytes,), dtype=torch.uint8, device=f"cuda:{device}", generator=gen)
    torch.cuda.synchronize(device)
    payload = pickle.dumps(pool.untyped_storage()._share_cuda_())
    sys.stdout.buffer.write(struct.pack("<Q", len(payload)) + payload)
    sys.stdout.buffer.flush()
    sys.stdin.buffer.read()  # EOF (the consumer closed the pipe or exited) means stop
    del pool


def _read_exact(stream: Any, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise RuntimeError("CUDA IPC producer exited before sharing its pool handle")
        data += chunk
    return data


class CudaIpcTransport:
    """Feature transport over real CUDA IPC between a producer process and this (consumer) process."""

    def __init__(self, cache: bool, feature_bytes: int, device: int = 0, *, pool_features: int = 16,
                 step_dim: int = 4096, step_matmuls: int = 16, seed: int = 0) -> None:
        import torch

        if feature_bytes <= 0:
            raise ValueError("feature_bytes must be positive")
        self.cache = cache
        self.feature_bytes = feature_bytes
        self.device = device
        self._slot_bytes = _align_up(feature_bytes)
        self._slots = max(1, pool_features)
        self._next_slot = 0
        self._storage_cache: dict | None = {} if cache else None
        self.features_rebuilt = 0
        self.steps = 0

        torch.cuda.set_device(device)
        self._producer = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--producer", str(self._slot_bytes * self._slots),
             str(device), str(seed)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            size = struct.unpack("<Q", _read_exact(self._producer.stdout, 8))[0]
            self._handle = pickle.loads(_read_exact(self._producer.stdout, size))
        except BaseException:
            self._producer.kill()
            raise

        gen = torch.Generator(device=f"cuda:{device}").manual_seed(seed + 1)
        self._a = torch.randn(step_dim, step_dim, dtype=torch.bfloat16, device=f"cuda:{device}", generator=gen)
        self._b = torch.randn(step_dim, step_dim, dtype=torch.bfloat16, device=f"cuda:{device}", generator=gen)
        self._c = torch.empty_like(self._a)
        self._step_matmuls = step_matmuls
        self.step()  # warm up cuBLAS so handle creation stays out of the loop
        # What the stand-in's SGLang-shaped proxy (sglang_standin._IPC_SRC) opens and copies through: it
        # calls ipc_open(*ipc_handle) itself (a C call, inline like SGLang's) and keeps the cache.
        self.ipc_open = torch.UntypedStorage._new_shared_cuda
        self.ipc_handle = tuple(self._handle)

    def reconstruct(self, n_features: int) -> None:
        """Rebuild `n_features` features from the producer's pool, as the scheduler does per request."""
        for _ in range(n_features):
            offset = self._next_slot * self._slot_bytes
            self._next_slot = (self._next_slot + 1) % self._slots
            storage = open_pool_storage(self._handle, self._storage_cache)
            rebuild_from_pool(storage, offset, self.feature_bytes, self.device)
            self.features_rebuilt += 1

    def open_budget(self) -> tuple[float, int]:
        raise RuntimeError("a real CUDA IPC transport opens through ipc_open, never a simulated budget")

    def copy_feature(self, storage: Any) -> None:
        """Rebuild one feature from an opened pool storage (the proxy decides whether it was re-opened)."""
        offset = self._next_slot * self._slot_bytes
        self._next_slot = (self._next_slot + 1) % self._slots
        rebuild_from_pool(storage, offset, self.feature_bytes, self.device)
        self.features_rebuilt += 1

    def step(self) -> None:
        """One forward-pass-sized GPU step: a few bf16 matrix products, then wait for them."""
        import torch

        # Independent products into one buffer: chaining them would grow the values without bound.
        for _ in range(self._step_matmuls):
            torch.matmul(self._a, self._b, out=self._c)
        torch.cuda.synchronize(self.device)
        self.steps += 1

    def close(self) -> None:
        if self._storage_cache is not None:
            self._storage_cache.clear()
        if self._producer.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self._producer.stdin.close()
            try:
                self._producer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._producer.kill()
                self._producer.wait()
        self._producer.stdout.close()

    def __enter__(self) -> CudaIpcTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "--producer":
    _producer_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
