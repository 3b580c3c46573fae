"""Pure: the revisions' Deployments, the pods to place, and the rollout's next state.

Every revision has its own Deployment (`<name>-<revision>`); "stable" and "canary" are roles recorded in status
(`stableRevision`, `rollout.revision`), never part of a pod's template, so no Ready pod of the winning revision is
ever restarted: promotion and rollback move pods between revisions by scaling (module placement: node by node,
within `rollout.maxUnavailable`, surging on free GPUs). Every fact the rollout needs lives in `status.rollout`
and the cluster, so a restarted operator computes the same plan. Inputs are plain values; `now` is unix seconds.

Without a `rollout` block a new revision replaces the pods the same way with no analysis (phase Updating). With
one:

    Progressing --step's canary pods placed and Ready--> Analysing --Promote (more steps)--> Progressing (next)
         |                                                  |  \\--Promote (last step)--> Promoting --all pods moved--> Promoted
         |--a pod not Ready within startupTimeout           |--Rollback--> RolledBack (canary pods replaced by stable
         |  --> RolledBack (CanaryStartTimeout)             |    ones on their nodes; held until the spec changes)
         |--no free GPU and the last stable pod must stay   |--Pause--> Paused (resume restarts the step's analysis)
         |  --> waits (rollout.waiting)                     Promoting: still analysed; a confident regression rolls back
    annotations: promote (skips to Promoting) / abort / pause / resume

The gate decides every verdict; this module only maps it to an action and never re-derives one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vlm_operator.analysis.gate import Decision
from vlm_operator.api.names import ACTIVE_PHASES as ACTIVE
from vlm_operator.api.names import HELD_PHASES, ROLE_BASELINE, ROLE_CANARY, ROLE_STABLE, UPDATING
from vlm_operator.api.settings import Settings
from vlm_operator.api.units import format_time as _iso
from vlm_operator.api.units import parse_duration, parse_time
from vlm_operator.api.v1alpha1 import (
    BeforeStatus,
    PairStatus,
    RolloutStatus,
    SignalStatus,
    StepDecision,
    VLMServiceSpec,
)
from vlm_operator.cluster.observed import BASELINE_KEY, Observed
from vlm_operator.desired import builders as B
from vlm_operator.rollout import placement as M

# A fresh baseline's pod that stays unschedulable this long: the canary is compared with the stable pods instead.
FRESH_BASELINE_PATIENCE_S = 120.0


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    replicas: dict[str, int]  # revision -> its Deployment's replicas; an observed one not here is deleted
    stable_revision: str | None
    canary_revision: str | None
    rollout: RolloutStatus | None
    events: tuple[Event, ...] = field(default=())
    baseline: tuple[str, int] | None = None  # the fresh baseline: (stable revision, pods), or None to delete it
    victims: tuple[str, ...] = ()  # pods to mark for removal, before the Deployments are scaled
    releases: tuple[tuple[str, str | None], ...] = ()  # (gated pod, node to pin it to or None)
    labels: tuple[tuple[str, str], ...] = ()  # (pod, role) for pods whose role label is behind
    want_ready: int = 0
    hands_off: bool = False  # spec.paused: change no Deployment
    wants_rooms: bool = False  # a move would surge and the nodes' free GPUs were not read (`needs_rooms` said no)


def _upd(r: RolloutStatus, **changes: Any) -> RolloutStatus:
    return r.model_copy(update=changes)


def _kept(new: list[SignalStatus], old: list[SignalStatus]) -> list[SignalStatus]:
    """While promoting, the stable pods go one by one: a signal this look could not estimate (no stable pod
    left beside it) keeps the estimate of the look before."""
    before = {s.name: s for s in old}
    return [s if s.delta is not None or s.name not in before else before[s.name] for s in new] or old


def _signals(d: Decision) -> list[SignalStatus]:
    return [
        SignalStatus(
            name=s.name, baseline=s.baseline, canary=s.canary, delta=s.delta, ci_low=s.ci_low, ci_high=s.ci_high,
            p_value=s.p_value, verdict=s.verdict, margin=s.margin, promote_margin=s.promote_margin,
            ceiling=s.ceiling, expand_bound=s.expand_bound,
            information=round(s.information, 3) if s.information is not None else None,
            covariate_cut=round(s.covariate_cut, 3) if s.covariate_cut is not None else None,
        )
        for s in d.signals
    ]


def _ceilings(d: Decision, before: dict[str, float] | None) -> dict[str, float] | None:
    """Per gated signal, the harm ceiling (percent) of this look, keyed as resolvableMargin; loop latency's from
    before the rollout started until the first look gives its own."""
    out = dict(before or {})
    for s in d.signals:
        if s.ceiling is not None:
            out[_status_key(s.name)] = round(100 * s.ceiling, 2)
    return out or None


def _status_key(signal: str) -> str:
    """A gated signal's key in status maps: its family camelCased, then the member (`stageTime:run_batch`)."""
    family, _, member = signal.partition(":")
    key = "".join(w if i == 0 else w.title() for i, w in enumerate(family.split("_")))
    return f"{key}:{member}" if member else key


