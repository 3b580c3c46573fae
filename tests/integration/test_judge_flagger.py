"""The judge's Flagger example against Flagger's own CRDs (v1.36.1, from the Go module proxy in the
setup step: hack/fetch-crds.sh) on the real API server: a server-side dry run of the Canary, every field kept (a
webhook field Flagger does not know would be pruned without an error); and Flagger's own controller and load
tester (v1.36.1, built from the Go module proxy: hack/build-binaries.sh --stage flagger) running it against the
judge over HTTPS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlm_testing import fetched
from vlm_testing.cluster import wait_for
from vlm_testing.integration import _dry_run, _established, _in, _kept

REPO = Path(__file__).resolve().parents[2]


def test_the_flagger_canary_passes_flaggers_own_schema(cluster, namespace):
    (crd,) = fetched.crds(fetched.FLAGGER)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd), timeout=120)
    wait_for(lambda: _established(json.loads(cluster.kubectl("get", "crd/canaries.flagger.app", "-o", "json"))),
             120, "CRD canaries.flagger.app Established")
    (canary,) = [d for d in _in(namespace, REPO / "examples" / "flagger" / "canary.yaml") if d["kind"] == "Canary"]
    back = _dry_run(cluster, canary)
    lost = _kept(canary["spec"], back["spec"], "Canary.spec")
    assert not lost, f"the API server dropped or changed {lost}"
    hook = back["spec"]["analysis"]["webhooks"][0]
    assert hook["type"] == "rollout" and "/v1/flagger" in hook["metadata"]["cmd"]


# ---------------------------------------------------------------- a real Flagger

def _flagger_canary(namespace: str, loadtester: int, judge_port: int, token: Path, ca: Path,
                    name: str = "qwen-vl") -> dict:
    """The example Canary, made to run here: Blue/Green (the kubernetes provider shifts no traffic: `iterations`),
    15 s checks, the load tester and the judge on loopback, the judge's Service name resolved to 127.0.0.1 by curl,
    and the token and CA from files (no pod runs the load tester here); for the Deployment `name` (the example's
    qwen-vl, or another: its names and selectors renamed)."""
    (canary,) = [d for d in _in(namespace, REPO / "examples" / "flagger" / "canary.yaml") if d["kind"] == "Canary"]
    if name != "qwen-vl":
        canary = json.loads(json.dumps(canary).replace("qwen-vl", name))
    host = f"vlm-operator-judge.{namespace}.svc"
    a = canary["spec"]["analysis"]
    for k in ("maxWeight", "stepWeight"):
        a.pop(k, None)
    # Blue/Green: 2 passed checks promote. Failed checks (the judge's Inconclusive while the canary warms up and
    # gathers its first windows, then Rollback) roll back at 8: room for the warm-up at 15 s a check.
    a.update(interval="15s", iterations=2, threshold=8)
    canary["spec"]["progressDeadlineSeconds"] = 120
    (hook,) = a["webhooks"]
    hook["url"] = f"http://127.0.0.1:{loadtester}/"
    cmd = hook["metadata"]["cmd"]
    cmd = cmd.replace("$(cat /var/run/secrets/kubernetes.io/serviceaccount/token)", f"$(cat {token})")
    cmd = cmd.replace("--cacert /etc/vlm-judge/ca.crt", f"--cacert {ca} --resolve {host}:{judge_port}:127.0.0.1")
    cmd = cmd.replace("https://vlm-operator-judge.vlm-system.svc:8090", f"https://{host}:{judge_port}")
    cmd = cmd.replace('"namespace": "serving"', f'"namespace": "{namespace}"')
    cmd = cmd.replace('{\\"interval\\": \\"1m\\", \\"maxDuration\\": \\"30m\\"}"',
                      '{\\"interval\\": \\"15s\\", \\"maxDuration\\": \\"2m\\"}", "telemetryInterval": "5s"')
    assert f"{host}:{judge_port}" in cmd and str(token) in cmd and "telemetryInterval" in cmd, cmd
    hook["metadata"]["cmd"] = cmd
    return canary


@pytest.mark.timeout(1800)  # a cold run waits for Flagger's build, behind the other stages
def test_flagger_promotes_what_the_judge_passes_and_rolls_back_what_it_fails_naming_the_function(
        cluster, crd, namespace, kube, tmp_path):
    """Flagger v1.36.1's own controller (`-mesh-provider kubernetes`: Blue/Green, no mesh) runs the example Canary,
    whose `rollout` webhook goes through Flagger's own load tester to the judge over HTTPS (verified against the CA
    the operator publishes, with a caller's ServiceAccount token), for two Deployments at once (one Flagger, one
    judge, one namespace): qwen-vl gets an unchanged revision: the judge's checks pass and Flagger promotes it;
    qwen-slow gets a revision whose loop is 20% slower: the judge answers Rollback, Flagger counts failed checks and
    rolls it back, and its Warning Events carry the judge's reason and the function that grew. (Side by side
    rather than one after the other: the same verdicts in half the wall time; each Canary's checks, Events and
    primary are its own.) Pods run on kwok; their sidecars are local stand-ins."""
    import subprocess
    import threading

    from kubernetes import client

    from vlm_testing import binaries
    from vlm_testing.integration import _token
    from vlm_testing.judge import StandIns, configmap
    from vlm_testing.operator_proc import OperatorProcess, free_port

    binaries.require("flagger", "Flagger's controller and load tester")
    bin_dir = Path.home() / ".cache" / "vlm-operator" / "bin"
    if (cluster.bin_dir / "flagger").exists():
        bin_dir = cluster.bin_dir
    (crd_file,) = fetched.crds(fetched.FLAGGER)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_file), timeout=120)
    wait_for(lambda: _established(json.loads(cluster.kubectl("get", "crd/canaries.flagger.app", "-o", "json"))),
             120, "CRD canaries.flagger.app Established")

    core, rbac, apps = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube), client.AppsV1Api(kube)
    custom = client.CustomObjectsApi(kube)
    # The caller: the load tester's ServiceAccount, allowed to ask the judge here (the chart's caller role).
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "flagger-loadtester"}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "judge-caller"}, "rules": [
        {"apiGroups": ["serving.vlmops.dev"], "resources": ["judgements"], "verbs": ["create"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "judge-caller"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "judge-caller"},
        "subjects": [{"kind": "ServiceAccount", "name": "flagger-loadtester", "namespace": namespace}]})
    token = tmp_path / "token"
    token.write_text(_token(kube, namespace, "flagger-loadtester"))

    sidecars = StandIns(tmp_path / "endpoints.json", slower=0.0)
    stop = threading.Event()

    def watch() -> None:  # a stand-in per pod as it appears: qwen-slow's canary pods (app=qwen-slow) 20% slower
        while not stop.is_set():
            try:
                for p in core.list_namespaced_pod(
                        namespace, label_selector="app in (qwen-vl, qwen-vl-primary, qwen-slow, qwen-slow-primary)").items:
                    if p.metadata.name not in sidecars.servers:
                        app = p.metadata.labels["app"]
                        sidecars.add(p.metadata.name, canary=app in ("qwen-vl", "qwen-slow"),
                                     slower=0.20 if app == "qwen-slow" else 0.0)
            except Exception:
                pass
            stop.wait(0.5)

    threading.Thread(target=watch, daemon=True).start()
    judge_port = free_port()
    op = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "operator.log", {
        "VLM_JUDGE_PORT": str(judge_port), "VLM_JUDGE_TLS": "self-signed", "VLM_JUDGE_NAMESPACE": namespace,
        "VLM_SIDECAR_ENDPOINTS": str(sidecars.path)}).start()
    procs: list[subprocess.Popen] = []
    logs = {name: open(tmp_path / f"{name}.log", "wb") for name in ("flagger", "loadtester")}  # noqa: SIM115
    try:
        cm = wait_for(lambda: configmap(core, namespace, "vlm-operator-judge-ca"), 60,
                      f"the judge's CA ConfigMap\n{op.log_tail(20)}")
        ca = tmp_path / "ca.crt"
        ca.write_text(cm.data["ca.crt"])
        lt_port = free_port()
        procs.append(subprocess.Popen([str(bin_dir / "loadtester"), "-port", str(lt_port), "-log-level", "info",
                                       "-zap-encoding", "console"], stdout=logs["loadtester"], stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen([str(bin_dir / "flagger"), "-kubeconfig", str(cluster.kubeconfig),
                                       "-namespace", namespace, "-mesh-provider", "kubernetes",
                                       "-metrics-server", "http://127.0.0.1:1", "-port", str(free_port()),
                                       "-control-loop-interval", "5s", "-log-level", "info", "-zap-encoding",
                                       "console", "-enable-config-tracking=false"],
                                      stdout=logs["flagger"], stderr=subprocess.STDOUT))

        (rollout,) = _in(namespace, REPO / "examples" / "argo-rollouts" / "rollout.yaml")
        template = rollout["spec"]["template"]
        for c in template["spec"]["containers"]:
            c.pop("resources", None)  # kwok's GPUs are shared with other tests: none taken here
        names = ("qwen-vl", "qwen-slow")
        for name in names:
            t = json.loads(json.dumps(template).replace("qwen-vl", name))
            apps.create_namespaced_deployment(namespace, {
                "metadata": {"name": name},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": t}})
            cluster.kubectl("apply", "--server-side", "-f", "-",
                            stdin=json.dumps(_flagger_canary(namespace, lt_port, judge_port, token, ca, name)))

        def status(name: str) -> dict:
            return custom.get_namespaced_custom_object("flagger.app", "v1beta1", namespace, "canaries",
                                                       name).get("status") or {}

        def tail() -> str:
            out = [f"canary status {n}: {json.dumps(status(n))[:1500]}" for n in names]
            for name in logs:
                logs[name].flush()
                out.append(f"--- {name}\n" + (tmp_path / f"{name}.log").read_text(errors="replace")[-2500:])
            return "\n".join([*out, "--- operator", op.log_tail(20)])

        def reach(phases: dict[str, str], timeout: float) -> None:
            try:
                wait_for(lambda: all(status(n).get("phase") == ph for n, ph in phases.items()), timeout,
                         f"Canary phases {phases}", interval=1)
            except AssertionError as e:
                raise AssertionError(f"{e}\n{tail()}") from None

        reach(dict.fromkeys(names, "Initialized"), 180)
        for name in names:  # a new revision of each: qwen-vl's canary as fast as its primary, qwen-slow's slower
            apps.patch_namespaced_deployment(name, namespace, {
                "spec": {"template": {"metadata": {"annotations": {"revision": "2"}}}}})
        # Each leaves Progressing for its verdict; neither may take the other's.
        seen: dict[str, set[str]] = {n: set() for n in names}

        def ended() -> bool:
            for n in names:
                seen[n].add(status(n).get("phase", ""))
            return status("qwen-vl").get("phase") in ("Succeeded", "Failed") \
                and status("qwen-slow").get("phase") in ("Succeeded", "Failed")
        try:
            wait_for(ended, 480, "both Canaries' verdicts", interval=1)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{tail()}") from None
        assert (status("qwen-vl")["phase"], status("qwen-slow")["phase"]) == ("Succeeded", "Failed"), tail()
        assert all("Progressing" in seen[n] for n in names), (seen, tail())

        # Flagger's own record of why: the failed checks (its webhook client drops a 5xx answer's body) and the
        # rollback at its threshold. Read from its log, which it writes with each Event: its Events on the Canary
        # go through client-go's spam filter (25 per object, then one per 5 minutes), and a run slowed by load
        # fails more warm-up checks, reaches that limit and has its rollback Event dropped (CI, 2026-12-07).
        def flagger_log() -> str:
            logs["flagger"].flush()
            return (tmp_path / "flagger.log").read_text(errors="replace")

        try:
            wait_for(lambda: "failed checks threshold reached" in flagger_log(), 60, "Flagger's rollback in its log",
                     interval=1)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{tail()}") from None
        assert "external check vlm-gate failed" in flagger_log(), tail()
        assert any(c.get("reason") == "Failed" for c in status("qwen-slow").get("conditions") or []), tail()
        uid = custom.get_namespaced_custom_object("flagger.app", "v1beta1", namespace, "canaries",
                                                  "qwen-slow")["metadata"]["uid"]
        # The judge's Event, on the same Canary (by uid: `kubectl describe canary` shows it): the reason and the
        # function. Its own source, so Flagger's many Events do not count against it.
        events = core.list_namespaced_event(namespace, field_selector="involvedObject.kind=Canary").items
        judged = [e for e in events if e.source.component == "vlm-operator-judge"]
        assert not [e for e in judged if e.involved_object.name == "qwen-vl" and e.type == "Warning"], judged
        judged = [e for e in judged if e.involved_object.name == "qwen-slow"]
        assert len(judged) == 1, [(e.reason, e.message[:200]) for e in judged]
        assert (judged[0].type, judged[0].reason, judged[0].involved_object.uid) == (
            "Warning", "LoopLatencyRegressed", uid)
        assert "reconstruct_on_target_device" in judged[0].message, judged[0].message
        primary = apps.read_namespaced_deployment("qwen-vl-primary", namespace)
        assert primary.spec.template.metadata.annotations.get("revision") == "2"  # promoted
        primary = apps.read_namespaced_deployment("qwen-slow-primary", namespace)
        assert (primary.spec.template.metadata.annotations or {}).get("revision") is None  # the first one, kept
    finally:
        stop.set()
        for p in procs:
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in logs.values():
            f.close()
        op.stop()
        sidecars.close()

