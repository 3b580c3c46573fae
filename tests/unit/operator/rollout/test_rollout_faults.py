"""Faults around node-paired moves: an operator stopped between a removal mark and the scale-down, a mark the
ReplicaSet did not act on, a pods index behind our own write, a pinned pod's node going away, replicas changed
mid-rollout, a third revision, a rollback while surge pairs stand. Each must end (no rollout stuck), keep Ready
at or above the budget, and never flap a Deployment. Each test drives the pure plan over FakeKube
(test_rollout.World) the way the reconcile does. (Found by a review of the design; the first five failed
before the fixes in placement.py.)"""

from __future__ import annotations

from vlm_operator.controller import act
from vlm_testing.rollout_world import CHANGE, T0, TIGHT, World, spec


def _stale_pods(w: World, pods):
    """Make the World's next rounds read the pods index as it was (`pods`), the Deployments as they are: kopf
    fills its pod and Deployment indexes from two watches, so one may show our own write and the other not yet."""
    def observed():
        obs = w.kube.observed("svc", pods=pods)
        stable = obs.stable_revision(w.stable)
        return obs.with_roles(stable, None)
    w.observed = observed  # type: ignore[method-assign]


def _fresh(w: World) -> None:
    w.__dict__.pop("observed", None)


def _done(new_rev):
    return lambda w: w.rollout is None and w.stable == new_rev


# -- 1. a victim marked, its Deployment never scaled down --------------------------------------------------------


def test_operator_stopped_between_marking_a_victim_and_scaling_its_deployment_does_not_stall_the_update():
    """act.pod_writes marks the victim (pod-deletion-cost) before the Deployments are applied. An operator that
    stops in between (or whose Deployment apply fails: the reconcile raises) leaves a Ready pod marked, its
    Deployment still at 3, and no pair in status. move() then treats that pod as gone for good (`standing`
    excludes victims): it counts 2 Ready of 3, a further replacement would leave 1 < floor 2, and nothing ever
    scales the old Deployment down to remove the marked pod. The update must still finish."""
    w = World(spec(rollout=None), nodes=dict(TIGHT))
    w.deploy()
    new_rev = w.change(spec(rollout=None, **CHANGE))
    obs = w.observed()
    p = w.plan(T0)
    assert len(p.victims) == 1
    # the round's first writes, and the operator stops here: no Deployment scaled, no status
    for x in act.pod_writes("ns", p, obs):
        w.kube.patch_pod(x.namespace, x.name, x.patch)
    w.kube.settle("svc")
    w.until(T0 + 10, _done(new_rev), limit=40)
    assert sorted(x.revision for x in w.serving()) == [new_rev] * 3


def test_a_victim_the_replicaset_did_not_remove_does_not_stall_the_update():
    """The ReplicaSet ranks a pod that is not Ready before a low pod-deletion-cost: when another old pod turns
    not Ready between the plan and the scale-down, the ReplicaSet removes that one, and the marked victim
    stays (Ready, serving, counted by its Deployment). move() never counts it again nor removes it."""
    w = World(spec(rollout=None), nodes=dict(TIGHT))
    old_rev = w.deploy()
    new_rev = w.change(spec(rollout=None, **CHANGE))
    p = w.step(T0, settle=False)
    victim = p.victims[0]
    other = next(x for x in w.pods_of(old_rev) if x.name != victim)
    w.kube.pod_store[("ns", other.name)]["ready"] = False  # crashed just now: the ReplicaSet takes it instead
    w.kube.settle("svc")
    assert victim in {x.name for x in w.serving()}  # (the fake ReplicaSet ranks as the real one)
    w.until(T0 + 10, _done(new_rev), limit=40)


# -- 2. the pods index behind the Deployments index: the budget is computed on pods about to go -------------------


def test_a_pods_index_behind_our_own_victim_mark_never_takes_ready_below_the_budget():
    """Round 1 marks victim V and scales the old Deployment 3 -> 2. Round 2 runs while the pods index does not show
    the mark yet (the Deployments index does show the scale): V counts as a Ready standing pod, so move() finds
    3 Ready and takes a second victim W (old Deployment 2 -> 1). The ReplicaSet then removes V and W together:
    1 Ready of 3 with maxUnavailable 1. Pods beyond their Deployment's replicas must count as gone."""
    w = World(spec(rollout=None), nodes=dict(TIGHT))
    w.deploy()
    w.change(spec(rollout=None, **CHANGE))
    before = w.kube.pods("svc")
    w.step(T0, settle=False)  # V marked, old Deployment 3 -> 2, the new one created at 1
    _stale_pods(w, before)  # the pod watch has not delivered the mark (nor anything since)
    w.step(T0 + 1, settle=False)
    _fresh(w)
    w.kube.settle("svc")
    assert sum(1 for x in w.serving() if x.ready) >= 2, [(x.name, x.revision, x.ready) for x in w.serving()]


# -- 3. a replacement pinned to a node that went away ------------------------------------------------------------


def test_a_replacement_pinned_to_a_node_that_went_away_does_not_stall_the_update():
    """A Replace pair's new pod is released pinned to the victim's node. If that node goes away (scaled down,
    drained, failed) before the pod is placed, the pod is unschedulable for good: the pair must be dropped (its pod
    marked and its Deployment scaled down) and the pod placed again, or the update, which has no startupTimeout,
    never finishes although a new node has room for it."""
    w = World(spec(rollout=None), nodes=dict(TIGHT))
    w.deploy()
    new_rev = w.change(spec(rollout=None, **CHANGE))
    p = w.step(T0)  # victim removed, its replacement made (gated)
    gone = p.rollout.pairs[0].node
    del w.kube.nodes[gone]  # the node goes; a new one comes
    w.kube.nodes["node-9"] = 1
    w.until(T0 + 10, _done(new_rev), limit=60)
    assert all(x.ready for x in w.serving()) and len(w.serving()) == 3


