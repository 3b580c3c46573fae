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
from vlm_operator.api.v1alpha1 import BeforeStatus, PairStatus, RolloutStatus, SignalStatus, VLMServiceSpec
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
    deployments: dict[str, dict[str, Any]]  # revision -> desired Deployment; an observed one not here is deleted
    stable_revision: str | None
    canary_revision: str | None
    rollout: RolloutStatus | None
    events: tuple[Event, ...] = field(default=())
    baseline: dict[str, Any] | None = None  # desired fresh-baseline Deployment, or None to delete it
    victims: tuple[str, ...] = ()  # pods to mark for removal, before the Deployments are scaled
    releases: tuple[tuple[str, str | None], ...] = ()  # (gated pod, node to pin it to or None)
    labels: tuple[tuple[str, str], ...] = ()  # (pod, role) for pods whose role label is behind
    want_ready: int = 0
    hands_off: bool = False  # spec.paused: change no Deployment
    wants_rooms: bool = False  # plan again with the nodes' free GPUs (a move would surge)


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
            p_value=s.p_value, verdict=s.verdict,
        )
        for s in d.signals
    ]


def _pairs_in(r: RolloutStatus | None) -> list[M.Pair]:
    return [M.Pair(**p.model_dump(by_alias=False)) for p in (r.pairs if r else [])]


def _pairs_out(pairs: Sequence[M.Pair]) -> list[PairStatus]:
    return [PairStatus(**p.__dict__) for p in pairs][-512:]