def _resolvable(d: Decision, before: dict[str, float] | None) -> dict[str, float] | None:
    """Per gated signal, the margin (percent) this rollout can resolve, as of this look: loop latency's from the
    pods' spread (as before the rollout started), every other signal's from its own look (camelCase family, then
    the member: `stageTime:run_batch`)."""
    out = dict(before or {})
    for s in d.signals:
        if s.resolvable is not None and s.name != "loop_latency":
            out[_status_key(s.name)] = round(100 * s.resolvable, 2)
    if d.resolvable_margin is not None:
        out["loopLatency"] = round(100 * d.resolvable_margin, 2)
    return out or None


def _decided(r: RolloutStatus, d: Decision, t: str) -> RolloutStatus:
    """The step's decision recorded: what decided it (`Decision.decided_by`), kept for the whole rollout."""
    if d.decided_by is None:
        return r
    loop = next((s for s in d.signals if s.name == "loop_latency"), None)
    info = round(loop.information, 3) if loop is not None and loop.information is not None else None
    rec = StepDecision(step=r.step, verdict=d.verdict, decided_by=d.decided_by, reason=d.reason, at=t,
                       information=info)
    return _upd(r, decisions=[*r.decisions, rec][-32:])


def _pairs_in(r: RolloutStatus | None) -> list[M.Pair]:
    return [M.Pair(**p.model_dump(by_alias=False)) for p in (r.pairs if r else [])]


def _pairs_out(pairs: Sequence[M.Pair]) -> list[PairStatus]:
    return [PairStatus(**p.__dict__) for p in pairs][-512:]


@dataclass
class _Round:
    """One plan's inputs, what follows from them, and the Events it collects; the phase functions below share it."""

    owner: B.Owner
    spec: VLMServiceSpec
    desired: B.Desired
    observed: Observed
    prev: RolloutStatus | None
    stable: str | None
    now: float
    rooms: Mapping[str, M.Room] | None
    decision: Decision | None
    action: str | None
    before: tuple[Sequence[BeforeStatus], float, float | None, float | None] | None
    events: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rev = self.desired.revision
        self.full = self.spec.replicas
        self.t = _iso(self.now)
        self.deps = self.observed.deployments
        self.pods = [p for p in self.observed.pods if p.labelled_role != BASELINE_KEY]
        ro = self.spec.rollout
        self.u = ro.max_unavailable if ro else 1
        self.capacity = ro.capacity if ro else "Auto"
        self.surge, self.replace = self.capacity != "Borrow", self.capacity != "Surge"

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def floor(self, u: int) -> int:
        """The Ready replicas a move keeps (the Ready condition's want meanwhile): never 0 for a service that has
        replicas (a 1-replica service replacing its only pod is not Ready)."""
        return max(self.full - u, min(self.full, 1))

    def labels_for(self, stable_r: str | None, canary_r: str | None) -> tuple[tuple[str, str], ...]:
        want = {stable_r: ROLE_STABLE, canary_r: ROLE_CANARY}
        return tuple((p.name, want[p.revision]) for p in sorted(self.pods, key=lambda p: p.name)
                     if p.revision in want and p.revision and not p.gated and not p.terminating
                     and p.labelled_role != want[p.revision])

    def run(self, m: M.Move, r: RolloutStatus | None) -> M.Outcome | None:
        """The move's next increment, or None when it has pods to add, may surge, and the nodes' free GPUs are
        not read yet (the reconcile reads them and plans again)."""
        if self.rooms is None and m.surge and self.observed.replicas(m.to) < m.target and any(
                p.revision != m.to for p in self.pods if not p.terminating):
            return None
        return M.move(m, {x: self.observed.replicas(x) for x in self.observed.revisions()}, self.pods, _pairs_in(r),
                      self.rooms, stable=self.stable, now=self.t)

    def finish(self, outcome: M.Outcome | None, stable_r: str | None, canary_r: str | None, r: RolloutStatus | None,
               *, want: int | None = None, baseline: tuple[str, int] | None = None, keep: Sequence[str] = (),
               more: Sequence[tuple[str, str | None]] = ()) -> Plan:
        """The plan: each revision's replicas as the outcome says (a drained one goes; the Deployments are built
        from them after the plan: `builders.revision_deployments`), the pod writes, and the Events of pairs
        dropped on this round."""
        wanted: dict[str, int] = {}
        reps = dict(outcome.replicas) if outcome else {}
        for x in {*reps, *keep, *(k for k in (stable_r, canary_r) if k)}:
            n = reps.get(x, self.observed.replicas(x) if x in self.deps else 0)
            if x not in (stable_r, canary_r) and n == 0 and not self.observed.pods_of(x) and x not in keep:
                continue  # drained: its Deployment goes
            if x in self.deps or x == self.rev:
                wanted[x] = n
        role = {stable_r: ROLE_STABLE, canary_r: ROLE_CANARY}
        rev_of = {q.name: q.revision for q in self.pods}
        releases = outcome.releases if outcome else M.release_all(self.pods)
        was = {(x.node, x.pod, x.started_at) for x in (self.prev.pairs if self.prev else []) if x.dropped}
        for x in (r.pairs if r else []):
            if x.dropped and (x.node, x.pod, x.started_at) not in was:
                self.event("Warning", "PairDropped", f"pair on node {x.node} dropped: {x.dropped}")
        return Plan(
            replicas=wanted, stable_revision=stable_r, canary_revision=canary_r, rollout=r,
            events=tuple(self.events), baseline=baseline, victims=outcome.victims if outcome else (),
            releases=tuple((p, n) for p, n in releases) + tuple(more),
            labels=self.labels_for(stable_r, canary_r) + tuple(
                (p, role[rev_of[p]]) for p, _ in releases if role.get(rev_of.get(p))),
            want_ready=self.full if want is None else want,
        )

    def to_stable(self, r: RolloutStatus | None) -> M.Move:
        return M.Move(to=self.stable or "", target=self.full, total=self.full, max_unavailable=self.u,
                      gpus_per_replica=self.spec.gpus_per_replica, surge=self.surge)


