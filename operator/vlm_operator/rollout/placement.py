"""Pure: move a service's pods from one revision to another, node by node, within an availability budget.

Every change of a service's pods goes through `move`: a canary step (the canary revision grows to the step's
replicas while stable pods stay), a warm promotion (the rest of the stable pods replaced), a rollback (the
canary's pods replaced by stable ones), and a spec change without a rollout block. Each call looks at the
cluster as it is (the revisions' Deployments and pods) and returns the next increment; nothing is kept
between calls but the pairs it records in status, so a restarted operator goes on where the last one stopped.

A new pod comes in one of two ways, both on the node of the pod it pairs with:

- **Surge**: a node that runs a pod of the old revision has a free GPU: the new pod is added there, and the old
  one stays until the new one is Ready (during an analysed step, until the step ends: a concurrent same-node
  pair). Ready replicas never dip.
- **Replace**: the old pod (the victim) is marked with the lowest `controller.kubernetes.io/pod-deletion-cost`
  and its Deployment scaled down by one, so its ReplicaSet removes exactly that pod; the new pod, held by the
  operator's scheduling gate, is pinned to the victim's node (required node affinity) and released. A
  replacement is made only while Ready replicas stay at or above `total - max_unavailable`.

Victims are spread over zones and nodes (the zone, then the node, with the most old pods first); pods that are
not Ready go first (they cost no availability, and the ReplicaSet removes them first anyway).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vlm_operator.api.units import parse_time
from vlm_operator.cluster.observed import PodInfo

SURGE = "Surge"
REPLACE = "Replace"
# A surged pod still unschedulable this long after its placement is given up (seconds).
SURGED_POD_PATIENCE_S = 90.0


@dataclass(frozen=True)
class Room:
    """A node's free GPUs (allocatable less what its pods request) and zone, read when a move needs them."""

    free_gpus: int
    zone: str = ""


@dataclass(frozen=True)
class Pair:
    """One new pod and the old pod it pairs with on a node (status.rollout.pairs)."""

    node: str
    kind: str  # Surge | Replace
    replaced: str | None  # the old pod's name (None: a surge on a node without one)
    revision: str  # the new pod's revision
    pod: str | None = None  # the new pod, once the operator released it
    started_at: str | None = None
    ready_at: str | None = None
    dropped: str | None = None  # why the pair no longer counts (its node or pod went away)


@dataclass(frozen=True)
class Move:
    to: str  # the revision pods move to
    target: int  # pods of `to` wanted when this move is done
    total: int  # the service's replicas
    max_unavailable: int = 1
    gpus_per_replica: int = 1
    hold_surplus: bool = False  # keep surged-over old pods while the step is analysed (concurrent pairs)
    keep_old: int = 0  # old pods that must stay (1 while the canary is compared with them)
    surge: bool = True  # may add pods on free GPUs (capacity Borrow: never)


@dataclass(frozen=True)
class Outcome:
    replicas: dict[str, int]  # revision -> its Deployment's replicas
    victims: tuple[str, ...] = ()  # pods to mark for removal (before the Deployments are scaled)
    releases: tuple[tuple[str, str | None], ...] = ()  # (gated pod, node it is pinned to or None)
    pairs: tuple[Pair, ...] = ()
    waiting: str | None = None  # why the move cannot grow now (None: it grew, or has nothing to add)
    no_capacity: bool = False  # waiting for a GPU: keep_old forbids a replacement and no node has room
    outage: bool = False  # the next replacement would leave no Ready pod
    done: bool = False  # `to` has `target` Ready pods and no surplus old pod is left to remove
    added: int = 0


def _spread_key(p: PodInfo, per_node: Mapping[str | None, int], per_zone: Mapping[str, int],
                zone_of: Mapping[str, str], stray: bool) -> tuple:
    z = zone_of.get(p.node or "", "")
    # stray revisions first, then pods not Ready, then the fullest zone and node, then by name (deterministic)
    return (not stray, p.ready, -per_zone.get(z, 0), -per_node.get(p.node, 0), p.node or "", p.name)


