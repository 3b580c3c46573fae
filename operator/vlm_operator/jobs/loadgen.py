"""The load hook's generator: chat completions at one fixed rate to each of a list of SGLang pods.

Run by the Job the operator makes while a canary step is analysed (``spec.rollout.load``; builders.build_load_job)::

    python -m vlm_operator.jobs.loadgen --target 10.0.0.5:30000 --target 10.0.0.6:30000 --rate 1 \
        --image-fraction 0.5 --images-per-request 1 --image-size 448 --max-tokens 16 --model default

Every target gets the same requests at the same rate: request k of every target is sent at
``start + (k + i / n) / rate`` (target i of n, so the targets' requests interleave instead of arriving together),
and whether it carries images follows k alone (exactly ``image-fraction`` of any run of requests, in the same
order for every target). Each image is a fresh PNG (a gradient with random bytes in its first row, so no two
requests share an image and SGLang's multimodal caches cannot skip the work). A target that already has
``--max-in-flight`` requests open skips that tick (counted as ``skipped``) rather than queueing: a slow pod
is not sent a burst later. Every ``--report-every`` seconds one JSON line on stdout says what was sent, answered
and failed per target. SIGTERM ends it with exit code 0 (the Job is deleted when the analysis ends).

Standard library only: the operator's image carries it, and nothing else needs installing.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import signal
import struct
import sys
import time
import zlib
from dataclasses import dataclass, field

PATH = "/v1/chat/completions"


_SHIFT = [bytes((i + y) & 0xFF for i in range(256)) for y in range(256)]


def png(size: int, salt: bytes) -> bytes:
    """A size x size RGB PNG: a gradient (compresses well) whose first row starts with `salt` (unique per image)."""
    row = bytes(x * 255 // max(size - 1, 1) for x in range(size) for _ in range(3))
    rows = [b"\x00" + (salt + row)[: 3 * size]]
    rows += [b"\x00" + row.translate(_SHIFT[y & 0xFF]) for y in range(1, size)]

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(rows), 1))
            + chunk(b"IEND", b""))


def carries_images(k: int, fraction: float) -> bool:
    """Whether request k carries images: exactly `fraction` of any run of requests, spread evenly."""
    return int((k + 1) * fraction + 1e-9) > int(k * fraction + 1e-9)


def body(k: int, cfg: Config) -> bytes:
    content: list[dict] = [{"type": "text", "text": cfg.prompt}]
    if carries_images(k, cfg.image_fraction):
        for _ in range(cfg.images_per_request):
            data = base64.b64encode(png(cfg.image_size, os.urandom(16))).decode()
            content.append({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}})
    msg = {"model": cfg.model, "max_tokens": cfg.max_tokens, "temperature": 0,
           "messages": [{"role": "user", "content": content}]}
    return json.dumps(msg, separators=(",", ":")).encode()


def split_target(target: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port`."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"target {target!r}: expected host:port")
    return host.strip("[]"), int(port)


@dataclass
class Config:
    targets: list[str]
    rate: float = 1.0
    image_fraction: float = 0.5
    images_per_request: int = 1
    image_size: int = 448
    max_tokens: int = 16
    prompt: str = "Describe this image in one sentence."
    model: str = "default"
    max_in_flight: int = 16
    timeout_s: float = 120.0
    duration_s: float = 0.0  # 0: until SIGTERM
    report_every_s: float = 10.0


@dataclass
class Counts:
    sent: int = 0
    ok: int = 0
    errors: int = 0
    skipped: int = 0
    images: int = 0
    in_flight: int = 0
    last_error: str = ""
    codes: dict[int, int] = field(default_factory=dict)


async def post(host: str, port: int, payload: bytes, timeout: float) -> int:
    """One POST; the HTTP status code (0: no answer)."""
    async def go() -> int:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            hostname = f"[{host}]" if ":" in host else host
            writer.write(
                f"POST {PATH} HTTP/1.1\r\nHost: {hostname}:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload
            )
            await writer.drain()
            line = await reader.readline()
            parts = line.split()
            code = int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0
            while await reader.read(1 << 16):
                pass
            return code
        finally:
            writer.close()

    return await asyncio.wait_for(go(), timeout)


async def drive(cfg: Config, stop: asyncio.Event, out=sys.stdout) -> dict[str, Counts]:
    counts = {t: Counts() for t in cfg.targets}
    n = len(cfg.targets)
    start = time.monotonic()
    tasks: set[asyncio.Task] = set()

    async def one(target: str, k: int) -> None:
        c = counts[target]
        host, port = split_target(target)
        payload = body(k, cfg)
        c.images += cfg.images_per_request if carries_images(k, cfg.image_fraction) else 0
        try:
            code = await post(host, port, payload, cfg.timeout_s)
        except (TimeoutError, OSError) as e:
            code, c.last_error = 0, f"{type(e).__name__}: {e}"
        c.codes[code] = c.codes.get(code, 0) + 1
        if 200 <= code < 300:
            c.ok += 1
        else:
            c.errors += 1
            if code:
                c.last_error = f"HTTP {code}"
        c.in_flight -= 1

    async def per_target(i: int, target: str) -> None:
        k = 0
        while not stop.is_set():
            due = start + (k + i / n) / cfg.rate
            wait = due - time.monotonic()
            if wait > 0:
                try:
                    await asyncio.wait_for(stop.wait(), wait)
                    return
                except TimeoutError:
                    pass
            c = counts[target]
            if c.in_flight >= cfg.max_in_flight:
                c.skipped += 1
            else:
                c.sent += 1
                c.in_flight += 1
                t = asyncio.create_task(one(target, k))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            k += 1

    async def reporter() -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), cfg.report_every_s)
            report(counts, time.monotonic() - start, out)

    async def timer() -> None:
        if cfg.duration_s > 0:
            try:
                await asyncio.wait_for(stop.wait(), cfg.duration_s)
            except TimeoutError:
                stop.set()

    await asyncio.gather(reporter(), timer(), *(per_target(i, t) for i, t in enumerate(cfg.targets)))
    if tasks:
        await asyncio.wait(set(tasks), timeout=min(cfg.timeout_s, 5.0))
    report(counts, time.monotonic() - start, out)  # the last word, with the answers still open at the stop
    return counts


def report(counts: dict[str, Counts], elapsed: float, out=sys.stdout) -> None:
    line = {"elapsed_s": round(elapsed, 1),
            "sent": sum(c.sent for c in counts.values()), "ok": sum(c.ok for c in counts.values()),
            "errors": sum(c.errors for c in counts.values()), "skipped": sum(c.skipped for c in counts.values()),
            "targets": {t: {"sent": c.sent, "ok": c.ok, "errors": c.errors, "skipped": c.skipped, "images": c.images,
                            **({"last_error": c.last_error} if c.last_error else {})} for t, c in counts.items()}}
    print(json.dumps(line, separators=(",", ":")), file=out, flush=True)


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(prog="python -m vlm_operator.jobs.loadgen", description=__doc__.split("\n")[0])
    p.add_argument("--target", action="append", required=True, help="host:port of an SGLang server (repeat)")
    p.add_argument("--rate", type=float, default=1.0, help="requests per second to each target")
    p.add_argument("--image-fraction", type=float, default=0.5)
    p.add_argument("--images-per-request", type=int, default=1)
    p.add_argument("--image-size", type=int, default=448)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--prompt", default="Describe this image in one sentence.")
    p.add_argument("--model", default="default")
    p.add_argument("--max-in-flight", type=int, default=16)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--duration", type=float, default=0.0, help="seconds; 0: until SIGTERM")
    p.add_argument("--report-every", type=float, default=10.0)
    a = p.parse_args(argv)
    for t in a.target:
        try:
            split_target(t)
        except ValueError as e:
            p.error(str(e))
    if not (a.rate > 0 and 0 <= a.image_fraction <= 1 and a.images_per_request >= 1 and a.image_size >= 1):
        p.error("--rate must be > 0, --image-fraction within 0..1, --images-per-request and --image-size >= 1")
    return Config(targets=a.target, rate=a.rate, image_fraction=a.image_fraction,
                  images_per_request=a.images_per_request, image_size=a.image_size, max_tokens=a.max_tokens,
                  prompt=a.prompt, model=a.model, max_in_flight=a.max_in_flight, timeout_s=a.timeout,
                  duration_s=a.duration, report_every_s=a.report_every)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await drive(cfg, stop)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