def needs_rooms(spec: VLMServiceSpec, desired: B.Desired, observed: Observed, prev: RolloutStatus | None,
                stable: str | None) -> bool:
    """Whether this round's plan may add pods on free GPUs, so the reconcile reads the nodes' free GPUs before it
    plans (once). It covers every move `plan` makes: a move surges only when it may (capacity Borrow never does,
    except an update without a rollout block), its revision (the desired or the stable one) has fewer pods than the
    service's replicas, and some live pod is of another revision; and a rollout that starts with a fresh baseline
    counts the free GPUs. An over-approximation: during a rollout the nodes are read at every round."""
    if spec.paused or stable is None:
        return False
    rev, ro = desired.revision, spec.rollout
    if ro is not None and rev != stable and ro.baseline == "Fresh" and not (
            prev is not None and prev.revision == rev and (prev.phase in ACTIVE or prev.phase in HELD_PHASES)):
        return True
    if ro is not None and ro.capacity == "Borrow":
        return False
    live = [p for p in observed.pods if p.labelled_role != BASELINE_KEY and not p.terminating]
    return any(observed.replicas(x) < spec.replicas and any(p.revision != x for p in live) for x in {rev, stable})


def plan(
    owner: B.Owner,
    spec: VLMServiceSpec,
    desired: B.Desired,
    observed: Observed,
    prev: RolloutStatus | None,
    *,
    stable: str | None,
    now: float,
    rooms: Mapping[str, M.Room] | None = None,
    decision: Decision | None = None,
    action: str | None = None,
    before: tuple[Sequence[BeforeStatus], float, float | None, float | None] | None = None,
) -> Plan:
    """The round's plan, by the phase the service is in. `before`: read at a rollout's start
    (analysis.before_start): the stable pods' pre-period, the loop-latency margin the rollout can resolve, the
    user's margin and loop latency's harm ceiling (relative), recorded once per rollout."""
    c = _Round(owner, spec, desired, observed, prev, stable, now, rooms, decision, action, before)
    if spec.paused:
        return Plan({}, stable, prev.revision if prev and prev.phase in ACTIVE else None, prev, want_ready=c.full,
                    hands_off=True)
    if stable is None:
        return _first_deploy(c)
    if c.rev == stable:
        return _at_stable(c)
    if spec.rollout is None:
        return _update(c)
    if prev is not None and prev.revision == c.rev and prev.phase in HELD_PHASES:
        return _back(c, prev)
    return _canary(c)


