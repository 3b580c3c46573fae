#!/usr/bin/env python3
"""`make demo`: the whole product on a laptop, with stand-ins where the GPUs would be.

    python hack/demo.py up     # idempotent: testbed, CRD, operator, Prometheus, Alertmanager, stand-ins,
                               # then a bad canary (IPC cache off, rolled back) and a good one (promoted)
    python hack/demo.py down   # stop the demo's processes and the testbed

kwok's fake H100 pods run nothing, so a background agent maps each pod to a
local SGLang scheduler stand-in (testing/vlm_testing/standin) plus the real profiler sidecar
running py-spy. The agent runs inside the testbed's network namespace (docs/testbed.md): each
stand-in and sidecar listens on its pod's IP, the operator reads the sidecars by pod IP and
Prometheus scrapes pod IPs, as in a cluster. A bridge relays Prometheus, Alertmanager and the
operator's /metrics to 127.0.0.1 outside the namespace; pod IPs are reached with
`hack/testbed exec -- curl http://<pod IP>:9400/...`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = Path(os.environ.get("VLM_DEMO_DIR", Path.home() / ".cache" / "vlm-operator" / "demo"))
STATE = RUN / "agent.json"
NAMESPACE = "vlm-demo"
NAME = "qwen-vl-demo"
SPEC = {
    "model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct", "servedName": "qwen-vl"},
    "replicas": 1,
    "sglang": {"image": "lmsysorg/sglang:v0.5.23"},
    "telemetry": {"interval": "4s", "duration": "3s", "rate": 250},
    "rollout": {
        "capacity": "Auto",
        "steps": [{"replicas": 1, "analysis": "40s"}],
        # The shipped margins and confidence (3% loop latency, 5 points of stage time, 10% TTFT/ITL, 5% throughput),
        # the clocks shortened so the demo takes minutes, not half an hour. One canary pod beside one stable pod
        # cannot resolve a 3% loop margin at the pods' spread: the gate promotes within the margin it can resolve
        # and says so (Warning CanaryMarginUnresolvable, status.rollout.signals[].promoteMargin).
        "analysis": {"interval": "8s", "maxDuration": "4m"},
    },
}


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def testbed(*args: str) -> str:
    out = subprocess.run([sys.executable, str(REPO / "hack" / "testbed"), *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"hack/testbed {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def testbed_env() -> dict[str, str]:
    return json.loads(testbed("env", "--json"))


def kubeconfig() -> str:
    return testbed_env()["KUBECONFIG"]


def kubectl(*args: str, check: bool = True) -> str:
    bindir = subprocess.run(["bash", str(REPO / "hack" / "build-binaries.sh"), "--print-dir"], capture_output=True,
                            text=True).stdout.strip()
    out = subprocess.run([f"{bindir}/kubectl", f"--kubeconfig={kubeconfig()}", *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def agent() -> None:
    """Long-lived: operator + pod mapper + Prometheus + Alertmanager, until SIGTERM."""
    info = testbed_env()
    ns = info.get("VLM_TESTBED_NETNS", "0")
    if ns == "0":
        raise SystemExit("the demo needs the testbed's pod network: run as root without VLM_TESTBED_NETNS=0 "
                         "(docs/testbed.md)")
    from kubernetes import config

    from vlm_testing.operator_proc import OperatorProcess, free_port
    from vlm_testing.standin.monitoring import Monitoring
    from vlm_testing.standin.podmap import PodMapper

    # Ports free out here for the bridge (the namespace is empty but for the testbed's own ports); the
    # bridge binds them here, then relays into the namespace, where Prometheus & co. listen on the same.
    prom_port, am_port, op_port = free_port(), free_port(), free_port()
    fwd = [f"127.0.0.1:{p}=127.0.0.1:{p}" for p in (prom_port, am_port, op_port)]
    bridge = subprocess.Popen([sys.executable, str(REPO / "hack" / "testbed_lib" / "bridge.py"), f"--run-dir={RUN}",
                               f"--netns={ns}", *fwd], stdout=open(RUN / "bridge.log", "ab"),  # noqa: SIM115
                              stderr=subprocess.STDOUT)
    from vlm_testing.testbed import netns

    netns.enter(ns)  # this thread, and every thread and process started from here on
    os.environ["KUBECONFIG"] = info["KUBECONFIG"]
    # The sidecars sample with the py-spy the sidecar image ships (built by `make setup`), as the tests do.
    pyspy_dir = subprocess.run(["bash", str(REPO / "hack" / "build-binaries.sh"), "--print-pyspy-dir"],
                               capture_output=True, text=True, check=True).stdout.strip()
    if (Path(pyspy_dir) / "py-spy").exists():
        os.environ["PATH"] = f"{pyspy_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    api = config.new_client_from_config(config_file=os.environ["KUBECONFIG"])
    pm = PodMapper(api, NAMESPACE, RUN / "pods").start()
    mon = Monitoring(RUN / "monitoring", pm.targets_file, operator_metrics=f"127.0.0.1:{op_port}",
                     prom_port=prom_port, am_port=am_port).start()
    op = OperatorProcess(Path(os.environ["KUBECONFIG"]), NAMESPACE, RUN / "operator.log",
                         {"VLM_PROMETHEUS_URL": mon.prometheus_url, "VLM_METRICS_PORT": str(op_port)}).start()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    STATE.write_text(json.dumps({"pid": os.getpid(), "prometheus": mon.prometheus_url,
                                 "alertmanager": mon.alertmanager_url, "operator_metrics": op_port,
                                 "pods": str(pm.pods_file), "netns": ns}))
    try:
        while not stop:
            if op.proc.poll() is not None:
                op.start()
            time.sleep(1)
    finally:
        op.stop()
        pm.stop()
        mon.stop()
        bridge.terminate()
        bridge.wait(10)
        STATE.unlink(missing_ok=True)


def stop_agent() -> None:
    if STATE.exists():
        pid = json.loads(STATE.read_text()).get("pid")
        try:
            os.kill(pid, signal.SIGTERM)
            for _ in range(60):
                os.kill(pid, 0)
                time.sleep(0.5)
        except (ProcessLookupError, TypeError):
            pass
        STATE.unlink(missing_ok=True)


def status() -> dict:
    out = kubectl("get", "vlms", NAME, "-n", NAMESPACE, "-o", "json", check=False)
    return json.loads(out).get("status", {}) if out else {}


def wait(pred, what: str, timeout: float = 600) -> dict:
    # A verdict can take the step's whole maxDuration (4m here) after the canary is Ready: a single canary pod
    # against pods whose spread the gate does not know yet is decided at its last look (docs/canary-analysis.md).
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = status()
        if pred(st):
            return st
        time.sleep(2)
    raise SystemExit(f"timed out waiting for {what}; status: {json.dumps(status(), indent=1)[:2000]}\n"
                     f"operator log: {RUN / 'operator.log'}")


def phase(st: dict) -> str | None:
    return (st.get("rollout") or {}).get("phase")


def patch(spec_patch: dict) -> None:
    kubectl("patch", "vlms", NAME, "-n", NAMESPACE, "--type=merge", "-p", json.dumps({"spec": spec_patch}))


def up() -> None:
    RUN.mkdir(parents=True, exist_ok=True)
    say("starting the local control plane (hack/testbed up)")
    testbed("up")
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    kubectl("wait", "--for=condition=Established", "crd/vlmservices.serving.vlmops.dev")
    if kubectl("get", "ns", NAMESPACE, check=False):
        say(f"removing the previous demo's VLMService in {NAMESPACE}")
        kubectl("delete", "vlms", "--all", "-n", NAMESPACE, "--wait=true", "--timeout=60s", check=False)
    else:
        kubectl("create", "ns", NAMESPACE)
    stop_agent()
    say("starting the operator, Prometheus, Alertmanager and the pod -> stand-in mapper")
    log = open(RUN / "agent.log", "ab")  # noqa: SIM115
    subprocess.Popen([sys.executable, __file__, "agent"], stdout=log, stderr=subprocess.STDOUT,
                     start_new_session=True, cwd=REPO)
    for _ in range(120):
        if STATE.exists():
            break
        time.sleep(0.5)
    else:
        raise SystemExit(f"the demo agent did not start; see {RUN / 'agent.log'}")
    state = json.loads(STATE.read_text())
    doc = {"apiVersion": "serving.vlmops.dev/v1alpha1", "kind": "VLMService",
           "metadata": {"name": NAME, "namespace": NAMESPACE}, "spec": SPEC}
    path = RUN / "vlmservice.json"
    path.write_text(json.dumps(doc))
    kubectl("apply", "-f", str(path))
    say(f"applied VLMService {NAMESPACE}/{NAME}; waiting for Ready")
    wait(lambda st: any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions", [])), "Ready")
    time.sleep(10)
    say("rolling out a BAD canary: spec.sglang.ipcCache.mode Off (the pre-0.5.10 behaviour)")
    patch({"sglang": {"ipcCache": {"mode": "Off"}}})
    st = wait(lambda st: phase(st) in ("RolledBack", "Promoted"), "the bad canary's verdict")
    r = st["rollout"]
    say(f"verdict: {r['phase']} ({r.get('reason')}): {r.get('message')}")
    say(f"regressed stage: {r.get('regressedStage')}, function: {r.get('regressedFunction')}")
    decided = [d.get("decidedBy") for d in r.get("decisions") or []]
    if r["phase"] != "RolledBack" or decided[-1:] != ["evidence"] or not r.get("regressedFunction"):
        raise SystemExit(f"[demo] WRONG VERDICT: the IPC-cache-off canary must be rolled back on evidence naming the "
                         f"function that regressed; got {r['phase']} ({r.get('reason')}), decided by {decided}, "
                         f"function {r.get('regressedFunction')}")
    say("rolling out a GOOD canary: cache back on, plus a harmless env var")
    patch({"sglang": {"ipcCache": {"mode": "Auto"}, "env": [{"name": "DEMO_RELEASE", "value": "2"}]}})
    st = wait(lambda st: phase(st) in ("Promoted",) or (phase(st) == "RolledBack" and st["rollout"].get("revision") != r.get("revision")),
              "the good canary's verdict")
    good = st["rollout"]
    say(f"verdict: {good['phase']} ({good.get('reason')}): {good.get('message')}")
    if good["phase"] != "Promoted":
        raise SystemExit(f"[demo] WRONG VERDICT: the good canary (cache back on) must be promoted; got "
                         f"{good['phase']} ({good.get('reason')}): {good.get('message')}")
    print(kubectl("get", "vlms", "-n", NAMESPACE, "-o", "wide"))
    pods = json.loads(kubectl("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/managed-by=vlm-operator",
                              "-o", "json"))["items"]
    for pod in pods:
        name, ip = pod["metadata"]["name"], pod.get("status", {}).get("podIP")
        if ip and not pod["metadata"].get("deletionTimestamp"):
            say(f"flamegraph of {name}: hack/testbed exec -- curl -so {name}.svg http://{ip}:9400/profile/latest.svg"
                "   (diff: /profile/diff.svg, data: /windows.json)")
    say(f"Prometheus: {state['prometheus']}   Alertmanager: {state['alertmanager']}   (relayed out of network "
        f"namespace {state['netns']})")
    say(f"operator metrics: http://127.0.0.1:{state['operator_metrics']}/metrics   logs: {RUN}")
    say("stop everything with: make demo-down")


def down() -> None:
    stop_agent()
    testbed("down")
    say("demo stopped")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "up"
    {"up": up, "down": down, "agent": agent}.get(cmd, lambda: sys.exit(f"usage: {sys.argv[0]} up|down"))()
