"""reconcile.reconcile against a fake of the operator's Kube wrapper (fakekube.FakeKube): what is applied,
what the status says, which Events are sent, and that a resync with nothing new writes nothing."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from vlm_operator.api import names
from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.errors import TemporaryError
from vlm_operator.api.settings import Settings
from vlm_operator.controller import handlers, reconcile
from vlm_operator.desired import builders
from vlm_testing.fakekube import ROLLOUT, SPEC, T0, FakeCluster


def test_first_reconcile_creates_service_deployment_and_budget_then_reports_pending():
    c = FakeCluster()
    c.run()
    applied = sorted(w.kind for w in c.kube.written("apply"))
    assert applied == ["Deployment", "NetworkPolicy", "PodDisruptionBudget", "Service"]
    dep = c.kube.deployment("svc", "stable")
    rev = dep["metadata"]["labels"][builders.LABEL_REVISION]
    assert list(c.kube.deployments()) == [rev]  # one Deployment, of the revision, named by it
    assert dep["spec"]["replicas"] == 2 and dep["metadata"]["name"] == f"svc-{rev}"
    assert dep["spec"]["template"]["spec"]["schedulingGates"] == [{"name": builders.SCHEDULING_GATE}]
    st = c.status
    assert st["phase"] == "Pending" and st["observedGeneration"] == 1
    assert st["replicas"] == 2 and st["readyReplicas"] == 0
    assert st["selector"] == f"{builders.LABEL_SERVICE}=svc"
    assert st["stableRevision"] == dep["metadata"]["labels"][builders.LABEL_REVISION]
    assert st["sglang"] == {"image": api.DEFAULT_SGLANG_IMAGE, "version": "0.5.23"}
    assert c.condition("Ready")["reason"] == "ReplicasNotReady"
    assert c.events == []  # replicas still starting are not news
    api.VLMServiceStatus.model_validate(st)  # what was written is a valid status


def test_pods_ready_flip_ready_with_one_normal_event_and_a_resync_writes_nothing():
    c = FakeCluster()
    c.run()
    c.kube.settle("svc")  # the ReplicaSet's pods, behind the operator's gate
    assert [p.gated for p in c.kube.pods("svc")] == [True, True]
    c.kube.reset_writes()
    c.run(T0 + 5)  # the reconcile releases them (no pin: nothing to pair with) and labels them stable
    released = c.kube.written("patch", "Pod")
    assert sorted(w.name for w in released) == sorted(p.name for p in c.kube.pods("svc"))
    for w in released:
        assert w.body["metadata"]["labels"] == {builders.LABEL_ROLE: builders.ROLE_STABLE}
        assert "affinity" not in w.body["spec"]
    assert c.status["phase"] == "Pending" and c.events == []
    c.kube.settle("svc")
    assert all(p.node == "node-0" and p.ready and p.labelled_role == "stable" for p in c.kube.pods("svc"))
    c.kube.reset_writes()
    c.run(T0 + 15)
    assert c.status["phase"] == "Ready" and c.status["readyReplicas"] == 2
    assert c.condition("Ready") == {**c.condition("Ready"), "status": "True", "reason": "AllReplicasReady"}
    assert [w.verb for w in c.kube.writes] == ["status"]
    assert c.events == [("Normal", "AllReplicasReady", "Ready=True: 2/2 replicas ready")]
    for i in range(2, 6):  # steady resyncs: no API write of any kind, no Event
        c.kube.reset_writes()
        c.run(T0 + 15 * i)
        assert c.kube.writes == []
    assert len(c.events) == 1


def test_transition_time_moves_only_when_a_condition_flips():
    c = FakeCluster()
    c.run(T0)
    before = c.condition("Ready")["lastTransitionTime"]
    c.run(T0 + 100)  # nothing changed
    assert c.condition("Ready")["lastTransitionTime"] == before
    c.kube.settle("svc")
    c.run(T0 + 150)  # the pods released, none Ready yet: still no flip
    assert c.condition("Ready")["lastTransitionTime"] == before
    c.kube.settle("svc")
    c.run(T0 + 200)
    assert c.condition("Ready")["lastTransitionTime"] != before


def test_invalid_spec_keeps_the_last_good_status_and_touches_no_deployment():
    c = FakeCluster()
    c.run()
    c.up(T0 + 5)
    c.run(T0 + 15)
    good = dict(c.status)
    c.kube.update_spec("svc", {**SPEC, "sglang": {"args": ["--tp", "2"]}})
    c.kube.reset_writes()
    c.run(T0 + 30)
    assert c.kube.written("apply") == [] and c.kube.written("delete") == []
    st = c.status
    assert st["phase"] == "Failed" and st["observedGeneration"] == 2
    assert c.condition("Ready")["reason"] == "InvalidSpec" and c.condition("Degraded")["status"] == "True"
    assert "spec.sglang.args" in c.condition("Ready")["message"]
    for k in ("stableRevision", "selector", "sglang"):
        assert st[k] == good[k], k
    # One Warning (Ready flipped); Degraded=InvalidSpec is said by the condition, not by a second Event.
    assert [(e[0], e[1]) for e in c.events[1:]] == [("Warning", "InvalidSpec")]
    c.kube.reset_writes()
    c.run(T0 + 45)
    assert c.kube.writes == []


def test_invalid_spec_with_a_garbled_status_does_not_stall():
    c = FakeCluster({"model": {"path": "m"}, "replicas": 1, "sglang": {"args": ["--port=1"]}})
    c.kube.vlmservice("svc")["status"] = {"profiler": {"loopP50": 3}, "stableRevision": "abc", "bogus": 1}
    c.run()
    st = c.status
    assert st["stableRevision"] == "abc" and "profiler" not in st and "bogus" not in st
    assert c.condition("Ready")["reason"] == "InvalidSpec"


def test_scaling_rewrites_the_deployment_and_the_status():
    c = FakeCluster()
    c.run()
    c.up(T0 + 5)
    c.run(T0 + 15)
    c.kube.update_spec("svc", {**SPEC, "replicas": 3})
    c.kube.reset_writes()
    c.run(T0 + 30)
    assert [w.kind for w in c.kube.written("apply")][:1] == ["Deployment"]
    assert list(c.kube.deployments()) == [c.status["stableRevision"]]  # the same revision: scaled, not replaced
    assert c.kube.deployment("svc", "stable")["spec"]["replicas"] == 3
    assert c.status["replicas"] == 3 and c.status["phase"] == "Pending"


def test_scaling_to_one_deletes_the_disruption_budget():
    c = FakeCluster()
    c.run()
    assert ("policy/v1", "PodDisruptionBudget", "ns", "svc") in c.kube.objects
    c.kube.update_spec("svc", {**SPEC, "replicas": 1})
    c.run(T0 + 15)
    assert ("policy/v1", "PodDisruptionBudget", "ns", "svc") not in c.kube.objects


def test_paused_changes_no_deployment_but_still_reports():
    c = FakeCluster()
    c.run()
    c.kube.update_spec("svc", {**SPEC, "replicas": 4, "paused": True})
    c.kube.reset_writes()
    c.run(T0 + 15)
    assert c.kube.written("apply") == [] and c.kube.written("delete") == []
    assert c.kube.deployment("svc", "stable")["spec"]["replicas"] == 2
    assert c.status["observedGeneration"] == 2


def test_unknown_action_is_a_warning_and_a_known_one_is_cleared():
    c = FakeCluster()
    c.kube.annotate("svc", names.ANNOTATION_ROLLOUT_ACTION, "launch")
    c.run()
    assert ("Warning", "UnknownAction") in [(e[0], e[1]) for e in c.events]
    assert c.kube.written("annotation") == []
    c.kube.annotate("svc", names.ANNOTATION_ROLLOUT_ACTION, "Promote")
    c.run(T0 + 15)
    assert [w.body for w in c.kube.written("annotation")] == [names.ANNOTATION_ROLLOUT_ACTION]
    assert names.ANNOTATION_ROLLOUT_ACTION not in c.kube.vlmservice("svc")["metadata"]["annotations"]


def test_a_temporary_api_error_propagates_and_the_next_reconcile_recovers():
    c = FakeCluster()
    c.kube.fail_next.append(TemporaryError("apply Deployment ns/svc: 503 unavailable", reason="Http503"))
    with pytest.raises(TemporaryError):
        c.run()
    assert c.status == {}
    c.run(T0 + 5)
    assert c.status["phase"] == "Pending"


def start_canary(c: FakeCluster) -> str:
    c.run(T0)
    c.up(T0 + 5)
    c.run(T0 + 15)
    c.kube.update_spec(c.name, {**ROLLOUT, "sglang": {"ipcCache": {"mode": "Off"}}})
    c.run(T0 + 30)
    return c.status["rollout"]["revision"]


def test_a_new_revision_starts_a_canary_with_a_fresh_baseline_when_gpus_are_free():
    fresh = {**ROLLOUT, "rollout": {**ROLLOUT["rollout"], "baseline": "Fresh"}}  # the default is now Stable
    c = FakeCluster(fresh, gpus=8)
    c.run(T0)
    c.up(T0 + 5)
    c.run(T0 + 15)
    stable = c.status["stableRevision"]
    c.kube.update_spec(c.name, {**fresh, "sglang": {"ipcCache": {"mode": "Off"}}})
    calls = c.kube.free_gpu_calls
    c.run(T0 + 30)
    rev = c.status["rollout"]["revision"]
    assert c.kube.free_gpu_calls == calls + 1  # the nodes' free GPUs read once, to place the canary and baseline
    deps = c.kube.deployments()
    assert set(deps) == {stable, rev, builders.ROLE_BASELINE}
    assert deps[rev]["metadata"]["name"] == f"svc-{rev}" and deps[rev]["spec"]["replicas"] == 1
    assert deps[builders.ROLE_BASELINE]["metadata"]["labels"][builders.LABEL_REVISION] == stable
    assert deps[builders.ROLE_BASELINE]["spec"]["replicas"] == 1
    assert deps[stable]["spec"]["replicas"] == 2  # room on the node: the canary surges, no stable pod goes
    assert c.status["rollout"]["baseline"] == "Fresh"
    st = c.status
    assert st["phase"] == "Canary" and st["rollout"]["phase"] == "Progressing" and st["canaryRevision"] == rev
    assert c.condition("Progressing")["reason"] == "CanaryProgressing"
    assert "CanaryStarted" in [e[1] for e in c.events]
    api.VLMServiceStatus.model_validate(st)


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_reconcile_publishes_per_service_metrics_and_delete_forgets_them():
    c = FakeCluster(ROLLOUT, gpus=8, name="metered")
    start_canary(c)
    svc = {"namespace": "ns", "vlmservice": "metered"}
    assert sample("vlm_operator_ipc_cache_active", **svc) == 0.0  # the canary's spec turned the cache Off
    assert sample("vlm_operator_rollout_phase", **svc, phase="Progressing") == 1.0
    assert sample("vlm_operator_rollout_phase", **svc, phase="Analysing") == 0.0
    n = sample("vlm_operator_reconcile_duration_seconds_count", result="ok")
    c.run(T0 + 45)
    assert sample("vlm_operator_reconcile_duration_seconds_count", result="ok") == n + 1
    c.rt.profiler_reads["uid-metered"] = T0
    handlers.forget_vlmservice(name="metered", namespace="ns", uid="uid-metered", memo=type("M", (), {"rt": c.rt})())
    assert sample("vlm_operator_ipc_cache_active", **svc) is None
    assert sample("vlm_operator_rollout_phase", **svc, phase="Progressing") is None
    assert "uid-metered" not in c.rt.profiler_reads


def test_a_failing_reconcile_is_counted_as_an_error():
    c = FakeCluster(name="failing")
    c.kube.fail_next.append(TemporaryError("503", reason="Http503"))
    n = sample("vlm_operator_reconcile_duration_seconds_count", result="error") or 0.0
    with pytest.raises(TemporaryError):
        c.run()
    assert sample("vlm_operator_reconcile_duration_seconds_count", result="error") == n + 1


def test_rollout_events_follow_the_status_so_a_failed_write_never_posts_them_twice():
    """The rollout's Events are posted after its status is written: a status write that fails (or an operator
    stopped before it) posts nothing, and the retry, planned from the status it finds, posts them once."""
    c = FakeCluster(ROLLOUT, gpus=8)
    c.run(T0)
    c.up(T0 + 5)
    c.run(T0 + 15)
    c.kube.update_spec(c.name, {**ROLLOUT, "sglang": {"ipcCache": {"mode": "Off"}}})
    real = c.kube.patch_status

    def failing(*a, **kw):
        raise TemporaryError("patch status: 503 unavailable", reason="Http503")
    c.kube.patch_status = failing
    with pytest.raises(TemporaryError):
        c.run(T0 + 30)
    assert "CanaryStarted" not in [e[1] for e in c.events]
    c.kube.patch_status = real
    c.run(T0 + 35)
    c.run(T0 + 50)
    assert [e[1] for e in c.events].count("CanaryStarted") == 1
    assert c.status["rollout"]["phase"] == "Progressing"


def test_a_stale_copy_queued_before_a_write_is_skipped():
    """kopf queues the create (or update) handler and the resync timer with the body each had: the one that
    runs second must not start from the status before the first one's write (a second CanaryStarted, a
    rollout restarted)."""
    c = FakeCluster(ROLLOUT, gpus=8)
    c.run(T0)
    c.up(T0 + 5)
    c.run(T0 + 15)
    c.kube.update_spec(c.name, {**ROLLOUT, "sglang": {"ipcCache": {"mode": "Off"}}})
    queued_update = c.kube.target(c.name)  # the update handler's copy
    queued_timer = c.kube.target(c.name)   # the timer's copy, taken at the same moment
    observed = c.kube.observed(c.name)
    emit = lambda *e: c.events.append(e)  # noqa: E731
    reconcile.reconcile(c.rt, queued_update, observed, emit, now=T0 + 30)
    writes = len(c.kube.writes)
    assert [e[1] for e in c.events].count("CanaryStarted") == 1
    reconcile.reconcile(c.rt, queued_timer, c.kube.observed(c.name), emit, now=T0 + 31)
    assert len(c.kube.writes) == writes and [e[1] for e in c.events].count("CanaryStarted") == 1
    c.run(T0 + 45)  # the current copy is reconciled as usual
    assert c.kube.conflicts == 0


def test_a_copy_older_than_another_writers_change_never_writes_its_status_or_events():
    """Another replica (or any other writer) changed the object after this copy was read: the status write
    is conditional on the copy's resourceVersion, the API server refuses it, nothing is posted, and the
    retry on a fresh copy plans from what the other writer recorded."""
    c = FakeCluster(ROLLOUT, gpus=8)
    c.run(T0)
    c.up(T0 + 5)
    c.run(T0 + 15)
    c.kube.update_spec(c.name, {**ROLLOUT, "sglang": {"ipcCache": {"mode": "Off"}}})
    lagging = c.kube.target(c.name)  # a standby's cached copy
    other = reconcile.Runtime(kube=c.kube, settings=Settings(), sidecars=c.reader)  # the active replica
    theirs: list = []
    reconcile.reconcile(other, c.kube.target(c.name), c.kube.observed(c.name), lambda *e: theirs.append(e),
                        now=T0 + 30)
    assert [e[1] for e in theirs].count("CanaryStarted") == 1
    with pytest.raises(TemporaryError) as e:
        reconcile.reconcile(c.rt, lagging, c.kube.observed(c.name), lambda *e: c.events.append(e), now=T0 + 31)
    assert e.value.reason == "StaleCopy" and c.kube.conflicts == 1
    assert "CanaryStarted" not in [ev[1] for ev in c.events]
    c.run(T0 + 32)  # the retry, on a fresh copy
    assert "CanaryStarted" not in [ev[1] for ev in c.events]
    assert c.status["rollout"]["phase"] == "Progressing"


def test_a_reconcile_on_an_index_behind_our_own_writes_does_not_apply_them_again():
    """The owned objects' index follows the watch, which lags behind the operator's own writes (most in a burst of
    creations): a reconcile that runs after the first one's writes but before the index shows them must not send
    the same Deployment and Service again (400 services created at once: 548 Deployment and 545 Service applies)."""
    c = FakeCluster()
    lagging = c.kube.observed(c.name)  # nothing yet, and the index will not catch up before the next run
    c.run(T0)
    first = sorted(w.kind for w in c.kube.written("apply"))
    assert first == ["Deployment", "NetworkPolicy", "PodDisruptionBudget", "Service"]
    c.kube.reset_writes()
    reconcile.reconcile(c.rt, c.kube.target(c.name), lagging, lambda *e: c.events.append(e), now=T0 + 1)
    assert c.kube.written("apply") == []
    # Once the index showed them, a Deployment deleted by hand is re-created at once.
    c.run(T0 + 2)
    c.kube.delete("apps/v1", "Deployment", "ns", f"{c.name}-{c.status['stableRevision']}")
    c.kube.reset_writes()
    c.run(T0 + 3)
    assert [w.kind for w in c.kube.written("apply")] == ["Deployment"]


def test_a_rounds_writes_go_out_in_one_call_in_order_and_a_refused_one_leaves_none_recorded():
    """Writer.write hands the client the round's writes in order; the first refusal stops the rest, and none of
    the round's applies counts as sent, so the next round sends them again instead of waiting out the TTL."""
    from vlm_operator.cluster.writer import Apply, Delete, PatchPod

    c = FakeCluster()
    w = c.rt.writer
    objs = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "ns", "name": n}, "data": {}}
            for n in ("a", "b")]
    sent: list[tuple] = []
    real_apply = c.kube.apply

    def apply(obj, observed):
        sent.append(("apply", obj["metadata"]["name"]))
        if obj["metadata"]["name"] == "b" and len(sent) < 4:
            raise TemporaryError("the API server did not answer")
        return real_apply(obj, observed)

    c.kube.apply = apply
    c.kube.delete = lambda *a: sent.append(("delete", a[-1])) or True
    c.kube.patch_pod = lambda ns, name, patch: sent.append(("patch_pod", name)) or True
    writes = [Apply(objs[0]), PatchPod("ns", "p", {}), Apply(objs[1]), Delete("v1", "ConfigMap", "ns", "z")]
    with pytest.raises(TemporaryError):
        w.write("u", writes, now=100.0)
    assert sent == [("apply", "a"), ("patch_pod", "p"), ("apply", "b")]  # in order, stopped at the refusal
    assert not w.unconfirmed.get("u")  # neither apply counts as sent
    w.write("u", writes, now=101.0)
    assert sent[3:] == [("apply", "a"), ("patch_pod", "p"), ("apply", "b"), ("delete", "z")]
    w.write("u", writes[:1], now=102.0)  # sent moments ago, not yet in the index: left out
    assert len(sent) == 7


