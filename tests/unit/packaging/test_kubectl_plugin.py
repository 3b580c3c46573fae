"""kubectl vlm, its pure parts (rows, table, action checks, patches, paths, watch outcomes), its commands
against a fake API whose pod proxy is a real sidecar HTTP app, the shim, the console script and the krew
manifest. The commands against a real API server are in tests/integration/test_plugin.py."""

from __future__ import annotations

import argparse
import hashlib
import importlib.machinery
import importlib.util
import subprocess
import sys
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from vlm_operator.api import names
from vlm_operator.cli import kubectl_vlm as vlm

REPO = Path(__file__).resolve().parents[3]
PLUGIN = REPO / "kubectl-plugin" / "kubectl-vlm"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
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


def test_shim_runs_the_module_and_console_script_is_declared():
    assert PYPROJECT["project"]["scripts"]["kubectl-vlm"] == "vlm_operator.cli.kubectl_vlm:main"
    proc = subprocess.run([sys.executable, str(PLUGIN), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "retry" in proc.stdout and "profile" in proc.stdout, proc


def _krew_archive():
    loader = importlib.machinery.SourceFileLoader("krew_archive", str(REPO / "kubectl-plugin" / "krew-archive"))
    spec = importlib.util.spec_from_loader("krew_archive", loader)
    krew = importlib.util.module_from_spec(spec)
    loader.exec_module(krew)
    return krew


def _without_vlm_operator(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import vlm_operator` fails (it is installed for the tests)."""
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "vlm_operator.py").write_text("raise ImportError('not installed')\n")
    return {"PYTHONPATH": str(blocker), "PATH": "/usr/bin:/bin"}


def test_shim_falls_back_to_the_modules_next_to_it(tmp_path):
    """The krew archive's layout: the archive's files side by side, vlm_operator not importable."""
    spec = importlib.util.find_spec("vlm_operator")
    for name, path in _krew_archive().FILES.items():
        (tmp_path / name).write_text(path.read_text())
    proc = subprocess.run([sys.executable, str(tmp_path / "kubectl-vlm"), "status", "--help"],
                          env=_without_vlm_operator(tmp_path), capture_output=True, text=True, timeout=60)
    assert spec is not None and proc.returncode == 0 and "--watch" in proc.stdout, proc


def test_shim_falls_back_to_the_checkout(tmp_path):
    """kubectl-plugin/ on PATH in a checkout, vlm_operator not installed: the shim finds the package beside it."""
    proc = subprocess.run([sys.executable, str(PLUGIN), "status", "--help"],
                          env=_without_vlm_operator(tmp_path), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--watch" in proc.stdout, proc


def test_every_flag_has_help():
    def walk(p: argparse.ArgumentParser):
        yield p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    yield from walk(sub)
    for p in walk(vlm.parser()):
        for a in p._actions:
            if a.option_strings or a.dest not in ("command",):
                assert a.help, f"{p.prog}: {a.option_strings or a.dest} has no help"


def test_row_of_an_analysing_canary_shows_progress_and_top_function():
    obj = svc(steps=3, readyReplicas=2, phase="Progressing", canaryRevision="7f9c2d",
              profiler={"loopP95": "24.0ms", "topFunction": "process_input_requests"},
              rollout={"phase": "Analysing", "step": 1, "revision": "7f9c2d", "verdict": "Continue",
                       "decisions": [{"step": 0, "verdict": "Promote", "decidedBy": "ceiling"}]})
    row = vlm.service_row(obj, NOW)
    assert row == {"NAMESPACE": "ml", "NAME": "qwen", "MODEL": "Qwen/Qwen2.5-VL-3B-Instruct", "READY": "2/2",
                   "PHASE": "Progressing", "ROLLOUT": "Analysing", "STEP": "2/3", "CANARY": "7f9c2d",
                   "VERDICT": "Continue", "DECIDED-BY": "ceiling", "LOOP-P95": "24.0ms",
                   "TOP-FUNCTION": "process_input_requests", "AGE": "1h"}


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


@pytest.mark.parametrize("rollout", [None, {"phase": "Promoted"}, {"phase": "RolledBack"}, {"phase": "Aborted"}])
def test_actions_without_a_canary_are_refused_with_the_reason(rollout):
    with pytest.raises(vlm.PluginError, match="no canary in progress"):
        vlm.check_action(svc(rollout=rollout), "abort")


def test_action_patch_sets_the_operator_annotation():
    assert vlm.action_patch("abort") == {"metadata": {"annotations": {"serving.vlmops.dev/rollout-action": "abort"}}}


def test_action_annotation_matches_the_operator():
    from vlm_operator.desired import builders

    assert names.ANNOTATION_ROLLOUT_ACTION == vlm.ACTION_ANNOTATION
    assert {"promote", "abort", "pause", "resume"} <= set(names.ROLLOUT_ACTIONS)
    assert set(vlm.ACTIVE_PHASES) == set(names.ACTIVE_PHASES)
    assert (vlm.LABEL_SERVICE, vlm.LABEL_ROLE) == (builders.LABEL_SERVICE, builders.LABEL_ROLE)


def test_pause_and_resume_are_checked_against_the_phase():
    assert vlm.check_action(svc(canaryRevision="r2", rollout={"phase": "Analysing"}), "pause") == "r2"
    assert vlm.check_action(svc(canaryRevision="r2", rollout={"phase": "Paused"}), "resume") == "r2"
    with pytest.raises(vlm.PluginError, match="already paused"):
        vlm.check_action(svc(rollout={"phase": "Paused"}), "pause")
    with pytest.raises(vlm.PluginError, match="not paused"):
        vlm.check_action(svc(rollout={"phase": "Analysing"}), "resume")


@pytest.mark.parametrize("phase", ["RolledBack", "Aborted"])
def test_retry_applies_to_a_held_revision_and_clears_status_rollout(phase):
    assert vlm.check_retry(svc(rollout={"phase": phase, "revision": "r9"})) == "r9"
    assert vlm.retry_patch() == {"status": {"rollout": None}}


@pytest.mark.parametrize("rollout", [None, {"phase": "Analysing"}, {"phase": "Promoted"}])
def test_retry_refuses_without_a_held_revision(rollout):
    with pytest.raises(vlm.PluginError, match="no rolled-back or aborted canary"):
        vlm.check_retry(svc(rollout=rollout))


def test_proxy_path_and_sidecar_port_match_the_operator_pods():
    from vlm_operator.desired import builders

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


def test_against_parses_roles_windows_and_pods():
    assert vlm.parse_against("stable") == ("role", "stable")
    assert vlm.parse_against("baseline") == ("role", "baseline")
    assert vlm.parse_against("12") == ("window", 12)
    assert vlm.parse_against("pod/qwen-abc") == ("pod", "qwen-abc")
    with pytest.raises(vlm.PluginError, match="--against 'latest'"):
        vlm.parse_against("latest")


def _pod(name, phase="Running", port=9400, role="stable"):
    return {"metadata": {"name": name, "labels": {vlm.LABEL_SERVICE: "qwen", vlm.LABEL_ROLE: role}},
            "spec": {"containers": [{"name": "profiler", "ports": [{"containerPort": port}]}]},
            "status": {"phase": phase}}


def test_baseline_pod_is_a_running_one_with_the_sidecar():
    pods = [_pod("c"), _pod("a", phase="Pending"), _pod("b", port=1), _pod("d")]
    assert vlm.pick_baseline_pod(pods, exclude="c", port=9400) == "d"
    assert vlm.pick_baseline_pod([_pod("c")], exclude="c", port=9400) is None


# ---- status --watch ----

def watched(gen=2, seen=2, rollout=None, steps=None, **status):
    obj = svc(rollout=rollout, steps=steps, observedGeneration=seen, **status)
    obj["metadata"]["generation"] = gen
    return obj


@pytest.mark.parametrize(("obj", "code", "text"), [
    (watched(seen=1, rollout={"phase": "Promoted"}), None, "observe generation 2"),
    (watched(rollout={"phase": "Analysing", "step": 0, "revision": "r2", "verdict": "Continue"}, steps=2), None,
     "canary r2 Analysing, step 1/2, verdict Continue"),
    (watched(rollout={"phase": "Paused", "revision": "r2"}), None, "Paused"),
    (watched(rollout={"phase": "Promoted", "revision": "r2"}), 0, "canary r2 promoted"),
    (watched(rollout={"phase": "RolledBack", "revision": "r2", "reason": "LoopLatencyRegressed",
                      "regressedFunction": "hash_feature"}), 1,
     "canary r2 rolled back (LoopLatencyRegressed, hash_feature)"),
    (watched(rollout={"phase": "Aborted", "revision": "r2", "reason": "AbortedByUser"}), 1, "aborted"),
    (watched(phase="Failed", conditions=[{"type": "Ready", "status": "False", "reason": "InvalidSpec",
                                          "message": "spec.replicas: bad"}]), 1, "invalid spec: spec.replicas: bad"),
    (watched(phase="Ready", readyReplicas=2), 0, "ready, 2/2 replicas (no canary)"),
    (watched(phase="Pending", readyReplicas=1), None, "Pending, 1/2 replicas ready"),
    (watched(phase="Failed", readyReplicas=0, conditions=[{"type": "Ready", "status": "False", "reason": "OOMKilled",
                                                           "message": "pod p: container sglang restarted 3 times"}]),
     None, "not serving, 0/2 replicas ready: OOMKilled: pod p: container sglang restarted 3 times"),
])
def test_watch_outcome(obj, code, text):
    got, line = vlm.watch_outcome(obj)
    assert got == code and text in line, line


class WatchApi:
    default_namespace = "ml"

    def __init__(self, answers):
        self.answers = list(answers)

    def get_service(self, ns, name):
        a = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(a, Exception):
            raise a
        return a


def _watch(answers, timeout=10.0):
    t = [0.0]
    args = argparse.Namespace(name="qwen", all_namespaces=False, namespace=None, timeout=timeout, interval=1.0)
    return vlm.watch(WatchApi(answers), args, sleep=lambda s: t.__setitem__(0, t[0] + s), clock=lambda: t[0])


def test_watch_exit_codes_promoted_rolled_back_timeout(capsys):
    analysing = watched(rollout={"phase": "Analysing", "revision": "r2"})
    assert _watch([analysing, vlm.PluginError("GET: 503"), watched(rollout={"phase": "Promoted"})]) == 0
    out = capsys.readouterr().out
    assert "Analysing" in out and "503 (retrying)" in out and "promoted" in out
    assert _watch([analysing, watched(rollout={"phase": "RolledBack"})]) == 1
    assert _watch([analysing], timeout=5) == 2
    assert "timed out after 5s" in capsys.readouterr().err
    with pytest.raises(vlm.NotFound):
        _watch([vlm.NotFound("vlmservice qwen not found in namespace ml")])


def test_watch_errors_exit_3_not_1(monkeypatch, capsys):
    class Boom:
        def __init__(self, *a):
            raise vlm.PluginError("cannot load kubeconfig: nope")
    monkeypatch.setattr(vlm, "Api", Boom)
    assert vlm.main(["status", "qwen", "--watch"]) == vlm.EXIT_ERROR == 3
    assert vlm.main(["status", "qwen"]) == 1
    assert capsys.readouterr().err.count("error: cannot load kubeconfig: nope") == 2


# ---- profile: a fake API whose pod proxy is a real sidecar HTTP app ----

class ProxyApi:
    """get_pod/list_pods from dicts; proxy() routes /api/v1/namespaces/NS/pods/POD:PORT/proxy/PATH to the
    sidecar app of POD, as the API server would (GET and POST, query, body)."""

    default_namespace = "ml"

    def __init__(self, pods, apps):
        self.pods, self.apps, self.calls = pods, apps, []

    def get_pod(self, ns, name):
        return self.pods[name]

    def list_pods(self, ns, selector):
        want = dict(kv.split("=") for kv in selector.split(","))
        return [p for p in self.pods.values() if want.items() <= p["metadata"]["labels"].items()]

    def proxy(self, method, path, query=None, body=None):
        self.calls.append((method, path, dict(query or {})))
        pod = path.split("/pods/")[1].split(":")[0]
        rest = "/" + path.split("/proxy/", 1)[1]
        q = {k: [v] for k, v in (query or {}).items()}
        app = self.apps[pod]
        status, _, out = app.get(rest, q) if method == "GET" else app.post(rest, q, body)
        if status != 200:
            raise vlm.PluginError(f"{method} {path}: {status}: {out.decode().strip()}")
        return out

    def proxy_get(self, path, query=None):
        return self.proxy("GET", path, query)


def _sidecar(golden: str):
    from vlm_sidecar.collector import ProfileStore
    from vlm_sidecar.estimators import summarize
    from vlm_sidecar.parser import parse_chrometrace
    from vlm_sidecar.server import SidecarHTTP

    store = ProfileStore(8)
    trace = parse_chrometrace((REPO / "tests/golden/sidecar" / f"{golden}.chrometrace.json").read_bytes())
    w, stacks = summarize(trace, window_id=store.new_id(), tp_rank=0, pid=100, start=1000.0, end=1001.0,
                          samples=500, watch=("hash_feature",), top_n=3)
    store.add_window(w, stacks, 500.0, None)
    return SidecarHTTP(store, {"namespace": "ml", "vlmservice": "qwen", "pod": "p", "revision": "r"}, 60, lambda: 1001.0)


def _profile_args(tmp_path, **kw):
    base = {"pod": "qwen-canary-1", "view": "diff", "against": None, "tp_rank": 0, "port": 9400, "namespace": "ml",
            "output": str(tmp_path / "diff.svg")}
    return argparse.Namespace(**{**base, **kw})


def test_diff_against_stable_posts_the_stable_pods_collapsed_stacks(tmp_path):
    api = ProxyApi({"qwen-canary-1": _pod("qwen-canary-1", role="canary"), "qwen-stable-1": _pod("qwen-stable-1")},
                   {"qwen-canary-1": _sidecar("cache_off"), "qwen-stable-1": _sidecar("cache_on")})
    assert vlm.cmd_profile(api, _profile_args(tmp_path)) == 0
    svg = (tmp_path / "diff.svg").read_text()
    assert svg.startswith("<svg") or "<svg" in svg[:200]
    assert "vs posted profile" in svg
    assert [c[:2] for c in api.calls] == [
        ("GET", "/api/v1/namespaces/ml/pods/qwen-stable-1:9400/proxy/profile/latest.json"),
        ("POST", "/api/v1/namespaces/ml/pods/qwen-canary-1:9400/proxy/profile/diff.svg")]
    assert api.calls[0][2] == {"format": "collapsed"}


def test_diff_against_a_window_id_asks_the_pod_itself(tmp_path):
    api = ProxyApi({"qwen-canary-1": _pod("qwen-canary-1", role="canary")}, {"qwen-canary-1": _sidecar("cache_on")})
    assert vlm.cmd_profile(api, _profile_args(tmp_path, against="1")) == 0
    assert "vs window 1" in (tmp_path / "diff.svg").read_text()
    assert api.calls == [("GET", "/api/v1/namespaces/ml/pods/qwen-canary-1:9400/proxy/profile/diff.svg",
                          {"baseline": "1"})]


def test_diff_without_a_stable_pod_says_how_to_find_one(tmp_path):
    api = ProxyApi({"qwen-canary-1": _pod("qwen-canary-1", role="canary")}, {})
    with pytest.raises(vlm.PluginError, match="no running stable pod of vlmservice ml/qwen"):
        vlm.cmd_profile(api, _profile_args(tmp_path))
    with pytest.raises(vlm.PluginError, match="--against needs --view diff"):
        vlm.cmd_profile(api, _profile_args(tmp_path, view="svg", against="stable"))


# ---- krew ----

def test_krew_manifest_matches_the_reproducible_archive():
    m = yaml.safe_load((REPO / "kubectl-plugin" / "vlm.yaml").read_text())
    assert (m["apiVersion"], m["kind"], m["metadata"]["name"]) == (
        "krew.googlecontainertools.github.com/v1alpha2", "Plugin", "vlm")
    assert m["spec"]["version"] == f"v{PYPROJECT['project']['version']}"
    krew = _krew_archive()
    data = krew.archive_bytes()
    assert data == krew.archive_bytes()  # reproducible
    for platform in m["spec"]["platforms"]:
        assert platform["bin"] == "kubectl-vlm"
        assert platform["sha256"] == hashlib.sha256(data).hexdigest(), "run kubectl-plugin/krew-archive"
        assert {f["from"] for f in platform["files"]} == set(krew.FILES)


def test_a_failed_service_shows_why_in_its_phase():
    obj = {"metadata": {"name": "s"}, "spec": {"model": {"path": "m"}},
           "status": {"phase": "Failed", "conditions": [{"type": "Ready", "status": "False", "reason": "ImagePullFailed"}]}}
    assert vlm.service_row(obj, NOW)["PHASE"] == "Failed (ImagePullFailed)"
    obj["status"]["phase"] = "Pending"
    assert vlm.service_row(obj, NOW)["PHASE"] == "Pending"
