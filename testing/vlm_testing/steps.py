"""Shared by tests (moved out of tests/unit/operator/controller/test_reconcile_steps.py, so no test imports another test module)."""

from __future__ import annotations

from vlm_operator.desired import builders
from vlm_testing.fakekube import SPEC, T0, SidecarCluster

STEPS = {
    **SPEC,
    "replicas": 4,
    "rollout": {"baseline": "Fresh",
                "steps": [{"replicas": 1, "analysis": "2m"}, {"replicas": 2, "analysis": "2m"},
                          {"replicas": 3, "analysis": "2m"}],
                "analysis": {"interval": "1m", "maxDuration": "10m", "minSamples": 5}},
}


CHANGE = {"sglang": {"env": [{"name": "HARMLESS", "value": "1"}]}}


def canary_revision(c: SidecarCluster) -> str | None:
    return (c.status.get("rollout") or {}).get("revision")


def is_canary(c: SidecarCluster, pod: str) -> bool:
    rev = canary_revision(c)
    return bool(rev) and pod.startswith(f"svc-{rev}-")


def walk(c: SidecarCluster, start: float, limit: int = 80, on_look=None) -> list[dict]:
    """A reconcile every minute, the cluster settling after each (gated pods released the round after they are
    made, placed pods Ready), until a verdict: each look's (step, phase, reason, canary replicas,
    analysisStartedAt, Ready serving pods)."""
    looks = []
    t = start
    for _ in range(limit):
        t += 60
        c.run(t)
        r = c.status["rollout"]
        if on_look:
            on_look(t, r)
        canary = c.kube.deployments("ns", "svc").get(r["revision"])
        looks.append({"t": t - start, "step": r.get("step"), "phase": r["phase"], "reason": r.get("reason"),
                      "canary": canary["spec"]["replicas"] if canary else None,
                      "started": r.get("analysisStartedAt"), "ready": serving_ready(c)})
        if r["phase"] in ("Promoted", "RolledBack", "Aborted"):
            return looks
        c.kube.settle("svc")
    raise AssertionError(f"no verdict after {limit} looks: {looks[-5:]}")


def serving_ready(c: SidecarCluster) -> int:
    return sum(1 for p in c.kube.pods("svc") if p.ready and p.labelled_role != builders.ROLE_BASELINE)


def finish(c: SidecarCluster, t: float, limit: int = 10) -> float:
    """Reconciles after the verdict until the service runs one revision (a rollback replaces the canary's pods
    first; a drained Deployment goes the round after its last pod)."""
    for _ in range(limit):
        c.kube.settle("svc")
        t += 60
        c.run(t)
        if len(c.kube.deployments("ns", "svc")) == 1 and all(p.ready for p in c.kube.pods("svc")):
            return t
    raise AssertionError(f"still {sorted(c.kube.deployments('ns', 'svc'))} after {limit} rounds")


def start(c: SidecarCluster, spec: dict = STEPS) -> float:
    """4 Ready stable pods of `spec`, then `spec` with CHANGE applied (a new revision): the rollout's start time."""
    c.run(T0)
    c.kube.settle("svc")  # the pods made, gated
    c.run(T0 + 1)  # released
    c.kube.settle("svc")  # placed and Ready
    c.run(T0 + 2)
    assert serving_ready(c) == 4
    c.kube.update_spec("svc", {**spec, **CHANGE})
    c.run(T0 + 10)
    return T0 + 10
