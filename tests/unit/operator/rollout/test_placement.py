"""The pure mover (vlm_operator.rollout.placement): which old pod goes, where a new pod lands, and the availability budget,
checked on constructed pods and on a small simulated cluster (ReplicaSets, scheduler, kubelet) walked round by
round as the operator would."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from vlm_operator.api import v1alpha1 as api
from vlm_operator.cluster.observed import PodInfo
from vlm_operator.rollout import placement
from vlm_operator.rollout.placement import REPLACE, SURGE, Move, Pair, Room, move

NOW = "2027-01-15T08:00:00Z"
OLD, NEW, STRAY = "old", "new", "stray"


def pod(name: str, revision: str = OLD, node: str | None = "node-a", *, ready: bool = True, gated: bool = False,
        victim: bool = False, terminating: bool = False) -> PodInfo:
    return PodInfo(name, "", revision, "Running" if node else "Pending", ready, node=node, gated=gated,
                   victim=victim, terminating=terminating)


# -- a small cluster: what the ReplicaSets, the scheduler and the kubelets do between two reconciles ---------------


@dataclass
class SimPod:
    name: str
    revision: str
    seq: int
    node: str | None = None
    ready: bool = False
    gated: bool = True
    victim: bool = False
    pin: str | None = None


@dataclass
class Sim:
    nodes: dict[str, int]  # node -> GPUs
    zones: dict[str, str] = field(default_factory=dict)
    replicas: dict[str, int] = field(default_factory=dict)
    pods: dict[str, SimPod] = field(default_factory=dict)
    seq: int = 0
    ready_seen: list[int] = field(default_factory=list)  # Ready pods at every point the cluster was looked at

    def run(self, revision: str, node: str) -> SimPod:
        """A Ready pod of `revision` already running on `node` (its Deployment counts it)."""
        self.seq += 1
        p = SimPod(f"{revision}-{self.seq}", revision, self.seq, node=node, ready=True, gated=False)
        self.pods[p.name] = p
        self.replicas[revision] = self.replicas.get(revision, 0) + 1
        return p

    def ready(self) -> int:
        return sum(1 for p in self.pods.values() if p.ready)

    def look(self) -> None:
        self.ready_seen.append(self.ready())

    def infos(self) -> list[PodInfo]:
        return [pod(p.name, p.revision, p.node, ready=p.ready, gated=p.gated, victim=p.victim)
                for p in sorted(self.pods.values(), key=lambda p: p.seq)]

    def rooms(self) -> dict[str, Room]:
        used: dict[str, int] = {}
        for p in self.pods.values():
            if p.node:
                used[p.node] = used.get(p.node, 0) + 1
        return {n: Room(g - used.get(n, 0), self.zones.get(n, "")) for n, g in self.nodes.items()}

    def on(self, node: str) -> list[SimPod]:
        return sorted((p for p in self.pods.values() if p.node == node), key=lambda p: p.seq)

    def of(self, revision: str) -> list[SimPod]:
        return sorted((p for p in self.pods.values() if p.revision == revision), key=lambda p: p.seq)

    def plan(self, m: Move, pairs: tuple[Pair, ...] = (), *, stable: str = OLD, rooms: bool = True) -> placement.Outcome:
        return move(m, dict(self.replicas), self.infos(), pairs, self.rooms() if rooms else None, stable=stable, now=NOW)

    def apply(self, out: placement.Outcome) -> None:
        """The operator's writes (victims marked, gated pods released and pinned, Deployments scaled), then the
        ReplicaSets (down: victims, then not Ready, then newest; up: new gated pods), the scheduler (a released pod
        on its pinned node, or the first with a free GPU) and the kubelets (a pod placed in an earlier round is
        Ready: a new pod takes one round to start, so a dip in Ready pods is seen)."""
        for v in out.victims:
            self.pods[v].victim = True
        for name, node in out.releases:
            p = self.pods[name]
            assert p.gated, f"{name} released twice"
            p.gated, p.pin = False, node
        self.replicas = dict(out.replicas)
        self.look()
        for rev, want in sorted(self.replicas.items()):
            mine = self.of(rev)
            while len(mine) > want:
                gone = min(mine, key=lambda p: (not p.victim, p.ready, -p.seq))
                mine.remove(gone)
                del self.pods[gone.name]
            self.look()
            while len(mine) < want:
                self.seq += 1
                p = SimPod(f"{rev}-{self.seq}", rev, self.seq)
                self.pods[p.name] = p
                mine.append(p)
        for p in self.pods.values():  # kubelet: placed last round -> Ready now
            if p.node and not p.ready:
                p.ready = True
        for p in sorted(self.pods.values(), key=lambda p: p.seq):  # scheduler
            if p.gated or p.node:
                continue
            free = self.rooms()
            for n in [p.pin] if p.pin else sorted(self.nodes):
                if free[n].free_gpus >= 1:
                    p.node = n
                    break
        self.look()


def walk(sim: Sim, m: Move, *, stable: str = OLD, rounds: int = 40) -> tuple[placement.Outcome, list[Pair]]:
    """Reconcile rounds (pairs carried from each round to the next, as status does) until the move is done."""
    pairs: tuple[Pair, ...] = ()
    for _ in range(rounds):
        out = sim.plan(m, pairs, stable=stable)
        pairs = out.pairs
        sim.apply(out)  # done: this outcome's last surplus removals still go
        if out.done:
            return out, list(pairs)
    raise AssertionError(f"move not done after {rounds} rounds: {sim.pods}")


# -- victim choice -----------------------------------------------------------------------------------------------


def test_victims_spread_over_zones_first_then_nodes():
    """z1 has three nodes of one pod each, z2 one node with two: the fullest zone goes first (node-a, though
    node-c holds more pods), then the zones tie and the fullest node goes (node-c), then z1 again."""
    zones = {"node-a": "z1", "node-b": "z1", "node-d": "z1", "node-c": "z2"}
    pods = [pod("a1", node="node-a"), pod("b1", node="node-b"), pod("d1", node="node-d"),
            pod("c1", node="node-c"), pod("c2", node="node-c")]
    rooms = {n: Room(0, z) for n, z in zones.items()}
    out = move(Move(to=NEW, target=3, total=5, max_unavailable=5), {OLD: 5}, pods, (), rooms, stable=OLD, now=NOW)
    assert out.victims == ("a1", "c1", "b1")
    assert out.replicas == {OLD: 2, NEW: 3}
    assert [(x.kind, x.node, x.replaced) for x in out.pairs] == [
        (REPLACE, "node-a", "a1"), (REPLACE, "node-c", "c1"), (REPLACE, "node-b", "b1")]


def test_a_pod_not_ready_goes_before_any_ready_one():
    zones = {"node-a": "z1", "node-b": "z1", "node-c": "z2"}
    pods = [pod("a1", node="node-a"), pod("a2", node="node-a"), pod("b1", node="node-b"),
            pod("c1", node="node-c", ready=False)]
    rooms = {n: Room(0, z) for n, z in zones.items()}
    out = move(Move(to=NEW, target=1, total=4), {OLD: 4}, pods, (), rooms, stable=OLD, now=NOW)
    assert out.victims == ("c1",)
    # It costs no availability, but it already uses the budget: 3 of 4 Ready, so no Ready one follows with
    # maxUnavailable 1; with 2, one Ready pod follows (from the fullest zone and node).
    out2 = move(Move(to=NEW, target=2, total=4), {OLD: 4}, pods, (), rooms, stable=OLD, now=NOW)
    assert out2.victims == ("c1",) and out2.waiting and "budget" in out2.waiting
    out3 = move(Move(to=NEW, target=3, total=4, max_unavailable=2), {OLD: 4}, pods, (), rooms, stable=OLD, now=NOW)
    assert out3.victims == ("c1", "a1") and out3.waiting and "budget" in out3.waiting


def test_a_stray_revisions_pods_go_first():
    """A third revision (neither stable nor the move's: an earlier canary being drained) is taken before the
    stable pods, even before a stable pod that is not Ready."""
    pods = [pod("s1", node="node-a", ready=False), pod("s2", node="node-b"), pod("x1", STRAY, node="node-c")]
    out = move(Move(to=NEW, target=1, total=3, max_unavailable=3), {OLD: 2, STRAY: 1}, pods, (), {}, stable=OLD,
               now=NOW)
    assert out.victims == ("x1",) and out.replicas == {OLD: 2, STRAY: 0, NEW: 1}


def test_a_pod_already_marked_or_terminating_is_not_taken_again():
    pods = [pod("a1", node="node-a", victim=True), pod("b1", node="node-b", terminating=True),
            pod("c1", node="node-c")]
    # a1's mark is already in its Deployment's replicas (1 for 2 live pods): it is on its way out
    out = move(Move(to=NEW, target=2, total=3, max_unavailable=3), {OLD: 1, NEW: 1}, pods, (), {}, stable=OLD, now=NOW)
    assert out.victims == ("c1",)


def test_a_mark_nothing_will_act_on_stands_and_is_taken_first():
    """The operator stopped between marking a1 and scaling its Deployment (still 2 for 2 live pods), or the
    ReplicaSet removed another pod: a1 still serves, counts as Ready, and is the one taken next."""
    pods = [pod("a1", node="node-a", victim=True), pod("c1", node="node-c")]
    out = move(Move(to=NEW, target=1, total=2, max_unavailable=1), {OLD: 2}, pods, (), {}, stable=OLD, now=NOW)
    assert out.victims == ("a1",) and out.replicas == {OLD: 1, NEW: 1} and out.waiting is None


# -- surge next to an old pod ------------------------------------------------------------------------------------


def test_surge_next_to_an_old_pod_is_a_concurrent_pair_held_then_released():
    sim = Sim({"node-a": 2, "node-b": 2})
    a, b = sim.run(OLD, "node-a"), sim.run(OLD, "node-b")
    step = Move(to=NEW, target=1, total=2, hold_surplus=True, keep_old=1)
    out = sim.plan(step)
    assert out.victims == () and out.replicas == {OLD: 2, NEW: 1} and out.added == 1
    assert [(x.kind, x.node, x.replaced, x.revision) for x in out.pairs] == [(SURGE, "node-a", a.name, NEW)]
    sim.apply(out)
    # The next round releases the new (gated) pod pinned to its partner's node.
    out = sim.plan(step, out.pairs)
    new_pod = sim.of(NEW)[0].name
    assert out.releases == ((new_pod, "node-a"),) and out.pairs[0].pod == new_pod
    sim.apply(out)
    sim.apply(sim.plan(step, out.pairs))
    # Both pods of the pair on node-a and Ready; the old one is held while the step is analysed.
    assert {p.revision for p in sim.on("node-a")} == {OLD, NEW} and all(p.ready for p in sim.pods.values())
    held = sim.plan(step, out.pairs)
    assert held.done and held.victims == () and held.replicas[OLD] == 2
    assert min(sim.ready_seen) == 2  # never a dip
    # Without hold_surplus (the step ended) the surged-over pod goes, and only that one.
    free = sim.plan(Move(to=NEW, target=1, total=2, keep_old=1), held.pairs)
    assert free.victims == (a.name,) and free.replicas == {OLD: 1, NEW: 1} and free.done
    sim.apply(free)
    assert [p.name for p in sim.of(OLD)] == [b.name]


def test_a_surged_over_pod_stays_until_the_new_one_is_ready():
    pods = [pod("a1", node="node-a"), pod("b1", node="node-b"), pod("n1", NEW, node="node-a", ready=False)]
    pairs = (Pair(node="node-a", kind=SURGE, replaced="a1", revision=NEW, pod="n1", started_at=NOW),)
    m = Move(to=NEW, target=1, total=2)
    early = move(m, {OLD: 2, NEW: 1}, pods, pairs, {}, stable=OLD, now=NOW)
    assert early.victims == () and early.replicas[OLD] == 2 and not early.done
    pods[2] = pod("n1", NEW, node="node-a")
    late = move(m, {OLD: 2, NEW: 1}, pods, pairs, {}, stable=OLD, now=NOW)
    assert late.victims == ("a1",) and late.replicas[OLD] == 1
    assert late.pairs[0].ready_at == NOW


def test_surge_only_next_to_an_old_pod_and_never_without_rooms():
    """A free node that runs no old pod is no surge target (the pair would not share a node): replace instead.
    Rooms not read (None): no surge either."""
    pods = [pod("a1", node="node-a"), pod("b1", node="node-b")]
    rooms = {"node-a": Room(0), "node-b": Room(0), "node-empty": Room(8)}
    out = move(Move(to=NEW, target=1, total=2), {OLD: 2}, pods, (), rooms, stable=OLD, now=NOW)
    assert [(x.kind, x.node) for x in out.pairs] == [(REPLACE, "node-a")] and out.victims == ("a1",)
    no_rooms = move(Move(to=NEW, target=1, total=2), {OLD: 2}, pods, (), None, stable=OLD, now=NOW)
    assert no_rooms.pairs[0].kind == REPLACE
    borrow = move(Move(to=NEW, target=1, total=2, surge=False), {OLD: 2}, pods, (),
                  {"node-a": Room(4), "node-b": Room(4)}, stable=OLD, now=NOW)
    assert borrow.pairs[0].kind == REPLACE


def test_surges_count_the_gpus_their_pinned_pods_will_take():
    """node-a has one free GPU: one surge pair takes it; the second canary pod surges on node-b, not node-a."""
    pods = [pod("a1", node="node-a"), pod("a2", node="node-a"), pod("b1", node="node-b")]
    rooms = {"node-a": Room(1), "node-b": Room(1)}
    out = move(Move(to=NEW, target=2, total=3, hold_surplus=True, keep_old=1), {OLD: 3}, pods, (), rooms,
               stable=OLD, now=NOW)
    assert sorted(x.node for x in out.pairs) == ["node-a", "node-b"] and out.victims == ()
    assert all(x.kind == SURGE for x in out.pairs)


# -- replace within max_unavailable ------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [1, 2])
def test_a_whole_move_by_replacement_never_dips_below_the_budget(budget):
    """4 pods on 4 one-GPU nodes, no room to surge: every pod replaced on its own node, Ready never below
    4 - maxUnavailable at any point the cluster is looked at."""
    nodes = {f"node-{i}": 1 for i in range(4)}
    sim = Sim(nodes)
    for n in nodes:
        sim.run(OLD, n)
    out, pairs = walk(sim, Move(to=NEW, target=4, total=4, max_unavailable=budget))
    assert min(sim.ready_seen) == 4 - budget, sim.ready_seen
    assert min(sim.ready_seen[1:]) < 4  # it did replace (a dip within the budget)
    assert out.replicas == {OLD: 0, NEW: 4} and out.victims == ()
    assert [p.revision for p in sim.pods.values()] == [NEW] * 4
    # Each new pod where the pod it replaced ran, one per node.
    assert all(x.kind == REPLACE for x in pairs) and sorted(x.node for x in pairs) == sorted(nodes)
    assert {sim.pods[x.pod].node for x in pairs} == set(nodes)
    assert all(sim.pods[x.pod].node == x.node for x in pairs)


def test_a_whole_move_with_room_surges_and_never_dips():
    nodes = {f"node-{i}": 2 for i in range(4)}
    sim = Sim(nodes)
    for n in nodes:
        sim.run(OLD, n)
    _out, pairs = walk(sim, Move(to=NEW, target=4, total=4))
    assert min(sim.ready_seen) == 4, sim.ready_seen
    assert all(x.kind == SURGE for x in pairs) and sorted(x.node for x in pairs) == sorted(nodes)
    assert sorted(p.revision for p in sim.pods.values()) == [NEW] * 4


def test_max_unavailable_zero_never_replaces():
    pods = [pod("a1", node="node-a"), pod("b1", node="node-b")]
    out = move(Move(to=NEW, target=1, total=2, max_unavailable=0), {OLD: 2}, pods, (), {}, stable=OLD, now=NOW)
    assert out.victims == () and out.replicas == {OLD: 2, NEW: 0} and out.waiting


def test_the_last_pod_replaced_is_an_outage_said_before():
    out = move(Move(to=NEW, target=1, total=1), {OLD: 1}, [pod("a1")], (), {"node-a": Room(0)}, stable=OLD, now=NOW)
    assert out.outage and out.victims == ("a1",)
    roomy = move(Move(to=NEW, target=1, total=1), {OLD: 1}, [pod("a1")], (), {"node-a": Room(1)}, stable=OLD, now=NOW)
    assert not roomy.outage and roomy.victims == () and roomy.pairs[0].kind == SURGE


# -- keep_old ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("total", [1, 2, 3])
def test_keep_old_never_takes_the_last_old_pod(total):
    nodes = {f"node-{i}": 1 for i in range(total)}
    pods = [pod(f"s{i}", node=n) for i, n in enumerate(nodes)]
    rooms = {n: Room(0) for n in nodes}
    m = Move(to=NEW, target=total, total=total, max_unavailable=64, hold_surplus=True, keep_old=1)
    out = move(m, {OLD: total}, pods, (), rooms, stable=OLD, now=NOW)
    assert out.no_capacity and out.waiting and "stable pod" in out.waiting
    assert len(out.victims) == total - 1 and out.replicas == {OLD: 1, NEW: total - 1}
    # Whatever the rounds after see, the last one stays.
    left = [p for p in pods if p.name not in out.victims]
    again = move(m, out.replicas, left, out.pairs, rooms, stable=OLD, now=NOW)
    assert again.no_capacity and again.victims == () and again.replicas[OLD] == 1


def test_keep_old_with_room_surges_instead_of_waiting():
    m = Move(to=NEW, target=1, total=1, hold_surplus=True, keep_old=1)
    out = move(m, {OLD: 1}, [pod("s0")], (), {"node-a": Room(1)}, stable=OLD, now=NOW)
    assert not out.no_capacity and out.pairs[0].kind == SURGE and out.replicas == {OLD: 1, NEW: 1}


# -- releases ----------------------------------------------------------------------------------------------------


def test_releases_pin_gated_pods_to_their_pairs_nodes_in_order():
    pods = [pod("s1", node="node-b"), pod("s2", node="node-a"),
            pod("new-2", NEW, None, ready=False, gated=True), pod("new-1", NEW, None, ready=False, gated=True),
            pod("new-3", NEW, None, ready=False, gated=True), pod("s-9", OLD, None, ready=False, gated=True)]
    pairs = (Pair(node="node-b", kind=REPLACE, replaced="s0", revision=NEW),
             Pair(node="node-a", kind=SURGE, replaced="s2", revision=NEW),
             Pair(node="node-c", kind=REPLACE, replaced="x", revision="other"))
    out = move(Move(to=NEW, target=3, total=3, max_unavailable=0), {OLD: 2, NEW: 3}, pods, pairs, None, stable=OLD,
               now=NOW)
    # by pod name, to the pairs in the order they were made; one more gated pod than open pairs: released free;
    # another revision's gated pod (its ReplicaSet replaced one that died): released free.
    assert out.releases == (("new-1", "node-b"), ("new-2", "node-a"), ("new-3", None), ("s-9", None))
    assert [x.pod for x in out.pairs] == ["new-1", "new-2", None]


def test_release_all_frees_every_gated_pod_that_stays():
    pods = [pod("b", NEW, None, gated=True, ready=False), pod("a", NEW, None, gated=True, ready=False),
            pod("c", NEW, None, gated=True, ready=False, terminating=True), pod("d", NEW)]
    assert placement.release_all(pods) == (("a", None), ("b", None))


# -- pairs survive a restart ------------------------------------------------------------------------------------


def test_pairs_passed_back_in_give_the_same_outcome():
    """A restarted operator has only status.rollout.pairs: passed back in (through the status' own model) they
    give the same outcome as the process that made them (the gated pod pinned to its victim's node)."""
    sim = Sim({f"node-{i}": 1 for i in range(3)})
    for n in sim.nodes:
        sim.run(OLD, n)
    m = Move(to=NEW, target=3, total=3)
    first = sim.plan(m)
    sim.apply(first)  # the victim went, the new pod waits behind its gate
    stored = api.RolloutStatus.model_validate(api.RolloutStatus(
        phase="Updating", pairs=[api.PairStatus(**x.__dict__) for x in first.pairs]).model_dump(by_alias=True))
    restored = tuple(Pair(**x.model_dump(by_alias=False)) for x in stored.pairs)
    assert restored == first.pairs
    live = sim.plan(m, first.pairs)
    again = sim.plan(m, restored)
    assert again == live
    assert live.releases == ((sim.of(NEW)[0].name, first.pairs[0].node),)
    lost = sim.plan(m, ())  # without them: the replacement on node-0 is not known any more
    assert lost != live and not any(x.kind == REPLACE for x in lost.pairs)


# -- schedule, plain scale, dropped pairs -----------------------------------------------------------------------


@pytest.mark.parametrize(("replicas", "steps"), [(1, [1]), (2, [1]), (3, [1, 2]), (4, [1, 2]), (8, [1, 2, 4]),
                                                 (9, [1, 2, 4, 8])])
def test_default_schedule(replicas, steps):
    assert placement.schedule(replicas) == steps
    # The API's default (no steps written) is the same schedule; every step leaves a stable pod (but 1 replica).
    ro = api.RolloutSpec()
    assert [s.replicas for s in ro.schedule(replicas)] == steps
    assert all(k < replicas for k in steps) or replicas == 1


def test_nothing_to_replace_is_a_plain_scale():
    first = move(Move(to=NEW, target=3, total=3), {}, [], (), None, stable=NEW, now=NOW)
    assert first.replicas == {NEW: 3} and first.victims == () and first.pairs == () and not first.done
    up = move(Move(to=NEW, target=4, total=4), {NEW: 3}, [pod(f"n{i}", NEW) for i in range(3)], (), None,
              stable=NEW, now=NOW)
    assert up.replicas == {NEW: 4} and up.pairs == () and up.waiting is None
    down = move(Move(to=NEW, target=2, total=2), {NEW: 3}, [pod(f"n{i}", NEW) for i in range(3)], (), None,
                stable=NEW, now=NOW)
    assert down.replicas == {NEW: 2} and down.victims == ()


def test_a_pair_whose_pod_went_away_is_dropped():
    pods = [pod("a1", node="node-a"), pod("n2", NEW, None, ready=False, gated=True)]
    pairs = (Pair(node="node-b", kind=SURGE, replaced="b1", revision=NEW, pod="n1", started_at=NOW),)
    out = move(Move(to=NEW, target=1, total=2, hold_surplus=True, keep_old=1), {OLD: 1, NEW: 1}, pods, pairs,
               {"node-a": Room(0), "node-b": Room(1)}, stable=OLD, now=NOW)
    assert out.pairs[0].dropped and "n1" in out.pairs[0].dropped and "node-b" in out.pairs[0].dropped
    # A dropped pair pins nothing: the ReplicaSet's replacement pod is released where the scheduler likes.
    assert out.releases == (("n2", None),)
    # Dropped once, it stays as it was.
    again = move(Move(to=NEW, target=1, total=2, hold_surplus=True, keep_old=1), {OLD: 1, NEW: 1}, pods, out.pairs,
                 {"node-a": Room(0), "node-b": Room(1)}, stable=OLD, now="2027-01-15T09:00:00Z")
    assert again.pairs == out.pairs