def _first_deploy(c: _Round) -> Plan:
    """One Deployment of the desired revision, its pods released where the scheduler likes."""
    prev = c.prev
    return c.finish(M.Outcome(replicas={c.rev: c.full}, releases=M.release_all(c.pods)), c.rev, None,
                    prev if prev and prev.phase not in (*ACTIVE, UPDATING) else None)


def _back(c: _Round, r: RolloutStatus) -> Plan:
    """Held (rolled back, aborted): the canary's pods replaced by stable ones on their nodes, within the budget;
    its Deployment goes once it has no pod."""
    out = c.run(c.to_stable(r), r)
    if out is None:
        return _rooms(c.stable, r)
    r = _upd(r, pairs=_pairs_out(out.pairs), waiting=out.waiting)
    return c.finish(out, c.stable, None, r, want=c.full if out.done else c.floor(c.u))


def _at_stable(c: _Round) -> Plan:
    """The spec is the stable revision: keep it at full replicas, drain anything else (a refused canary)."""
    prev, rev, full = c.prev, c.rev, c.full
    r = prev
    if prev and prev.phase in (*ACTIVE, UPDATING) and prev.revision == rev:
        # Only the operator's own promotion (or update) makes this rollout's revision the stable one: it stopped
        # (or its status write failed) between the last round's writes and recording them. Record what it did
        # instead of reading the spec as reverted.
        if prev.phase == UPDATING:
            r = None
            c.event("Normal", "Updated", f"all {full} replicas run revision {rev}")
        else:
            msg = f"canary {rev} promoted to stable (the promotion was applied before the operator restarted)"
            r = _upd(prev, phase="Promoted", verdict="Promote", reason="PromotionApplied", message=msg, waiting=None)
            c.event("Normal", "CanaryPromoted", msg)
    elif prev and prev.phase in (*ACTIVE, UPDATING):
        r = _upd(prev, phase="Aborted", reason="SpecReverted", message="spec is back at the stable revision",
                 waiting=None)
    out = c.run(c.to_stable(r), r)
    if out is None:
        return _rooms(c.stable, r)
    if r is not None and r.phase in HELD_PHASES:
        r = _upd(r, pairs=_pairs_out(out.pairs), waiting=out.waiting)
    moving = any(p.revision != c.stable for p in c.pods if not p.terminating)  # else a plain scale: want them all
    return c.finish(out, c.stable, None, r, want=full if out.done or not moving else c.floor(c.u))


def _update(c: _Round) -> Plan:
    """A new revision without a rollout block: replaced node by node, no analysis."""
    prev, rev, full, stable = c.prev, c.rev, c.full, c.stable
    r = prev if prev and prev.phase == UPDATING and prev.revision == rev else RolloutStatus(
        phase=UPDATING, revision=rev, from_revision=stable, started_at=c.t, step_started_at=c.t,
        message=f"updating from {stable} to {rev}")
    out = c.run(M.Move(to=rev, target=full, total=full, max_unavailable=1, gpus_per_replica=c.spec.gpus_per_replica),
                r)
    if out is None:
        return _rooms(stable, r)
    if out.outage and not r.warning:
        # Told before it happens: this round only says so; the next one replaces the pod.
        msg = (f"no free GPU next to the only Ready pod: updating to {rev} takes the service down until the new "
               "pod is Ready (add a GPU, or raise replicas, to update without an outage)")
        c.event("Warning", "UpdateCausesOutage", msg)
        return c.finish(None, stable, None, _upd(r, warning=msg, waiting="outage announced; replacing next round"))
    r = _upd(r, pairs=_pairs_out(out.pairs), waiting=out.waiting,
             message=f"updating from {stable} to {rev}: {c.observed.ready_of(rev)}/{full} replaced")
    if out.done:
        c.event("Normal", "Updated", f"all {full} replicas run revision {rev}")
        return c.finish(out, rev, None, None)
    return c.finish(out, stable, None, r, want=c.floor(1))


def _canary(c: _Round) -> Plan:
    """A rollout with analysis: started (or carried on), the user's action and the gate's verdict applied, then
    the step's pods moved."""
    r = _started(c)
    if r is None:
        return _rooms(c.stable, c.prev)  # a fresh baseline is asked for: are there free GPUs for it?
    r = _before_recorded(c, r)
    r, back = _user_action(c, r)
    if not back:
        r, back = _verdict(c, r)
    return _back(c, r) if back else _step_pods(c, r)


