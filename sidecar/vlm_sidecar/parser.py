"""Parsers for py-spy output: chrometrace (timed B/E events) and raw/collapsed stacks.

They never raise on bad input: whatever cannot be read is counted (`bad_events`, `truncated`,
`error`) so the runner can report it, and whatever can be read is kept. A py-spy killed mid-write
leaves a JSON list cut anywhere; the salvage path decodes event by event up to the cut.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable

from vlm_sidecar.model import ParsedTrace, Segment

_RAW_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


def frame_label(name: str, filename: str | None) -> str:
    """'Scheduler.run_batch' + '/x/y/scheduler.py' -> 'Scheduler.run_batch (scheduler.py)'.

    Line numbers are dropped and paths cut to the base name so that a stack from this revision
    and one from the previous (or from a raw profile) line up in the diff view.
    """
    if not filename:
        return name
    return f"{name} ({filename.rsplit('/', 1)[-1]})"


def function_name(label: str) -> str:
    """'Scheduler.run_batch (scheduler.py)' -> 'run_batch': the name SGLang's code uses."""
    name = label.split(" (", 1)[0]
    if name.startswith("<"):
        return name
    return name.rsplit(".", 1)[-1]


def _load_events(text: str) -> tuple[list | None, bool]:
    """Whole-document decode, else event-by-event salvage of a cut list. Returns (events, truncated)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        doc = None
    else:
        if isinstance(doc, dict):
            doc = doc.get("traceEvents")
        return (doc if isinstance(doc, list) else None), False
    start = text.find("[")
    if start < 0:
        return None, False
    decoder = json.JSONDecoder()
    events: list = []
    pos = start + 1
    n = len(text)
    while pos < n:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n or text[pos] == "]":
            break
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            break
        events.append(obj)
    return events, True


def _valid(ev: object) -> tuple[str, str, float, int, str | None] | None:
    if not isinstance(ev, dict):
        return None
    ph, name, ts, tid = ev.get("ph"), ev.get("name"), ev.get("ts"), ev.get("tid")
    if ph not in ("B", "E") or not isinstance(name, str):
        return None
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        return None
    if isinstance(tid, bool) or not isinstance(tid, int):
        return None
    args = ev.get("args")
    filename = args.get("filename") if isinstance(args, dict) else None
    return ph, name, float(ts), tid, filename if isinstance(filename, str) else None


def parse_chrometrace(data: bytes | str) -> ParsedTrace:
    """py-spy `-f chrometrace` output -> per-thread segments of unchanged stacks."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes | bytearray) else data
    events, truncated = _load_events(text)
    if events is None:
        return ParsedTrace(truncated=truncated, error="not a chrometrace JSON list")
    bad = 0
    per_tid: dict[int, list[tuple[float, int, str, str]]] = {}
    for i, ev in enumerate(events):
        v = _valid(ev)
        if v is None:
            bad += 1
            continue
        ph, name, ts, tid, filename = v
        per_tid.setdefault(tid, []).append((ts, i, ph, frame_label(name, filename)))
    threads: dict[int, list[Segment]] = {}
    for tid, evs in per_tid.items():
        evs.sort()  # py-spy writes in time order; the sort only guards against a reordered file
        stack: list[str] = []
        segs: list[Segment] = []
        last_ts = evs[0][0]
        for ts, _i, ph, label in evs:
            if ts > last_ts:
                if stack:
                    if segs and segs[-1].stack == tuple(stack) and segs[-1].end_us == last_ts:
                        segs[-1] = Segment(segs[-1].start_us, ts, segs[-1].stack)
                    else:
                        segs.append(Segment(last_ts, ts, tuple(stack)))
                last_ts = ts
            if ph == "B":
                stack.append(label)
            elif stack and stack[-1] == label:
                stack.pop()
            elif label in stack:
                # An end for a frame below the top: close everything above it too.
                del stack[len(stack) - 1 - stack[::-1].index(label):]
                bad += 1
            else:
                bad += 1
        if segs:
            threads[tid] = segs
    error = None if threads else "no usable events"
    return ParsedTrace(threads=threads, bad_events=bad, truncated=truncated, error=error)


def parse_collapsed(text: str | bytes) -> tuple[dict[tuple[str, ...], float], int]:
    """py-spy `-f raw` / Brendan Gregg collapsed stacks -> ({stack: weight}, bad_lines)."""
    if isinstance(text, bytes | bytearray):
        text = text.decode("utf-8", "replace")
    out: dict[tuple[str, ...], float] = {}
    bad = 0
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        stack_text, _, count_text = line.rpartition(" ")
        try:
            count = float(count_text)
        except ValueError:
            bad += 1
            continue
        if not stack_text or not math.isfinite(count) or count <= 0:
            bad += 1
            continue
        frames = []
        for raw in stack_text.split(";"):
            m = _RAW_FRAME.match(raw)
            frames.append(frame_label(m["name"], m["file"]) if m else raw)
        key = tuple(frames)
        out[key] = out.get(key, 0.0) + count
    return out, bad


def collapse_segments(segments: Iterable[Segment]) -> dict[tuple[str, ...], float]:
    """Segments -> collapsed stacks weighted by time in microseconds."""
    out: dict[tuple[str, ...], float] = {}
    for s in segments:
        out[s.stack] = out.get(s.stack, 0.0) + s.duration_us
    return out


def format_collapsed(stacks: dict[tuple[str, ...], float]) -> str:
    """Collapsed-stack text (weights rounded to integers), heaviest first."""
    rows = sorted(stacks.items(), key=lambda kv: -kv[1])
    return "".join(f"{';'.join(k)} {round(v)}\n" for k, v in rows if round(v) > 0)