def test_what_the_index_never_showed_is_applied_again_after_the_ttl_and_a_delete_forgets_it():
    c = FakeCluster()
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "ns", "name": "x"}, "data": {"a": "1"}}
    assert c.rt.writer.apply("u", obj, None, now=100.0)
    assert not c.rt.writer.apply("u", obj, None, now=130.0)  # the same object, moments later: not sent
    assert c.rt.writer.apply("u", {**obj, "data": {"a": "2"}}, None, now=131.0)  # a change is always sent
    later = 131.0 + reconcile.UNCONFIRMED_TTL_S
    assert c.rt.writer.apply("u", {**obj, "data": {"a": "2"}}, None, now=later)  # TTL over
    assert not c.rt.writer.apply("u", {**obj, "data": {"a": "2"}}, None, now=later + 1)
    c.rt.writer.delete("u", "v1", "ConfigMap", "ns", "x")
    assert c.rt.writer.apply("u", {**obj, "data": {"a": "2"}}, None, now=later + 2)  # deleted: no longer known to exist
    c.rt.forget("u")
    assert "u" not in c.rt.writer.unconfirmed


def test_a_new_service_deletes_nothing_it_never_made_but_a_changed_spec_still_cleans_up():
    c = FakeCluster({**SPEC, "replicas": 1})
    deletes = []
    real_delete = c.kube.delete
    c.kube.delete = lambda *a: deletes.append(a) or real_delete(*a)  # the fake records only deletes that hit
    c.run()
    assert deletes == [] and ("policy/v1", "PodDisruptionBudget", "ns", "svc") not in c.kube.objects
    # A first reconcile that made a budget (replicas 2) and died before its status write; the spec then went to
    # one replica: the next reconcile, at generation 2, still removes the budget.
    c = FakeCluster()
    t = c.kube.target(c.name)
    reconcile.reconcile(c.rt, t, c.kube.observed(c.name), lambda *e: None, now=T0)
    c.kube.objects[(f"{api.GROUP}/{api.VERSION}", api.KIND, "ns", c.name)].pop("status", None)
    c.kube.update_spec(c.name, {**SPEC, "replicas": 1})
    c.run(T0 + 1)
    assert ("policy/v1", "PodDisruptionBudget", "ns", "svc") not in c.kube.objects