def _started(c: _Round) -> RolloutStatus | None:
    """The rollout of this revision: started here (or a newer spec supersedes one in progress), else as recorded.
    None: a fresh baseline is wanted and the nodes' free GPUs are not read yet."""
    prev, rev, stable = c.prev, c.rev, c.stable
    if prev is not None and prev.revision == rev and prev.phase in ACTIVE:
        return prev
    ro = c.spec.rollout
    assert ro is not None
    steps = c.spec.steps()
    baseline = "Stable"
    if ro.baseline == "Fresh":
        if c.rooms is None:
            return None
        if sum(x.free_gpus for x in c.rooms.values()) >= 2 * steps[0].replicas * c.spec.gpus_per_replica:
            baseline = "Fresh"
    r = RolloutStatus(phase="Progressing", revision=rev, from_revision=stable, step=0, steps=len(steps),
                      capacity="Borrow" if c.capacity == "Borrow" else "Surge" if c.capacity == "Surge" else None,
                      baseline=baseline, started_at=c.t, step_started_at=c.t,
                      message=f"canary {rev} started against stable {stable}")
    detail = "" if baseline == ro.baseline else "; no free GPUs for a fresh baseline, comparing with the stable pods"
    c.event("Normal", "CanaryStarted", f"canary revision {rev} against stable {stable} "
            f"({len(steps)} step(s): {', '.join(str(s.replicas) for s in steps)} pod(s){detail})")
    return r


def _before_recorded(c: _Round, r: RolloutStatus) -> RolloutStatus:
    """The stable pods' pre-period and the margin this rollout can resolve, recorded once per rollout (with a
    warning when the user's margin is finer than that)."""
    if c.before is None or r.before_at is not None:
        return r
    pre, resolvable, margin, ceiling = c.before
    r = _upd(r, before=list(pre), before_at=c.t, resolvable_margin={"loopLatency": round(100 * resolvable, 2)},
             expand_ceiling={"loopLatency": round(100 * ceiling, 2)} if ceiling is not None else None)
    if margin is not None and resolvable > margin:
        msg = (f"with {len(pre)} stable pod(s) measured, the pods' spread and this schedule the gate resolves "
               f"loop-latency margins of about {resolvable:.1%} or more, against maxRegression.loopLatency "
               f"{margin:.0%}: a regression of that size is rolled back less than half the time; add steps or "
               f"pods, or widen the margin")
        c.event("Warning", "CanaryMarginUnresolvable", f"canary {c.rev}: {msg}")
        r = _upd(r, warning=r.warning or msg)
    return r


def _user_action(c: _Round, r: RolloutStatus) -> tuple[RolloutStatus, bool]:
    """The kubectl vlm annotation (abort, pause, resume, promote); True: roll back now."""
    action, t, rev = c.action, c.t, c.rev
    if action == "abort":
        r = _upd(r, phase="Aborted", reason="AbortedByUser", message="aborted by annotation")
        c.event("Warning", "CanaryAborted", f"canary {rev} aborted by annotation")
        return r, True
    if action == "pause" and r.phase != "Paused":
        r = _upd(r, phase="Paused", reason="PausedByUser", message="paused by annotation")
    elif action == "resume" and r.phase == "Paused":
        r = _upd(r, phase="Progressing", analysis_started_at=None, data_started_at=None, step_started_at=t,
                 reason="Resumed", message="resumed by annotation")
    elif action == "promote" and r.phase != "Promoting":
        steps = c.spec.steps()
        r = _upd(r, step=len(steps) - 1, phase="Promoting", verdict="Promote", reason="PromotedByUser",
                 message="promoted by annotation", analysis_started_at=None, data_started_at=None, step_started_at=t)
        c.event("Normal", "CanaryPromoting", f"canary {rev} promoted by annotation: replacing the rest")
    return r, False


