"""Chaos end to end (issue 14, items 4 and 5): faults in every rollout phase under two operator replicas,
each service ending with the verdict its undisturbed rollout reaches, no duplicate Events, no orphaned
objects, and never two replicas acting.

Two replicas run as the chart runs them with peering on (`--peering vlm-operator`, a random priority each,
the chart's KopfPeering), each through its own ApiRecorder (testing/vlm_testing/api_recorder.py), so every request each
one sent is counted, kopf's own included. The active replica is SIGKILLed while five services' rollouts are
in different phases:

| service          | change            | undisturbed verdict | state at the SIGKILL                               |
|------------------|-------------------|---------------------|----------------------------------------------------|
| chaos-promoting  | harmless          | Promoted            | Promoting: verdict reached, the stable pod not yet marked for removal, status not yet written |
| chaos-rollingback| IPC cache off     | RolledBack          | RollingBack: verdict reached, the canary pod not yet marked for removal, status not yet written |
| chaos-analysing  | harmless, 80 s step, signals from Prometheus | Promoted | Analysing, mid-step         |
| chaos-paused     | harmless          | Promoted            | Paused (`kubectl vlm pause`), resumed after the takeover |
| chaos-progressing| IPC cache off     | RolledBack          | Progressing: canary started, analysis not begun    |

The two mid-reconcile states are made exact by the active replica's recorder: it holds the first pod write
that marks one of the service's pods for removal (its pod-deletion-cost: the warm promotion's, or the
rollback's, first move, sent before the revisions' Deployments are scaled and before the status is written),
and from then on the service's status writes (a retried reconcile after the held write timed out would
otherwise record the verdict), and the replica is killed while those are held (they never reach the API
server).
chaos-progressing's status writes after "Progressing" are held the same way, so it is still Progressing at
the kill however fast kwok makes its pods Ready.

The standby takes over when the dead replica's keep-alive expires (peering lifetime 20 s here,
`VLM_PEERING_LIFETIME_SECONDS`; the chart's default is 60), and then, one after another while the rollouts
go on: chaos-paused's canary Deployment (`<name>-<revision>`) is deleted by hand once it is resumed (the
operator recreates it),
chaos-progressing's canary sidecar is SIGKILLed and started again (as the kubelet restarts a crashed
container), Prometheus is restarted (chaos-analysing reads its signals from it), and the API server and etcd
are restarted (`hack/testbed restart`).
"""

from __future__ import annotations

import copy
import itertools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from vlm_operator.cli.kubectl_vlm import main as kubectl_vlm
from vlm_testing.api_recorder import ApiRecorder
from vlm_testing.cluster import REPO, home_network, wait_for
from vlm_testing.e2e import SPEC, create, operator_env, patch, rollout
from vlm_testing.operator_proc import GROUP, PLURAL, VERSION, OperatorProcess, dump, get_vlms, vlms

PROMOTING, ROLLINGBACK, ANALYSING, PAUSED, PROGRESSING = (
    "chaos-promoting", "chaos-rollingback", "chaos-analysing", "chaos-paused", "chaos-progressing")
HARMLESS = {"sglang": {"env": [{"name": "HARMLESS", "value": "1"}]}}
CACHE_OFF = {"sglang": {"ipcCache": {"mode": "Off"}}}
CHANGES = {PROMOTING: HARMLESS, ROLLINGBACK: CACHE_OFF, ANALYSING: HARMLESS, PAUSED: HARMLESS, PROGRESSING: CACHE_OFF}
EXPECTED = {PROMOTING: "Promoted", ROLLINGBACK: "RolledBack", ANALYSING: "Promoted", PAUSED: "Promoted",
            PROGRESSING: "RolledBack"}
VERDICT_EVENT = {"Promoted": "CanaryPromoted", "RolledBack": "CanaryRolledBack"}
FINAL = {"Promoted", "RolledBack", "Aborted"}


def _spec(name: str) -> dict:
    spec = copy.deepcopy(SPEC)
    # Two pods per service in a rollout (canary and stable), not three: five services side by side stay within
    # the machine's two cores.
    spec["rollout"]["baseline"] = "Stable"
    # py-spy at 100 Hz instead of 250: ten sampled pods, two operators and the control plane share two cores,
    # and the faults are the subject here (the stage shares still show the cache-off canaries plainly).
    spec["telemetry"]["rate"] = 100
    if CHANGES[name] is HARMLESS:
        # Wide margins: a harmless change's undisturbed verdict is Promoted however noisy five services' loops
        # are on two cores (the faults are the subject here; the gate's sensitivity is test_canary's).
        spec["rollout"]["analysis"]["maxRegression"].update(loopLatency=100, stageTime=20)
    if name == ANALYSING:
        # Started after the others' verdicts are held, still mid-step through the takeover and the restarts; its
        # signals come from Prometheus.
        spec["rollout"]["steps"] = [{"replicas": 1, "analysis": "80s"}]
        spec["rollout"]["analysis"]["source"] = "Auto"  # the operator's Prometheus (VLM_PROMETHEUS_URL)
    return spec