def move(m: Move, replicas: Mapping[str, int], pods: Sequence[PodInfo], pairs: Sequence[Pair],
         rooms: Mapping[str, Room] | None, *, stable: str | None, now: str) -> Outcome:
    """The next increment of move `m`. `replicas`: every revision Deployment's replicas as asked so far;
    `pods`: the service's pods (the fresh baseline's excluded); `pairs`: those recorded so far; `rooms`: free
    GPUs per node (None: not read this round, so no surge); `stable`: the stable revision (an old revision
    other than it is drained first). In order: the surplus old pods removed, pinned pods that cannot be placed
    given up, growth (surge or replace), then the gated pods released."""
    s = _Placing.start(m, replicas, pods, pairs, rooms, stable, now)
    s.drop_surplus()
    regrow = s.give_up_unplaceable()
    waiting, no_capacity, outage = s.grow() if regrow else (None, False, False)
    if not regrow:
        s.settle_scale()
    releases = s.releases()
    reps, new = s.reps, s.new
    done = (sum(1 for p in new if p.ready) >= m.target and reps[m.to] >= m.target
            and (m.hold_surplus or sum(n for r, n in reps.items() if r != m.to) <= max(m.total - m.target, 0)))
    return Outcome(replicas=reps, victims=tuple(s.victims), releases=tuple(releases), pairs=tuple(s.pairs),
                   waiting=waiting, no_capacity=no_capacity, outage=outage, done=done, added=s.added)