def _recorded_look(r: RolloutStatus, d: Decision, t: str, confident: bool) -> RolloutStatus:
    """The look in status: every field while analysing (or a confident regression while promoting); while
    promoting otherwise only the look's count and the signals it could estimate."""
    if not (r.phase == "Analysing" or confident):
        return _upd(r, last_analysis_at=t, analyses=r.analyses + 1, signals=_kept(_signals(d), r.signals))
    return _upd(
        r, last_analysis_at=t, analyses=r.analyses + 1, signals=_signals(d) or r.signals,
        verdict=d.verdict, reason=d.reason, message=d.message,
        warning=r.warning if _margin_told(r.warning) or not d.warning else "\n".join(w for w in (d.warning, r.warning) if w),
        resolvable_margin=_resolvable(d, r.resolvable_margin),
        expand_ceiling=_ceilings(d, r.expand_ceiling),
        warmup_shift=round(100 * d.warmup_shift, 2) if d.warmup_shift is not None else r.warmup_shift,
        sglang_agreement={k: round(100 * v, 2) for k, v in d.sglang_disagreement.items()} or r.sglang_agreement,
        comparison=list(d.pairing) or r.comparison,
        data_started_at=r.data_started_at or (
            _iso(d.clock_started_at) if d.clock_started_at is not None else None),
    )


def _margin_told(warning: str | None) -> bool:
    """Whether rollout.warning already holds the margin warning (one line; its other lines are expandCeiling's)."""
    return any(w and not w.startswith("expandCeiling.") for w in (warning or "").splitlines())


def _ceiling_told(c: _Round, r: RolloutStatus, d: Decision) -> RolloutStatus:
    """A fixed expandCeiling below what one canary pod's noise calls for: a Warning Event
    (CanaryExpandCeilingCapped) and a line in rollout.warning, once per rollout and setting."""
    if not d.ceiling_warning:
        return r
    told = {x.split(" ", 1)[0] for x in (r.warning or "").splitlines()}
    new = [w for w in d.ceiling_warning.splitlines() if w.split(" ", 1)[0] not in told]
    if not new:
        return r
    c.event("Warning", "CanaryExpandCeilingCapped", f"canary {c.rev}: {'; '.join(new)}")
    return _upd(r, warning="\n".join([w for w in (r.warning, *new) if w]))


def _verdict(c: _Round, r: RolloutStatus) -> tuple[RolloutStatus, bool]:
    """The gate's verdict mapped to the rollout's next state (the gate decides; this only maps); True: roll back."""
    d, rev, t = c.decision, c.rev, c.t
    if d is None or r.phase not in ("Analysing", "Promoting"):
        return r, False
    if d.warning and not _margin_told(r.warning):
        c.event("Warning", "CanaryMarginUnresolvable", d.warning)
    confident = any(s.verdict == "fail" for s in d.signals)
    r = _recorded_look(r, d, t, confident)
    r = _ceiling_told(c, r, d)
    if d.verdict == "Rollback" and (r.phase == "Analysing" or confident):
        r = _decided(r, d, t)
        r = _upd(r, phase="RolledBack", regressed_function=d.regressed_function, regressed_stage=d.regressed_stage)
        fn = f"; function {d.regressed_function} grew most" if d.regressed_function else ""
        c.event("Warning", "CanaryRolledBack", f"canary {rev} rolled back: {d.message}{fn}")
        return r, True
    if r.phase == "Analysing" and d.verdict == "Pause":
        r = _upd(_decided(r, d, t), phase="Paused")
        c.event("Warning", "CanaryPaused", f"canary {rev} paused: {d.message}")
    elif r.phase == "Analysing" and d.verdict == "Promote":
        r = _decided(r, d, t)
        steps = c.spec.steps()
        if r.step + 1 < len(steps):
            clock = r.data_started_at or r.analysis_started_at
            spent = max(0.0, c.now - parse_time(clock)) if clock else 0.0
            r = _upd(r, step=r.step + 1, step_started_at=t, analysis_started_at=None, data_started_at=None,
                     phase="Progressing", analysed_seconds=round(r.analysed_seconds + spent, 1))
            c.event("Normal", "CanaryStep", f"canary {rev} passed step {r.step}; moving on")
        else:
            r = _upd(r, phase="Promoting", step_started_at=t, analysis_started_at=t, data_started_at=None)
            c.event("Normal", "CanaryPromoting", f"canary {rev} passed its last step: replacing the remaining stable pods")
    return r, False


def _step_move(c: _Round, r: RolloutStatus, k: int) -> M.Move:
    """A step grows the canary to its k pods (Analysing, Paused: they stay; one lost with its Deployment, deleted
    by hand, comes back); promotion moves the rest."""
    gpr = c.spec.gpus_per_replica
    if r.phase == "Promoting":
        m = M.Move(to=c.rev, target=c.full, total=c.full, max_unavailable=c.u, gpus_per_replica=gpr, surge=c.surge)
    else:
        m = M.Move(to=c.rev, target=k, total=c.full, max_unavailable=c.u, gpus_per_replica=gpr, hold_surplus=True,
                   keep_old=1, surge=c.surge)
    return m if c.replace else M.Move(**{**m.__dict__, "max_unavailable": 0})


