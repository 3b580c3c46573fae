"""Structured logs: one JSON object per line with time, level, logger and msg (the operator's json format
writes the same keys), Kubernetes style messages ("Found scheduler"), fields next to them, no secrets."""

from __future__ import annotations

import json
import logging
import sys
import time

log = logging.getLogger("vlm_sidecar")
# Events that mean the sidecar exports less than it should; the rest are informational.
WARNINGS = frozenset({"SGLang metrics scrape failed", "Lost scheduler", "Profiling window failed",
                      "Profiling window partial"})


def event(msg: str, **fields) -> None:
    """One structured line per event, Kubernetes style ("Found scheduler ...")."""
    log.log(logging.WARNING if msg in WARNINGS else logging.INFO, msg, extra={"fields": fields})


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in (getattr(record, "fields", None) or {}).items():
            line.setdefault(k, v)
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(stream=None, level: int = logging.INFO) -> None:
    """JSON lines on stderr for every logger of the process (ours and the libraries')."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
