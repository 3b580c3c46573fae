"""Signal sources: where the gate's windows come from, one module per source behind one small interface.

- `sidecars`: every ready pod's `/windows.json` on the pod network (cached per pod window);
- `prometheus`: the sidecars' per-window gauges, through PromQL range queries.
Both build `vlm_operator.analysis.window.Window` directly with the same fields, and both raise `SignalsUnavailable`
when nothing could be read, which the analysis turns into an Inconclusive look (never a promotion).
`choose` picks one for a service, as its spec and the operator's settings say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from vlm_operator.analysis.sources.base import SignalsUnavailable
from vlm_operator.analysis.sources.prometheus import from_prometheus
from vlm_operator.analysis.sources.sidecars import SidecarReader, from_sidecars
from vlm_operator.analysis.window import Window


class Source(Protocol):
    """Windows of the given revisions that ended at or after `since` (unix seconds), as of `now`."""

    kind: str

    def read(self, revisions: Sequence[str], since: float, now: float) -> list[Window]: ...


@dataclass(frozen=True)
class Sidecars:
    reader: SidecarReader
    pods: Sequence[tuple[str, str, str | None]]  # (name, revision, IP) of the ready pods
    interval_s: float  # the telemetry interval: when a pod's next window is due
    group: str = ""  # the service ("namespace/name"): windows of its pods that left still count
    kind: str = "Sidecars"

    def read(self, revisions: Sequence[str], since: float, now: float) -> list[Window]:
        pods = [p for p in self.pods if p[1] in revisions]
        return self.reader.read(pods, since, interval=self.interval_s, now=now, group=self.group,
                                revisions=revisions)


@dataclass(frozen=True)
class Prometheus:
    url: str
    namespace: str
    service: str
    interval_s: float  # the telemetry interval
    kind: str = "Prometheus"

    def read(self, revisions: Sequence[str], since: float, now: float) -> list[Window]:
        # A third of the telemetry interval: every window is seen at least once while the scrape keeps up;
        # seeing one several times is harmless (from_prometheus keeps one observation per window).
        step = max(1.0, self.interval_s / 3)
        return from_prometheus(self.url, self.namespace, self.service, revisions, since=since, now=now, step=step)


def choose(
    source: str,
    url: str | None,
    *,
    namespace: str,
    service: str,
    interval_s: float,
    pods: Sequence[tuple[str, str, str | None]],
    reader: SidecarReader,
) -> Source:
    """`source` (the spec's analysis.source: Auto, Prometheus or Sidecars) and the Prometheus URL (the spec's,
    else the operator's): Prometheus when asked for, or on Auto when a URL is known; the sidecars otherwise."""
    if source == "Prometheus" or (source == "Auto" and url):
        return Prometheus(url or "", namespace, service, interval_s)  # (the API refuses Prometheus without a URL)
    return Sidecars(reader, pods, interval_s, group=f"{namespace}/{service}")


__all__ = [
    "Prometheus",
    "SidecarReader",
    "Sidecars",
    "SignalsUnavailable",
    "Source",
    "choose",
    "from_prometheus",
    "from_sidecars",
]