def _phase(kube, namespace: str, name: str) -> str | None:
    return rollout(kube, namespace, name).get("phase")


def _wait_phase(kube, namespace, name, phases, timeout, what=""):
    return wait_for(lambda: _phase(kube, namespace, name) in phases, timeout,
                    f"{name} in {phases} {what}".strip(), interval=0.5)


def _events(kube, namespace: str) -> dict[str, Counter]:
    """Events by reason per service (an Event's count included: a repeated one is a duplicate too)."""
    out: dict[str, Counter] = {}
    for e in client.CoreV1Api(kube).list_namespaced_event(namespace).items:
        if e.involved_object.kind == "VLMService":
            out.setdefault(e.involved_object.name, Counter())[e.reason] += e.count or 1
    return out


def _deployments(kube, namespace: str) -> list[str]:
    return sorted(d.metadata.name for d in client.AppsV1Api(kube).list_namespaced_deployment(namespace).items)


def _orphans(kube, namespace: str) -> list[str]:
    """The operator's objects (its label) without a controller reference to a VLMService that exists: what
    garbage collection would leave behind when the services go. (Pods belong to their ReplicaSets.)"""
    sel = "app.kubernetes.io/managed-by=vlm-operator"
    apps, core, net = client.AppsV1Api(kube), client.CoreV1Api(kube), client.NetworkingV1Api(kube)
    custom = client.CustomObjectsApi(kube)
    live = {o["metadata"]["uid"] for o in vlms(kube).list_namespaced_custom_object(GROUP, VERSION, namespace,
                                                                                     PLURAL)["items"]}
    objs = [("Deployment", o.to_dict()) for o in apps.list_namespaced_deployment(namespace, label_selector=sel).items]
    objs += [("Service", o.to_dict()) for o in core.list_namespaced_service(namespace, label_selector=sel).items]
    objs += [("NetworkPolicy", o.to_dict())
             for o in net.list_namespaced_network_policy(namespace, label_selector=sel).items]
    for plural in ("podmonitors", "prometheusrules"):
        objs += [(plural, o) for o in custom.list_namespaced_custom_object("monitoring.coreos.com", "v1", namespace,
                                                                            plural, label_selector=sel)["items"]]
    out = []
    for kind, o in objs:
        refs = o["metadata"].get("owner_references") or o["metadata"].get("ownerReferences") or []
        if not any(r.get("kind") == "VLMService" and r.get("controller") and r.get("uid") in live for r in refs):
            out.append(f"{kind}/{o['metadata']['name']}")
    return out


def _testbed(log: Path, *args: str) -> float:
    t0 = time.monotonic()
    # From the namespace the session started in: the testbed's probes of its host-side bridge need it.
    with open(log, "w") as out, home_network():
        try:
            rc = subprocess.run([sys.executable, str(REPO / "hack" / "testbed"), *args], stdout=out,
                                stderr=subprocess.STDOUT, timeout=240, cwd=REPO).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    assert rc == 0, f"hack/testbed {' '.join(args)}: {rc} after {time.monotonic() - t0:.0f}s:\n{log.read_text()}"
    return time.monotonic() - t0


PEERING = "vlm-operator"  # the chart's peering.name
LIFETIME_S = 20  # VLM_PEERING_LIFETIME_SECONDS here (the chart's default 60): the takeover comes within it


def install_peering(cluster, namespace: str) -> None:
    """The chart's peering CRDs and this namespace's KopfPeering, as `helm install` with peering enabled."""
    out = subprocess.run(
        [str(cluster.bin_dir / "helm"), "template", "vlm-operator", str(REPO / "charts" / "vlm-operator"),
         "--namespace", namespace, "--kube-version", "1.34.4", "-s", "templates/peering.yaml",
         "--set", "peering.enabled=true", "--set", f"watchNamespaces={{{namespace}}}"],
        capture_output=True, text=True, check=True, timeout=60,
        env={**os.environ, "HELM_CACHE_HOME": "/tmp/vlm-helm-cache", "HELM_CONFIG_HOME": "/tmp/vlm-helm-config",
             "HELM_DATA_HOME": "/tmp/vlm-helm-data"})
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    peerings = [d for d in docs if d["kind"] == "KopfPeering"]
    assert {c["metadata"]["name"] for c in crds} == {"kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"}, docs
    assert [p["metadata"]["namespace"] for p in peerings] == [namespace], docs
    for c in crds:
        # The chart tests leave these CRDs behind (helm.sh/resource-policy: keep, as in a cluster): take them over.
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump(c))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/kopfpeerings.kopf.dev", "crd/clusterkopfpeerings.kopf.dev")
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(peerings[0]))