@dataclass
class _Placing:
    """One `move` call's working state: the replicas asked so far, the old pods still standing, the pairs, and
    what this round has taken and added."""

    m: Move
    reps: dict[str, int]
    live: list[PodInfo]
    new: list[PodInfo]  # live pods of the move's revision
    standing: list[PodInfo]  # old pods not on their way out
    pairs: list[Pair]
    rooms: Mapping[str, Room] | None
    stable: str | None
    now: str
    victims: list[str] = field(default_factory=list)
    gone: set[str] = field(default_factory=set)
    added: int = 0

    @classmethod
    def start(cls, m: Move, replicas: Mapping[str, int], pods: Sequence[PodInfo], pairs: Sequence[Pair],
              rooms: Mapping[str, Room] | None, stable: str | None, now: str) -> _Placing:
        reps = {r: int(n) for r, n in replicas.items()}
        reps.setdefault(m.to, 0)
        live = [p for p in pods if not p.terminating]
        new = [p for p in live if p.revision == m.to]
        old = [p for p in live if p.revision != m.to and p.revision in reps]
        # A marked pod is on its way out only while its revision has more pods than its Deployment asks for;
        # otherwise nothing will remove it (the operator stopped between the mark and the scale-down, or the
        # ReplicaSet took a pod that went not-Ready instead): it stands, and is the first taken again.
        count = {r: sum(1 for p in old if p.revision == r) for r in reps}
        standing = [p for p in old if not p.victim or count[p.revision] <= reps[p.revision]]
        # Only the pairs of the revision being placed can be dropped: the other revision's pods go away by
        # design (a rollback removes the canary's, a promotion the stable's).
        by_name = {p.name: p for p in live}
        pairs_l = [_refresh(x, by_name, now) if x.revision == m.to else x for x in pairs]
        return cls(m, reps, live, new, standing, pairs_l, rooms, stable, now)

    def ready_now(self) -> int:
        # An old revision counts at most as many Ready pods as its Deployment keeps (a pods index behind our own
        # mark may still show the marked pod as standing).
        old_ready = sum(min(sum(1 for p in self.standing if p.revision == r and p.ready and p.name not in self.gone),
                            self.reps[r])
                        for r in self.reps if r != self.m.to)
        return sum(1 for p in self.new if p.ready) + old_ready

    def olds_left(self) -> list[PodInfo]:
        return [p for p in self.standing if p.name not in self.gone]

    def take(self, victim: PodInfo) -> None:
        self.victims.append(victim.name)
        self.gone.add(victim.name)
        self.reps[victim.revision] = max(self.reps.get(victim.revision, 0) - 1, 0)

    def pick(self, candidates: list[PodInfo]) -> PodInfo | None:
        if not candidates:
            return None
        zone_of = {n: r.zone for n, r in (self.rooms or {}).items()}
        per_node: dict[str | None, int] = {}
        per_zone: dict[str, int] = {}
        for p in self.olds_left():
            per_node[p.node] = per_node.get(p.node, 0) + 1
            z = zone_of.get(p.node or "", "")
            per_zone[z] = per_zone.get(z, 0) + 1
        return min(candidates, key=lambda p: (not p.victim, *_spread_key(p, per_node, per_zone, zone_of,
                                                                          p.revision != self.stable)))

    def drop_surplus(self) -> None:
        """Old pods beyond the service's replicas (surged over, or a stray revision's), removed once the new pods
        stand in for them; pods not Ready go at once (they serve nothing)."""
        m, reps = self.m, self.reps
        surplus = sum(n for r, n in reps.items() if r != m.to) + reps[m.to] - m.total
        if surplus > 0 and not m.hold_surplus:
            for _ in range(surplus):
                if not self.olds_left():
                    break  # the surplus is the move's own revision (replicas lowered): a plain scale, below
                # a pod not Ready, or a Ready one while the rest keep every replica Ready
                unready = [p for p in self.olds_left() if not p.ready]
                if unready:
                    self.take(self.pick(unready))  # type: ignore[arg-type]
                elif self.ready_now() - 1 >= m.total:
                    paired = {x.replaced for x in self.pairs if x.kind == SURGE and x.dropped is None}
                    self.take(self.pick([p for p in self.olds_left() if p.name in paired])
                              or self.pick(self.olds_left()))  # type: ignore[arg-type]
                else:
                    break
        elif surplus > 0:
            # Held: only a stray revision's pods (neither stable nor the move's) go.
            for p in [p for p in self.olds_left() if p.revision != self.stable][:surplus]:
                self.take(p)

    def give_up_unplaceable(self) -> bool:
        """A pinned pod its node has no room for after all (another pod took the GPU between the read and the
        placement) or that lost its node: its pair is dropped and its Deployment scaled down by one (a
        ReplicaSet removes unscheduled pods first); the next round places it again from fresh free-GPU counts.
        False when one was given up: the scale-down must reach the ReplicaSet before a pod is added again."""
        regrow = True
        for i, x in enumerate(self.pairs):
            p = next((q for q in self.new if q.name == x.pod), None)
            if x.dropped is not None or p is None or p.node:
                continue
            lost = self.rooms is not None and bool(x.node) and x.node not in self.rooms
            stuck = (bool(p.unschedulable) and bool(x.started_at)
                     and _age(x.started_at or self.now, self.now) >= SURGED_POD_PATIENCE_S)
            if lost or stuck:
                why = f"node {x.node} is gone" if lost else f"no room left on node {x.node}"
                self.pairs[i] = _with(x, dropped=f"{why} for {x.pod}")
                self.victims.append(p.name)  # marked: of the unplaced pods, its ReplicaSet removes this one
                self.reps[self.m.to] = max(self.reps[self.m.to] - 1, 0)
                self.new = [q for q in self.new if q.name != p.name]
                regrow = False
        return regrow

    def settle_scale(self) -> None:
        """The replicas of a plain scale and of a held step, whatever else this round does."""
        m, reps = self.m, self.reps
        if not self.olds_left() and not any(r != m.to and n for r, n in reps.items()):
            reps[m.to] = m.target  # nothing to replace: a plain scale (a first deploy, replicas changed)
        if m.hold_surplus and self.stable is not None and self.stable != m.to and self.stable in reps:
            # A step holds the stable pods; replicas raised meanwhile are stable pods (a plain scale of its revision).
            reps[self.stable] = max(reps[self.stable], m.total - max(reps[m.to], m.target))

    def grow(self) -> tuple[str | None, bool, bool]:
        """Surge where a node with an old pod has a free GPU, else replace within the budget: (why it waits,
        waiting for a GPU, the replacement leaves no Ready pod)."""
        m, reps = self.m, self.reps
        used: dict[str, int] = {}
        placed = {p.name for p in self.new if p.node}
        for x in self.pairs:  # a pair's pod not on its node yet holds its GPU there (the free count does not show it)
            if x.dropped is None and x.node and x.revision == m.to and x.pod not in placed:
                used[x.node] = used.get(x.node, 0) + m.gpus_per_replica
        paired_old = {x.replaced for x in self.pairs if x.dropped is None and x.replaced}
        self.settle_scale()
        outage = False
        while reps[m.to] < m.target:
            if self._surge_beside_old(used, paired_old):
                continue
            left = self.olds_left()
            victim = self.pick([p for p in left if p.name not in paired_old] or left)
            after = self.ready_now() - (1 if victim is not None and victim.ready else 0)
            floor = m.total - m.max_unavailable
            blocked = None
            if len(left) - 1 < m.keep_old:
                blocked = (f"no free GPU on a node that runs a stable pod, and the last {m.keep_old} stable pod(s) "
                           "must stay to compare with")
            elif after < floor:
                blocked = (f"{self.ready_now()} of {m.total} replicas Ready: replacing one more would leave {after} "
                           f"(budget: at least {max(floor, 0)})")
            dark = blocked is None and after == 0 and self.ready_now() > 0  # the replacement would leave no Ready pod
            # A free GPU on a node without an old pod: an unpaired surge beats waiting, and beats an outage.
            if (blocked is not None or dark) and self._surge_on_spare(used):
                continue
            if blocked is not None:
                return blocked, len(left) - 1 < m.keep_old, outage
            assert victim is not None
            outage = outage or dark
            self.take(victim)
            paired_old.add(victim.name)
            self._add(Pair(node=victim.node or "", kind=REPLACE, replaced=victim.name, revision=m.to,
                           started_at=self.now))
        return None, False, outage

    def _add(self, pair: Pair) -> None:
        self.reps[self.m.to] += 1
        self.added += 1
        self.pairs.append(pair)

    def _surge_beside_old(self, used: dict[str, int], paired_old: set[str | None]) -> bool:
        """A new pod on the node of an old pod not yet paired, where that node has a free GPU."""
        m = self.m
        if not (m.surge and self.rooms):
            return False
        hosts = [p for p in self.olds_left() if p.node and p.name not in paired_old]
        fits = [p for p in hosts
                if (self.rooms.get(p.node) or Room(0)).free_gpus - used.get(p.node, 0) >= m.gpus_per_replica]  # type: ignore[arg-type]
        partner = self.pick(fits)
        if partner is None:
            return False
        node = partner.node or ""
        used[node] = used.get(node, 0) + m.gpus_per_replica
        paired_old.add(partner.name)
        self._add(Pair(node=node, kind=SURGE, replaced=partner.name, revision=m.to, started_at=self.now))
        return True

    def _surge_on_spare(self, used: dict[str, int]) -> bool:
        """A new pod on a free GPU of a node without an old pod (an unpaired surge)."""
        m = self.m
        spare = sorted(n for n, room in (self.rooms or {}).items()
                       if m.surge and room.free_gpus - used.get(n, 0) >= m.gpus_per_replica)
        if not spare:
            return False
        used[spare[0]] = used.get(spare[0], 0) + m.gpus_per_replica
        self._add(Pair(node=spare[0], kind=SURGE, replaced=None, revision=m.to, started_at=self.now))
        return True

    def releases(self) -> list[tuple[str, str | None]]:
        """The gated pods of the move's revision, each to the node of a pair still waiting for its pod, in order;
        any other revision's gated pod (its ReplicaSet replaced one that died) where the scheduler likes."""
        out: list[tuple[str, str | None]] = []
        open_pairs = [i for i, x in enumerate(self.pairs)
                      if x.pod is None and x.dropped is None and x.revision == self.m.to]
        for p in sorted((p for p in self.new if p.gated), key=lambda p: p.name):
            if open_pairs:
                i = open_pairs.pop(0)
                out.append((p.name, self.pairs[i].node or None))
                self.pairs[i] = _with(self.pairs[i], pod=p.name)
            else:
                out.append((p.name, None))  # a scale-up, or a pair lost with an operator that stopped
        out += [(p.name, None) for p in sorted(self.live, key=lambda p: p.name) if p.gated and p.revision != self.m.to]
        return out


