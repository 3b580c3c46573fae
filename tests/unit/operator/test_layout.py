"""The reconcile's shape, measured: the cluster snapshot (`Observed`) goes gather -> decide -> act in one pass.

A reconcile that analyses a canary step (fake Kube, fake sidecars, the real gate) is traced with
sys.setprofile; every operator function that receives the reconcile's `Observed` as an argument is a place it
visits (its own methods excepted). The walk, collapsed by module, must visit each module once, in the order
gather (analysis) -> decide (rollout, status) -> act (act): a module it left is never entered again.
Measured with this walk: at 74f816c, 13 places in 3 modules, reconcile -> rollout -> reconcile -> rollout ->
reconcile -> status (3 returns to a module it had left: the reconcile read signals between the rollout's two
calls and applied the plan before reading the profiler); now 12 places in 5 modules, reconcile -> analysis ->
rollout -> status -> act.
Since revision Deployments (issue 32) the reconcile first settles which revision is stable
(`rollout.stable_revision`, from status or by adoption) and reads the snapshot again with each pod's role as
status says (`Observed.with_roles`, a new Observed): the walk follows that one too. The index's snapshot goes
only to the reconcile and `stable_revision`; the one with roles goes analysis -> rollout -> status -> act.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import vlm_operator
from vlm_operator.observed import Observed
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

    c.sidecars.now = now
    sys.setprofile(profile)
    try:
        from vlm_operator import reconcile

        reconcile.reconcile(c.rt, c.kube.target("svc"), observed, lambda *e: c.events.append(e), now=now)
    finally:
        sys.setprofile(None)
    c.reader.wait_idle()
    return seen


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
        if ("analysis", "_look") in places:
            break
    assert ("analysis+", "_look") in places, places
    # The index's snapshot: only the reconcile, and the stable revision it settles before anything else.
    before = [p for p in places if not p[0].endswith("+")]
    assert before == [("reconcile", "reconcile"), ("reconcile", "_reconcile"), ("rollout", "stable_revision")], places
    assert places[: len(before)] == before  # all of it before the snapshot with roles is made
    modules = collapse([(m.removesuffix("+"), f) for m, f in places[len(before):]])
    assert len(modules) == len(set(modules)), f"the walk returns to a module it left: {modules} ({places})"
    assert modules == ["analysis", "rollout", "status", "act"], modules
    assert isinstance(c.kube.observed("svc"), Observed)