# -- scenarios the design handled from the start, kept as guards -----------------------------------------------


def _replicas_history(w: World, rev: str) -> list[int]:
    name = f"svc-{rev}"
    return [x.body["spec"]["replicas"] for x in w.kube.written("apply", "Deployment") if x.name == name]


def test_regression_replicas_raised_mid_update_finishes_without_flapping():
    roomy = {"node-0": 2, "node-1": 2, "node-2": 2}
    w = World(spec(rollout=None), nodes=dict(roomy))
    w.deploy()
    new_rev = w.change(spec(rollout=None, **CHANGE))
    w.step(T0)
    w.step(T0 + 10)
    w.spec = spec(rollout=None, replicas=4, **CHANGE)
    w.until(T0 + 20, _done(new_rev), limit=40)
    assert len([x for x in w.serving() if x.ready]) == 4
    h = _replicas_history(w, new_rev)
    assert h == sorted(h), h
    assert min(w.ready_seen) >= 2


def test_regression_replicas_lowered_mid_update_finishes():
    w = World(spec(rollout=None, replicas=3), nodes=dict(TIGHT))
    w.deploy()
    new_rev = w.change(spec(rollout=None, **CHANGE))
    w.step(T0)
    w.step(T0 + 10)
    w.spec = spec(rollout=None, replicas=2, **CHANGE)
    w.until(T0 + 20, _done(new_rev), limit=40)
    assert len(w.serving()) == 2 and all(x.ready and x.revision == new_rev for x in w.serving())


def test_regression_third_revision_mid_canary():
    w = World(spec(), nodes=dict(TIGHT))
    old = w.deploy()
    b = w.change(spec(**CHANGE))
    t = w.until(T0, lambda w: w.rollout.phase == "Analysing")
    c = w.change(spec(sglang={"ipcCache": {"mode": "Off"}, "env": [{"name": "X", "value": "1"}]}))
    t = w.until(t + 10, lambda w: w.rollout.phase == "Analysing" and w.rollout.revision == c)
    assert b not in w.kube.deployments("ns", "svc") and not w.pods_of(b)
    assert min(w.ready_seen) >= 2 and w.stable == old


def test_regression_replicas_lowered_mid_promoting_finishes_at_the_new_count():
    w = World(spec(replicas=4, rollout={"steps": [{"replicas": 1}, {"replicas": 2}]}),
              nodes={"n0": 1, "n1": 1, "n2": 1, "n3": 1})
    w.deploy()
    new_rev = w.change(spec(replicas=4, rollout={"steps": [{"replicas": 1}, {"replicas": 2}]}, **CHANGE))
    from vlm_testing.rollout_world import decision
    t = w.until(T0, lambda w: w.rollout.phase == "Analysing")
    w.step(t + 1, decision=decision("Promote"))
    t = w.until(t + 10, lambda w: w.rollout.phase == "Analysing")
    w.step(t + 1, decision=decision("Promote"))
    assert w.rollout.phase == "Promoting"
    w.spec = spec(replicas=2, rollout={"steps": [{"replicas": 1}, {"replicas": 2}]}, **CHANGE)
    w.until(t + 10, lambda w: w.rollout.phase == "Promoted")
    w.step(t + 1000)
    w.step(t + 1010)
    assert w.stable == new_rev and len(w.serving()) == 2 and all(x.ready for x in w.serving())
    assert min(w.ready_seen) >= 1


def test_replicas_raised_mid_canary_step_are_served_before_the_promotion():
    """BUG: spec.replicas raised 3 -> 5 (by hand or an HPA through the scale subresource) while a canary step runs:
    the step's move (hold_surplus, target = the step's canary pods) never grows the stable revision, so the
    service runs 3 pods, reports 3/5 Ready, for the whole analysis (every step), until Promoting. (Lowered
    replicas are ignored the same way: the held surplus keeps every stable pod.)"""
    w = World(spec(), nodes={"n0": 1, "n1": 1, "n2": 1, "n3": 1, "n4": 1})
    w.deploy()
    new_rev = w.change(spec(**CHANGE))
    w.step(T0)
    w.spec = spec(replicas=5, **CHANGE)
    w.until(T0 + 10, lambda w: w.rollout.phase == "Analysing")
    assert len(w.serving()) == 5 and len(w.pods_of(new_rev)) == 1


def test_regression_rollback_while_surge_pairs_stand():
    from vlm_testing.rollout_world import decision, fail_signal
    roomy = {"node-0": 2, "node-1": 2, "node-2": 2}
    w = World(spec(rollout={"steps": [{"replicas": 1}, {"replicas": 2}]}), nodes=dict(roomy))
    old = w.deploy()
    new_rev = w.change(spec(rollout={"steps": [{"replicas": 1}, {"replicas": 2}]}, **CHANGE))
    t = w.until(T0, lambda w: w.rollout.phase == "Analysing")
    assert len(w.pods_of(old)) == 3  # concurrent surge pair
    w.step(t + 1, decision=decision("Rollback", signals=(fail_signal(),)))
    w.until(t + 10, lambda w: new_rev not in w.kube.deployments("ns", "svc"))
    assert len(w.pods_of(old)) == 3 and all(x.ready for x in w.serving()) and min(w.ready_seen) >= 3