def test_an_object_the_api_server_refuses_is_an_invalid_spec_reported_once_and_not_sent_again():
    """A spec value the schema lets through but the Deployment's own validation refuses (found by fuzzing the
    running operator: a toleration's rules, a string the API server's YAML decoder would not read): the
    service says so (Ready=False/InvalidSpec with the API server's message, one Warning Event), the resync
    does not send the same objects again (it used to fail every resync: a handler error loop), and a new
    spec is tried at once."""
    c = FakeCluster()
    c.kube.refuse = lambda obj: ("spec.template.spec.tolerations[0].effect: Invalid value: \"\": effect must be "
                                 "'NoExecute' when `tolerationSeconds` is set") if obj["kind"] == "Deployment" else None
    c.run(T0)
    ready = c.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec"), ready
    assert "the API server refused" in ready["message"] and "tolerationSeconds" in ready["message"]
    assert c.status["observedGeneration"] == 1
    assert [e[1] for e in c.events] == ["InvalidSpec"] and c.events[0][0] == "Warning"
    before = len(c.kube.writes)
    for i in range(1, 4):
        c.run(T0 + 15 * i)
    assert len(c.kube.writes) == before, c.kube.writes[before:]  # no apply, no status write, no Event
    assert len(c.events) == 1
    # The user fixes the spec: tried at once, and Ready again once the pods are.
    c.kube.refuse = None
    c.kube.update_spec("svc", {**SPEC, "sglang": {"args": ["--fixed"]}})
    c.run(T0 + 60)
    assert "Deployment" in [w.kind for w in c.kube.written("apply")]
    c.up(T0 + 70)
    c.run(T0 + 75)
    assert c.condition("Ready")["status"] == "True"


