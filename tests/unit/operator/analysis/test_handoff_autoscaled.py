"""The analysis when an autoscaler moves the stable revision mid-step: a stable pod that joined after the analysis
began is no pair and no part of the stable mean until it has run a pre-period (gate.PRE_PERIOD_S); pods that were
there (in the pre-period) and the fresh-baseline case are untouched. Windows of a pod that left: see
test_sources_sidecars.py."""

from __future__ import annotations

from vlm_operator.analysis import gate
from vlm_operator.analysis.handoff import warmed
from vlm_operator.analysis.window import Window
from vlm_operator.cluster.observed import Observed, PodInfo

STARTED = 1_000.0


def w(pod: str, end: float) -> Window:
    return Window("s", pod, f"{pod}-{end}", end, 500, 0.02, 0.021, {}, {})


def pod(name: str, ready_since: float | None) -> PodInfo:
    return PodInfo(name=name, role="stable", revision="s", phase="Running", ready=True, ready_since=ready_since)


def test_a_stable_pod_that_joined_mid_step_counts_after_its_pre_period():
    observed = Observed(pods=[pod("old", STARTED - 3600), pod("new", STARTED + 60), pod("listed", STARTED + 30)])
    ends = [STARTED + 60 + k * 15 for k in range(40)]
    base = [w("old", e) for e in ends] + [w("new", e) for e in ends] + [w("listed", e) for e in ends]
    kept = warmed(base, observed, "s", STARTED, before={"listed"})
    assert [x for x in kept if x.pod == "old"] == [x for x in base if x.pod == "old"]  # there all along
    assert [x for x in kept if x.pod == "listed"] == [x for x in base if x.pod == "listed"]  # has a pre-period
    new = [x.end for x in kept if x.pod == "new"]
    assert new and min(new) >= STARTED + 60 + gate.PRE_PERIOD_S  # its first 5 minutes are its warm-up
    assert len(new) == len([e for e in ends if e >= STARTED + 60 + gate.PRE_PERIOD_S])


def test_pods_without_a_known_ready_time_are_kept():
    observed = Observed(pods=[pod("p", None)])
    base = [w("p", STARTED + 10)]
    assert warmed(base, observed, "s", STARTED, before=set()) == base


def test_ready_since_is_read_from_the_ready_condition():
    body = {"metadata": {"name": "p", "labels": {}}, "status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-07T10:00:00Z"}]}}
    assert PodInfo.from_body(body).ready_since == 1796637600.0
    body["status"]["conditions"][0]["status"] = "False"
    assert PodInfo.from_body(body).ready_since is None
