"""The names the operator and the sidecar share agree: each package defines them once (vlm_operator.api.names,
vlm_sidecar.names; the two packages are independent, so neither imports the other's), and this is where
they are held together.

Shared: the scheduler stages (same order), the front-end roles, the sidecar's port, the environment the
pod builder gives the sidecar (with the labels it reads through the downward API), the /windows.json
entry (every key the operator's parser reads is one the sidecar writes, and a real entry fills every field
of the operator's Window), the JSON log line. Also within the operator: the API's Literal types are built
from vlm_operator.api.names, and names.py imports nothing.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import get_args

import pytest

from vlm_operator.analysis.window import Window
from vlm_operator.api import metrics
from vlm_operator.api import names as op
from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.settings import Settings
from vlm_operator.cli import kubectl_vlm
from vlm_operator.desired import builders
from vlm_sidecar import config, model
from vlm_sidecar import names as sc
from vlm_sidecar.collector import ProfileStore
from vlm_sidecar.model import WindowSummary
from vlm_sidecar.roles import RoleSummary, frontend_window
from vlm_sidecar.server import SidecarHTTP

OWNER = builders.Owner("qwen", "ml", "00000000-0000-0000-0000-000000000001")
# Read by the operator's parser but written by no sidecar: request signals may sit under an `sglang`
# object instead of at the entry's top level (Window.from_sidecar reads both).
READ_NOT_WRITTEN = {"sglang"}


def _imports(module) -> list[str]:
    tree = ast.parse(Path(inspect.getsourcefile(module)).read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append("." * node.level + (node.module or ""))
    return out


@pytest.mark.parametrize("module", [op, sc], ids=["vlm_operator.api.names", "vlm_sidecar.names"])
def test_names_modules_import_nothing(module):
    """Any module may import them (the kubectl plugin, which runs with the kubernetes client alone, too)."""
    assert set(_imports(module)) <= {"__future__", "typing"}, _imports(module)


def test_scheduler_stages_agree():
    assert op.STAGES == sc.STAGES == model.STAGES
    assert op.LOOP_STAGES == sc.LOOP_STAGES == model.LOOP_STAGES
    assert (*op.LOOP_STAGES, "idle", "other") == op.STAGES


def test_frontend_roles_agree():
    assert op.FRONTEND_ROLES == sc.FRONTEND_ROLES == config.FRONTEND_ROLES == model.FRONTEND_ROLES
    assert ("scheduler", *op.FRONTEND_ROLES) == sc.ROLES
    # The API's enum (spec.telemetry.frontendRoles) is built from them.
    assert get_args(api.FrontendRole) == op.FRONTEND_ROLES
    items = api.TelemetrySpec.model_json_schema(by_alias=True)["properties"]["frontendRoles"]["items"]
    assert items["enum"] == list(op.FRONTEND_ROLES)


def test_rollout_phases_are_the_apis():
    assert get_args(api.RolloutPhase) == op.PHASES
    assert api.RolloutStatus.model_json_schema(by_alias=True)["properties"]["phase"]["enum"] == list(op.PHASES)
    assert set(op.ACTIVE_PHASES) | {op.UPDATING} | set(op.ENDED_PHASES) == set(op.PHASES)
    assert op.UPDATING not in op.ACTIVE_PHASES  # no canary: the plugin's promote/abort/pause do not apply
    assert not set(op.ACTIVE_PHASES) & set(op.ENDED_PHASES) and set(op.HELD_PHASES) < set(op.ENDED_PHASES)
    assert metrics.PHASES == op.PHASES
    assert (kubectl_vlm.ACTIVE_PHASES, kubectl_vlm.HELD_PHASES) == (op.ACTIVE_PHASES, op.HELD_PHASES)


def test_sidecar_port_agrees():
    assert op.SIDECAR_PORT == sc.DEFAULT_PORT == config.SidecarConfig().port == config.load_config([], {}).port
    assert kubectl_vlm.SIDECAR_PORT == op.SIDECAR_PORT
    # The sidecar's default SGLang /metrics URL is the port the operator starts SGLang on.
    assert re.fullmatch(rf"http://127\.0\.0\.1:{op.SGLANG_PORT}/metrics", config.DEFAULT_SGLANG_METRICS_URL)


def test_watched_functions_default_agrees():
    assert set(op.DEFAULT_WATCH_FUNCTIONS) <= set(config.DEFAULT_WATCH)
    assert api.TelemetrySpec().watch_functions == list(op.DEFAULT_WATCH_FUNCTIONS)


def _sidecar_env(roles: list[str]) -> tuple[dict[str, str], dict]:
    """The profiler container's environment as the kubelet would give it (downward API resolved) in a
    stable pod the builders make, and the pod."""
    spec = api.parse_spec({"model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"}, "telemetry": {"frontendRoles": roles}})
    d = builders.build_desired(OWNER, spec, Settings(sidecar_image="vlmops/vlm-sidecar:test"))
    pod = builders.build_deployment(OWNER, d.template, d.revision, 1)["spec"]["template"]
    pod = {**pod, "metadata": {**pod["metadata"], "name": "qwen-7f9c-x", "namespace": OWNER.namespace}}
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == "profiler"]
    env = {}
    for e in c["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
            continue
        path = e["valueFrom"]["fieldRef"]["fieldPath"]
        label = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
        if label:
            assert label[1] in pod["metadata"]["labels"], f"{e['name']} reads label {label[1]}, which the pod lacks"
            env[e["name"]] = pod["metadata"]["labels"][label[1]]
        else:
            assert path in ("metadata.name", "metadata.namespace"), path
            env[e["name"]] = pod["metadata"][path.split(".")[1]]
    return env, pod


def test_the_sidecar_reads_every_variable_the_pod_builder_sets():
    env, pod = _sidecar_env(list(op.FRONTEND_ROLES))
    assert set(env) <= set(config.ENV_OF.values()), set(env) - set(config.ENV_OF.values())
    cfg = config.load_config([], env)
    labels = pod["metadata"]["labels"]
    assert cfg.port == op.SIDECAR_PORT
    assert [p["containerPort"] for c in pod["spec"]["containers"] if c["name"] == "profiler" for p in c["ports"]] \
        == [op.SIDECAR_PORT]
    assert cfg.frontend_roles == op.FRONTEND_ROLES
    assert cfg.watch_functions == op.DEFAULT_WATCH_FUNCTIONS
    assert (cfg.vlmservice, cfg.revision) == (labels[op.LABEL_SERVICE], labels[op.LABEL_REVISION])
    assert (cfg.vlmservice, cfg.pod, cfg.namespace) == (OWNER.name, "qwen-7f9c-x", OWNER.namespace)
    assert cfg.sglang_metrics_url == config.DEFAULT_SGLANG_METRICS_URL


def _entry() -> dict:
    """One /windows.json entry as a sidecar serves it, every field set (the front end sampled too)."""
    store = ProfileStore()
    w = WindowSummary(
        id=store.new_id(), tp_rank=1, pid=4242, start=1000.0, end=1005.0, samples=5000,
        loop_mean_seconds=0.021, loop_p50_seconds=0.020, loop_p95_seconds=0.024, iterations=238,
        stage_shares={s: 1 / len(sc.STAGES) for s in sc.STAGES},
        function_shares={"process_input_requests": 0.31, "hash_feature": 0.12},
        self_shares={"process_input_requests": 0.05, "hash_feature": 0.11}, top_function="hash_feature",
        stale=True, error=None, sglang_stage_shares={"run_batch": 0.5}, ttft_seconds=0.18, itl_seconds=0.012,
        throughput=950.0, request_rate=22.5, forward_pass_rate=41.0, queued_requests=3.0, prompt_tokens_per_request=640.0,
        feature_transport_share=0.07,
        ipc_handle_reopen_share=0.02,
        feature_transport_samples=350, unexported_self_share_max=0.03,
        edge_shares={"hash_feature;process_input_requests": 0.1},
    )
    store.add_window(w, None, 1000.0)
    roles = {r: RoleSummary(role=r, processes=1, sampled=1, pids=(100 + i,), busy_share=0.1 + 0.1 * i,
                            busy_share_max=0.5, image_processing_share=0.2, function_shares={"f": 0.4},
                            self_shares={"f": 0.3}, observed_seconds=2.0, sampled_until=1002.0,
                            unexported_self_share_max=0.01)
             for i, r in enumerate(sc.FRONTEND_ROLES)}
    store.add_frontend(frontend_window(store.new_id(), 1000.0, 1005.0, roles, [0.2]), {}, [w.id])
    status, kind, body = SidecarHTTP(store, {}, 60.0, lambda: 1006.0).get("/windows.json", {})
    assert (status, kind) == (200, "application/json")
    (entry,) = json.loads(body)
    return entry


def _written_keys(entry: dict) -> set[str]:
    keys = set(entry) | set(entry["frontend"]) | set(entry["frontend"]["roles"])
    for role in entry["frontend"]["roles"].values():
        keys |= set(role)
    return keys


def _read_keys() -> set[str]:
    """The string keys Window.from_sidecar and the helpers it calls look up (`x.get("key")`, `pick("key")`)."""
    tree = ast.parse(Path(inspect.getsourcefile(Window)).read_text())
    keys = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and ((isinstance(node.func, ast.Attribute) and node.func.attr == "get")
                     or (isinstance(node.func, ast.Name) and node.func.id == "pick"))):
            keys.add(node.args[0].value)
    return keys


def test_every_windows_json_key_the_operator_reads_is_one_the_sidecar_writes():
    read = _read_keys()
    assert {"loop_mean_seconds", "stage_shares", "function_shares", "roles", "busy_share"} <= read  # parsed
    assert read - READ_NOT_WRITTEN <= _written_keys(_entry()), read - READ_NOT_WRITTEN - _written_keys(_entry())


def test_a_sidecar_entry_fills_every_field_of_the_operators_window():
    entry = _entry()
    w = Window.from_sidecar("7f9c2d", "qwen-7f9c-x", entry)
    for f in dataclasses.fields(Window):
        v = getattr(w, f.name)
        empty = v is None or v is False or v == 0 or v == "" or (isinstance(v, Mapping) and not v)
        assert not empty, f"Window.{f.name} is {v!r}: the operator reads a key the sidecar does not write"
    assert (w.id, w.end, w.samples, w.tp_rank, w.iterations, w.stale) == (str(entry["id"]), 1005.0, 5000, 1, 238, True)
    assert (w.loop_mean_seconds, w.loop_p95_seconds, w.ttft_seconds, w.itl_seconds, w.throughput, w.request_rate) \
        == (0.021, 0.024, 0.18, 0.012, 950.0, 22.5)
    assert dict(w.stage_shares) == entry["stage_shares"] and set(w.stage_shares) == set(op.STAGES)
    assert dict(w.function_shares) == entry["function_shares"] and dict(w.self_shares) == entry["self_shares"]
    assert (w.feature_transport_share, w.ipc_handle_reopen_share, w.feature_transport_samples) == (0.07, 0.02, 350)
    assert w.unexported_self_share_max == 0.03
    assert set(w.frontend) == set(op.FRONTEND_ROLES)
    for i, role in enumerate(op.FRONTEND_ROLES):
        r = w.frontend[role]
        assert r.busy_share == pytest.approx(0.1 + 0.1 * i)
        assert (dict(r.function_shares), dict(r.self_shares), r.unexported_self_share_max) == ({"f": 0.4}, {"f": 0.3}, 0.01)


def test_log_lines_have_the_same_shape():
    from vlm_operator.__main__ import JsonFormatter as OperatorFormatter
    from vlm_sidecar.log import JsonFormatter as SidecarFormatter

    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "hello %s", ("world",), None)
    a, b = json.loads(OperatorFormatter().format(record)), json.loads(SidecarFormatter().format(record))
    assert a == b and set(a) == {"time", "level", "logger", "msg"}