def _step_clock(c: _Round, r: RolloutStatus, out: M.Outcome, k: int) -> tuple[RolloutStatus, bool]:
    """A progressing step: analysed once its pods (and a fresh baseline's) are Ready, rolled back when they are
    not within startupTimeout (True), its clock held while it waits for a GPU."""
    if r.phase != "Progressing":
        return r, False
    prev, rev = c.prev, c.rev
    ro = c.spec.rollout
    assert ro is not None
    if out.no_capacity and (prev.waiting if prev is not None and prev.revision == rev else None) != out.waiting:
        c.event("Warning", "CanaryWaitingForGPU",
                f"canary {rev}: {out.waiting}; it waits (kubectl vlm promote replaces without analysis)")
    fresh_ready = sum(1 for p in c.observed.pods if p.labelled_role == BASELINE_KEY and p.ready and not p.terminating)
    if out.done and (r.baseline != "Fresh" or fresh_ready >= k):  # a fresh baseline starts with the canary
        return _upd(r, phase="Analysing", analysis_started_at=c.t, data_started_at=None, waiting=None,
                    evidence_since=r.evidence_since or c.t), False
    if not out.no_capacity and c.now - parse_time(r.step_started_at) >= parse_duration(ro.startup_timeout):
        msg = f"canary pods of step {r.step + 1} not Ready within startupTimeout {ro.startup_timeout}"
        r = _upd(r, phase="RolledBack", verdict="Rollback", reason="CanaryStartTimeout", message=msg)
        c.event("Warning", "CanaryRolledBack", f"canary {rev} rolled back: {msg}")
        return r, True
    if out.no_capacity:
        r = _upd(r, step_started_at=c.t)
    return r, False


def _fresh_baseline(c: _Round, r: RolloutStatus, k: int) -> tuple[RolloutStatus, tuple[str, int] | None]:
    """A fresh baseline next to the canary while its steps are analysed, given up for the stable pods when its
    pod stays unschedulable."""
    if not (r.baseline == "Fresh" and r.phase in ("Progressing", "Analysing", "Paused") and c.stable in c.deps):
        return r, None
    stuck = [p for p in c.observed.pods if p.labelled_role == BASELINE_KEY and p.unschedulable]
    if stuck and c.now - parse_time(r.step_started_at) >= FRESH_BASELINE_PATIENCE_S:
        r = _upd(r, baseline="Stable", message="no free GPU for the fresh baseline: comparing with the stable pods")
        c.event("Normal", "CanaryBaselineStable", "no free GPU for a fresh baseline: comparing with the stable pods")
        return r, None
    assert c.stable is not None
    return r, (c.stable, k)


def _step_pods(c: _Round, r: RolloutStatus) -> Plan:
    """The pods of the rollout's current step (or of the promotion), and what their progress means."""
    ro = c.spec.rollout
    assert ro is not None
    steps = c.spec.steps()
    k = steps[min(r.step, len(steps) - 1)].replicas
    out = c.run(_step_move(c, r, k), r)
    if out is None:
        return _rooms(c.stable, r, canary=c.rev)
    r = _upd(r, pairs=_pairs_out(out.pairs), waiting=out.waiting)
    if out.added:
        r = _upd(r, step_started_at=c.t)  # the start-up clock counts from the last pod placed
    r, back = _step_clock(c, r, out, k)
    if back:
        return _back(c, r)
    if r.phase == "Promoting" and out.done:
        r = _upd(r, phase="Promoted", verdict="Promote", waiting=None,
                 reason=r.reason if r.reason == "PromotedByUser" else "Promoted",
                 message=r.message if r.reason == "PromotedByUser" else f"all {c.full} replicas run {c.rev}")
        c.event("Normal", "CanaryPromoted", f"canary {c.rev} promoted to stable: {r.message}")
        return c.finish(out, c.rev, None, r)
    r, base = _fresh_baseline(c, r, k)
    # The fresh baseline's pods wait behind the gate until the canary's are on their nodes: otherwise the
    # scheduler may give one the free GPU a canary pod is pinned to.
    more: list[tuple[str, str | None]] = []
    canary_pods = [p for p in c.pods if p.revision == c.rev and not p.terminating]
    if base is not None and len(canary_pods) >= out.replicas.get(c.rev, 0) and all(p.node for p in canary_pods):
        more = [(p.name, None) for p in sorted(c.observed.pods, key=lambda p: p.name)
                if p.labelled_role == BASELINE_KEY and p.gated and not p.terminating]
    return c.finish(out, c.stable, c.rev, r, want=c.full if r.phase != "Promoting" else c.floor(c.u), baseline=base,
                    keep=(c.stable,), more=more)