QUOTA = (403, 'deployments.apps "svc" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, '
              'used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8')


def test_an_apply_refused_outside_the_spec_is_a_condition_and_is_tried_again_at_every_resync():
    """A 403 (a ResourceQuota, an admission policy, the operator's RBAC) is not the spec's fault and not an
    error loop to read in the operator's log: the service says Ready=False/ApplyRefused and
    Degraded=True/ApplyRefused with the API server's answer, one Warning Event; every resync applies again,
    and once the quota frees the objects are made (those made once per generation too) without a spec change."""
    c = FakeCluster()
    c.kube.refuse = lambda obj: QUOTA if obj["kind"] == "Deployment" else None
    c.run(T0)
    ready, degraded = c.condition("Ready"), c.condition("Degraded")
    assert (ready["status"], ready["reason"]) == ("False", "ApplyRefused"), ready
    assert (degraded["status"], degraded["reason"]) == ("True", "ApplyRefused"), degraded
    assert "exceeded quota" in ready["message"] and "403" in ready["message"]
    assert c.status["phase"] == "Failed"
    assert "observedGeneration" not in c.status  # the objects made once per generation are still to make
    assert [(e[0], e[1]) for e in c.events] == [("Warning", "ApplyRefused")], c.events
    c.kube.reset_writes()
    c.run(T0 + 15)
    assert [w.kind for w in c.kube.written("refused")] == ["Deployment"]  # tried again
    assert c.kube.written("status") == [] and len(c.events) == 1  # nothing new to say
    c.kube.refuse = None  # the quota is raised
    c.run(T0 + 30)
    assert "Deployment" in [w.kind for w in c.kube.written("apply")]
    assert ("policy/v1", "PodDisruptionBudget", "ns", "svc") in c.kube.objects
    assert c.status["observedGeneration"] == 1
    c.up(T0 + 40)
    c.run(T0 + 45)
    assert (c.condition("Ready")["status"], c.condition("Degraded")["status"]) == ("True", "False")
    assert c.events[-1][:2] == ("Normal", "AllReplicasReady"), c.events