def stable_revision(recorded: str | None, observed: Observed) -> str | None:
    """The stable revision: status.stableRevision while its Deployment exists; otherwise (a service from a release
    before revision Deployments, or a status lost) the revision with the most Ready pods, adopted as it runs."""
    revs = observed.revisions()
    if recorded in revs:
        return recorded
    if not revs:
        return None
    return max(revs, key=lambda r: (observed.ready_of(r), observed.replicas(r), r))


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
    before: tuple[Sequence[BeforeStatus], float, float | None] | None = None,
) -> Plan:
    """`before`: read at a rollout's start (analysis.before_start): the stable pods' pre-period, the loop-latency
    margin the rollout can resolve and the user's margin (relative), recorded once per rollout."""
    rev = desired.revision
    full = spec.replicas
    t = _iso(now)
    deps = observed.deployments
    pods = [p for p in observed.pods if p.labelled_role != BASELINE_KEY]
    events: list[Event] = []

    def dep(r: str, n: int) -> dict[str, Any] | None:
        if r in deps:
            return B.rescaled(owner, deps[r], n)
        return B.build_deployment(owner, desired.template, r, n) if r == rev else None

    def labels_for(stable_r: str | None, canary_r: str | None) -> tuple[tuple[str, str], ...]:
        want = {stable_r: ROLE_STABLE, canary_r: ROLE_CANARY}
        return tuple((p.name, want[p.revision]) for p in sorted(pods, key=lambda p: p.name)
                     if p.revision in want and p.revision and not p.gated and not p.terminating
                     and p.labelled_role != want[p.revision])

    def finish(outcome: M.Outcome | None, stable_r: str | None, canary_r: str | None, r: RolloutStatus | None,
               *, want: int = full, baseline: dict[str, Any] | None = None, keep: Sequence[str] = (),
               more: Sequence[tuple[str, str | None]] = ()) -> Plan:
        wanted: dict[str, dict[str, Any]] = {}
        reps = dict(outcome.replicas) if outcome else {}
        for x in {*reps, *keep, *(k for k in (stable_r, canary_r) if k)}:
            n = reps.get(x, observed.replicas(x) if x in deps else 0)
            if x not in (stable_r, canary_r) and n == 0 and not observed.pods_of(x) and x not in keep:
                continue  # drained: its Deployment goes
            d = dep(x, n)
            if d is not None:
                wanted[x] = d
        role = {stable_r: ROLE_STABLE, canary_r: ROLE_CANARY}
        rev_of = {q.name: q.revision for q in pods}
        releases = outcome.releases if outcome else M.release_all(pods)
        was = {(x.node, x.pod, x.started_at) for x in (prev.pairs if prev else []) if x.dropped}
        for x in (r.pairs if r else []):
            if x.dropped and (x.node, x.pod, x.started_at) not in was:
                events.append(Event("Warning", "PairDropped", f"pair on node {x.node} dropped: {x.dropped}"))
        return Plan(
            deployments=wanted, stable_revision=stable_r, canary_revision=canary_r, rollout=r, events=tuple(events),
            baseline=baseline, victims=outcome.victims if outcome else (),
            releases=tuple((p, n) for p, n in releases) + tuple(more),
            labels=labels_for(stable_r, canary_r) + tuple(
                (p, role[rev_of[p]]) for p, _ in releases if role.get(rev_of.get(p))),
            want_ready=want,
        )

    def run(m: M.Move, r: RolloutStatus | None) -> M.Outcome | None:
        """The move's next increment, or None when it has pods to add, may surge, and the nodes' free GPUs are
        not read yet (the reconcile reads them and plans again)."""
        if rooms is None and m.surge and observed.replicas(m.to) < m.target and any(
                p.revision != m.to for p in pods if not p.terminating):
            return None
        return M.move(m, {x: observed.replicas(x) for x in observed.revisions()}, pods, _pairs_in(r), rooms,
                      stable=stable, now=t)

    def _back(r: RolloutStatus) -> Plan:
        """Held (rolled back, aborted): the canary's pods replaced by stable ones on their nodes, within the budget;
        its Deployment goes once it has no pod."""
        m = M.Move(to=stable, target=full, total=full, max_unavailable=u, gpus_per_replica=spec.gpus_per_replica,
                   surge=surge)
        out = run(m, r)
        if out is None:
            return _rooms(stable, r)
        r = _upd(r, pairs=_pairs_out(out.pairs), waiting=out.waiting)
        return finish(out, stable, None, r, want=full if out.done else floor(u))

    def floor(u: int) -> int:
        """The Ready replicas a move keeps (the Ready condition's want meanwhile): never 0 for a service that has
        replicas (a 1-replica service replacing its only pod is not Ready)."""
        return max(full - u, min(full, 1))

    if spec.paused:
        return Plan({}, stable, prev.revision if prev and prev.phase in ACTIVE else None, prev, want_ready=full,
                    hands_off=True)

    # ---- first deploy: one Deployment of the desired revision, its pods released where the scheduler likes
    if stable is None:
        return finish(M.Outcome(replicas={rev: full}, releases=M.release_all(pods)), rev, None,
                      prev if prev and prev.phase not in (*ACTIVE, UPDATING) else None)

    u = spec.rollout.max_unavailable if spec.rollout else 1
    capacity = spec.rollout.capacity if spec.rollout else "Auto"
    surge, replace = capacity != "Borrow", capacity != "Surge"

    # ---- the spec is the stable revision: keep it at full replicas, drain anything else (a refused canary)
    if rev == stable:
        r = prev
        if prev and prev.phase in (*ACTIVE, UPDATING) and prev.revision == rev:
            # Only the operator's own promotion (or update) makes this rollout's revision the stable one: it stopped
            # (or its status write failed) between the last round's writes and recording them. Record what it did
            # instead of reading the spec as reverted.
            if prev.phase == UPDATING:
                r = None
                events.append(Event("Normal", "Updated", f"all {full} replicas run revision {rev}"))
            else:
                msg = f"canary {rev} promoted to stable (the promotion was applied before the operator restarted)"
                r = _upd(prev, phase="Promoted", verdict="Promote", reason="PromotionApplied", message=msg, waiting=None)
                events.append(Event("Normal", "CanaryPromoted", msg))
        elif prev and prev.phase in (*ACTIVE, UPDATING):
            msg = "spec is back at the stable revision"
            r = _upd(prev, phase="Aborted", reason="SpecReverted", message=msg, waiting=None)
        m = M.Move(to=stable, target=full, total=full, max_unavailable=u, gpus_per_replica=spec.gpus_per_replica,
                   surge=surge)
        out = run(m, r)
        if out is None:
            return _rooms(stable, r)
        if r is not None and r.phase in HELD_PHASES:
            r = _upd(r, pairs=_pairs_out(out.pairs), waiting=out.waiting)
        moving = any(p.revision != stable for p in pods if not p.terminating)  # else a plain scale: want them all
        return finish(out, stable, None, r, want=full if out.done or not moving else floor(u))

    # ---- a new revision without a rollout block: replaced node by node, no analysis
    if spec.rollout is None:
        r = prev if prev and prev.phase == UPDATING and prev.revision == rev else RolloutStatus(
            phase=UPDATING, revision=rev, from_revision=stable, started_at=t, step_started_at=t,
            message=f"updating from {stable} to {rev}")
        out = run(M.Move(to=rev, target=full, total=full, max_unavailable=1, gpus_per_replica=spec.gpus_per_replica), r)
        if out is None:
            return _rooms(stable, r)
        if out.outage and not r.warning:
            # Told before it happens: this round only says so; the next one replaces the pod.
            msg = (f"no free GPU next to the only Ready pod: updating to {rev} takes the service down until the new "
                   "pod is Ready (add a GPU, or raise replicas, to update without an outage)")
            events.append(Event("Warning", "UpdateCausesOutage", msg))
            return finish(None, stable, None, _upd(r, warning=msg, waiting="outage announced; replacing next round"))
        r = _upd(r, pairs=_pairs_out(out.pairs), waiting=out.waiting,
                 message=f"updating from {stable} to {rev}: {observed.ready_of(rev)}/{full} replaced")
        if out.done:
            events.append(Event("Normal", "Updated", f"all {full} replicas run revision {rev}"))
            return finish(out, rev, None, None)
        return finish(out, stable, None, r, want=floor(1))

    ro = spec.rollout
    steps = ro.schedule(full)

    # ---- held: the canary was refused; its pods are replaced by stable ones on their nodes
    if prev is not None and prev.revision == rev and prev.phase in HELD_PHASES:
        return _back(prev)

    # ---- a rollout of this revision starts (or a newer spec supersedes one in progress)
    if prev is None or prev.revision != rev or prev.phase not in ACTIVE:
        baseline = "Stable"
        if ro.baseline == "Fresh":
            free = sum(x.free_gpus for x in (rooms or {}).values())
            if rooms is None:
                return _rooms(stable, prev)
            if free >= 2 * steps[0].replicas * spec.gpus_per_replica:
                baseline = "Fresh"
        r = RolloutStatus(phase="Progressing", revision=rev, from_revision=stable, step=0, steps=len(steps),
                          capacity="Borrow" if capacity == "Borrow" else "Surge" if capacity == "Surge" else None,
                          baseline=baseline, started_at=t, step_started_at=t,
                          message=f"canary {rev} started against stable {stable}")
        detail = "" if baseline == ro.baseline else "; no free GPUs for a fresh baseline, comparing with the stable pods"
        events.append(Event("Normal", "CanaryStarted", f"canary revision {rev} against stable {stable} "
                            f"({len(steps)} step(s): {', '.join(str(s.replicas) for s in steps)} pod(s){detail})"))
    else:
        r = prev
    if before is not None and r.before_at is None:
        pre, resolvable, margin = before
        r = _upd(r, before=list(pre), before_at=t, resolvable_margin={"loopLatency": round(100 * resolvable, 2)})
        if margin is not None and resolvable > margin:
            msg = (f"with {len(pre)} stable pod(s) measured, the pods' spread and this schedule the gate resolves "
                   f"loop-latency margins of about {resolvable:.1%} or more, against maxRegression.loopLatency "
                   f"{margin:.0%}: a regression of that size is rolled back less than half the time; add steps or "
                   f"pods, or widen the margin")
            events.append(Event("Warning", "CanaryMarginUnresolvable", f"canary {rev}: {msg}"))
            r = _upd(r, warning=r.warning or msg)

    # ---- the decision point: the user's action, the start-up, the gate's verdict
    if action == "abort":
        r = _upd(r, phase="Aborted", reason="AbortedByUser", message="aborted by annotation")
        events.append(Event("Warning", "CanaryAborted", f"canary {rev} aborted by annotation"))
        return _back(r)
    if action == "pause" and r.phase != "Paused":
        r = _upd(r, phase="Paused", reason="PausedByUser", message="paused by annotation")
    elif action == "resume" and r.phase == "Paused":
        r = _upd(r, phase="Progressing", analysis_started_at=None, data_started_at=None, step_started_at=t,
                 reason="Resumed", message="resumed by annotation")
    elif action == "promote" and r.phase != "Promoting":
        r = _upd(r, step=len(steps) - 1, phase="Promoting", verdict="Promote", reason="PromotedByUser",
                 message="promoted by annotation", analysis_started_at=None, data_started_at=None, step_started_at=t)
        events.append(Event("Normal", "CanaryPromoting", f"canary {rev} promoted by annotation: replacing the rest"))

    if decision is not None and r.phase in ("Analysing", "Promoting"):
        if decision.warning and not r.warning:
            events.append(Event("Warning", "CanaryMarginUnresolvable", decision.warning))
        confident = any(s.verdict == "fail" for s in decision.signals)
        if r.phase == "Analysing" or confident:
            r = _upd(
                r, last_analysis_at=t, analyses=r.analyses + 1, signals=_signals(decision) or r.signals,
                verdict=decision.verdict, reason=decision.reason, message=decision.message,
                warning=r.warning or decision.warning,
                resolvable_margin=({"loopLatency": round(100 * decision.resolvable_margin, 2)}
                                   if decision.resolvable_margin is not None else r.resolvable_margin),
                warmup_shift=(round(100 * decision.warmup_shift, 2) if decision.warmup_shift is not None
                              else r.warmup_shift),
                comparison=list(decision.pairing) or r.comparison,
                data_started_at=r.data_started_at or (
                    _iso(decision.clock_started_at) if decision.clock_started_at is not None else None),
            )
        else:  # promoting: only a confident regression counts; the look is still recorded
            r = _upd(r, last_analysis_at=t, analyses=r.analyses + 1, signals=_kept(_signals(decision), r.signals))
        if decision.verdict == "Rollback" and (r.phase == "Analysing" or confident):
            r = _upd(r, phase="RolledBack", regressed_function=decision.regressed_function,
                     regressed_stage=decision.regressed_stage)
            fn = f"; function {decision.regressed_function} grew most" if decision.regressed_function else ""
            events.append(Event("Warning", "CanaryRolledBack", f"canary {rev} rolled back: {decision.message}{fn}"))
            return _back(r)
        if r.phase == "Analysing" and decision.verdict == "Pause":
            r = _upd(r, phase="Paused")
            events.append(Event("Warning", "CanaryPaused", f"canary {rev} paused: {decision.message}"))
        elif r.phase == "Analysing" and decision.verdict == "Promote":
            if r.step + 1 < len(steps):
                clock = r.data_started_at or r.analysis_started_at
                spent = max(0.0, now - parse_time(clock)) if clock else 0.0
                r = _upd(r, step=r.step + 1, step_started_at=t, analysis_started_at=None, data_started_at=None,
                         phase="Progressing", analysed_seconds=round(r.analysed_seconds + spent, 1))
                events.append(Event("Normal", "CanaryStep", f"canary {rev} passed step {r.step}; moving on"))
            else:
                r = _upd(r, phase="Promoting", step_started_at=t, analysis_started_at=t, data_started_at=None)
                events.append(Event("Normal", "CanaryPromoting",
                                    f"canary {rev} passed its last step: replacing the remaining stable pods"))

    # ---- the pods: a step grows the canary, promotion moves the rest, a pause holds
    k = steps[min(r.step, len(steps) - 1)].replicas
    gpr = spec.gpus_per_replica
    if r.phase == "Promoting":
        m = M.Move(to=rev, target=full, total=full, max_unavailable=u, gpus_per_replica=gpr, surge=surge)
    else:
        # (Analysing, Paused: the step's pods stay; one lost with its Deployment, deleted by hand, comes back)
        target = k
        m = M.Move(to=rev, target=target, total=full, max_unavailable=u, gpus_per_replica=gpr, hold_surplus=True,
                   keep_old=1, surge=surge)
    if not replace:
        m = M.Move(**{**m.__dict__, "max_unavailable": 0})
    out = run(m, r)
    if out is None:
        return _rooms(stable, r, canary=rev)
    r = _upd(r, pairs=_pairs_out(out.pairs), waiting=out.waiting)
    if out.added:
        r = _upd(r, step_started_at=t)  # the start-up clock counts from the last pod placed

    if r.phase == "Progressing":
        if out.no_capacity and (prev.waiting if prev is not None and prev.revision == rev else None) != out.waiting:
            events.append(Event("Warning", "CanaryWaitingForGPU",
                                f"canary {rev}: {out.waiting}; it waits (kubectl vlm promote replaces without analysis)"))
        fresh_ready = sum(1 for p in observed.pods if p.labelled_role == BASELINE_KEY and p.ready and not p.terminating)
        if out.done and (r.baseline != "Fresh" or fresh_ready >= k):  # a fresh baseline starts with the canary
            r = _upd(r, phase="Analysing", analysis_started_at=t, data_started_at=None, waiting=None,
                     evidence_since=r.evidence_since or t)
        elif not out.no_capacity and now - parse_time(r.step_started_at) >= parse_duration(ro.startup_timeout):
            msg = f"canary pods of step {r.step + 1} not Ready within startupTimeout {ro.startup_timeout}"
            r = _upd(r, phase="RolledBack", verdict="Rollback", reason="CanaryStartTimeout", message=msg)
            events.append(Event("Warning", "CanaryRolledBack", f"canary {rev} rolled back: {msg}"))
            return _back(r)
        elif out.no_capacity:
            r = _upd(r, step_started_at=t)
    if r.phase == "Promoting" and out.done:
        r = _upd(r, phase="Promoted", verdict="Promote", waiting=None,
                 reason=r.reason if r.reason == "PromotedByUser" else "Promoted",
                 message=r.message if r.reason == "PromotedByUser" else f"all {full} replicas run {rev}")
        events.append(Event("Normal", "CanaryPromoted", f"canary {rev} promoted to stable: {r.message}"))
        return finish(out, rev, None, r)

    # a fresh baseline next to the canary while its steps are analysed
    base = None
    if r.baseline == "Fresh" and r.phase in ("Progressing", "Analysing", "Paused") and stable in deps:
        stuck = [p for p in observed.pods if p.labelled_role == BASELINE_KEY and p.unschedulable]
        if stuck and now - parse_time(r.step_started_at) >= FRESH_BASELINE_PATIENCE_S:
            r = _upd(r, baseline="Stable", message="no free GPU for the fresh baseline: comparing with the stable pods")
            events.append(Event("Normal", "CanaryBaselineStable",
                                "no free GPU for a fresh baseline: comparing with the stable pods"))
        else:
            base = B.build_baseline(owner, deps[stable]["spec"]["template"], stable, k)
    # The fresh baseline's pods wait behind the gate until the canary's are on their nodes: otherwise the
    # scheduler may give one the free GPU a canary pod is pinned to.
    more: list[tuple[str, str | None]] = []
    canary_pods = [p for p in pods if p.revision == rev and not p.terminating]
    if base is not None and len(canary_pods) >= out.replicas.get(rev, 0) and all(p.node for p in canary_pods):
        more = [(p.name, None) for p in sorted(observed.pods, key=lambda p: p.name)
                if p.labelled_role == BASELINE_KEY and p.gated and not p.terminating]
    return finish(out, stable, rev, r, want=full if r.phase != "Promoting" else floor(u), baseline=base,
                  keep=(stable,), more=more)


def _rooms(stable: str | None, r: RolloutStatus | None, canary: str | None = None) -> Plan:
    """Nothing decided yet: plan again with the nodes' free GPUs."""
    return Plan({}, stable, canary, r, hands_off=True, wants_rooms=True)


__all__ = ["Event", "Plan", "plan", "stable_revision"]


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
