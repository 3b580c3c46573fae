"""The reconcile's shape, measured: the cluster snapshot (`Observed`) goes gather -> decide -> act in one pass.

A reconcile that analyses a canary step (fake Kube, fake sidecars, the real gate) is traced with
sys.setprofile; every operator function that receives the reconcile's `Observed` as an argument is a place it
visits (its own methods excepted). The walk, collapsed by module, must visit each module once, in the order
gather (analysis) -> decide (rollout, status) -> act (act): a module it left is never entered again.
Measured with this walk: at 74f816c, 13 places in 3 modules, reconcile -> rollout -> reconcile -> rollout ->
reconcile -> status (3 returns to a module it had left: the reconcile read signals between the rollout's two
calls and applied the plan before reading the profiler); now 12 places in 5 modules, reconcile -> analysis ->
rollout -> status -> act.
Since revision Deployments the reconcile first settles which revision is stable (`Observed.stable_revision`, from
status or by adoption) and reads the snapshot again with each pod's role as status says (`Observed.with_roles`, a
new Observed): the walk follows that one too. The index's snapshot goes only to the reconcile; the one with roles
goes analysis -> rollout -> status -> act.

The deeper walk (`deep_walk`) follows the snapshot's parts too (its pods, its Deployments, lists of them): every
operator function outside `cluster.observed` that receives one. `python -m pytest tests/unit/operator/controller/test_layout.py
-s` prints it; docs/architecture.md reports it. Counted by module and by package (the layers): a stay is a run
of places in one module (package), a return a stay in a module (package) the walk had left before.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import vlm_operator
from vlm_operator.cluster.observed import Observed
from vlm_testing.fakekube import SidecarCluster
from vlm_testing.steps import STEPS, start

PACKAGE = Path(vlm_operator.__file__).resolve().parent


@functools.cache
def _module(filename: str) -> str | None:
    path = Path(filename).resolve()
    if PACKAGE not in path.parents:
        return None
    rel = path.relative_to(PACKAGE).with_suffix("")
    return ".".join(p for p in rel.parts if p != "__init__")


def walk(c: SidecarCluster, now: float) -> list[tuple[str, str]]:
    """(module, function) of every operator function that received the reconcile's Observed (the index's, or
    the one `with_roles` made of it: then marked with a "+"), in call order."""
    observed = c.kube.observed("svc")
    seen: list[tuple[str, str]] = []
    tracked: list[Observed] = [observed]

    def profile(frame, event, arg):
        if event == "return":
            if (frame.f_code.co_name == "with_roles" and isinstance(arg, Observed)
                    and any(frame.f_locals.get("self") is o for o in tracked)):
                tracked.append(arg)
            return
        if event != "call":
            return
        module = _module(frame.f_code.co_filename)
        if module is None or any(frame.f_locals.get("self") is o for o in tracked):
            return
        code = frame.f_code
        args = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        for i, o in enumerate(tracked):
            if any(frame.f_locals.get(a) is o for a in args):
                seen.append((module + ("+" if i else ""), code.co_name))
                break

    _traced(c, observed, now, profile)
    return seen


def _traced(c: SidecarCluster, observed: Observed, now: float, profile) -> None:
    """One reconcile of the service with `profile` as the profiler."""
    c.sidecars.now = now
    sys.setprofile(profile)
    try:
        from vlm_operator.controller import reconcile

        reconcile.reconcile(c.rt, c.kube.target("svc"), observed, lambda *e: c.events.append(e), now=now)
    finally:
        sys.setprofile(None)
    c.reader.wait_idle()


def collapse(places: list[tuple[str, str]]) -> list[str]:
    out: list[str] = []
    for module, _ in places:
        if not out or out[-1] != module:
            out.append(module)
    return out


def test_observed_goes_gather_decide_act_without_returning_to_a_module_it_left():
    c = SidecarCluster(STEPS, gpus=16)
    c.run(1_800_000_000.0)
    t = start(c)
    places = []
    for _ in range(10):  # until a look of the gate runs in a traced reconcile
        t += 60
        c.kube.settle("svc")
        places = walk(c, t)
        if ("analysis.handoff+", "_look") in places:
            break
    assert ("analysis.handoff+", "_look") in places, places
    # The index's snapshot: only the reconcile (the stable revision is the snapshot's own accessor).
    before = [p for p in places if not p[0].endswith("+")]
    assert before == [("controller.reconcile", "reconcile"), ("controller.reconcile", "_reconcile")], places
    assert places[: len(before)] == before  # all of it before the snapshot with roles is made
    modules = collapse([(m.removesuffix("+"), f) for m, f in places[len(before):]])
    assert len(modules) == len(set(modules)), f"the walk returns to a module it left: {modules} ({places})"
    assert modules == ["analysis.handoff", "rollout.steps", "status.build", "controller.act"], modules
    assert isinstance(c.kube.observed("svc"), Observed)


def deep_walk(c: SidecarCluster, now: float) -> list[tuple[str, str]]:
    """(module, function) of every operator function outside `cluster.observed` that received the snapshot or one
    of its parts (a pod, a Deployment, the pods or Deployments, a list or tuple of them), in call order."""
    observed = c.kube.observed("svc")
    ids: set[int] = set()
    keep: list[Observed] = []

    def track(o: Observed) -> None:
        keep.append(o)  # alive while traced, so no id is reused
        ids.update({id(o), id(o.pods), id(o.deployments), *(id(p) for p in o.pods),
                    *(id(d) for d in o.deployments.values())})

    def part(v: object) -> bool:
        return id(v) in ids or (isinstance(v, list | tuple) and bool(v) and id(v[0]) in ids)

    seen: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event == "return":
            if frame.f_code.co_name == "with_roles" and isinstance(arg, Observed):
                track(arg)
            return
        if event != "call":
            return
        module = _module(frame.f_code.co_filename)
        if module is None or module == "cluster.observed":
            return
        code = frame.f_code
        if any(part(frame.f_locals.get(a)) for a in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]):
            seen.append((module, code.co_name))

    track(observed)
    _traced(c, observed, now, profile)
    return seen


def stays_and_returns(units: list[str]) -> tuple[list[str], int]:
    stays = collapse([(u, "") for u in units])
    return stays, sum(1 for i, u in enumerate(stays) if u in stays[:i])


def test_the_snapshot_and_its_parts_walk_the_layers_with_few_returns():
    """A canary step's look, traced deep. The bounds are a ratchet: the walk measured when they were set may
    shrink, never grow. By package (the layers) it goes gather -> decide -> write with one return, to the
    controller that started it (the walk before the plan returned replicas and act returned its writes: 9 stays,
    3 returns); by module the rollout's steps call placement and carry on (the one return), and the writer hands
    the round's writes to the client in one call (they alternated per object before: 14 stays, 5 returns)."""
    c = SidecarCluster(STEPS, gpus=16)
    c.run(1_800_000_000.0)
    t = start(c)
    places: list[tuple[str, str]] = []
    for _ in range(10):
        t += 60
        c.kube.settle("svc")
        places = deep_walk(c, t)
        if ("analysis.handoff", "_look") in places:
            break
    assert ("analysis.handoff", "_look") in places, places
    by_module, module_returns = stays_and_returns([m for m, _ in places])
    by_package, package_returns = stays_and_returns([m.split(".")[0] for m, _ in places])
    print(f"\nby module: {len(by_module)} stays in {len(set(by_module))} modules, {module_returns} returns: "
          f"{' -> '.join(by_module)}\nby package: {len(by_package)} stays in {len(set(by_package))} packages, "
          f"{package_returns} returns: {' -> '.join(by_package)}")
    assert by_package[:2] == ["controller", "analysis"], by_package  # gather first
    assert len(by_package) <= 7 and package_returns <= 1, by_package
    assert by_package[-2:] == ["controller", "cluster"], by_package  # all writes decided, then written in one call
    assert len(by_module) <= 10 and module_returns <= 1, by_module
    assert by_module[-2:] == ["cluster.writer", "cluster.client"], by_module  # one hand-over, not one per object
