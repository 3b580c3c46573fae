"""Shared by tests (moved out of tests/unit/operator/rollout/test_rollout.py, so no test imports another test module)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vlm_operator.analysis.gate import Decision
from vlm_operator.analysis.gate.verdict import SignalResult
from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.names import ACTIVE_PHASES
from vlm_operator.api.settings import Settings
from vlm_operator.cluster.observed import BASELINE_KEY, Observed
from vlm_operator.controller import act
from vlm_operator.desired import builders
from vlm_operator.rollout import placement
from vlm_operator.rollout import steps as rollout
from vlm_testing.fakekube import FakeKube

T0 = 1_800_000_000.0
OWNER = builders.Owner("svc", "ns", "uid-1")


SETTINGS = Settings()


CHANGE = {"sglang": {"ipcCache": {"mode": "Off"}}}


TIGHT = {"node-0": 1, "node-1": 1, "node-2": 1}  # one GPU each: no room to surge


def spec(**over) -> api.VLMServiceSpec:
    """Most tests here compare with the stable pods (baseline Stable); the fresh-baseline tests say Fresh."""
    base = {
        "model": {"path": "m"},
        "replicas": 3,
        "rollout": {"steps": [{"replicas": 1, "analysis": "5m"}], "analysis": {"interval": "1m", "maxDuration": "30m"}},
    }
    base.update(over)
    if isinstance(base["rollout"], dict):
        base["rollout"] = {"baseline": "Stable", **base["rollout"]}
    return api.parse_spec(base)


def desired(s: api.VLMServiceSpec) -> builders.Desired:
    return builders.build_desired(OWNER, s, SETTINGS)


def decision(verdict: str, **kw) -> Decision:
    return Decision(verdict=verdict, reason=kw.pop("reason", verdict), message=kw.pop("message", verdict), **kw)


def fail_signal() -> SignalResult:
    return SignalResult(name="loop_latency", baseline=0.02, canary=0.03, delta=0.5, ci_low=0.4, ci_high=0.6,
                        p_value=0.001, n_baseline=40, n_canary=40, verdict="fail")


def stored(r: api.RolloutStatus | None) -> api.RolloutStatus | None:
    """The rollout status as the API server keeps it (JSON, camelCase, nulls dropped) and a restart reads it."""
    return api.RolloutStatus.model_validate(r.model_dump(by_alias=True, exclude_none=True)) if r else None


@dataclass
class World:
    """One service on a FakeKube, its status (stableRevision, rollout) kept here as the reconcile keeps it."""

    spec: api.VLMServiceSpec
    nodes: dict[str, int] = field(default_factory=lambda: dict(TIGHT))
    stable: str | None = None
    rollout: api.RolloutStatus | None = None
    events: list[rollout.Event] = field(default_factory=list)
    ready_seen: list[int] = field(default_factory=list)  # Ready serving pods after every settle
    built: tuple = ({}, None)  # the last step's Deployments and baseline, built from its plan as the reconcile does

    def __post_init__(self) -> None:
        self.kube = FakeKube(nodes=dict(self.nodes))

    # what a reconcile reads
    def observed(self) -> Observed:
        obs = self.kube.observed("svc")
        stable = obs.stable_revision(self.stable)
        prev = self.rollout
        canary = prev.revision if prev and prev.phase in ACTIVE_PHASES and prev.revision != stable else None
        return obs.with_roles(stable, canary)

    def plan(self, now: float, *, decision: Decision | None = None, action: str | None = None,
             prev: api.RolloutStatus | str | None = "status") -> rollout.Plan:
        obs = self.observed()
        r = self.rollout if prev == "status" else prev
        stable = obs.stable_revision(self.stable)
        rooms = None
        if rollout.needs_rooms(self.spec, desired(self.spec), obs, r, stable):  # the reconcile's one read, as it does
            rooms = {n: placement.Room(f, z) for n, (f, z) in self.kube.rooms("").items()}
        p = rollout.plan(OWNER, self.spec, desired(self.spec), obs, r, stable=stable, now=now, rooms=rooms,
                         decision=decision, action=action)
        # needs_rooms must cover every move that surges: a plan asking for the rooms it was not given is a bug
        assert not p.wants_rooms, "plan wanted the nodes' free GPUs that needs_rooms did not ask for"
        return p

    def step(self, now: float, *, settle: bool = True, ready: bool = True, **kw) -> rollout.Plan:
        """One reconcile (plan, apply, status written), then the cluster settles."""
        obs = self.observed()
        p = self.plan(now, **kw)
        assert not p.wants_rooms
        if not p.hands_off:
            for x in act.pod_writes("ns", p, obs):
                self.kube.patch_pod(x.namespace, x.name, x.patch)
            deps, base = builders.revision_deployments(OWNER, desired(self.spec), obs.deployments, p.replicas,
                                                       p.baseline)
            self.built = (deps, base)
            for rev, body in sorted(deps.items()):
                self.kube.apply(body, obs.deployments.get(rev))
            if base is not None:
                self.kube.apply(base, obs.deployments.get(BASELINE_KEY))
            for rev, body in obs.deployments.items():
                if rev not in deps and (rev != BASELINE_KEY or base is None):
                    self.kube.delete("apps/v1", "Deployment", "ns", body["metadata"]["name"])
        self.stable, self.rollout = p.stable_revision, stored(p.rollout)
        self.events += p.events
        if settle:
            self.kube.settle("svc", ready=ready)
            self.ready_seen.append(sum(1 for x in self.serving() if x.ready))
        return p

    def serving(self):
        return [p for p in self.kube.pods("svc") if p.labelled_role != BASELINE_KEY]

    def pods_of(self, rev: str):
        return [p for p in self.serving() if p.revision == rev]

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]

    def deploy(self, now: float = T0 - 100) -> str:
        """First deploy, settled: every pod Ready, labelled stable."""
        for i in range(3):
            self.step(now + i)
        assert self.stable and len(self.pods_of(self.stable)) == self.spec.replicas
        assert all(p.ready and p.labelled_role == "stable" for p in self.serving())
        self.ready_seen.clear()
        return self.stable

    def change(self, new: api.VLMServiceSpec) -> str:
        self.spec = new
        return desired(new).revision

    def until(self, now: float, done, *, limit: int = 40, dt: float = 10, **kw) -> float:
        for _ in range(limit):
            self.step(now, **kw)
            if done(self):
                return now
            now += dt
        raise AssertionError(f"not reached after {limit} rounds: {self.rollout}")

