"""What a rollout costs in pods and availability, at the shipped defaults (maxUnavailable 1, capacity Auto, the
default schedule 1, 2, 4, ... while a stable pod is left, baseline Stable).

Each scenario walks one rollout through the operator's own plan (`rollout.plan`, `placement.move`) and writes
(`act.pod_writes`, the revision Deployments) on the test suite's fake cluster (testing/vlm_testing/fakekube.py:
its ReplicaSets remove the lowest pod-deletion-cost first, its scheduler honours pins and free GPUs, a placed
pod is Ready at the next round, as a model load that takes one resync). The gate is not run: every look says
Promote (or Rollback at the last step, for the rollback rows), so the rows measure the mechanics alone.

Counted per rollout: pods started (model loads), pods of the winning revision removed while Ready (warm pods
dropped), the least Ready pods of the service at any round, how many new pods sat on the node of the pod they
paired with, and the rounds from the change to the end (each round one resync; a model load takes one).

The release before this one, from its code (rollout.py at 74f816c), for comparison: a step's k canary pods and
k fresh baseline pods started, then at promotion the canary Deployment deleted (k warm pods dropped) and all N
stable pods cold-restarted by a rolling update with maxSurge 0 (N more model loads, Ready N-1 throughout); with
no free GPU (Borrow) the stable Deployment lent k (or 2k with a fresh baseline) replicas, max(N - lent, 0): a
1-replica service ran its canary with no stable pod at all.

    python bench/rollout_moves.py [--out bench/results/rollout_moves.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vlm_operator.analysis.gate import Decision
from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.names import ACTIVE_PHASES
from vlm_operator.api.settings import Settings
from vlm_operator.cluster.observed import BASELINE_KEY
from vlm_operator.controller import act
from vlm_operator.desired import builders
from vlm_operator.rollout import placement
from vlm_operator.rollout import steps as rollout
from vlm_testing.fakekube import FakeKube

REPO = Path(__file__).resolve().parent.parent

OWNER = builders.Owner("svc", "ns", "uid-1")
T0 = 1_800_000_000.0


def spec(n: int, env: str | None = None, steps: list[int] | None = None) -> api.VLMServiceSpec:
    s = {"model": {"path": "m"}, "replicas": n, "rollout": {"analysis": {"interval": "1m", "maxDuration": "30m"}}}
    if steps:
        s["rollout"]["steps"] = [{"replicas": k} for k in steps]
    if env:
        s["sglang"] = {"env": [{"name": "CHANGE", "value": env}]}
    return api.parse_spec(s)


def walk(n: int, gpus_per_node: int, verdict_last: str, steps: list[int] | None = None) -> dict[str, object]:
    kube = FakeKube(nodes={f"node-{i}": gpus_per_node for i in range(n)})
    stable: str | None = None
    r: api.RolloutStatus | None = None
    sp = spec(n, steps=steps)

    def round_(now: float, decision: Decision | None) -> rollout.Plan:
        nonlocal stable, r
        obs = kube.observed("svc")
        st = obs.stable_revision(stable)
        canary = r.revision if r and r.phase in ACTIVE_PHASES and r.revision != st else None
        obs = obs.with_roles(st, canary)
        d = builders.build_desired(OWNER, sp, Settings())

        rooms = None
        if rollout.needs_rooms(sp, d, obs, r, st):  # the reconcile's one read of the free GPUs
            rooms = {k: placement.Room(f, z) for k, (f, z) in kube.rooms("").items()}
        p = rollout.plan(OWNER, sp, d, obs, r, stable=st, now=now, rooms=rooms, decision=decision)
        assert not p.wants_rooms
        for x in act.pod_writes("ns", p, obs):
            kube.patch_pod(x.namespace, x.name, x.patch)
        deps, _ = builders.revision_deployments(OWNER, d, obs.deployments, p.replicas, p.baseline)
        for rev, body in sorted(deps.items()):
            kube.apply(body, obs.deployments.get(rev))
        for rev, body in obs.deployments.items():
            if rev not in deps and rev != BASELINE_KEY:
                kube.delete("apps/v1", "Deployment", "ns", body["metadata"]["name"])
        stable = p.stable_revision
        r = api.RolloutStatus.model_validate(p.rollout.model_dump(by_alias=True, exclude_none=True)) if p.rollout else None
        kube.settle("svc", rounds=1)
        return p

    t = T0
    for _ in range(4):
        round_(t, None)
        t += 15
    started_before = kube.pod_counter
    old_rev = stable
    assert old_rev is not None
    sp = spec(n, "2", steps)
    new_rev = builders.build_desired(OWNER, sp, Settings()).revision
    low = n
    rounds = 0
    removed_ready: list[str] = []  # revisions of Ready pods that went away
    steps_n = len(sp.rollout.schedule(n))  # type: ignore[union-attr]
    final = "waits (no free GPU)"
    for _ in range(60):
        rounds += 1
        dec = None
        if r and r.phase == "Analysing":
            last = r.step + 1 >= steps_n
            dec = Decision(verdict=verdict_last if last else "Promote", reason="bench", message="bench")
        before = {p.name: p for p in kube.pods("svc")}
        round_(t, dec)
        t += 15
        after = {p.name for p in kube.pods("svc")}
        removed_ready += [p.revision for name, p in before.items() if p.ready and name not in after]
        serving = [p for p in kube.pods("svc") if p.labelled_role != BASELINE_KEY]
        low = min(low, sum(1 for p in serving if p.ready))
        revs = {p.revision for p in serving}
        ended = r is None or r.phase in ("Promoted", "RolledBack")
        settled = len(revs) == 1 and len(serving) == n and all(p.ready for p in serving)
        if ended and settled and len(kube.deployments("ns", "svc")) == 1:
            final = r.phase if r else "?"
            break
    winner = new_rev if final == "Promoted" else old_rev
    alive = {p.name: p.node for p in kube.pods("svc")}
    mine = [x for x in (r.pairs if r else []) if x.revision == winner and x.dropped is None]
    same_node = sum(1 for x in mine if x.pod in alive and alive[x.pod] == x.node)
    return {
        "replicas": n, "gpus/node": gpus_per_node, "verdict": final, "final_rev": "new" if stable == new_rev else "old",
        "pods started": kube.pod_counter - started_before,
        "warm pods dropped": sum(1 for x in removed_ready if x == winner),
        "least Ready": low, "pairs": len(mine), "paired": same_node, "rounds": rounds,
    }


def old_release(n: int, gpus_per_node: int, verdict_last: str) -> dict[str, object]:
    """The previous release's mechanics from its code (one step of 1 canary pod, baseline Fresh where it fits)."""
    k = 1
    free = n * (gpus_per_node - 1)
    surge = free >= k
    fresh = free >= 2 * k or n >= 2 * k
    lent = 0 if surge else k + (k if fresh else 0)
    started = k + (k if fresh else 0) + (n if verdict_last == "Promote" else (0 if surge else lent))
    low_step = n if surge else max(n - lent, 0)
    low = min(low_step, n - 1) if verdict_last == "Promote" else low_step
    return {"pods started": started, "warm pods dropped": k if verdict_last == "Promote" else 0, "least Ready": low}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = []
    for verdict in ("Promote", "Rollback"):
        for steps in (None, [1]):
            for n in (1, 2, 4, 8):
                for g in (1, 2):
                    rows.append((verdict, steps, walk(n, g, verdict, steps), old_release(n, g, verdict)))
    head = ("| last verdict | steps | replicas | GPUs per node | pods started (before) | warm pods dropped (before) | "
            "least Ready (before) | winner's pods on their pair's node | rounds |")
    lines = [head, "|" + "---|" * 9]
    for verdict, steps, got, old in rows:
        sched = "default" if steps is None else ",".join(map(str, steps))
        lines.append(
            f"| {verdict}: {got['verdict']} | {sched} | {got['replicas']} | {got['gpus/node']} | {got['pods started']} "
            f"({old['pods started']}) | {got['warm pods dropped']} ({old['warm pods dropped']}) | "
            f"{got['least Ready']} ({old['least Ready']}) | {got['paired']}/{got['pairs']} | {got['rounds']} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(
            "# Rollout mechanics: pods and availability per rollout\n\n"
            "`python bench/rollout_moves.py --out bench/results/rollout_moves.md` (the module's docstring says what is "
            "counted and how the previous release's numbers, in parentheses, follow from its code).\n\n" + text + "\n")


if __name__ == "__main__":
    main()
