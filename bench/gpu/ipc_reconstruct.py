"""Part 1: per-feature reconstruct cost of SGLang's CUDA IPC transport, pool-handle cache off vs on.

Two producer processes hold one feature pool each (`MmItemMemoryPool`), one started with
`SGLANG_USE_IPC_POOL_HANDLE_CACHE=0` and one with `=1`, and wrap random bf16 features into proxies the
way SGLang's multimodal processor does. This process plays the scheduler: it asks the producers in
turn for a request of n features (off/on in a random order inside every pair, so the two settings
are interleaved), times each `reconstruct_on_target_device` call and the whole request, and checks
every rebuilt feature against the producer's checksum. Writes one JSON file.

    python3 bench/gpu/ipc_reconstruct.py --impl sglang --site /tmp/sglang-0.5.10 --out part1.json
    python3 bench/gpu/ipc_reconstruct.py --impl torch --out part1-torch.json
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import platform
import random
import sys
import time
from typing import Any

# transports and feature_sizes sit next to this script: its folder is on sys.path when it runs.
import transports
from feature_sizes import HIDDEN_SIZE_3B, build_scenarios
from summary import ratio, summarize

SOURCES_PER_SIZE = 4


def producer_main(conn: Any, impl: str, site: str | None, cache: bool, pool_mb: int, device: int,
                  token_counts: list[int], seed: int) -> None:
    """Tokenizer-side process: owns the pool, answers (tokens, n) with n proxies and their checksums."""
    # SGLang reads these at import time, so set them before the transport module loads.
    os.environ["SGLANG_USE_IPC_POOL_HANDLE_CACHE"] = "1" if cache else "0"
    os.environ["SGLANG_MM_FEATURE_CACHE_MB"] = str(pool_mb)
    import torch

    adapter = transports.make_adapter(impl, site)
    use_cache = adapter.cache_from_env()
    torch.cuda.set_device(device)
    pool = adapter.make_pool(pool_mb << 20, device)
    gen = torch.Generator(device=f"cuda:{device}").manual_seed(seed)
    sources = {t: [torch.randn(t, HIDDEN_SIZE_3B, dtype=torch.bfloat16, device=f"cuda:{device}", generator=gen)
                   for _ in range(SOURCES_PER_SIZE)] for t in token_counts}
    sums = {t: [float(s.float().sum()) for s in srcs] for t, srcs in sources.items()}
    conn.send({"name": adapter.name, "version": adapter.version, "stubs": adapter.stubs,
               "use_cache": use_cache, "pid": os.getpid()})
    counter = 0
    while True:
        msg = conn.recv()
        if msg is None:
            break
        tokens, n = msg
        proxies, checks = [], []
        for _ in range(n):
            i = counter % SOURCES_PER_SIZE
            counter += 1
            proxies.append(transports.wrap_when_free(adapter, pool, sources[tokens][i], use_cache))
            checks.append(sums[tokens][i])
        torch.cuda.synchronize(device)  # data in place before the consumer reads it (not timed)
        conn.send((proxies, checks))
    adapter.shutdown(pool)
    conn.close()


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


class Consumer:
    """The scheduler side: times reconstructs of the features a producer sends."""

    def __init__(self, adapter: Any, device: int) -> None:
        import torch

        self.torch = torch
        self.adapter = adapter
        self.device = device

    def request(self, conn: Any, tokens: int, n: int) -> tuple[list[float], float, int]:
        """One request: returns (per-feature us, whole-request us, features that failed the check)."""
        torch = self.torch
        conn.send((tokens, n))
        proxies, checks = conn.recv()
        torch.cuda.synchronize(self.device)
        outs, per_feature = [], []
        t_req = time.perf_counter_ns()
        for proxy in proxies:
            t0 = time.perf_counter_ns()
            outs.append(self.adapter.reconstruct(proxy, self.device))
            per_feature.append((time.perf_counter_ns() - t0) / 1e3)
        t_req = (time.perf_counter_ns() - t_req) / 1e3
        torch.cuda.synchronize(self.device)
        bad = sum(not _close(float(o.float().sum()), c) for o, c in zip(outs, checks, strict=True))
        return per_feature, t_req, bad


def run(args: argparse.Namespace) -> dict:
    import torch

    scenarios = build_scenarios()
    token_counts = sorted({s.tokens for s in scenarios})
    torch.cuda.set_device(args.device)
    adapter = transports.make_adapter(args.impl, args.site)  # the classes proxies unpickle into
    consumer = Consumer(adapter, args.device)

    ctx = mp.get_context("spawn")
    producers: dict[bool, tuple[Any, Any, dict]] = {}
    for cache in (False, True):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=producer_main, daemon=True,
                           args=(child, args.impl, args.site, cache, args.pool_mb, args.device,
                                 token_counts, args.seed))
        proc.start()
        child.close()
        info = parent.recv()
        if info["use_cache"] != cache:
            raise RuntimeError(f"producer with cache={cache} read SGLANG_USE_IPC_POOL_HANDLE_CACHE as "
                               f"{info['use_cache']}")
        producers[cache] = (proc, parent, info)

    rng = random.Random(args.seed)
    first_us = {}
    for cache in (False, True):  # the first open of the pool, reported apart from the steady state
        feat, _, bad = consumer.request(producers[cache][1], token_counts[0], 1)
        first_us["on" if cache else "off"] = feat[0]
        if bad:
            raise RuntimeError("first rebuilt feature does not match its source")

    cells = []
    for sc in scenarios:
        samples = {c: {"feature": [], "request": [], "bad": 0} for c in (False, True)}
        for r in range(args.warmup + args.requests):
            pair = [False, True]
            rng.shuffle(pair)
            for cache in pair:
                feat, req, bad = consumer.request(producers[cache][1], sc.tokens, sc.n_images)
                samples[cache]["bad"] += bad
                if r >= args.warmup:
                    samples[cache]["feature"] += feat
                    samples[cache]["request"].append(req)
        gc.collect()
        cell = {"resolution": sc.resolution, "n_images": sc.n_images, "tokens": sc.tokens,
                "feature_bytes": sc.feature_bytes}
        for cache in (False, True):
            key = "on" if cache else "off"
            s = samples[cache]
            cell[key] = {"per_feature_us": summarize(s["feature"]), "per_request_us": summarize(s["request"]),
                         "bad_features": s["bad"],
                         "raw_per_feature_us": [round(x, 2) for x in s["feature"]],
                         "raw_per_request_us": [round(x, 2) for x in s["request"]]}
        cell["speedup_feature_median"] = ratio(cell["off"]["per_feature_us"]["median"],
                                               cell["on"]["per_feature_us"]["median"])
        cell["speedup_request_median"] = ratio(cell["off"]["per_request_us"]["median"],
                                               cell["on"]["per_request_us"]["median"])
        cells.append(cell)
        print(f"{adapter.name:>16} {sc.resolution:>5} x{sc.n_images}: feature median off "
              f"{cell['off']['per_feature_us']['median']:8.1f} us on {cell['on']['per_feature_us']['median']:6.1f}"
              f" us | request median off {cell['off']['per_request_us']['median']:8.1f} on "
              f"{cell['on']['per_request_us']['median']:8.1f} us | bad {cell['off']['bad_features']}"
              f"/{cell['on']['bad_features']}", flush=True)

    for proc, conn, _ in producers.values():
        conn.send(None)
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()

    return {
        "part": 1,
        "impl": args.impl,
        "name": adapter.name,
        "version": adapter.version,
        "placeholder_modules": adapter.stubs,
        "producers": {("on" if c else "off"): p[2] for c, p in producers.items()},
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device_name": torch.cuda.get_device_name(args.device),
        "python": platform.python_version(),
        "requests_per_cell": args.requests,
        "warmup_per_cell": args.warmup,
        "pool_mb": args.pool_mb,
        "first_open_us": first_us,
        "cells": cells,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", choices=("sglang", "torch"), required=True)
    ap.add_argument("--site", help="directory the SGLang wheel was installed into (--impl sglang)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=300, help="timed requests per cell and cache setting")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--pool-mb", type=int, default=2048)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    result = run(args)
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
