"""Attribution: which stage and which function grew most on the canary (what a rollback names).

Inclusive function times nest, so the deepest of the near-largest growths is named; loop-wide frames
(`vlm_operator.window.loop_wide`) are never candidates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..window import loop_wide
from .policy import NOT_A_REGRESSION_STAGE
from .samples import Fns, Unit


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


def regressed_function(b: Sequence[Unit], c: Sequence[Unit]) -> str | None:
    """The scheduler function whose time per iteration grew most on the canary, preferring the deepest of
    near-ties; loop-wide frames are not candidates. A function the baseline's sidecars (mostly) did not
    export is compared through the bound they state for what they left out: its self-time growth is at
    least its canary self time minus that bound. Without the bound it is unknown there and not a
    candidate; so is a function only the baseline exported (it can only have shrunk or stayed)."""
    return _most_grown([u.fns for u in b], [u.fns for u in c])


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
