"""A service made by the release before revision Deployments is adopted as it runs (issue: node-paired rollouts,
test (e)): its `NAME` Deployment, with the role in its selector and template, becomes its stable revision's; the
reconcile re-applies it unchanged (same name, selector, template: no pod restarted) and makes no other
Deployment; a later change replaces its pods node by node like any other revision's."""

from __future__ import annotations

import copy

from vlm_operator.api.names import LABEL_REVISION, LABEL_ROLE, LABEL_SERVICE, ROLE_STABLE
from vlm_operator.desired import builders
from vlm_testing.fakekube import SPEC, T0, FakeCluster


def legacy_deployment(c: FakeCluster, replicas: int) -> dict:
    """The stable Deployment as the previous release built it: named NAME, selector {service, role: stable}, the
    role and revision in its template (the revision of today's template for the same spec)."""
    owner = builders.Owner("svc", "ns", "uid-svc")
    from vlm_operator.api import v1alpha1 as api
    from vlm_operator.api.settings import Settings
    desired = builders.build_desired(owner, api.parse_spec(dict(SPEC, replicas=replicas)), Settings())
    t = copy.deepcopy(desired.template)
    t["metadata"]["labels"] = {**t["metadata"]["labels"], LABEL_REVISION: desired.revision, LABEL_ROLE: ROLE_STABLE}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "svc", "namespace": "ns", "generation": 1, "uid": "uid-legacy",
                     "labels": {**builders.common_labels(owner), LABEL_REVISION: desired.revision, LABEL_ROLE: ROLE_STABLE},
                     "ownerReferences": [owner.reference()]},
        "spec": {"replicas": replicas, "revisionHistoryLimit": 3, "progressDeadlineSeconds": 1800,
                 "selector": {"matchLabels": {LABEL_SERVICE: "svc", LABEL_ROLE: ROLE_STABLE}},
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                 "template": t},
    }


def test_a_previous_release_service_is_adopted_without_a_restart_then_updated_node_by_node():
    c = FakeCluster(dict(SPEC, replicas=2))
    c.kube.nodes = {"n0": 1, "n1": 1}
    legacy = legacy_deployment(c, 2)
    c.kube.objects[("apps/v1", "Deployment", "ns", "svc")] = legacy
    c.kube.settle("svc")
    before = {p.name: p.node for p in c.kube.pods("svc")}
    assert len(before) == 2 and set(before.values()) == {"n0", "n1"}
    c.kube.vlmservice("svc")["status"] = {"stableRevision": legacy["metadata"]["labels"][LABEL_REVISION]}
    c.kube.reset_writes()
    c.run(T0)
    c.kube.settle("svc")
    # adopted: the same Deployment, its template and selector as they were, no other Deployment, the same pods
    deps = [w for w in c.kube.written() if w.kind == "Deployment"]
    assert all(w.name == "svc" for w in deps), [(w.verb, w.name) for w in deps]
    kept = c.kube.objects[("apps/v1", "Deployment", "ns", "svc")]
    assert kept["spec"]["template"] == legacy["spec"]["template"] and kept["spec"]["selector"] == legacy["spec"]["selector"]
    assert {p.name: p.node for p in c.kube.pods("svc")} == before
    assert c.status["stableRevision"] == legacy["metadata"]["labels"][LABEL_REVISION]

    # a change without a rollout block: the new revision's pods take the old ones' nodes, never 0 Ready
    c.kube.update_spec("svc", dict(SPEC, replicas=2, sglang={"env": [{"name": "X", "value": "1"}]}))
    low = 2
    t = T0 + 10
    for _ in range(20):
        c.run(t)
        c.kube.settle("svc")
        low = min(low, sum(1 for p in c.kube.pods("svc") if p.ready))
        t += 15
        if c.status.get("rollout") is None and c.status["stableRevision"] != legacy["metadata"]["labels"][LABEL_REVISION]:
            break
    pods = c.kube.pods("svc")
    assert c.status.get("rollout") is None, c.status.get("rollout")
    assert {p.revision for p in pods} == {c.status["stableRevision"]} and len(pods) == 2
    assert sorted(p.node for p in pods) == ["n0", "n1"]
    assert low >= 1, low  # maxUnavailable 1 of 2
    assert ("apps/v1", "Deployment", "ns", "svc") not in c.kube.objects  # the adopted Deployment went, drained
