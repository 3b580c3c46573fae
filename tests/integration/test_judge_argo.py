"""The judge's Argo Rollouts examples against Argo Rollouts' own CRDs (v1.8.3, from the Go module proxy in the
setup step: hack/fetch-crds.sh) on the real API server: a server-side dry run of the AnalysisTemplate,
the Rollout and the caller's objects, and every field we wrote survives the CRDs' structural schemas (a field
Argo does not know would be pruned without an error, and the metric would run without it)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from vlm_testing import fetched
from vlm_testing.cluster import wait_for
from vlm_testing.integration import _dry_run, _established, _in, _kept
from vlm_testing.judge import StandIns

REPO = Path(__file__).resolve().parents[2]
ARGO = REPO / "examples" / "argo-rollouts"


@pytest.fixture(scope="module")
def argo_crds(cluster) -> Path:
    """Argo Rollouts' CRDs installed (server-side apply; left in place, as other tests' CRDs are)."""
    files = fetched.crds(fetched.ARGO_ROLLOUTS)
    for f in files:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f), timeout=120)
    for name in ("rollouts", "analysistemplates", "analysisruns"):
        # The whole object is read: a jsonpath filter fails on a CRD the API server has given no condition yet.
        wait_for(lambda n=name: _established(json.loads(cluster.kubectl("get", f"crd/{n}.argoproj.io", "-o", "json"))),
                 120, f"CRD {name}.argoproj.io Established")
    return files[0].parent


def test_the_argo_examples_pass_argos_own_schemas(cluster, argo_crds, namespace):
    for path in (ARGO / "analysis-template.yaml", ARGO / "rollout.yaml", ARGO / "judge-caller.yaml"):
        for obj in _in(namespace, path):
            if obj["kind"] == "RoleBinding":  # its ClusterRole is in examples/judge/operator.yaml
                continue
            got = _dry_run(cluster, obj)
            lost = _kept(obj.get("spec", {}), got.get("spec", {}), f"{obj['kind']}.spec")
            assert not lost, f"{path.name}: the API server dropped or changed {lost}"
            if obj["kind"] == "AnalysisTemplate":
                web = got["spec"]["metrics"][0]["provider"]["web"]
                assert web["method"] == "POST" and "{{args.canary-hash}}" in web["body"]
                assert got["spec"]["metrics"][0]["consecutiveSuccessLimit"] == 1


# ---------------------------------------------------------------- a real Argo Rollouts controller
# A cold run (nothing built) waits here for the Argo Rollouts controller, built behind the other stages while the
# parallel pass runs: over 600 s in a cold CI run (2026-12-06), so the default timeout would end the test mid-wait.
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("slower", [0.20, 0.0], ids=["slower-aborted", "unchanged-promoted"])
def test_argo_rollouts_follows_the_judges_verdict(cluster, crd, argo_crds, namespace, kube, tmp_path, slower):
    """Argo Rollouts v1.8.3's own controller runs the example AnalysisTemplate (its web metric against the judge
    the operator serves, with a ServiceAccount token from a Secret) at the example Rollout's first canary step.
    A canary whose loop is 20% slower: the judge answers Rollback naming the stage and function, the AnalysisRun
    fails and Argo aborts the Rollout. An unchanged canary (maxDuration 2m, so the last look decides on the
    estimates): the judge answers Promote, the AnalysisRun succeeds and the canary becomes the stable revision.
    Pods run on kwok; their sidecars are local stand-ins."""
    import threading
    import time

    from kubernetes import client

    from vlm_testing import binaries
    from vlm_testing.integration import _token
    from vlm_testing.operator_proc import OperatorProcess, free_port

    binaries.require("argo", "Argo Rollouts' controller")  # built behind the other stages (testing/vlm_testing/binaries.py)
    controller = cluster.bin_dir / "rollouts-controller"
    if not controller.exists():
        controller = Path.home() / ".cache" / "vlm-operator" / "bin" / "rollouts-controller"

    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    # The caller: a ServiceAccount allowed to ask the judge here, its token in the Secret the template reads.
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "vlm-judge-caller"}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "vlm-judge-caller"}, "rules": [
        {"apiGroups": ["serving.vlmops.dev"], "resources": ["judgements"], "verbs": ["create"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "vlm-judge-caller"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "vlm-judge-caller"},
        "subjects": [{"kind": "ServiceAccount", "name": "vlm-judge-caller", "namespace": namespace}]})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "vlm-judge-caller-token"},
                                              "stringData": {"token": _token(kube, namespace, "vlm-judge-caller")}})

    judge_port = free_port()
    (template,) = _in(namespace, ARGO / "analysis-template.yaml")
    metric = template["spec"]["metrics"][0]
    metric["interval"] = "15s"
    body = metric["provider"]["web"]["body"]
    body = body.replace('"interval": "1m", "maxDuration": "30m"',
                        f'"interval": "15s", "maxDuration": "{"10m" if slower else "2m"}"')
    metric["provider"]["web"]["body"] = body.replace('"id":', '"telemetryInterval": "5s", "id":')
    for a in template["spec"]["args"]:
        if a["name"] == "judge-url":
            a["value"] = f"http://127.0.0.1:{judge_port}/v1/judge"
    (rollout,) = _in(namespace, ARGO / "rollout.yaml")
    rollout["spec"]["replicas"] = 2
    steps = rollout["spec"]["strategy"]["canary"]["steps"]
    rollout["spec"]["strategy"]["canary"]["steps"] = [{"setWeight": 50}, steps[1]]
    for c in rollout["spec"]["template"]["spec"]["containers"]:
        c.pop("resources", None)  # kwok's GPUs are shared with other tests: none taken here
    for obj in (template, rollout):
        cluster.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(obj))

    sidecars = StandIns(tmp_path / "endpoints.json", slower=slower)
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                for p in core.list_namespaced_pod(namespace, label_selector="app=qwen-vl").items:
                    h = (p.metadata.labels or {}).get("rollouts-pod-template-hash", "")
                    if p.metadata.name not in sidecars.servers and sidecars.canary_hash != "?":
                        sidecars.add(p.metadata.name, canary=bool(sidecars.canary_hash) and h == sidecars.canary_hash)
            except Exception:
                pass
            stop.wait(0.5)

    threading.Thread(target=watch, daemon=True).start()
    op = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "operator.log",
                         {"VLM_JUDGE_PORT": str(judge_port), "VLM_SIDECAR_ENDPOINTS": str(sidecars.path)}).start()
    log = open(tmp_path / "rollouts-controller.log", "wb")  # noqa: SIM115 - closed below
    argo = subprocess.Popen([str(controller), "--kubeconfig", str(cluster.kubeconfig), "--namespaced", "--namespace",
                             namespace, "--leader-elect=false", "--metricsport", str(free_port()),
                             "--healthzPort", str(free_port())], stdout=log, stderr=subprocess.STDOUT)
    custom = client.CustomObjectsApi(kube)

    def ro() -> dict:
        return custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", namespace, "rollouts", "qwen-vl")

    def tail() -> str:
        return (tmp_path / "rollouts-controller.log").read_text(errors="replace")[-3000:] + "\n--- operator\n" + \
            op.log_tail(30)

    try:
        try:
            wait_for(lambda: (ro().get("status") or {}).get("phase") == "Healthy", 180, "the first revision Healthy")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{json.dumps(ro().get('status'), indent=1)[:2000]}\n{tail()}") from None
        stable = ro()["status"]["stableRS"]
        # A new revision: the canary's pods get the slower stand-ins.
        sidecars.canary_hash = "?"
        custom.patch_namespaced_custom_object("argoproj.io", "v1alpha1", namespace, "rollouts", "qwen-vl", {
            "spec": {"template": {"metadata": {"annotations": {"revision": "2"}}}}})
        # A setup wait, not the verdict: 180 s, since beside the parallel pass's other workers the controller took
        # over 60 s to see the new revision (CI, 2026-12-07).
        canary = wait_for(lambda: (h := ro()["status"].get("currentPodHash")) != stable and h, 180, "the canary hash")
        sidecars.canary_hash = canary
        t0 = time.time()

        want = "Failed" if slower else "Successful"

        def ended_run() -> dict | None:
            runs = custom.list_namespaced_custom_object("argoproj.io", "v1alpha1", namespace, "analysisruns")["items"]
            return next((r for r in runs if (r.get("status") or {}).get("phase") in ("Failed", "Successful", "Error")),
                        None)

        try:
            run = wait_for(ended_run, 420, f"a {want} AnalysisRun", interval=2)
        except AssertionError as e:
            runs = custom.list_namespaced_custom_object("argoproj.io", "v1alpha1", namespace, "analysisruns")["items"]
            raise AssertionError(f"{e}\n{json.dumps([r.get('status') for r in runs], indent=1)[:4000]}\n{tail()}"
                                 ) from None
        elapsed = time.time() - t0
        (result,) = run["status"]["metricResults"]
        last = json.loads(result["measurements"][-1]["value"])
        assert run["status"]["phase"] == want, json.dumps(run["status"], indent=1)[:3000]
        if not slower:
            assert last["verdict"] == "Promote" and last["pass"] == 1, last
            assert all(s["verdict"] != "fail" for s in last["signals"]), last["signals"]
            wait_for(lambda: (ro().get("status") or {}).get("stableRS") == canary, 120, "the canary promoted to stable")
            print(f"canary step to Successful AnalysisRun: {elapsed:.0f} s, {result.get('count')} measurements, "
                  f"{result.get('inconclusive', 0)} inconclusive; {last['reason']}")
            return
        assert (last["verdict"], last["reason"]) == ("Rollback", "LoopLatencyRegressed"), last
        assert last["regressedStage"] == "process_input_requests"
        assert last["analysis"]["canaryPods"] and all(canary in p for p in last["analysis"]["canaryPods"])
        assert last["flamegraphDiff"]["kubectl"].startswith("kubectl vlm profile")
        wait_for(lambda: ro()["status"].get("abort") is True, 60, "the Rollout aborted")
        print(f"canary step to Failed AnalysisRun: {elapsed:.0f} s, {result.get('count')} measurements, "
              f"{result.get('inconclusive', 0)} inconclusive")
    finally:
        stop.set()
        argo.terminate()
        try:
            argo.wait(20)
        except subprocess.TimeoutExpired:
            argo.kill()
        log.close()
        op.stop()
        sidecars.close()