def test_a_refused_change_to_a_serving_service_keeps_it_ready_and_marks_it_degraded():
    """The pods serve on while a change to them is refused: Ready stays True, Degraded=True/ApplyRefused."""
    c = FakeCluster()
    c.run(T0)
    c.up(T0 + 5)
    c.run(T0 + 15)
    c.events.clear()
    c.kube.refuse = lambda obj: QUOTA if obj["kind"] == "Deployment" else None
    c.kube.update_spec("svc", {**SPEC, "sglang": {"args": ["--new"]}})
    c.run(T0 + 30)
    assert c.condition("Ready")["status"] == "True"
    degraded = c.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ApplyRefused"), degraded
    assert c.status["phase"] == "Ready" and c.status["observedGeneration"] == 1
    assert [(e[0], e[1]) for e in c.events] == [("Warning", "ApplyRefused")], c.events


def monitored(c: FakeCluster) -> list[str]:
    return sorted(w.kind for w in c.kube.writes if w.verb == "apply" and w.kind in builders.MONITORING_KINDS)


def test_a_new_service_gets_every_object_in_its_first_pass_the_policy_before_the_deployment():
    """All of a new service's objects in one pass, in a burst of new services too (nothing waits for a later
    resync): the policy and the budget before the Deployment, then the Service and the monitoring objects."""
    c = FakeCluster()
    c.rt.monitoring = True
    c.run()
    assert [w.kind for w in c.kube.written("apply")] == [
        "NetworkPolicy", "PodDisruptionBudget", "Deployment", "Service", "PodMonitor", "PrometheusRule"]
    assert c.status["observedGeneration"] == 1
    c.kube.reset_writes()
    c.run(T0 + 15)
    assert c.kube.written("apply") == []  # they exist: nothing more