def _rooms(stable: str | None, r: RolloutStatus | None, canary: str | None = None) -> Plan:
    """Nothing decided yet: plan again with the nodes' free GPUs."""
    return Plan({}, stable, canary, r, hands_off=True, wants_rooms=True)


__all__ = ["Event", "Plan", "needs_rooms", "plan"]


# The phases in which the canary is analysed: the load hook runs then.
_ANALYSED = ("Analysing", "Promoting")
# The load Job outlives a step's maxDuration by this much at most (activeDeadlineSeconds).
LOAD_DEADLINE_MARGIN_S = 300.0


def load_job(owner: B.Owner, spec: VLMServiceSpec, settings: Settings, plan: Plan,
              observed: Observed) -> dict[str, Any] | None:
    """spec.rollout.load's Job while the canary is analysed: the same rate to every Ready canary, stable and
    fresh-baseline pod with an IP that this plan keeps (not a pod it marks for removal, not a baseline it drops),
    a new Job when that set changes; None otherwise (any load Job is then deleted)."""
    if spec.rollout is None or spec.rollout.load is None or plan.rollout is None or plan.rollout.phase not in _ANALYSED:
        return None
    roles = (ROLE_CANARY, ROLE_STABLE, ROLE_BASELINE) if plan.baseline is not None else (ROLE_CANARY, ROLE_STABLE)
    leaving = set(plan.victims)
    targets = sorted({p.ip for p in observed.pods if p.ip and p.ready and not p.terminating and not p.victim
                      and p.name not in leaving and p.role in roles})
    if not any(p.role == ROLE_CANARY and p.ready and p.ip for p in observed.pods):
        return None
    deadline = parse_duration(spec.rollout.analysis.max_duration) + LOAD_DEADLINE_MARGIN_S
    return B.build_load_job(owner, spec, settings, targets, deadline)


@dataclass(frozen=True)
class Weights:
    """model.cache.download: the Job that fills the cache, and whether the weights are there (ModelReady)."""

    job: dict[str, Any] | None = None  # the Job to have; None: the operator downloads nothing for this spec
    ready: bool | None = None  # None: not the operator's to say (no download wanted)
    reason: str = ""
    message: str = ""


def weights(owner: B.Owner, spec: VLMServiceSpec, settings: Settings, observed: Observed) -> Weights:
    """The weights Job of the spec's model and revision, and its state as the Jobs index shows it. A failed Job
    stays (with its pods' logs) until someone deletes it; then the next reconcile makes a new one, which resumes."""
    if not B.wants_download(spec):
        return Weights()
    job = B.build_weights_job(owner, spec, settings)
    name = job["metadata"]["name"]
    model = f"{spec.model.path}@{spec.model.revision or 'main'}"
    claim = spec.model.cache.claim_name if spec.model.cache else ""
    info = observed.jobs.get(name)
    if info is not None and info.finished == "Complete":
        return Weights(job, True, "Downloaded", f"{model} is in claim {claim} (Job {name})")
    if info is not None and info.finished == "Failed":
        return Weights(job, False, "DownloadFailed",
                       f"Job {name} could not download {model} into claim {claim}: {info.message}; see kubectl logs "
                       f"job/{name}; delete the Job to try again (it resumes)")
    tried = f"; attempt {info.failed + 1} of {B.WEIGHTS_BACKOFF_LIMIT + 1}" if info is not None and info.failed else ""
    return Weights(job, False, "Downloading", f"Job {name} is downloading {model} into claim {claim}{tried}; "
                   f"pods start when it is done (kubectl logs job/{name} shows the bytes so far)")


def held(plan: Plan, revision: str, observed: Observed) -> Plan:
    """The plan with the pods of `revision` kept behind the scheduling gate (its weights are not there yet): they
    hold no GPU meanwhile, and start once the weights Job is done."""
    of_rev = {p.name for p in observed.pods if p.revision == revision}
    releases = tuple(r for r in plan.releases if r[0] not in of_rev)
    return plan if releases == plan.releases else replace(plan, releases=releases)
