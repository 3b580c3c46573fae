"""Producer/consumer adapters over the feature transports that Part 1 measures.

`sglang`: SGLang's own CUDA IPC transport module, loaded from an unpacked release wheel
(`srt/utils/cuda_ipc_transport_utils.py` up to 0.5.17, `srt/multimodal/transport/cuda_ipc.py` from
0.5.18). Importing it the normal way pulls in `sglang/__init__.py` and `sglang.srt.server_args`,
whose import chain reaches `from sgl_kernel import ...` on a CUDA machine (e.g.
server_args -> hf_transformers_utils -> configs.deepseek_ocr -> ... -> speculative.eagle_info in
0.5.10; runtime_context -> server_args -> utils.common -> platforms -> layers.quantization in 0.5.23).
sgl-kernel is a 536 MB wheel built against SGLang's pinned torch (2.9.1 for 0.5.10), which neither
fits the GPU machine's 64 MiB carry limit nor matches its torch 2.11. So this loader puts
placeholder modules in `sys.modules` for exactly these names and runs everything else from the wheel:

- `sglang`, `sglang.srt.utils`, `sglang.srt.multimodal.transport`: packages whose `__init__` is
  skipped (their submodules still load from the wheel's files);
- `sglang.srt.server_args.get_global_server_args` (0.5.10): an object with `tp_size=1`, read only by
  the pool's recycler thread;
- `sglang.srt.runtime_context.get_parallel` (0.5.18+): one rank (`tp_size=1`, no attention DP), read
  only to count consumers, and not at all with `consumer_count=1`;
- `sglang.srt.utils.log_info_on_rank0`: a logging call used by CUDA VMM paths that are not run.

Real and unmodified: `sglang.srt.environ` (the env-var parsing, so `SGLANG_USE_IPC_POOL_HANDLE_CACHE`
is read by SGLang's own `EnvBool`), the transport module, `memory_pool.py` and
`utils/cuda_vmm_utils.py` (0.5.18+), `MmItemMemoryPool`, `CudaIpcTensorTransportProxy` and
`reconstruct_on_target_device`.

`torch`: the same shape of work with nothing but torch's `_share_cuda_` / `_new_shared_cuda`
(the fallback the issue asks for, and the code path of `testing/vlm_testing/standin/cuda_transport.py`).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import re
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_cuda_transport() -> types.ModuleType:
    """testing/vlm_testing/standin/cuda_transport.py (shared with the scheduler stand-in), by path: this bench runs
    on a GPU machine from a plain checkout, without the test harness installed."""
    path = os.path.join(os.path.dirname(os.path.dirname(HERE)), "testing", "vlm_testing", "standin", "cuda_transport.py")
    spec = importlib.util.spec_from_file_location("cuda_transport", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("cuda_transport", mod)
    spec.loader.exec_module(mod)
    return sys.modules["cuda_transport"]


cuda_transport = _load_cuda_transport()

NEW_LAYOUT_MODULE = "sglang.srt.multimodal.transport.cuda_ipc"
OLD_LAYOUT_MODULE = "sglang.srt.utils.cuda_ipc_transport_utils"


def sglang_version(site: str) -> str:
    """Version from the wheel's `sglang/_version.py` (written by setuptools-scm at build time)."""
    with open(os.path.join(site, "sglang", "_version.py")) as f:
        found = re.search(r"^__version__ = .*?['\"]([^'\"]+)['\"]", f.read(), re.MULTILINE)
    if not found:
        raise ValueError(f"no version in {site}/sglang/_version.py")
    return found.group(1)


def _stub_package(name: str, path: str | None, **attrs: Any) -> None:
    mod = types.ModuleType(name)
    if path is not None:
        mod.__path__ = [path]
    mod.__dict__.update(attrs)
    sys.modules[name] = mod


def load_sglang_transport(site: str) -> tuple[types.ModuleType, Any, list[str]]:
    """Import SGLang's transport module from `site` with the placeholders listed in the module doc.

    Returns (transport module, `envs`, names of the placeholder modules).
    """
    root = os.path.join(site, "sglang")
    new_layout = os.path.exists(os.path.join(root, "srt", "multimodal", "transport", "cuda_ipc.py"))
    one_rank = types.SimpleNamespace(tp_size=1, tp_rank=0, attn_dp_enabled=False, num_dp_ranks=1, nnodes=1)
    stubs = ["sglang", "sglang.srt", "sglang.srt.utils"]
    _stub_package("sglang", root)
    _stub_package("sglang.srt", os.path.join(root, "srt"))  # no __init__.py in the wheel either
    _stub_package("sglang.srt.utils", os.path.join(root, "srt", "utils"),
                  log_info_on_rank0=lambda logger, msg: logger.info(msg))
    if new_layout:
        _stub_package("sglang.srt.runtime_context", None, get_parallel=lambda: one_rank)
        _stub_package("sglang.srt.multimodal.transport",
                      os.path.join(root, "srt", "multimodal", "transport"))
        stubs += ["sglang.srt.runtime_context", "sglang.srt.multimodal.transport"]
        importlib.import_module("sglang.srt.multimodal")
        mod = importlib.import_module(NEW_LAYOUT_MODULE)
        importlib.import_module("sglang.srt.utils.cuda_vmm_utils")  # real check_drv for stream memops
    else:
        _stub_package("sglang.srt.server_args", None, get_global_server_args=lambda: one_rank)
        stubs.append("sglang.srt.server_args")
        mod = importlib.import_module(OLD_LAYOUT_MODULE)
    envs = importlib.import_module("sglang.srt.environ").envs
    return mod, envs, stubs