def peers(kube, namespace: str) -> dict[str, dict]:
    """The KopfPeering's status: identity -> {priority, lifetime, lastseen}."""
    obj = client.CustomObjectsApi(kube).get_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings",
                                                                     PEERING)
    return {k: v for k, v in (obj.get("status") or {}).items() if isinstance(v, dict)}


def _describe(writes) -> list[str]:
    return [f"{w.method} {w.path}" for w in writes[:20]]


@pytest.mark.timeout(1200)  # about 5-8 minutes on a quiet machine; the API server alone restarts in 13-70 s
def test_faults_in_every_phase_end_with_the_undisturbed_verdicts(cluster, kube, namespace, crd, monitoring, podmap,
                                                                  tmp_path):
    install_peering(cluster, namespace)
    env = {**operator_env(monitoring), "VLM_PEERING_LIFETIME_SECONDS": str(LIFETIME_S)}
    replicas: dict[str, tuple[OperatorProcess, ApiRecorder]] = {}
    timeline: list[tuple[float, str]] = []
    t0 = time.monotonic()

    def mark(what: str) -> None:
        timeline.append((round(time.monotonic() - t0, 1), what))

    try:
        for ident in ("replica-a", "replica-b"):
            r = ApiRecorder(cluster.kubeconfig).start()
            # Each serves /metrics on its own port; Prometheus' operator target (the stand-in pod's port) is a's.
            e = {**env, "POD_ID": ident} if ident == "replica-a" else {**env, "POD_ID": ident, "VLM_METRICS_PORT": ""}
            replicas[ident] = (OperatorProcess(r.kubeconfig, namespace, tmp_path / f"{ident}.log", e,
                                               args=["--peering", PEERING]).start(), r)
        seen = wait_for(lambda: (p := peers(kube, namespace)).keys() >= set(replicas) and p, 60,
                        "both replicas in the KopfPeering", interval=0.5)
        active = max(replicas, key=lambda i: seen[i]["priority"])
        standby = next(i for i in replicas if i != active)
        (op, rec), (op2, rec2) = replicas[active], replicas[standby]
        mark(f"{active} active, {standby} standing by")

        for name in CHANGES:
            create(kube, namespace, _spec(name), name=name)
        for name in CHANGES:
            wait_for(lambda n=name: get_vlms(kube, namespace, n).get("status", {}).get("stableRevision"), 120,
                     f"{name} deployed", interval=1.0)
        podmap.wait_mapped(len(CHANGES), timeout=90)
        time.sleep(8)  # a few stable windows
        mark("all Ready")

        # Every matching request is held: urllib3 retries a DELETE that timed out (30 s), and the retry must not pass.
        holds = {n: rec.hold(lambda r, n=n: r.method == "PATCH" and f"/pods/{n}-" in r.path
                             and b"pod-deletion-cost" in (r.body or b""), once=False)
                 for n in (PROMOTING, ROLLINGBACK)}
        # From the moment a service's DELETE is first held, its status writes are held too: the held DELETE times
        # out after 30 s on a slow run, the reconcile is retried, and the retry would record the verdict
        # (Promoted/PromotionApplied) before the kill. Registered now, gated on the hit, so no write slips
        # through between the hit and the test noticing it (the pause below can take longer than 30 s).
        for n, h in holds.items():
            rec.hold(lambda r, n=n, h=h: h.hit.is_set() and r.method == "PATCH"
                     and r.path.endswith(f"/{PLURAL}/{n}/status"), once=False)
        for name in (PROMOTING, ROLLINGBACK, PAUSED):
            patch(kube, namespace, CHANGES[name], name=name)
        _wait_phase(kube, namespace, PAUSED, {"Analysing"}, 90)
        assert kubectl_vlm(["pause", PAUSED, "-n", namespace, "--kubeconfig", str(cluster.kubeconfig)]) == 0
        _wait_phase(kube, namespace, PAUSED, {"Paused"}, 30, "after kubectl vlm pause")
        mark("paused")
        for name, h in holds.items():
            if not h.hit.wait(330):  # one pod a side: a verdict may take its maxDuration (4m)
                states = {n: rollout(kube, namespace, n) for n in CHANGES}
                raise AssertionError(f"{name} reached no verdict:\n{dump(states)}\n{op.log_tail()}")
            mark(f"{name}: the first removal mark held")

        # Analysing: started only now, so its 80 s step is still running through the takeover and the restarts.
        patch(kube, namespace, CHANGES[ANALYSING], name=ANALYSING)
        _wait_phase(kube, namespace, ANALYSING, {"Analysing"}, 60)
        # Progressing: its later status writes are held from the moment the status says Progressing.
        status_path = f"/{PLURAL}/{PROGRESSING}/status"
        # Held from the start: a write that moves it past Progressing (kwok can make the canary pods Ready, and
        # the operator record Analysing, between the test seeing Progressing and the hold below).
        rec.hold(lambda r: r.method == "PATCH" and r.path.endswith(status_path)
                 and r.rollout_phase() not in (None, "Progressing"), once=False)
        patch(kube, namespace, CHANGES[PROGRESSING], name=PROGRESSING)
        _wait_phase(kube, namespace, PROGRESSING, {"Progressing"}, 30)
        rec.hold(lambda r: r.method == "PATCH" and r.path.endswith(status_path), once=False)
        assert _phase(kube, namespace, PROGRESSING) == "Progressing"

        at_kill = {n: _phase(kube, namespace, n) for n in CHANGES}
        # The active replica's last keep-alive as the standby judges it: the `lastseen` kopf stamped in it (the
        # peers' deadlines are that stamp plus the lifetime), of the keep-alives the API server answered, and the
        # entry read back from the KopfPeering (one CI run found no entry for the active replica there). Not the
        # time a keep-alive reached the relay: kopf stamps it when it builds the patch, and a busy replica sent
        # one 8.8 s after stamping it in one CI run, which put the standby's (correct) takeover 8.8 s "early".
        touches = [r for r in rec.requests if r.peering and r.method == "PATCH" and not r.held]
        answered = [r.stamp for r in touches if r.stamp is not None and r.answer and r.answer[0] < 300]
        entry = peers(kube, namespace).get(active)
        lastseen = max([*answered, *([datetime.fromisoformat(entry["lastseen"]).timestamp()] if entry else [])])
        gaps = [b - a for a, b in itertools.pairwise(sorted(r.at for r in touches))]
        lags = [r.at - r.stamp for r in touches if r.stamp is not None]
        mark(f"{active}'s keep-alives every {min(gaps, default=0):.1f}-{max(gaps, default=0):.1f}s "
             f"(a third of the {LIFETIME_S}s lifetime), sent {min(lags, default=0):.1f}-{max(lags, default=0):.1f}s "
             f"after kopf stamped them")
        mark(f"{active}'s last keep-alive stamped {time.time() - lastseen:.1f}s before the kill "
             f"({'in' if entry else 'NOT in'} the KopfPeering)")
        os.kill(op.proc.pid, signal.SIGKILL)
        t_kill = time.time()
        op.proc.wait(10)
        mark(f"{active} SIGKILLed; phases {at_kill}")
        rec.stop()

        def peering_log(o: OperatorProcess) -> list[str]:
            return [line for line in o.log_path.read_text(errors="replace").splitlines()
                    if "Pausing operations" in line or "Resuming operations" in line or "conflicting" in line]

        assert at_kill == {PROMOTING: "Analysing", ROLLINGBACK: "Analysing", ANALYSING: "Analysing",
                           PAUSED: "Paused", PROGRESSING: "Progressing"}, (
            f"phases at the kill: {at_kill}\ntimeline: {timeline}\n"
            f"{standby}'s writes before the kill: {_describe(rec2.writes(until=t_kill))}\n"
            f"{standby}'s peering log: {peering_log(op2)}\n{active}'s peering log: {peering_log(op)}\n"
            f"{active}'s requests for {PROMOTING}: "
            f"{[(round(r.at - t0, 1), r.method, r.path, r.held) for r in rec.requests if PROMOTING in r.path]}")
        # Promoting: both revisions' Deployments still there, with their pods, none marked for removal.
        canary_rev = rollout(kube, namespace, PROMOTING)["revision"]
        stable_rev = get_vlms(kube, namespace, PROMOTING)["status"]["stableRevision"]
        assert {f"{PROMOTING}-{stable_rev}", f"{PROMOTING}-{canary_rev}"} <= set(_deployments(kube, namespace))
        marked = [p.metadata.name for p in client.CoreV1Api(kube).list_namespaced_pod(
            namespace, label_selector=f"serving.vlmops.dev/vlmservice={PROMOTING}").items
            if "controller.kubernetes.io/pod-deletion-cost" in (p.metadata.annotations or {})]
        assert marked == [], marked
        # While the active replica lived, the standby wrote nothing but its keep-alives; the active did the work.
        assert rec2.writes(until=t_kill) == [], _describe(rec2.writes(until=t_kill))
        assert rec2.writes(until=t_kill, peering=True), "the standby sent no keep-alive"
        acted = rec.writes(until=t_kill)
        assert any("/deployments" in w.path for w in acted) and any(w.path.endswith("/status") for w in acted)

        # The takeover: not before the dead peer's keep-alive expired (never both acting), and soon after: kopf
        # resumes at the deadline, and the first write waits for the next event or resync of a service (15 s).
        wait_for(lambda: rec2.writes(), LIFETIME_S + 60, f"a first write of {standby}", interval=0.2)
        first = rec2.writes()[0].at
        deadline = lastseen + LIFETIME_S
        mark(f"{standby} took over: first write {first - t_kill:.1f}s after the kill "
             f"({first - deadline:+.1f}s from the peering deadline)")
        assert deadline - 1 <= first <= deadline + 30, (first - t_kill, first - deadline, timeline)
        assert kubectl_vlm(["resume", PAUSED, "-n", namespace, "--kubeconfig", str(cluster.kubeconfig)]) == 0

        # Faults under the standby, now active, one after another while the rollouts go on; each must happen
        # while its service is mid-analysis, so none is skipped by a verdict that came first.
        _wait_phase(kube, namespace, PAUSED, {"Analysing"}, 60, "after the resume")
        paused_canary = f"{PAUSED}-{rollout(kube, namespace, PAUSED)['revision']}"
        client.AppsV1Api(kube).delete_namespaced_deployment(paused_canary, namespace)
        mark(f"{paused_canary} Deployment (the canary's) deleted by hand")
        _wait_phase(kube, namespace, PROGRESSING, {"Analysing"}, 60, "after the takeover")
        pod = podmap.restart_sidecar(f"{PROGRESSING}-{rollout(kube, namespace, PROGRESSING)['revision']}-")
        assert pod, f"no canary pod of {PROGRESSING} mapped: {sorted(podmap.mapped)}"
        mark(f"sidecar of {pod} killed and restarted")
        assert _phase(kube, namespace, ANALYSING) == "Analysing", f"chaos-analysing ended early: {timeline}"
        monitoring.stop_prometheus()
        monitoring.start_prometheus()
        mark("Prometheus restarted")
        took = _testbed(tmp_path / "restart.log", "restart", "kube-apiserver", "etcd")
        mark(f"API server and etcd restarted ({took:.1f}s)")

        try:
            wait_for(lambda: all(_phase(kube, namespace, n) in FINAL for n in CHANGES), 480, "every verdict",
                     interval=1.0)
        except AssertionError as e:
            states = {n: rollout(kube, namespace, n) for n in CHANGES}
            raise AssertionError(f"{e}\n{dump(states)}\ntimeline: {timeline}\n{op2.log_tail(40)}") from None
        got = {n: rollout(kube, namespace, n) for n in CHANGES}
        mark("all verdicts")
        phases = {n: r["phase"] for n, r in got.items()}
        assert phases == EXPECTED, f"{dump(got)}\ntimeline: {timeline}\n{op2.log_tail(60)}"

        # No orphans: only the stable revisions' Deployments are left, one PodMonitor per service.
        stables = sorted(f"{n}-{get_vlms(kube, namespace, n)['status']['stableRevision']}" for n in CHANGES)
        wait_for(lambda: _deployments(kube, namespace) == stables, 60, f"only the stable Deployments {stables}",
                 interval=1.0)
        # No duplicate Events: one start and one verdict per service, never the other verdict.
        events = _events(kube, namespace)
        for name, phase in EXPECTED.items():
            ev = events.get(name, Counter())
            other = VERDICT_EVENT["Promoted" if phase == "RolledBack" else "RolledBack"]
            assert (ev["CanaryStarted"], ev[VERDICT_EVENT[phase]], ev[other]) == (1, 1, 0), (name, ev, timeline)
        assert active not in peers(kube, namespace), "the dead peer was not cleaned from the KopfPeering"
        # Everything the operator made goes with its service (a controller reference to a live VLMService each).
        assert _orphans(kube, namespace) == []
        print("timeline:", *timeline, sep="\n  ")
    finally:
        for o, r in replicas.values():
            r.stop()
            o.stop()
