"""Attribution: which stage and which function grew most on the canary (what a rollback names).

Inclusive function times nest, so the deepest of the near-largest growths is named; loop-wide frames
(`vlm_operator.analysis.window.loop_wide`) are never candidates. A function with several callers is named with the one
whose calls into it carry most of its growth, from the sidecar's call-edge shares ("hash_feature -> helper").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vlm_operator.analysis.gate.policy import NOT_A_REGRESSION_STAGE
from vlm_operator.analysis.gate.samples import Fns, Unit
from vlm_operator.analysis.window import EDGE_SEP, loop_wide


def _growth(
    b: Sequence[Mapping[str, float]], c: Sequence[Mapping[str, float]], *, min_units: int = 1
) -> dict[str, tuple[float, float]]:
    """name -> (canary - baseline mean, canary mean) for names present in at least `min_units` maps
    on each side (a name a side did not export is unknown there, never 0)."""
    mb, mc = _present_lists(b), _present_lists(c)
    out = {}
    for k in set(mb) & set(mc):
        if len(mb[k]) < min_units or len(mc[k]) < min_units:
            continue
        cb, cc = sum(mb[k]) / len(mb[k]), sum(mc[k]) / len(mc[k])
        out[k] = (cc - cb, cc)
    return out


def _present_lists(maps: Sequence[Mapping[str, float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for m in maps:
        for k, v in m.items():
            out.setdefault(k, []).append(v)
    return out


# Inclusive function times nest: every caller of a function that grew grows at least as much. Among
# the functions whose growth is within this fraction of the largest, the smallest (the deepest frame)
# is the one to name: "reconstruct_on_target_device", not its caller "process_input_requests".
_NEAR_MAX_GROWTH = 0.8


def _grown_unexported_on_baseline(b: Sequence[Fns], c: Sequence[Fns], need: int) -> dict[str, tuple[float, float]]:
    """Functions the canary's sidecars exported in at least `need` units and the baseline's in fewer (below
    the baseline's top-N cut in most windows): name -> (a lower bound of their growth, canary mean time).
    In a baseline unit that did not export one, its self time was at most the unit's stated bound for what
    it left out (`unexported_self_share_max`), so the baseline mean is at most the mean of the values it has
    and the bounds where it has none, and the self time grew by at least the canary mean minus that.
    Nothing for a function when a baseline unit that left it out states no bound."""
    on_b = _present_lists([v.incl for v in b])
    selfs = _present_lists([v.self_ for v in c])
    incl = _present_lists([v.incl for v in c])
    out = {}
    for k, v in selfs.items():
        if len(v) < need or k not in incl or len(on_b.get(k, ())) >= need:
            continue
        upper = [u.self_.get(k, u.cut) for u in b]
        if not upper or None in upper:
            continue
        out[k] = (sum(v) / len(v) - sum(upper) / len(upper), sum(incl[k]) / len(incl[k]))  # type: ignore[arg-type]
    return out


def _most_grown(b: Sequence[Fns], c: Sequence[Fns]) -> str | None:
    """The function whose time grew most on the canary, preferring the deepest of near-ties; frames around
    (nearly) all of the time on both sides are not candidates (see regressed_function)."""
    if not (b and c):
        return None
    wide = loop_wide([v.shares for v in b]) & loop_wide([v.shares for v in c])
    need = max(1, min(len(b), len(c)) // 2)
    both = _growth([v.incl for v in b], [v.incl for v in c], min_units=need)
    grown = {
        k: v
        for k, v in {**_grown_unexported_on_baseline(b, c, need), **both}.items()
        if v[0] > 0 and k not in wide
    }
    if not grown:
        return None
    top = max(g for g, _ in grown.values())
    near = [(t, -g, k) for k, (g, t) in grown.items() if g >= _NEAR_MAX_GROWTH * top]
    return min(near)[2]


# How a caller is joined to the function it grew in a name ("hash_feature -> helper").
CALLER_ARROW = " -> "
# The growth of one caller's calls must carry at least this much of the function's growth for the caller to
# be named: more than half, so neither of two callers that share the growth evenly is, with a margin for the
# noise of sampled shares.
_CALLER_SHARE_OF_GROWTH = 2 / 3


def _calls_into(u: Unit, fn: str) -> dict[str, float] | None:
    """caller -> seconds per iteration of the unit's exported calls into `fn`; None when they are unknown (the
    unit did not export `fn`, or its sidecar exports no call edges)."""
    if fn not in u.function_seconds or not u.edge_seconds:
        return None
    out = {}
    for k, v in u.edge_seconds.items():
        caller, _, callee = k.partition(EDGE_SEP)
        if callee == fn:
            out[caller] = v
    return out


def _edge_growth(b: Sequence[Unit], c: Sequence[Unit], caller: str, callee: str) -> float | None:
    """At least how much the time of `caller`'s calls into `callee` grew (seconds per iteration); None: unknown.

    The sidecar exports the few largest callers of each function: a caller a unit left out had at most the
    smallest share it exported into `callee` (0 with none), so the canary's time (0 where left out) minus the
    baseline's (that bound where left out) is a lower bound. Units that did not export `callee` or no edges say
    nothing; as for the functions, at least half of each side's units must."""
    need = max(1, min(len(b), len(c)) // 2)
    eb = [e for u in b if (e := _calls_into(u, callee)) is not None]
    ec = [e for u in c if (e := _calls_into(u, callee)) is not None]
    if len(eb) < need or len(ec) < need:
        return None
    base = [e.get(caller, min(e.values(), default=0.0)) for e in eb]
    return sum(e.get(caller, 0.0) for e in ec) / len(ec) - sum(base) / len(base)


def _fn_growth(b: Sequence[Unit], c: Sequence[Unit], fn: str) -> float:
    return _growth([u.function_seconds for u in b], [u.function_seconds for u in c]).get(fn, (0.0, 0.0))[0]


def _neighbours(units: Sequence[Unit], fn: str) -> tuple[set[str], set[str]]:
    """(callers, callees) of `fn` in the units' exported call edges."""
    callers, callees = set(), set()
    for u in units:
        for k in u.edge_seconds:
            caller, _, callee = k.partition(EDGE_SEP)
            if callee == fn:
                callers.add(caller)
            elif caller == fn:
                callees.add(callee)
    return callers, callees


def _deepest_callee(b: Sequence[Unit], c: Sequence[Unit], fn: str) -> str:
    """Follow the calls that carry (nearly) all of a function's growth down to the function they went to. The
    deepest of near-ties is otherwise the one with the least time, which misses a helper shared with other
    callers (more time than the one caller whose calls of it grew: `hash_feature`, not its `helper`)."""
    seen = {fn} | (loop_wide([u.function_shares for u in b]) & loop_wide([u.function_shares for u in c]))
    while (grown := _fn_growth(b, c, fn)) > 0:
        steps = [(g, y) for y in sorted(_neighbours([*b, *c], fn)[1] - seen)
                 if (g := _edge_growth(b, c, fn, y)) is not None and g >= _NEAR_MAX_GROWTH * grown]
        if not steps:
            break
        fn = max(steps)[1]
        seen.add(fn)
    return fn


def grown_caller(b: Sequence[Unit], c: Sequence[Unit], fn: str) -> str | None:
    """The caller of `fn` whose calls into it grew by at least _CALLER_SHARE_OF_GROWTH of `fn`'s own growth
    (inclusive, seconds per iteration), where the call edges show more than one caller; None otherwise (one
    caller: nothing to tell apart)."""
    callers = _neighbours([*b, *c], fn)[0]
    grown = _fn_growth(b, c, fn)
    if len(callers) < 2 or grown <= 0:
        return None
    growth = {k: g for k in sorted(callers) if (g := _edge_growth(b, c, k, fn)) is not None}
    best = max(growth, key=lambda k: growth[k], default=None)
    return best if best is not None and growth[best] >= _CALLER_SHARE_OF_GROWTH * grown else None


def regressed_function(b: Sequence[Unit], c: Sequence[Unit]) -> str | None:
    """The scheduler function whose time per iteration grew most on the canary, preferring the deepest of
    near-ties; loop-wide frames are not candidates. A function the baseline's sidecars (mostly) did not
    export is compared through the bound they state for what they left out: its self-time growth is at
    least its canary self time minus that bound. Without the bound it is unknown there and not a
    candidate; so is a function only the baseline exported (it can only have shrunk or stayed).

    Where the sidecars export call edges, a function whose growth went (nearly) all into one callee is
    followed down to it, and a function with several callers is named with the one whose calls into it carry
    most of its growth: `caller -> function` (a shared helper, a copy or a lock, grows because one of its
    callers calls it more)."""
    fn = _most_grown([u.fns for u in b], [u.fns for u in c])
    if fn is None:
        return None
    fn = _deepest_callee(b, c, fn)
    caller = grown_caller(b, c, fn)
    return f"{caller}{CALLER_ARROW}{fn}" if caller else fn


def regressed_role_function(b: Sequence[Unit], c: Sequence[Unit], role: str) -> str | None:
    """The same for one front-end role: the function whose share of the role's time grew most (the role's
    own frames around all of its time, `_process_worker` or the event loop's `run`, are not candidates)."""
    return _most_grown([f for u in b if (f := u.role_fns(role))], [f for u in c if (f := u.role_fns(role))])


def regressed_stage(b: Sequence[Unit], c: Sequence[Unit]) -> str | None:
    """The stage (idle excluded) whose time per iteration grew most on the canary."""
    grown = {
        k: v
        for k, v in _growth([u.stage_seconds for u in b], [u.stage_seconds for u in c]).items()
        if k != NOT_A_REGRESSION_STAGE and v[0] > 0
    }
    if not grown:
        return None
    return max(grown.items(), key=lambda kv: (kv[1][0], kv[0]))[0]