@dataclass
class SglangAdapter:
    """Producer and consumer calls exactly as SGLang's processor and scheduler make them."""

    site: str
    name: str = ""
    version: str = ""
    stubs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.mod, self.envs, self.stubs = load_sglang_transport(self.site)
        self.version = sglang_version(self.site)
        self.name = f"sglang-{self.version}"
        self.new_layout = self.mod.__name__ == NEW_LAYOUT_MODULE

    def cache_from_env(self) -> bool:
        # base_processor.py reads this EnvBool at import (producer side) in both layouts.
        return bool(self.envs.SGLANG_USE_IPC_POOL_HANDLE_CACHE.get())

    def make_pool(self, nbytes: int, device: int) -> Any:
        import torch

        torch.cuda.set_device(device)
        interval = self.mod.MM_ITEM_MEMORY_POOL_RECYCLE_INTERVAL
        if self.new_layout:
            return self.mod.MmItemMemoryPool(nbytes, interval, base_gpu_id=device, consumer_count=1)
        return self.mod.MmItemMemoryPool(nbytes, interval)

    def wrap(self, pool: Any, tensor: Any, use_cache: bool) -> Any | None:
        """Put one feature in the pool and return its proxy, or None while the pool is full."""
        import torch

        if self.new_layout:
            return pool.wrap_tensor(tensor, use_pool_handle_cache=use_cache)
        # The 0.5.10 body of BaseMultimodalProcessor.process_and_combine_mm_data's IPC branch.
        sync_flag, available_slice, byte_offset = pool.return_a_slice_tensor_with_flag(tensor)
        if not isinstance(available_slice, torch.Tensor):
            return None
        available_slice.copy_(tensor.view(torch.int8).view(-1), non_blocking=True)
        return self.mod.CudaIpcTensorTransportProxy(
            data=available_slice, info_data=tensor, sync_buffer_meta=sync_flag,
            pool_ipc_handle=pool._pool_ipc_handle if use_cache else None,
            pool_byte_offset=byte_offset, pool_device_index=pool._pool_device_index)

    def reconstruct(self, proxy: Any, device: int) -> Any:
        return proxy.reconstruct_on_target_device(device)

    def shutdown(self, pool: Any) -> None:
        pool.shutdown()


class _TorchPool:
    """A ring over one allocation; the benchmark's lock-step protocol frees it before each request."""

    def __init__(self, nbytes: int, device: int) -> None:
        import torch

        self.tensor = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
        self.handle = self.tensor.untyped_storage()._share_cuda_()
        self.next = 0

    def take(self, nbytes: int) -> int:
        if self.next + nbytes > self.tensor.numel():
            self.next = 0
        offset = self.next
        self.next = cuda_transport._align_up(offset + nbytes)
        return offset


@dataclass
class TorchAdapter:
    """Fallback: the same pool/proxy/rebuild shape with torch's IPC calls only."""

    name: str = "torch-ipc"
    version: str = ""
    stubs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        import torch

        self.version = torch.__version__
        self._cache: dict = {}

    def cache_from_env(self) -> bool:
        return os.environ.get("SGLANG_USE_IPC_POOL_HANDLE_CACHE", "0").lower() in ("1", "true", "yes", "y")

    def make_pool(self, nbytes: int, device: int) -> _TorchPool:
        return _TorchPool(nbytes, device)

    def wrap(self, pool: _TorchPool, tensor: Any, use_cache: bool) -> dict:
        import torch

        nbytes = tensor.numel() * tensor.element_size()
        offset = pool.take(nbytes)
        pool.tensor[offset: offset + nbytes].copy_(tensor.view(torch.uint8).view(-1), non_blocking=True)
        return {"handle": pool.handle, "offset": offset, "nbytes": nbytes, "shape": tuple(tensor.shape),
                "dtype": tensor.dtype, "use_cache": use_cache}

    def reconstruct(self, proxy: dict, device: int) -> Any:
        storage = cuda_transport.open_pool_storage(proxy["handle"], self._cache if proxy["use_cache"] else None)
        return cuda_transport.rebuild_from_pool(storage, proxy["offset"], proxy["nbytes"], device,
                                                proxy["shape"], proxy["dtype"])

    def shutdown(self, pool: _TorchPool) -> None:
        del pool


def make_adapter(impl: str, site: str | None) -> SglangAdapter | TorchAdapter:
    if impl == "sglang":
        if not site:
            raise ValueError("--site is required for --impl sglang")
        return SglangAdapter(site)
    if impl == "torch":
        return TorchAdapter()
    raise ValueError(f"unknown impl {impl!r}")


def wrap_when_free(adapter: Any, pool: Any, tensor: Any, use_cache: bool, timeout_s: float = 30.0) -> Any:
    """Retry while the pool is full; SGLang's recycler thread frees slices every few tens of ms."""
    deadline = time.monotonic() + timeout_s
    while True:
        proxy = adapter.wrap(pool, tensor, use_cache)
        if proxy is not None:
            return proxy
        if time.monotonic() > deadline:
            raise TimeoutError("feature pool stayed full")
        time.sleep(0.0005)


logging.getLogger("sglang").setLevel(logging.WARNING)
