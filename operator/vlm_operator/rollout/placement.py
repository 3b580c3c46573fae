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
from dataclasses import dataclass

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
    other than it is drained first)."""
    reps = {r: int(n) for r, n in replicas.items()}
    reps.setdefault(m.to, 0)
    live = [p for p in pods if not p.terminating]
    new = [p for p in live if p.revision == m.to]
    old = [p for p in live if p.revision != m.to and p.revision in reps]
    # A marked pod is on its way out only while its revision has more pods than its Deployment asks for; otherwise
    # nothing will remove it (the operator stopped between the mark and the scale-down, or the ReplicaSet took a
    # pod that went not-Ready instead): it stands, and is the first taken again.
    count = {r: sum(1 for p in old if p.revision == r) for r in reps}
    standing = [p for p in old if not p.victim or count[p.revision] <= reps[p.revision]]
    # Only the pairs of the revision being placed can be dropped: the other revision's pods go away by design (a
    # rollback removes the canary's, a promotion the stable's).
    by_name = {p.name: p for p in live}
    pairs_l = [_refresh(x, by_name, now) if x.revision == m.to else x for x in pairs]
    victims: list[str] = []
    gone: set[str] = set()

    def ready_now() -> int:
        # An old revision counts at most as many Ready pods as its Deployment keeps (a pods index behind our own
        # mark may still show the marked pod as standing).
        old_ready = sum(min(sum(1 for p in standing if p.revision == r and p.ready and p.name not in gone), reps[r])
                        for r in reps if r != m.to)
        return sum(1 for p in new if p.ready) + old_ready

    def olds_left() -> list[PodInfo]:
        return [p for p in standing if p.name not in gone]

    def take(victim: PodInfo) -> None:
        victims.append(victim.name)
        gone.add(victim.name)
        reps[victim.revision] = max(reps.get(victim.revision, 0) - 1, 0)

    zone_of = {n: r.zone for n, r in (rooms or {}).items()}

    def pick(candidates: list[PodInfo]) -> PodInfo | None:
        if not candidates:
            return None
        left = olds_left()
        per_node: dict[str | None, int] = {}
        per_zone: dict[str, int] = {}
        for p in left:
            per_node[p.node] = per_node.get(p.node, 0) + 1
            z = zone_of.get(p.node or "", "")
            per_zone[z] = per_zone.get(z, 0) + 1
        return min(candidates, key=lambda p: (not p.victim, *_spread_key(p, per_node, per_zone, zone_of, p.revision != stable)))

    # 1. Surplus: old pods beyond the service's replicas (surged over, or a stray revision's), removed once the
    #    new pods stand in for them; pods not Ready go at once (they serve nothing).
    surplus = sum(n for r, n in reps.items() if r != m.to) + reps[m.to] - m.total
    if surplus > 0 and not m.hold_surplus:
        for _ in range(surplus):
            if not olds_left():
                break  # the surplus is the move's own revision (replicas lowered): a plain scale, below
            # a pod not Ready, or a Ready one while the rest keep every replica Ready
            unready = [p for p in olds_left() if not p.ready]
            if unready:
                take(pick(unready))  # type: ignore[arg-type]
            elif ready_now() - 1 >= m.total:
                paired = {x.replaced for x in pairs_l if x.kind == SURGE and x.dropped is None}
                take(pick([p for p in olds_left() if p.name in paired]) or pick(olds_left()))  # type: ignore[arg-type]
            else:
                break
    elif surplus > 0:
        # Held: only a stray revision's pods (neither stable nor the move's) go.
        for p in [p for p in olds_left() if p.revision != stable][:surplus]:
            take(p)

    # A pinned pod its node has no room for after all (another pod took the GPU between the read and the
    # placement) or that lost its node: its pair is dropped and its Deployment scaled down by one (a ReplicaSet
    # removes unscheduled pods first); the next round places it again from fresh free-GPU counts.
    regrow = True
    for i, x in enumerate(pairs_l):
        p = next((q for q in new if q.name == x.pod), None)
        if x.dropped is not None or p is None or p.node:
            continue
        lost = rooms is not None and bool(x.node) and x.node not in rooms
        stuck = bool(p.unschedulable) and bool(x.started_at) and _age(x.started_at or now, now) >= SURGED_POD_PATIENCE_S
        if lost or stuck:
            why = f"node {x.node} is gone" if lost else f"no room left on node {x.node}"
            pairs_l[i] = _with(x, dropped=f"{why} for {x.pod}")
            victims.append(p.name)  # marked: of the unplaced pods, its ReplicaSet removes this one
            reps[m.to] = max(reps[m.to] - 1, 0)
            new = [q for q in new if q.name != p.name]
            regrow = False  # the scale-down must reach the ReplicaSet before a pod is added again

    # 2. Growth: surge where a node with an old pod has a free GPU, else replace within the budget.
    added = 0
    waiting = None
    no_capacity = outage = False
    used: dict[str, int] = {}
    placed = {p.name for p in new if p.node}
    for x in pairs_l:  # a pair's pod not on its node yet holds its GPU there (the free count does not show it)
        if x.dropped is None and x.node and x.revision == m.to and x.pod not in placed:
            used[x.node] = used.get(x.node, 0) + m.gpus_per_replica
    paired_old = {x.replaced for x in pairs_l if x.dropped is None and x.replaced}
    if not olds_left() and not any(r != m.to and n for r, n in reps.items()):
        reps[m.to] = m.target  # nothing to replace: a plain scale (a first deploy, replicas changed)
    if m.hold_surplus and stable is not None and stable != m.to and stable in reps:
        # A step holds the stable pods; replicas raised meanwhile are stable pods (a plain scale of its revision).
        reps[stable] = max(reps[stable], m.total - max(reps[m.to], m.target))
    while regrow and reps[m.to] < m.target:
        node = None
        if m.surge and rooms:
            hosts = [p for p in olds_left() if p.node and p.name not in paired_old]
            fits = [p for p in hosts if (rooms.get(p.node) or Room(0)).free_gpus - used.get(p.node, 0) >= m.gpus_per_replica]  # type: ignore[arg-type]
            partner = pick(fits)
            if partner is not None:
                node = partner.node
                used[node] = used.get(node, 0) + m.gpus_per_replica  # type: ignore[index]
                paired_old.add(partner.name)
                reps[m.to] += 1
                added += 1
                pairs_l.append(Pair(node=node, kind=SURGE, replaced=partner.name, revision=m.to, started_at=now))  # type: ignore[arg-type]
                continue
        left = olds_left()
        candidates = [p for p in left if p.name not in paired_old] or left
        victim = pick(candidates)
        after = ready_now() - (1 if victim is not None and victim.ready else 0)
        floor = m.total - m.max_unavailable
        blocked = None
        if len(left) - 1 < m.keep_old:
            blocked = (f"no free GPU on a node that runs a stable pod, and the last {m.keep_old} stable pod(s) "
                       "must stay to compare with")
        elif after < floor:
            blocked = (f"{ready_now()} of {m.total} replicas Ready: replacing one more would leave {after} "
                       f"(budget: at least {max(floor, 0)})")
        dark = blocked is None and after == 0 and ready_now() > 0  # the replacement would leave no Ready pod
        if blocked is not None or dark:
            # A free GPU on a node without an old pod: an unpaired surge beats waiting, and beats an outage.
            spare = sorted(n for n, room in (rooms or {}).items()
                           if m.surge and room.free_gpus - used.get(n, 0) >= m.gpus_per_replica)
            if spare:
                used[spare[0]] = used.get(spare[0], 0) + m.gpus_per_replica
                reps[m.to] += 1
                added += 1
                pairs_l.append(Pair(node=spare[0], kind=SURGE, replaced=None, revision=m.to, started_at=now))
                continue
        if blocked is not None:
            no_capacity = len(left) - 1 < m.keep_old
            waiting = blocked
            break
        assert victim is not None
        if dark:
            outage = True
        take(victim)
        paired_old.add(victim.name)
        reps[m.to] += 1
        added += 1
        pairs_l.append(Pair(node=victim.node or "", kind=REPLACE, replaced=victim.name, revision=m.to, started_at=now))

    # 3. Release the gated pods of `to`: each to the node of a pair still waiting for its pod, in order.
    releases: list[tuple[str, str | None]] = []
    open_pairs = [i for i, x in enumerate(pairs_l) if x.pod is None and x.dropped is None and x.revision == m.to]
    for p in sorted((p for p in new if p.gated), key=lambda p: p.name):
        if open_pairs:
            i = open_pairs.pop(0)
            releases.append((p.name, pairs_l[i].node or None))
            pairs_l[i] = _with(pairs_l[i], pod=p.name)
        else:
            releases.append((p.name, None))  # a scale-up, or a pair lost with an operator that stopped
    # Any other revision's gated pod (its ReplicaSet replaced one that died): released where the scheduler likes.
    releases += [(p.name, None) for p in sorted(live, key=lambda p: p.name) if p.gated and p.revision != m.to]

    done = (sum(1 for p in new if p.ready) >= m.target and reps[m.to] >= m.target
            and (m.hold_surplus or sum(n for r, n in reps.items() if r != m.to) <= max(m.total - m.target, 0)))
    return Outcome(replicas=reps, victims=tuple(victims), releases=tuple(releases), pairs=tuple(pairs_l),
                   waiting=waiting, no_capacity=no_capacity, outage=outage, done=done, added=added)


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
