"""The Grafana dashboard's queries as Grafana would run them, for the e2e monitoring proofs
(tests/e2e/test_monitoring.py, tests/e2e/test_frontend.py): every panel target, its variables substituted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "vlm-operator.json"
SCRAPE_S = 15  # the PodMonitor's interval; Grafana's $__rate_interval is max(4 x scrape, step + scrape)
RATE_INTERVAL = f"{4 * SCRAPE_S}s"
# The targets that need front-end sampling (telemetry.frontendRoles, off by default): test_frontend.py, whose
# pods run SGLang's front end, checks these; test_monitoring.py every other one.
FRONTEND_TARGETS = {("Busy share per role", "A"), ("Front-end saturation and processes", "A"),
                    ("Front-end saturation and processes", "B"), ("Front-end saturation and processes", "C")}
# spec.autoscaling's panels: drawn where KEDA runs (tests/e2e/test_autoscaling.py reads them)
AUTOSCALING_TARGETS = {("Replicas: desired vs running", "A"), ("Replicas: desired vs running", "B"),
                       ("Replicas: desired vs running", "C"), ("Autoscaling signals: value / target", "A")}


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(panels: list[dict]) -> Iterator[dict]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def targets(dash: dict) -> Iterator[tuple[str, dict]]:
    """(panel title, target) for every target of every panel, rows' panels included."""
    for p in _panels(dash["panels"]):
        for t in p.get("targets", []):
            yield p["title"], t


def expr(text: str, namespace: str, service: str, range_s: float) -> str:
    return (text.replace("$namespace", namespace).replace("$vlmservice", service)
            .replace("$__rate_interval", RATE_INTERVAL).replace("$__range", f"{max(60, int(range_s))}s"))


def has_data(mon, target: dict, namespace: str, service: str, t_begin: float, now: float) -> bool:
    """Whether the target's query returns data over [t_begin, now] (an instant query at now where it is one)."""
    q = expr(target["expr"], namespace, service, now - t_begin)
    if target.get("instant"):
        return bool(mon.query(q, at=now))
    return any(s["values"] for s in mon.query_range(q, t_begin, now, SCRAPE_S))
