"""kubectl vlm, its pure parts: the status rows and table, the action checks and patch, the proxy path.
The commands against a real API server are in tests/integration/test_plugin.py."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from datetime import UTC, datetime
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PLUGIN = REPO / "kubectl-plugin" / "kubectl-vlm"


def _load():
    loader = importlib.machinery.SourceFileLoader("kubectl_vlm", str(PLUGIN))
    spec = importlib.util.spec_from_loader("kubectl_vlm", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


vlm = _load()
NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def svc(name="qwen", rollout=None, steps=None, **status):
    spec = {"model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"}, "replicas": 2}
    if steps is not None:
        spec["rollout"] = {"steps": [{"replicas": 1}] * steps}
    return {"metadata": {"name": name, "namespace": "ml", "creationTimestamp": "2025-01-01T10:30:00Z"},
            "spec": spec, "status": {**status, **({"rollout": rollout} if rollout else {})}}


def test_plugin_is_executable_with_a_python_shebang():
    assert PLUGIN.stat().st_mode & 0o111
    assert PLUGIN.read_text().startswith("#!/usr/bin/env python3\n")


def test_row_of_an_analysing_canary_shows_progress_and_top_function():
    obj = svc(steps=3, readyReplicas=2, phase="Progressing", canaryRevision="7f9c2d",
              profiler={"loopP95": "24.0ms", "topFunction": "process_input_requests"},
              rollout={"phase": "Analysing", "step": 1, "revision": "7f9c2d", "verdict": "Continue"})
    row = vlm.service_row(obj, NOW)
    assert row == {"NAMESPACE": "ml", "NAME": "qwen", "MODEL": "Qwen/Qwen2.5-VL-3B-Instruct", "READY": "2/2",
                   "PHASE": "Progressing", "ROLLOUT": "Analysing", "STEP": "2/3", "CANARY": "7f9c2d",
                   "VERDICT": "Continue", "LOOP-P95": "24.0ms", "TOP-FUNCTION": "process_input_requests",
                   "AGE": "1h"}


def test_rolled_back_row_names_the_regressed_function_and_no_live_canary():
    obj = svc(phase="Degraded", profiler={"topFunction": "run_batch"},
              rollout={"phase": "RolledBack", "step": 0, "revision": "abc", "reason": "LoopLatencyRegressed",
                       "regressedFunction": "hash_feature"})
    row = vlm.service_row(obj, NOW)
    assert (row["ROLLOUT"], row["STEP"], row["CANARY"], row["VERDICT"], row["TOP-FUNCTION"]) == (
        "RolledBack", "-", "-", "LoopLatencyRegressed", "hash_feature")


def test_row_without_status_and_default_steps():
    row = vlm.service_row({"metadata": {"name": "new"}, "spec": {"model": {"path": "m"}}}, NOW)
    assert (row["READY"], row["PHASE"], row["ROLLOUT"], row["AGE"]) == ("0/1", "<pending>", "-", "<unknown>")


def test_table_aligns_columns_and_adds_namespace_with_all_namespaces():
    rows = [vlm.service_row(svc("a"), NOW), vlm.service_row(svc("longer-name"), NOW)]
    lines = vlm.format_table(rows, all_namespaces=True).splitlines()
    assert lines[0].split()[:3] == ["NAMESPACE", "NAME", "MODEL"]
    assert lines[1].index("Qwen") == lines[2].index("Qwen") == lines[0].index("MODEL")
    assert "NAMESPACE" not in vlm.format_table(rows, all_namespaces=False)
    assert vlm.format_table([], False) == "No VLMServices found."


@pytest.mark.parametrize("phase", ["Progressing", "Analysing", "Paused"])
def test_actions_apply_to_a_canary_in_progress(phase):
    assert vlm.check_action(svc(canaryRevision="r2", rollout={"phase": phase}), "promote") == "r2"


@pytest.mark.parametrize("rollout", [None, {"phase": "Promoted"}, {"phase": "RolledBack"}, {"phase": "Idle"}])
def test_actions_without_a_canary_are_refused_with_the_reason(rollout):
    with pytest.raises(vlm.PluginError, match="no canary in progress"):
        vlm.check_action(svc(rollout=rollout), "abort")


def test_action_patch_sets_the_operator_annotation():
    assert vlm.action_patch("abort") == {"metadata": {"annotations": {"serving.vlmops.dev/rollout-action": "abort"}}}


def test_action_annotation_matches_the_operator():
    from vlm_operator import rollout

    assert rollout.ANNOTATION_ACTION == vlm.ACTION_ANNOTATION
    assert {"promote", "abort"} <= set(rollout.ACTIONS)


def test_proxy_path_and_sidecar_port_match_the_operator_pods():
    from vlm_operator import builders

    assert vlm.SIDECAR_PORT == builders.SIDECAR_PORT
    assert vlm.proxy_path("ml", "qwen-abc", 9400, "svg") == "/api/v1/namespaces/ml/pods/qwen-abc:9400/proxy/profile/latest.svg"
    assert vlm.proxy_path("ml", "p", 9400, "diff").endswith("/proxy/profile/diff.svg")
    pod = {"spec": {"containers": [{"name": "sglang", "ports": [{"containerPort": 30000}]},
                                   {"name": "profiler", "ports": [{"containerPort": 9400}]}]}}
    assert vlm.sidecar_port(pod, 9400) and not vlm.sidecar_port(pod, 9401)


def test_namespace_flag_works_before_and_after_the_subcommand():
    p = vlm.parser()
    assert p.parse_args(["-n", "a", "status"]).namespace == "a"
    assert p.parse_args(["status", "-n", "b"]).namespace == "b"
    assert not hasattr(p.parse_args(["status"]), "namespace")  # main() fills in the context's namespace