def _age(start: str, now: str) -> float:
    return parse_time(now) - parse_time(start)


def _with(p: Pair, **changes: object) -> Pair:
    d = {**p.__dict__, **changes}
    return Pair(**d)  # type: ignore[arg-type]


def _refresh(x: Pair, live: Mapping[str, PodInfo], now: str) -> Pair:
    """A recorded pair as the cluster shows it now: Ready time, or dropped when its pod went away."""
    if x.dropped is not None or x.pod is None:
        return x
    p = live.get(x.pod)
    if p is None:
        return _with(x, dropped=f"pod {x.pod} went away" + (f" (node {x.node})" if x.node else ""))
    if p.ready and x.ready_at is None:
        return _with(x, ready_at=now)
    return x


def schedule(replicas: int) -> list[int]:
    """The default canary steps for a service of `replicas`: 1, 2, 4, ... while a stable pod is left to compare
    with (a 1-replica service: one canary pod, next to its stable pod on a free GPU)."""
    out = [1]
    while out[-1] * 2 < replicas:
        out.append(out[-1] * 2)
    return out


def release_all(pods: Sequence[PodInfo]) -> tuple[tuple[str, str | None], ...]:
    """Every gated pod released where the scheduler likes (no move in progress: a first deploy, a scale-up)."""
    return tuple((p.name, None) for p in sorted(pods, key=lambda p: p.name) if p.gated and not p.terminating)


__all__ = ["REPLACE", "SURGE", "Move", "Outcome", "Pair", "Room", "move", "release_all", "schedule"]