def test_a_service_edited_by_hand_is_repaired():
    """A Service the index showed is compared and repaired (here: its selector edited by hand)."""
    c = FakeCluster()
    c.run()
    c.run(T0 + 15)  # the index shows it
    key = ("v1", "Service", "ns", "svc")
    c.kube.objects[key]["spec"]["selector"] = {"edited": "by-hand"}
    c.kube.reset_writes()
    c.run(T0 + 30)
    assert [w.kind for w in c.kube.written("apply")] == ["Service"]
    assert c.kube.objects[key]["spec"]["selector"] == {builders.LABEL_SERVICE: "svc"}


def test_monitoring_objects_come_at_once_and_a_deleted_one_is_recreated():
    c = FakeCluster()
    c.rt.monitoring = True
    c.run()
    assert monitored(c) == ["PodMonitor", "PrometheusRule"]
    rule = ("monitoring.coreos.com/v1", "PrometheusRule", "ns", "svc")
    assert rule in c.kube.objects
    c.run(T0 + 15)  # the index shows both
    del c.kube.objects[rule]  # deleted by hand
    c.kube.reset_writes()
    c.run(T0 + 30)
    assert monitored(c) == ["PrometheusRule"]


def test_a_spec_change_reapplies_existing_monitoring_objects():
    c = FakeCluster()
    c.rt.monitoring = True
    c.run()
    c.kube.update_spec("svc", {**SPEC, "telemetry": {"interval": "5s"}})
    c.kube.reset_writes()
    c.run(T0 + 15)
    assert monitored(c) == ["PodMonitor", "PrometheusRule"]  # both, at each generation (as before)
    pm = c.kube.objects[("monitoring.coreos.com/v1", "PodMonitor", "ns", "svc")]
    assert {e["interval"] for e in pm["spec"]["podMetricsEndpoints"]} == set(builders.pod_monitor_intervals("5s"))
