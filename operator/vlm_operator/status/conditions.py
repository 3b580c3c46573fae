"""Kubernetes-style conditions: type/status/reason/message/observedGeneration/lastTransitionTime.

The transition time moves only when the status flips; a changed reason or
message with the same status keeps the old time (API conventions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from vlm_operator.api.units import TIME_FORMAT

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
IPC_CACHE_ACTIVE = "IPCCacheActive"
MARGIN_RESOLVABLE = "MarginResolvable"
MODEL_READY = "ModelReady"
AUTOSCALING = "Autoscaling"  # spec.autoscaling only: its ScaledObject written, or what is missing
ORDER = (READY, PROGRESSING, DEGRADED, MODEL_READY, IPC_CACHE_ACTIVE, MARGIN_RESOLVABLE, AUTOSCALING)


@dataclass(frozen=True)
class Cond:
    type: str
    status: bool | None  # None -> "Unknown"
    reason: str
    message: str = ""


def _status_word(v: bool | None) -> str:
    return "Unknown" if v is None else ("True" if v else "False")


def rfc3339(now: datetime) -> str:
    return now.strftime(TIME_FORMAT)


def merge(
    current: Sequence[dict], wanted: Sequence[Cond], *, generation: int | None, now: datetime
) -> list[dict]:
    """New conditions list: wanted ones updated in place, others kept, in a stable order."""
    by_type = {c.get("type"): dict(c) for c in current if isinstance(c, dict)}
    for w in wanted:
        old = by_type.get(w.type)
        status = _status_word(w.status)
        flipped = old is None or old.get("status") != status
        by_type[w.type] = {
            "type": w.type,
            "status": status,
            "reason": w.reason,
            "message": w.message,
            "observedGeneration": generation,
            "lastTransitionTime": rfc3339(now) if flipped else old.get("lastTransitionTime", rfc3339(now)),
        }
    known = [by_type.pop(t) for t in ORDER if t in by_type]
    return known + [by_type[t] for t in sorted(by_type)]


def find(conditions: Sequence[dict], type_: str) -> dict | None:
    for c in conditions:
        if isinstance(c, dict) and c.get("type") == type_:
            return c
    return None


def transitions(before: Sequence[dict], after: Sequence[dict]) -> list[dict]:
    """Conditions whose status or reason changed (these become Events)."""
    out = []
    for c in after:
        old = find(before, c["type"])
        if old is None or old.get("status") != c["status"] or old.get("reason") != c["reason"]:
            out.append(c)
    return out


IPC_NOT_OBSERVED_EVENT = "IPCCacheNotObserved"
# Degraded reasons whose Event the rollout posts itself, with the verdict's message (rollout.py): the
# condition's flip would post the same reason a second time.
ROLLOUT_POSTED = frozenset({"CanaryRolledBack"})


def events_for(transitions: Sequence[dict]) -> list[tuple[str, str, str]]:
    """Ready and Degraded flips become Events (type, reason, message): Warnings for trouble, Normal for
    recovery. Replicas still starting and an invalid spec (reported by its own condition) are not news;
    a Warning reason posted once even when Ready and Degraded both turn for it.
    IPCCacheActive turning False/NotObserved (pods told to cache re-open IPC handles) is a Warning
    `IPCCacheNotObserved`. Autoscaling's flips are Events of their reason (Normal when its ScaledObject is written,
    a Warning naming what is missing otherwise). A Degraded flip whose reason the rollout posts itself (CanaryRolledBack) is
    not posted again."""
    out = []
    for c in transitions:
        text = f"{c['type']}={c['status']}: {c['message']}"
        if c["type"] == IPC_CACHE_ACTIVE:
            if c["status"] == "False" and c["reason"] == "NotObserved":
                out.append(("Warning", IPC_NOT_OBSERVED_EVENT, text))
        elif c["type"] == AUTOSCALING:
            out.append(("Normal" if c["status"] == "True" else "Warning", c["reason"], text))
        elif c["type"] == READY and c["status"] == "True":
            out.append(("Normal", c["reason"], text))
        elif (c["type"] == READY and c["status"] == "False" and c["reason"] != "ReplicasNotReady") or (
            c["type"] == DEGRADED and c["status"] == "True" and c["reason"] not in ("InvalidSpec", *ROLLOUT_POSTED)
        ):
            out.append(("Warning", c["reason"], text))
    # One Event per reason: Ready and Degraded turning for the same cause (ApplyRefused) are posted once.
    return [ev for i, ev in enumerate(out) if ev[0] != "Warning" or all(ev[1] != o[1] for o in out[:i])]
