"""`kubectl vlm` run by the real kubectl (plugin discovery on PATH) against the testbed's API server.

status/promote/abort/pause/resume read and write real VLMServices; one test drives a real canary with the
operator running, aborts it through the plugin, retries the held revision and waits for it with
`status --watch` (exit codes). The installed console script is found by kubectl too. `profile` goes through the API server's pod proxy: kwok pods
have no network behind their IPs, so the proxy hop fails and the test checks that the plugin asks for
the right path and reports the API server's answer on one line (the sidecar's SVG itself is covered by
the sidecar's tests).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from kubernetes import client

from vlm_testing.cluster import wait_for
from vlm_testing.operator_proc import GROUP, PLURAL, VERSION, get_vlms, run_operator, vlms

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "kubectl-plugin"
EXAMPLE = yaml.safe_load((REPO / "examples" / "qwen2.5-vl-3b.yaml").read_text())


def kubectl_vlm(cluster, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """`kubectl vlm ...` exactly as a user runs it: kubectl finds kubectl-vlm on PATH."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
           # the plugin's `#!/usr/bin/env python3` must find an interpreter with the kubernetes package
           "PATH": os.pathsep.join([str(PLUGIN_DIR), str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    return subprocess.run([str(cluster.bin_dir / "kubectl"), "vlm", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def create(kube, namespace: str, name: str, **spec_extra) -> None:
    body = copy.deepcopy(EXAMPLE)
    body["metadata"] = {"name": name}
    body["spec"].update(spec_extra)
    vlms(kube).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def write_status(kube, namespace: str, name: str, status: dict) -> None:
    vlms(kube).patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, {"status": status})


CANARY_STATUS = {
    "phase": "Canary", "replicas": 2, "readyReplicas": 2, "stableRevision": "5d8f7c", "canaryRevision": "9a1b2e",
    "rollout": {"phase": "Analysing", "step": 1, "revision": "9a1b2e", "verdict": "Continue", "analyses": 3,
                "decisions": [{"step": 0, "verdict": "Promote", "decidedBy": "ceiling", "reason": "BelowCeiling"}]},
    "profiler": {"loopP95": "24.1ms", "loopP50": "21.0ms", "topFunction": "process_input_requests"},
}


def test_plugin_is_found_by_kubectl(cluster):
    env = {**os.environ, "PATH": os.pathsep.join([str(PLUGIN_DIR), os.environ.get("PATH", "")])}
    out = subprocess.run([str(cluster.bin_dir / "kubectl"), "plugin", "list"], env=env, capture_output=True,
                         text=True, timeout=30).stdout
    assert str(PLUGIN_DIR / "kubectl-vlm") in out, out


def test_console_script_is_found_by_kubectl(cluster):
    """`pip install` puts kubectl-vlm next to the interpreter; kubectl finds it there without the shim."""
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "kubectl-vlm").exists(), "pip install -e . did not install the kubectl-vlm console script"
    env = {**os.environ, "PATH": os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])}
    out = subprocess.run([str(cluster.bin_dir / "kubectl"), "plugin", "list"], env=env, capture_output=True,
                         text=True, timeout=30).stdout
    assert str(bin_dir / "kubectl-vlm") in out, out
    proc = subprocess.run([str(cluster.bin_dir / "kubectl"), "vlm", "--help"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "retry" in proc.stdout, proc


def test_status_table_shows_rollout_progress_and_top_function(cluster, kube, crd, namespace):
    create(kube, namespace, "canary-svc", replicas=2,
           rollout={"steps": [{"replicas": 1, "analysis": "1m"}, {"replicas": 2, "analysis": "1m"}]})
    create(kube, namespace, "steady-svc")
    write_status(kube, namespace, "canary-svc", CANARY_STATUS)
    write_status(kube, namespace, "steady-svc", {"phase": "Ready", "replicas": 1, "readyReplicas": 1,
                                                 "profiler": {"loopP95": "19.5ms", "topFunction": "run_batch"}})
    proc = kubectl_vlm(cluster, "status", "-n", namespace)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["NAME", "MODEL", "READY", "PHASE", "ROLLOUT", "STEP", "CANARY", "VERDICT",
                                "DECIDED-BY", "LOOP-P95", "TOP-FUNCTION", "AGE"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["canary-svc"][2:11] == ["2/2", "Canary", "Analysing", "2/2", "9a1b2e", "Continue", "ceiling",
                                        "24.1ms", "process_input_requests"]
    assert rows["steady-svc"][2:11] == ["1/1", "Ready", "-", "-", "-", "-", "-", "19.5ms", "run_batch"]

    every = kubectl_vlm(cluster, "status", "-A", "-o", "json")
    assert every.returncode == 0, every.stderr
    mine = [r for r in json.loads(every.stdout) if r["NAMESPACE"] == namespace]
    assert sorted(r["NAME"] for r in mine) == ["canary-svc", "steady-svc"]

    one = kubectl_vlm(cluster, "status", "steady-svc", "-n", namespace)
    assert one.returncode == 0 and len(one.stdout.splitlines()) == 2, one


def test_promote_and_abort_set_the_annotation_and_refuse_without_a_canary(cluster, kube, crd, namespace):
    create(kube, namespace, "a")
    create(kube, namespace, "b")
    write_status(kube, namespace, "a", CANARY_STATUS)
    ok = kubectl_vlm(cluster, "promote", "a", "-n", namespace)
    assert ok.returncode == 0 and "promote requested for canary 9a1b2e" in ok.stdout, ok
    assert get_vlms(kube, namespace, "a")["metadata"]["annotations"]["serving.vlmops.dev/rollout-action"] == "promote"

    refused = kubectl_vlm(cluster, "abort", "b", "-n", namespace)
    assert refused.returncode == 1 and "no canary in progress" in refused.stderr, refused
    assert "serving.vlmops.dev/rollout-action" not in (get_vlms(kube, namespace, "b")["metadata"].get("annotations") or {})
    forced = kubectl_vlm(cluster, "abort", "b", "-n", namespace, "--force")
    assert forced.returncode == 0, forced.stderr
    assert get_vlms(kube, namespace, "b")["metadata"]["annotations"]["serving.vlmops.dev/rollout-action"] == "abort"

    write_status(kube, namespace, "b", {**CANARY_STATUS, "rollout": {**CANARY_STATUS["rollout"], "phase": "Paused"}})
    not_paused = kubectl_vlm(cluster, "resume", "a", "-n", namespace)
    assert not_paused.returncode == 1 and "not paused" in not_paused.stderr, not_paused
    resumed = kubectl_vlm(cluster, "resume", "b", "-n", namespace)
    assert resumed.returncode == 0 and "resume requested" in resumed.stdout, resumed
    assert get_vlms(kube, namespace, "b")["metadata"]["annotations"]["serving.vlmops.dev/rollout-action"] == "resume"
    paused = kubectl_vlm(cluster, "pause", "a", "-n", namespace)
    assert paused.returncode == 0, paused.stderr
    assert get_vlms(kube, namespace, "a")["metadata"]["annotations"]["serving.vlmops.dev/rollout-action"] == "pause"

    missing = kubectl_vlm(cluster, "promote", "nope", "-n", namespace)
    assert missing.returncode == 1 and f"vlmservice nope not found in namespace {namespace}" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_abort_a_real_canary_with_the_operator_running(cluster, kube, crd, namespace, tmp_path):
    """The operator starts a canary for a spec change; `kubectl vlm abort --wait` ends it."""
    for op in run_operator(cluster.kubeconfig, namespace, tmp_path):
        create(kube, namespace, "live", replicas=2,
               rollout={"capacity": "Surge", "steps": [{"replicas": 1, "analysis": "10m"}]})
        wait_for(lambda: (get_vlms(kube, namespace, "live").get("status") or {}).get("readyReplicas") == 2, 120,
                 f"live ready; operator log:\n{op.log_tail()}")
        vlms(kube).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "live",
                                                  {"spec": {"sglang": {"args": ["--chunked-prefill-size", "4096"]}}})
        wait_for(lambda: ((get_vlms(kube, namespace, "live").get("status") or {}).get("rollout") or {}).get("phase")
                 in ("Progressing", "Analysing"), 90, f"a canary; operator log:\n{op.log_tail()}")
        proc = kubectl_vlm(cluster, "abort", "live", "-n", namespace, "--wait", "--wait-timeout", "60")
        assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\noperator log:\n{op.log_tail()}"
        assert "operator acted" in proc.stdout
        ro = wait_for(lambda: (get_vlms(kube, namespace, "live")["status"].get("rollout") or {}).get("phase")
                      not in ("Progressing", "Analysing") and get_vlms(kube, namespace, "live")["status"]["rollout"],
                      60, "rollout ended")
        assert ro["phase"] == "Aborted", ro
        after = kubectl_vlm(cluster, "status", "live", "-n", namespace)
        assert "Aborted" in after.stdout, after.stdout
        # The operator holds the aborted revision: --watch ends at once with 1 (not promoted).
        held = kubectl_vlm(cluster, "status", "live", "-n", namespace, "--watch", "--timeout", "30")
        assert held.returncode == 1 and "aborted" in held.stdout, held

        # retry: the same revision is analysed again, from step 1.
        retried = kubectl_vlm(cluster, "retry", "live", "-n", namespace, "--wait", "--wait-timeout", "60")
        assert retried.returncode == 0, f"{retried.stdout}\n{retried.stderr}\noperator log:\n{op.log_tail()}"
        again = get_vlms(kube, namespace, "live")["status"]["rollout"]
        assert again["revision"] == ro["revision"] and again["phase"] in ("Progressing", "Analysing"), again
        refused = kubectl_vlm(cluster, "retry", "live", "-n", namespace)
        assert refused.returncode == 1 and "no rolled-back or aborted canary" in refused.stderr, refused

        # A canary with a 10-minute analysis does not end within 3 s: exit 2, the last state on stderr.
        timeout = kubectl_vlm(cluster, "status", "live", "-n", namespace, "--watch", "--timeout", "3",
                              "--interval", "1")
        assert timeout.returncode == 2 and "timed out after 3s" in timeout.stderr, timeout
        promoted = kubectl_vlm(cluster, "promote", "live", "-n", namespace)
        assert promoted.returncode == 0, promoted.stderr
        done = kubectl_vlm(cluster, "status", "live", "-n", namespace, "--watch", "--timeout", "90", timeout=120)
        assert done.returncode == 0 and "promoted" in done.stdout, f"{done}\noperator log:\n{op.log_tail()}"


def _pod(kube, namespace: str, name: str, port: int | None, role: str | None = None) -> None:
    container = {"name": "profiler" if port else "app", "image": "vlmops/vlm-sidecar:0.1.0"}
    if port:
        container["ports"] = [{"containerPort": port, "name": "profiler"}]
    labels = {"serving.vlmops.dev/vlmservice": "qwen", "serving.vlmops.dev/role": role} if role else {}
    client.CoreV1Api(kube).create_namespaced_pod(namespace, {"metadata": {"name": name, "labels": labels},
                                                             "spec": {"containers": [container]}})


def test_profile_goes_through_the_pod_proxy_and_reports_failures_clearly(cluster, kube, namespace, tmp_path):
    _pod(kube, namespace, "with-sidecar", 9400)
    _pod(kube, namespace, "no-sidecar", None)
    wait_for(lambda: client.CoreV1Api(kube).read_namespaced_pod("with-sidecar", namespace).status.pod_ip, 60,
             "kwok gives the pod an IP")
    out = tmp_path / "flame.svg"

    proc = kubectl_vlm(cluster, "profile", "with-sidecar", "-n", namespace, "-o", str(out), "--request-timeout", "20")
    path = f"/api/v1/namespaces/{namespace}/pods/with-sidecar:9400/proxy/profile/latest.svg"
    assert proc.returncode == 1, proc
    # One line naming the exact proxy path and what the API server said; no traceback, no partial file.
    assert proc.stderr.startswith(f"error: GET {path}: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()

    diff = kubectl_vlm(cluster, "profile", "with-sidecar", "-n", namespace, "--view", "diff", "--against", "3",
                       "--request-timeout", "20")
    assert "pods/with-sidecar:9400/proxy/profile/diff.svg?baseline=3: " in diff.stderr, diff.stderr
    unlabelled = kubectl_vlm(cluster, "profile", "with-sidecar", "-n", namespace, "--view", "diff")
    assert unlabelled.returncode == 1 and "has no serving.vlmops.dev/vlmservice label" in unlabelled.stderr

    # --against stable: the plugin finds the service's running stable pod and asks its sidecar first.
    _pod(kube, namespace, "qwen-canary-x", 9400, role="canary")
    _pod(kube, namespace, "qwen-stable-x", 9400, role="stable")
    wait_for(lambda: client.CoreV1Api(kube).read_namespaced_pod("qwen-stable-x", namespace).status.phase == "Running",
             60, "kwok runs the stable pod")
    against = kubectl_vlm(cluster, "profile", "qwen-canary-x", "-n", namespace, "--view", "diff", "--request-timeout", "20")
    want = f"GET /api/v1/namespaces/{namespace}/pods/qwen-stable-x:9400/proxy/profile/latest.json?format=collapsed: "
    assert against.returncode == 1 and want in against.stderr, against.stderr

    no_sidecar = kubectl_vlm(cluster, "profile", "no-sidecar", "-n", namespace)
    assert no_sidecar.returncode == 1 and "has no container port 9400: no profiler sidecar" in no_sidecar.stderr

    missing = kubectl_vlm(cluster, "profile", "ghost", "-n", namespace)
    assert missing.returncode == 1 and f"pod ghost not found in namespace {namespace}" in missing.stderr
