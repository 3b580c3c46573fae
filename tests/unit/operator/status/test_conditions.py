"""conditions.py: merge keeps transition times unless the status flips; transitions and Events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from vlm_operator.status import conditions as C

T0 = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def test_merge_sets_time_on_create_and_keeps_it_without_a_flip():
    first = C.merge([], [C.Cond(C.READY, False, "ReplicasNotReady", "0/1")], generation=1, now=T0)
    assert first == [{"type": "Ready", "status": "False", "reason": "ReplicasNotReady", "message": "0/1",
                      "observedGeneration": 1, "lastTransitionTime": "2027-01-15T08:00:00Z"}]
    same = C.merge(first, [C.Cond(C.READY, False, "Unschedulable", "no GPU")], generation=2, now=T1)
    assert same[0]["lastTransitionTime"] == "2027-01-15T08:00:00Z"  # reason changed, status did not
    assert same[0]["reason"] == "Unschedulable" and same[0]["observedGeneration"] == 2
    flipped = C.merge(same, [C.Cond(C.READY, True, "AllReplicasReady")], generation=2, now=T1)
    assert flipped[0]["lastTransitionTime"] == "2027-01-15T08:05:00Z" and flipped[0]["status"] == "True"


def test_merge_orders_known_types_first_and_keeps_others():
    current = [{"type": "Zeta", "status": "True", "reason": "X", "lastTransitionTime": "t"}]
    out = C.merge(current, [C.Cond(C.IPC_CACHE_ACTIVE, None, "Unknown"), C.Cond(C.READY, True, "R")],
                  generation=1, now=T0)
    assert [c["type"] for c in out] == ["Ready", "IPCCacheActive", "Zeta"]
    assert out[1]["status"] == "Unknown"


def test_transitions_are_status_or_reason_changes():
    before = C.merge([], [C.Cond(C.READY, False, "ReplicasNotReady", "0/2"), C.Cond(C.DEGRADED, False, "AsExpected")],
                     generation=1, now=T0)
    after = C.merge(before, [C.Cond(C.READY, False, "ReplicasNotReady", "1/2"), C.Cond(C.DEGRADED, True, "Unschedulable")],
                    generation=1, now=T1)
    assert [c["type"] for c in C.transitions(before, after)] == ["Degraded"]  # a new message alone is not one


def test_events_for_trouble_and_recovery_only():
    def cond(t, s, r, m=""):
        return {"type": t, "status": s, "reason": r, "message": m}

    evs = C.events_for([
        cond("Ready", "True", "AllReplicasReady", "2/2"),
        cond("Ready", "False", "ReplicasNotReady", "1/2"),  # pods starting: not news
        cond("Ready", "False", "Unschedulable", "no GPU"),
        cond("Degraded", "True", "InvalidSpec", "x"),  # the Ready=False InvalidSpec event says it
        cond("Degraded", "True", "CanaryRolledBack", "slower"),  # the rollout's own Event says it
        cond("Degraded", "False", "AsExpected"),
        cond("Progressing", "True", "CanaryAnalysing"),
    ])
    assert evs == [
        ("Normal", "AllReplicasReady", "Ready=True: 2/2"),
        ("Warning", "Unschedulable", "Ready=False: no GPU"),
    ]
