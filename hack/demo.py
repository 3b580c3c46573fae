#!/usr/bin/env python3
"""`make demo`: the whole product on a laptop, with stand-ins where the GPUs would be.

    python hack/demo.py up     # idempotent: testbed, CRD, operator, Prometheus, Alertmanager, stand-ins,
                               # then a bad canary (IPC cache off, rolled back) and a good one (promoted)
    python hack/demo.py down   # stop the demo's processes and the testbed

kwok's fake H100 pods run nothing, so a background agent maps each pod to a
local SGLang scheduler stand-in (bench/standin) plus the real profiler sidecar
running py-spy; everything listens on 127.0.0.1.
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
sys.path.insert(0, str(REPO))
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
        "analysis": {"interval": "8s", "minSamples": 4, "maxDuration": "4m",
                     "maxRegression": {"loopLatency": 25, "stageTime": 4, "ttft": 50, "itl": 50, "throughput": 50}},
    },
}


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def testbed(*args: str) -> str:
    out = subprocess.run([sys.executable, str(REPO / "hack" / "testbed"), *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"hack/testbed {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def kubeconfig() -> str:
    for line in testbed("env").splitlines():
        if "KUBECONFIG=" in line:
            return line.split("KUBECONFIG=", 1)[1].strip().strip("'\"")
    raise SystemExit("hack/testbed env printed no KUBECONFIG")


def kubectl(*args: str, check: bool = True) -> str:
    bindir = subprocess.run(["bash", str(REPO / "hack" / "build-binaries.sh"), "--print-dir"], capture_output=True,
                            text=True).stdout.strip()
    out = subprocess.run([f"{bindir}/kubectl", f"--kubeconfig={kubeconfig()}", *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def agent() -> None:
    """Long-lived: operator + pod mapper + Prometheus + Alertmanager, until SIGTERM."""
    from kubernetes import config

    from bench.standin.monitoring import Monitoring
    from bench.standin.podmap import PodMapper
    from tests.operator_proc import OperatorProcess, free_port

    os.environ["KUBECONFIG"] = kubeconfig()
    api = config.new_client_from_config(config_file=os.environ["KUBECONFIG"])
    pm = PodMapper(api, NAMESPACE, RUN / "pods").start()
    op_port = free_port()
    mon = Monitoring(RUN / "monitoring", pm.targets_file, operator_metrics=f"127.0.0.1:{op_port}").start()
    op = OperatorProcess(Path(os.environ["KUBECONFIG"]), NAMESPACE, RUN / "operator.log",
                         {"VLM_PROMETHEUS_URL": mon.prometheus_url, "VLM_METRICS_PORT": str(op_port),
                          "VLM_SIDECAR_ENDPOINTS": str(pm.endpoints_file)}).start()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    STATE.write_text(json.dumps({"pid": os.getpid(), "prometheus": mon.prometheus_url,
                                 "alertmanager": mon.alertmanager_url, "operator_metrics": op_port,
                                 "endpoints": str(pm.endpoints_file)}))
    try:
        while not stop:
            if op.proc.poll() is not None:
                op.start()
            time.sleep(1)
    finally:
        op.stop()
        pm.stop()
        mon.stop()
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


def wait(pred, what: str, timeout: float = 300) -> dict:
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
    say("rolling out a GOOD canary: cache back on, plus a harmless env var")
    patch({"sglang": {"ipcCache": {"mode": "Auto"}, "env": [{"name": "DEMO_RELEASE", "value": "2"}]}})
    st = wait(lambda st: phase(st) in ("Promoted",) or (phase(st) == "RolledBack" and st["rollout"].get("revision") != r.get("revision")),
              "the good canary's verdict")
    say(f"verdict: {st['rollout']['phase']} ({st['rollout'].get('reason')})")
    print(kubectl("get", "vlms", "-n", NAMESPACE, "-o", "wide"))
    endpoints = json.loads(Path(state["endpoints"]).read_text())
    for pod, addr in endpoints.items():
        say(f"flamegraph of {pod}: http://{addr}/profile/latest.svg   (diff: /profile/diff.svg, data: /windows.json)")
    say(f"Prometheus: {state['prometheus']}   Alertmanager: {state['alertmanager']}")
    say(f"operator metrics: http://127.0.0.1:{state['operator_metrics']}/metrics   logs: {RUN}")
    say("stop everything with: make demo-down")


def down() -> None:
    stop_agent()
    testbed("down")
    say("demo stopped")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "up"
    {"up": up, "down": down, "agent": agent}.get(cmd, lambda: sys.exit(f"usage: {sys.argv[0]} up|down"))()
