"""The SGLang version table: version parsing, image tags, and the IPC-cache plan per row and mode.

The expectations here are written out by hand from the released wheels
(tests/compat/test_sglang_wheels.py re-reads the wheels); the golden file
pins the exact messages. Regenerate it with
UPDATE_GOLDEN=1 pytest tests/unit/operator/desired/test_sglang.py.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from vlm_operator.api.errors import InvalidSpec
from vlm_operator.desired import sglang
from vlm_operator.desired.sglang import (
    ENV_CACHE,
    ENV_POOL_MB,
    ENV_TRANSPORT,
    FLAG_TRANSPORT,
    IPCPlan,
    check_user_overrides,
    parse_version,
    plan_ipc_cache,
    resolve_version,
    version_from_image,
)

GOLDEN = Path(__file__).resolve().parents[3] / "golden" / "sglang" / "ipc_plans.yaml"
FLAG = (FLAG_TRANSPORT, "cuda_ipc")
ENV_ERA = {ENV_TRANSPORT: "1", ENV_CACHE: "1"}  # 0.5.10 - 0.5.15
FLAG_ERA = {ENV_CACHE: "1"}  # 0.5.16 and later, with FLAG

# ---------------------------------------------------------------- parse_version


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.5.10", (0, 5, 10, 0, 0)),
        ("v0.5.10", (0, 5, 10, 0, 0)),
        (" 0.5.9 ", (0, 5, 9, 0, 0)),
        ("0.5.10.post1", (0, 5, 10, 1, 1)),
        ("0.5.6.post2", (0, 5, 6, 1, 2)),
        ("0.5.10post1", (0, 5, 10, 1, 1)),
        ("0.5.10rc0", (0, 5, 10, -1, 0)),
        ("0.5.10rc1", (0, 5, 10, -1, 1)),
        ("0.5.10b2", (0, 5, 10, -2, 2)),
        ("0.5.10a1", (0, 5, 10, -3, 1)),
        ("0.5.10.dev3", (0, 5, 10, -4, 3)),
        ("0.5.10+cu130", (0, 5, 10, 0, 0)),
        ("1.0.0", (1, 0, 0, 0, 0)),
        ("0.5", None),
        ("0.5.x", None),
        ("latest", None),
        ("", None),
        ("0.5.10-cu130", None),  # a tag, not a version: version_from_image handles tags
        ("0.5.10.post", (0, 5, 10, 1, 0)),
        ("v0.5.10.post1.extra", None),
    ],
)
def test_parse_version(text, expected):
    assert parse_version(text) == expected


def test_parse_version_orders_like_pep440():
    texts = [
        "0.4.10.post2",
        "0.5.9",
        "0.5.10a1",
        "0.5.10rc0",
        "0.5.10rc1",
        "0.5.10",
        "0.5.10.post1",
        "0.5.11",
    ]
    parsed = [parse_version(t) for t in texts]
    assert parsed == sorted(parsed)
    assert len(set(parsed)) == len(parsed)


def test_parse_version_rejects_non_strings():
    assert parse_version(None) is None  # type: ignore[arg-type]
    assert parse_version(5) is None  # type: ignore[arg-type]


# ---------------------------------------------------------------- version_from_image


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("lmsysorg/sglang:v0.5.10.post1-cu130", "0.5.10.post1"),
        ("lmsysorg/sglang:v0.5.10", "0.5.10"),
        ("lmsysorg/sglang:0.5.17", "0.5.17"),
        ("lmsysorg/sglang:v0.5.9-runtime", "0.5.9"),
        ("lmsysorg/sglang:v0.5.23-cu130-runtime", "0.5.23"),
        ("lmsysorg/sglang:v0.5.10rc0-cu126", "0.5.10rc0"),
        ("docker.io/lmsysorg/sglang:v0.5.16", "0.5.16"),
        ("registry.local:5000/lmsysorg/sglang:v0.5.15-cu129", "0.5.15"),
        ("registry.local:5000/team/sglang-vl:v0.5.18", "0.5.18"),
        ("lmsysorg/sglang:v0.5.10@sha256:" + "a" * 64, "0.5.10"),
        ("lmsysorg/sglang@sha256:" + "a" * 64, None),
        ("registry.local:5000/lmsysorg/sglang", None),
        ("registry.local:5000/lmsysorg/sglang@sha256:" + "b" * 64, None),
        ("lmsysorg/sglang", None),
        ("lmsysorg/sglang:latest", None),
        ("lmsysorg/sglang:dev", None),
        ("lmsysorg/sglang:nightly-dev-20260101-1a2b3c4d", None),
        ("lmsysorg/sglang:v0.5", None),
        ("lmsysorg/sglang:cu130-v0.5.10", None),
        ("lmsysorg/sglang:v0.5.10-", None),
        ("", None),
        (":::", None),
    ],
)
def test_version_from_image(image, expected):
    assert version_from_image(image) == expected


def test_every_tag_version_parses():
    for tag in ("v0.5.10.post1-cu130", "v0.5.10rc0-cu126", "v0.5.10.dev2-runtime"):
        version = version_from_image(f"lmsysorg/sglang:{tag}")
        assert version is not None and parse_version(version) is not None


@pytest.mark.parametrize(
    ("spec_version", "image", "expected"),
    [
        ("0.5.17", "lmsysorg/sglang:v0.5.10", "0.5.17"),  # the spec wins
        (None, "lmsysorg/sglang:v0.5.10", "0.5.10"),
        ("  ", "lmsysorg/sglang:v0.5.10", "0.5.10"),
        (None, "lmsysorg/sglang:latest", None),
        ("garbage", "lmsysorg/sglang:v0.5.10", "garbage"),  # the plan reports it as unknown
    ],
)
def test_resolve_version(spec_version, image, expected):
    assert resolve_version(spec_version, image) == expected


# ---------------------------------------------------------------- the table itself


def test_table_rows_are_contiguous_and_ordered():
    rows = sglang.TABLE
    assert rows[0].first == (0, 0, 0)
    for prev, row in itertools.pairwise(rows):
        assert row.first > prev.last
        assert row.first == (prev.last[0], prev.last[1], prev.last[2] + 1)
        assert row.first <= row.last
    assert sglang.LAST_CHECKED == rows[-1].last == (0, 5, 23)


@pytest.mark.parametrize(
    ("version", "first"),
    [
        ("0.4.10.post2", (0, 0, 0)),
        ("0.5.9", (0, 0, 0)),
        ("0.5.10rc0", (0, 0, 0)),
        ("0.5.10", (0, 5, 10)),
        ("0.5.10.post1", (0, 5, 10)),
        ("0.5.11", (0, 5, 11)),
        ("0.5.13.post1", (0, 5, 11)),
        ("0.5.15.post1", (0, 5, 11)),
        ("0.5.16", (0, 5, 16)),
        ("0.5.17", (0, 5, 17)),
        ("0.5.18", (0, 5, 18)),
        ("0.5.23", (0, 5, 18)),
        ("0.6.0", (0, 5, 18)),
    ],
)
def test_row_for(version, first):
    assert sglang.row_for(parse_version(version)).first == first


# ---------------------------------------------------------------- the plan, row by row

# version -> (env, args) that Auto and On give with tp=1 and no featureCacheMB.
ENABLED = {
    "0.5.10": (ENV_ERA, ()),
    "0.5.10.post1": (ENV_ERA, ()),
    "0.5.11": (ENV_ERA, ()),
    "0.5.12.post1": (ENV_ERA, ()),
    "0.5.15": (ENV_ERA, ()),
    "0.5.15.post1": (ENV_ERA, ()),
    "0.5.16": (FLAG_ERA, FLAG),
    "0.5.17": (FLAG_ERA, FLAG),  # the defaults already say so; explicit on purpose
    "0.5.18": (FLAG_ERA, FLAG),
    "0.5.20": (FLAG_ERA, FLAG),
    "0.5.23": (FLAG_ERA, FLAG),
    "0.5.23.post1": (FLAG_ERA, FLAG),
}
TOO_OLD = ["0.4.10.post2", "0.5.8.post1", "0.5.9", "0.5.10rc1"]
NEWER = ["0.5.24", "0.6.0", "1.0.0rc1"]
UNKNOWN = [None, "", "latest", "garbage", "0.5", "v0.5.x"]
TPS = [1, 2, 8]


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("mode", ["Auto", "On"])
@pytest.mark.parametrize("version", sorted(ENABLED))
def test_enabled_rows(version, mode, tp):
    env, args = ENABLED[version]
    plan = plan_ipc_cache(version, mode, tp)
    assert (plan.env, plan.args, plan.active, plan.reason) == (env, args, True, "Enabled")
    assert version in plan.message
    extra_context = version.startswith("0.5.10") and tp > 1
    assert bool(plan.warnings) == extra_context
    if extra_context:
        (warning,) = plan.warnings
        assert f"{tp - 1} extra CUDA context" in warning and f"~{(tp - 1) * 500} MiB" in warning


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("version", sorted(ENABLED) + NEWER)
def test_off_pins_the_cache_off(version, tp):
    plan = plan_ipc_cache(version, "Off", tp)
    assert plan.env == {ENV_CACHE: "0"}
    assert plan.args == ()
    assert (plan.active, plan.reason) == (False, "DisabledBySpec")


def test_off_on_0_5_17_says_the_transport_stays_ipc():
    # 0.5.17 auto-picks cuda_ipc when the transport is unset, so Off means "IPC without the cache".
    assert "cuda_ipc" in plan_ipc_cache("0.5.17", "Off", 1).message
    assert "cuda_ipc" not in plan_ipc_cache("0.5.18", "Off", 1).message


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("version", TOO_OLD)
def test_too_old(version, tp):
    auto = plan_ipc_cache(version, "Auto", tp)
    assert (auto.env, auto.args, auto.active, auto.reason) == ({}, (), False, "SGLangTooOld")
    assert version in auto.message and "0.5.10" in auto.message
    off = plan_ipc_cache(version, "Off", tp)
    assert (off.env, off.args, off.active, off.reason) == ({}, (), False, "DisabledBySpec")
    with pytest.raises(InvalidSpec) as err:
        plan_ipc_cache(version, "On", tp)
    assert err.value.field == "spec.sglang.ipcCache.mode"
    assert err.value.reason == "InvalidSpec"
    assert version in err.value.message


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("version", UNKNOWN)
def test_unknown_version(version, tp):
    auto = plan_ipc_cache(version, "Auto", tp)
    # Nothing at all: any flag could be one an older SGLang refuses at start.
    assert (auto.env, auto.args, auto.active, auto.reason) == ({}, (), False, "VersionUnknown")
    off = plan_ipc_cache(version, "Off", tp)
    # An env var no release refuses: older ones never read it, newer ones default it on.
    assert (off.env, off.args, off.active, off.reason) == ({ENV_CACHE: "0"}, (), False, "DisabledBySpec")
    with pytest.raises(InvalidSpec) as err:
        plan_ipc_cache(version, "On", tp)
    assert err.value.field == "spec.sglang.version"


@pytest.mark.parametrize("version", NEWER)
@pytest.mark.parametrize("mode", ["Auto", "On"])
def test_newer_than_table_assumes_last_row(version, mode):
    plan = plan_ipc_cache(version, mode, 2)
    last = plan_ipc_cache("0.5.23", mode, 2)
    assert (plan.env, plan.args, plan.active, plan.reason) == (last.env, last.args, True, "Enabled")
    assert "0.5.23" in plan.message and "assumed" in plan.message
    assert any("newer than 0.5.23" in w for w in plan.warnings)


def test_checked_versions_carry_no_assumption():
    for version in ENABLED:
        assert "assumed" not in plan_ipc_cache(version, "Auto", 1).message


# ---------------------------------------------------------------- featureCacheMB


@pytest.mark.parametrize("version", ["0.5.10", "0.5.15", "0.5.17", "0.5.23", "0.6.0"])
@pytest.mark.parametrize("mode", ["Auto", "On", "Off"])
def test_feature_cache_mb_sets_the_pool(version, mode):
    plan = plan_ipc_cache(version, mode, 1, feature_cache_mb=2048)
    assert plan.env[ENV_POOL_MB] == "2048"
    without = plan_ipc_cache(version, mode, 1)
    assert {k: v for k, v in plan.env.items() if k != ENV_POOL_MB} == without.env
    if plan.active:
        assert "2048 MiB" in plan.message


@pytest.mark.parametrize(
    ("version", "default_mb"), [("0.5.10", 4096), ("0.5.10.post1", 4096), ("0.5.11", 1024)]
)
def test_pool_default_in_message(version, default_mb):
    plan = plan_ipc_cache(version, "Auto", 1)
    assert ENV_POOL_MB not in plan.env
    assert f"{default_mb} MiB (SGLang default)" in plan.message


@pytest.mark.parametrize("version", [None, "garbage", "0.5.9"])
@pytest.mark.parametrize("mode", ["Auto", "Off"])
def test_feature_cache_mb_not_applied_without_the_cache(version, mode):
    plan = plan_ipc_cache(version, mode, 1, feature_cache_mb=2048)
    assert ENV_POOL_MB not in plan.env
    assert any("featureCacheMB=2048 not applied" in w for w in plan.warnings)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mode": "on"}, "spec.sglang.ipcCache.mode"),
        ({"mode": "Enabled"}, "spec.sglang.ipcCache.mode"),
        ({"tensor_parallel": 0}, "spec.sglang.tensorParallel"),
        ({"tensor_parallel": -2}, "spec.sglang.tensorParallel"),
        ({"feature_cache_mb": 0}, "spec.sglang.ipcCache.featureCacheMB"),
        ({"feature_cache_mb": -1}, "spec.sglang.ipcCache.featureCacheMB"),
    ],
)
def test_bad_input_is_invalid_spec(kwargs, field):
    args = {"version": "0.5.17", "mode": "Auto", "tensor_parallel": 1} | kwargs
    with pytest.raises(InvalidSpec) as err:
        plan_ipc_cache(**args)
    assert err.value.field == field


# ---------------------------------------------------------------- properties over any version

versions = st.tuples(
    st.integers(0, 2),
    st.integers(0, 30),
    st.integers(0, 40),
    st.sampled_from(["", "rc1", ".post1", ".post2"]),
).map(lambda t: f"{t[0]}.{t[1]}.{t[2]}{t[3]}")


@given(version=versions, tp=st.integers(1, 16), pool=st.none() | st.integers(1, 65536))
def test_plan_invariants(version, tp, pool):
    auto = plan_ipc_cache(version, "Auto", tp, pool)
    off = plan_ipc_cache(version, "Off", tp, pool)
    # Every env value is one SGLang's EnvBool/EnvInt accepts.
    for plan in (auto, off):
        assert all(v in ("0", "1") or v.isdigit() for v in plan.env.values())
        assert isinstance(plan, IPCPlan) and plan.reason and plan.message
    # Off never switches anything on.
    assert not off.active and off.args == ()
    assert "1" not in {v for k, v in off.env.items() if k != ENV_POOL_MB}
    # On is Auto, or a refusal where Auto would do nothing.
    if auto.active:
        assert plan_ipc_cache(version, "On", tp, pool) == auto
        assert auto.env[ENV_CACHE] == "1"
        assert (ENV_TRANSPORT in auto.env) != (auto.args == FLAG)
    else:
        assert (auto.env, auto.args) == ({}, ())
        with pytest.raises(InvalidSpec):
            plan_ipc_cache(version, "On", tp, pool)


def test_plan_is_deterministic_and_frozen():
    a = plan_ipc_cache("0.5.10", "Auto", 2, 1024)
    assert a == plan_ipc_cache("0.5.10", "Auto", 2, 1024)
    with pytest.raises(AttributeError):
        a.active = False  # type: ignore[misc]


# ---------------------------------------------------------------- user overrides


def test_user_overrides_that_agree_pass():
    plan = plan_ipc_cache("0.5.17", "Auto", 1, 2048)
    check_user_overrides(
        plan, ["--mm-feature-transport", "cuda_ipc"], {ENV_CACHE: "true", ENV_POOL_MB: "2048"}
    )
    check_user_overrides(plan, ["--mm-feature-transport=cuda_ipc", "--mem-fraction-static", "0.8"], {})


@pytest.mark.parametrize(
    ("version", "mode", "args", "env", "field"),
    [
        ("0.5.17", "Auto", ["--mm-feature-transport", "cpu"], {}, "spec.sglang.args"),
        ("0.5.23", "On", ["--mm-feature-transport=cuda_vmm"], {}, "spec.sglang.args"),
        ("0.5.17", "Auto", [], {ENV_CACHE: "0"}, "spec.sglang.env"),
        ("0.5.10", "Auto", [], {ENV_TRANSPORT: "false"}, "spec.sglang.env"),
        ("0.5.17", "Off", [], {ENV_CACHE: "1"}, "spec.sglang.env"),
        ("0.5.17", "Off", [], {ENV_CACHE: "maybe"}, "spec.sglang.env"),
        (None, "Off", [], {ENV_CACHE: "yes"}, "spec.sglang.env"),
    ],
)
def test_user_overrides_that_contradict_are_refused(version, mode, args, env, field):
    plan = plan_ipc_cache(version, mode, 1)
    with pytest.raises(InvalidSpec) as err:
        check_user_overrides(plan, args, env)
    assert err.value.field == field


def test_user_pool_size_contradicting_feature_cache_mb_is_refused():
    plan = plan_ipc_cache("0.5.17", "Auto", 1, 2048)
    with pytest.raises(InvalidSpec):
        check_user_overrides(plan, [], {ENV_POOL_MB: "4096"})


def test_user_transport_when_cache_not_planned_is_left_alone():
    # Off or an unknown version: the operator has no opinion about the transport.
    check_user_overrides(plan_ipc_cache("0.5.18", "Off", 1), ["--mm-feature-transport", "cpu"], {})
    check_user_overrides(plan_ipc_cache(None, "Auto", 1), ["--mm-feature-transport", "cuda_ipc"], {})


# ---------------------------------------------------------------- golden file


GOLDEN_VERSIONS = [
    None, "garbage", "0.5.9", "0.5.10rc0", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.15",
    "0.5.16", "0.5.17", "0.5.18", "0.5.23", "0.6.0",
]  # fmt: skip


def _golden_plans() -> dict:
    out: dict = {}
    for version in GOLDEN_VERSIONS:
        for mode in ("Auto", "On", "Off"):
            for tp, pool in ((1, None), (2, None), (8, None), (2, 2048)):
                key = f"{version}/{mode}/tp{tp}" + (f"/pool{pool}" if pool else "")
                try:
                    plan = plan_ipc_cache(version, mode, tp, pool)
                except InvalidSpec as err:
                    out[key] = {"error": {"reason": err.reason, "field": err.field, "message": err.message}}
                    continue
                out[key] = {
                    "active": plan.active,
                    "reason": plan.reason,
                    "env": dict(sorted(plan.env.items())),
                    "args": list(plan.args),
                    "message": plan.message,
                    "warnings": list(plan.warnings),
                }
    return out


def test_golden():
    """Regenerate with UPDATE_GOLDEN=1 pytest tests/unit/operator/desired/test_sglang.py."""
    text = yaml.safe_dump(_golden_plans(), sort_keys=False, width=120)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert GOLDEN.read_text() == text


# ---------------------------------------------------------------- liveness


@pytest.mark.parametrize("version", ["0.5.9", "0.5.10", "0.5.10.post1", "0.5.16", "0.5.23", "0.6.0"])
def test_liveness_switches_health_generation_off_where_the_release_has_it(version):
    plan = sglang.plan_liveness(version, {})
    assert plan.probe == "http" and plan.env == {sglang.ENV_HEALTH_GENERATION: "0"}


@pytest.mark.parametrize("version", [None, "", "latest", "0.4.10.post2", "0.5.8", "0.5.9rc0"])
def test_liveness_is_a_tcp_check_where_the_switch_is_not_known(version):
    plan = sglang.plan_liveness(version, {})
    assert plan.probe == "tcp" and plan.env == {}


@pytest.mark.parametrize(("value", "probe"), [("0", "http"), ("false", "http"), ("no", "http"), ("1", "tcp"),
                                              ("true", "tcp"), ("bogus", "tcp"), (None, "tcp")])
def test_the_specs_own_setting_decides_the_check(value, probe):
    plan = sglang.plan_liveness("0.5.23", {sglang.ENV_HEALTH_GENERATION: value, "OTHER": "1"})
    assert plan.probe == probe and plan.env == {}  # the spec's variable is never overridden


def test_liveness_env_is_an_env_bool_every_release_reads_as_false():
    # "0" (not "false"): SGLang's EnvBool accepts it in every release, as for the IPC cache's variables.
    assert sglang.plan_liveness("0.5.23", {}).env[sglang.ENV_HEALTH_GENERATION] == "0"
    assert sglang.TABLE[1].first >= sglang.HEALTH_ENV_FIRST  # every release with the IPC cache has it
