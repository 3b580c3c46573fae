"""Map the operator's (kwok, fake) pods to local processes: a scheduler stand-in plus a real sidecar each.

Used by the e2e tests and `make demo`; never shipped. kwok pods have no
containers, so for every Running pod of a VLMService this starts
`sglang_standin.py` with the args and env the operator put in the pod's
`sglang` container (so the IPC-cache flags decide its speed) and `vlm-sidecar`
with the pod's profiler env and Downward-API labels, pinned to that stand-in
with VLM_DISCOVERY_ROOT_PID.

Both listen on the pod's own IP and the pod's own ports (SGLang's `--port`, 30000; the sidecar's
VLM_SIDECAR_PORT, 9400), so the operator, Prometheus and the API server's pod proxy reach them exactly
as in a cluster. That needs the testbed's network namespace (docs/testbed.md), where every pod IP is an
address of `lo`: run the mapper inside it (pytest's `cluster` fixture and the demo's agent are). One
difference from a pod remains: the pods share one loopback, so the sidecar reads SGLang's metrics at
<pod IP>:30000 instead of the pod's 127.0.0.1:30000. It writes:

- `targets.json`: Prometheus file_sd targets <pod IP>:9400 (sidecar) and <pod IP>:30000 (SGLang),
  labelled like the pods (the demo's hand-written config; the e2e tier runs the Prometheus Operator's
  generated one, testing/vlm_testing/standin/kube_sd.py);
- `pods.json`: pod -> {ip, sidecar, sglang} (for people: where to point curl).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "sglang_standin.py"
LABEL_SERVICE = "serving.vlmops.dev/vlmservice"
LABEL_REVISION = "serving.vlmops.dev/revision"
LABEL_ROLE = "serving.vlmops.dev/role"
LABEL_PROFILE = "serving.vlmops.dev/profile"  # on pods the injection webhook gave a sidecar


DEFAULT_SGLANG_PORT = 30000
DEFAULT_SIDECAR_PORT = 9400
# The stand-ins' cost model unless a pod's args name one (they come after it and win): "hybrid" (each scheduler stage
# naps in its own frame, then spins its last 0.2 ms to the deadline) keeps "wall"'s stage lengths and frames for
# about 4% of a core per busy stand-in instead of a whole one (a pass with a dozen pods kept both cores spinning),
# so the testbed's pods leave the CPU to the operator, the samplers and the tests beside them.
# VLM_STANDIN_COST_MODEL=wall brings back the all-spinning stand-ins.
COST_MODEL = os.environ.get("VLM_STANDIN_COST_MODEL", "hybrid")


def bindable(ip: str) -> bool:
    """Whether `ip` is an address here: a pod IP is, inside the testbed's network namespace."""
    family = socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET
    with socket.socket(family) as s:
        try:
            s.bind((ip, 0))
        except OSError:
            return False
    return True


def _flag(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def _version_from_image(image: str) -> str | None:
    m = re.search(r":v?(\d+\.\d+\.\d+(?:\.post\d+)?)", image or "")
    return m.group(1) if m else None


def _replace_flag(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().rstrip(b"\0")
    return dict(kv.split("=", 1) for kv in raw.decode(errors="surrogateescape").split("\0") if "=" in kv)


def _identity(pod: Any, prof: Any) -> dict[str, str]:
    """The sidecar's VLM_SERVICE_NAME and VLM_REVISION as the kubelet would resolve them: a fixed value, or a
    downward-API reference to one of the pod's labels or annotations."""
    out = {}
    meta = {"labels": pod.metadata.labels or {}, "annotations": pod.metadata.annotations or {}}
    for e in (prof.env if prof else None) or []:
        if e.name not in ("VLM_SERVICE_NAME", "VLM_REVISION"):
            continue
        ref = e.value_from.field_ref.field_path if e.value_from and e.value_from.field_ref else ""
        m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", ref)
        out[e.name] = meta[m.group(1)].get(m.group(2), "") if m else (e.value or "")
    return out


@dataclass
class Mapped:
    pod: str
    revision: str
    role: str
    ip: str
    standin: subprocess.Popen
    sidecar: subprocess.Popen
    standin_port: int
    sidecar_port: int
    labels: dict[str, str]


def _syncing(mapper: Any, period: float, name: str) -> threading.Thread:
    """A daemon thread calling `mapper.sync()` every `period` seconds until `mapper._stop` is set; a failed round
    (a flaky API call) is logged and the next one retries."""
    def loop() -> None:
        while not mapper._stop.is_set():
            try:
                mapper.sync()
            except Exception as e:
                print(f"[{name}] sync failed: {e}", file=sys.stderr)
            mapper._stop.wait(period)

    t = threading.Thread(target=loop, daemon=True, name=name)
    t.start()
    return t


@dataclass
class PodMapper:
    api: client.ApiClient
    namespace: str
    workdir: Path
    standin_args: list[str] = field(default_factory=list)  # extra --standin-* flags for every pod
    mapped: dict[str, Mapped] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _refused: set[str] = field(default_factory=set)  # pods whose IP is not an address here (said once)
    # Also map pods the injection webhook gave a sidecar (labelled serving.vlmops.dev/profile=true, not a
    # VLMService's): their SGLang container is the first that is not the sidecar, their identity the sidecar's
    # downward-API references (docs/injection.md).
    injected: bool = False

    @property
    def pods_file(self) -> Path:
        return self.workdir / "pods.json"

    @property
    def targets_file(self) -> Path:
        return self.workdir / "targets.json"

    def start(self, period: float = 1.0) -> PodMapper:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write()
        self._thread = _syncing(self, period, "podmap")
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)
        with self._lock:
            for name in list(self.mapped):
                self._kill(self.mapped.pop(name))
            self._write()

    def restart_sidecar(self, pod_prefix: str, down_s: float = 4.0) -> str | None:
        """SIGKILL the sidecar of the first mapped pod named `pod_prefix`..., and start it again after `down_s`
        with the same command line and environment, as the kubelet restarts a crashed container (the stand-in,
        SGLang's container, keeps running). The pod's name, or None when no such pod is mapped, or when the pod
        went away meanwhile (then nothing is started: a sidecar outliving its pod would hold its address)."""
        with self._lock:
            m = next((m for name, m in self.mapped.items() if name.startswith(pod_prefix)), None)
            if m is None:
                return None
            cmd, env = m.sidecar.args, _environ(m.sidecar.pid)
            os.killpg(m.sidecar.pid, signal.SIGKILL)
            m.sidecar.wait(10)
        time.sleep(down_s)
        with self._lock:
            if self.mapped.get(m.pod) is not m:
                return None
            log = open(self.workdir / f"{m.pod}.sidecar.log", "ab")  # noqa: SIM115 - closed with the process
            m.sidecar = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return m.pod

    def sync(self) -> None:
        pods = client.CoreV1Api(self.api).list_namespaced_pod(
            self.namespace, label_selector="app.kubernetes.io/managed-by=vlm-operator"
        ).items
        if self.injected:
            pods += [p for p in client.CoreV1Api(self.api).list_namespaced_pod(
                self.namespace, label_selector=f"{LABEL_PROFILE}=true").items
                if self._container(p, "profiler") is not None and p.metadata.name not in {q.metadata.name for q in pods}]
        running = {p.metadata.name: p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp}
        with self._lock:
            for name in list(self.mapped):
                m = self.mapped[name]
                if name not in running or m.standin.poll() is not None:
                    self._kill(self.mapped.pop(name))
            for name, pod in running.items():
                if name not in self.mapped and pod.status.pod_ip:
                    if not bindable(pod.status.pod_ip):
                        if name not in self._refused:
                            self._refused.add(name)
                            print(f"[podmap] {name}: pod IP {pod.status.pod_ip} is no address here; run inside "
                                  "the testbed's network namespace (hack/testbed exec, docs/testbed.md)",
                                  file=sys.stderr)
                        continue
                    self.mapped[name] = self._launch(pod)
            self._write()

    def _container(self, pod: Any, name: str) -> Any:
        return next((c for c in pod.spec.containers if c.name == name), None)

    def _launch(self, pod: Any) -> Mapped:
        labels = pod.metadata.labels or {}
        sg = self._container(pod, "sglang") or next(c for c in pod.spec.containers if c.name != "profiler")
        prof = self._container(pod, "profiler")
        ident = _identity(pod, prof)
        ip = pod.status.pod_ip
        penv = {e.name: e.value for e in ((prof.env if prof else None) or []) if e.value is not None}
        sp = int(_flag(list(sg.args or []), "--port") or DEFAULT_SGLANG_PORT)
        cp = int(penv.get("VLM_SIDECAR_PORT") or DEFAULT_SIDECAR_PORT)
        # The pod's own address instead of 0.0.0.0: every pod's stand-in listens on port 30000.
        args = _replace_flag(list(sg.args or []), "--host", ip)
        version = _version_from_image(sg.image)
        if version:
            args += ["--standin-version", version]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "VLM_"))}
        env.update({e.name: e.value for e in (sg.env or []) if e.value is not None})
        env["STANDIN_NODE_NAME"] = pod.spec.node_name or ""  # the node's speed (STANDIN_NODE_SPEED), if set
        log = open(self.workdir / f"{pod.metadata.name}.standin.log", "ab")  # noqa: SIM115
        standin = subprocess.Popen(
            [sys.executable, str(STANDIN), "--standin-cost-model", COST_MODEL, *args, *self.standin_args], env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        senv = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "VLM_"))}
        senv.update(penv)
        senv.update(
            {
                "VLM_SIDECAR_PORT": str(cp),
                "VLM_SIDECAR_HOST": ip,
                "VLM_SGLANG_METRICS_URL": f"http://{ip}:{sp}/metrics",
                "VLM_DISCOVERY_ROOT_PID": str(standin.pid),
                "POD_NAME": pod.metadata.name,
                "POD_NAMESPACE": pod.metadata.namespace,
                "VLM_SERVICE_NAME": labels.get(LABEL_SERVICE) or ident.get("VLM_SERVICE_NAME", ""),
                "VLM_REVISION": labels.get(LABEL_REVISION) or ident.get("VLM_REVISION", ""),
            }
        )
        # The console script of this interpreter's install (the project venv's), not another one on PATH.
        sidecar_bin = Path(sys.executable).with_name("vlm-sidecar")
        cmd = [str(sidecar_bin)] if sidecar_bin.exists() else [sys.executable, "-m", "vlm_sidecar"]
        slog = open(self.workdir / f"{pod.metadata.name}.sidecar.log", "ab")  # noqa: SIM115
        sidecar = subprocess.Popen(cmd, env=senv, stdout=slog, stderr=subprocess.STDOUT, start_new_session=True)
        print(f"[podmap] {pod.metadata.name}: stand-in {ip}:{sp} (pid {standin.pid}), sidecar {ip}:{cp}",
              file=sys.stderr)
        return Mapped(
            pod=pod.metadata.name,
            ip=ip,
            revision=labels.get(LABEL_REVISION, ""),
            role=labels.get(LABEL_ROLE, ""),
            standin=standin,
            sidecar=sidecar,
            standin_port=sp,
            sidecar_port=cp,
            labels={
                "namespace": pod.metadata.namespace,
                "vlmservice": labels.get(LABEL_SERVICE) or ident.get("VLM_SERVICE_NAME", ""),
                "pod": pod.metadata.name,
                "revision": labels.get(LABEL_REVISION) or ident.get("VLM_REVISION", ""),
                "role": labels.get(LABEL_ROLE, ""),
                # What the PodMonitor's podTargetLabels make of the pod labels (the dashboard's SGLang
                # panels select by them; SGLang's own series carry no service labels).
                **{re.sub(r"[^a-zA-Z0-9_]", "_", k): labels.get(k, "")
                   for k in (LABEL_SERVICE, LABEL_REVISION, LABEL_ROLE)},
            },
        )

    @staticmethod
    def _kill(m: Mapped) -> None:
        for p in (m.sidecar, m.standin):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for p in (m.sidecar, m.standin):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)

    def _write(self) -> None:
        pods = {m.pod: {"ip": m.ip, "sidecar": f"{m.ip}:{m.sidecar_port}", "sglang": f"{m.ip}:{m.standin_port}"}
                for m in self.mapped.values()}
        targets = [
            {"targets": [f"{m.ip}:{m.sidecar_port}"], "labels": {**m.labels, "job_kind": "sidecar"}}
            for m in self.mapped.values()
        ] + [
            {"targets": [f"{m.ip}:{m.standin_port}"], "labels": {**m.labels, "job_kind": "sglang"}}
            for m in self.mapped.values()
        ]
        for path, data in ((self.pods_file, pods), (self.targets_file, targets)):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(path)

    def wait_mapped(self, n: int, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if len(self.mapped) >= n:
                return
            time.sleep(0.5)
        raise AssertionError(f"only {len(self.mapped)} of {n} pods mapped to stand-ins")


@dataclass
class JobPods:
    """Run the operator's Job pods (kwok pods: no containers) as local processes, and report their end.

    For every Running pod labelled `app.kubernetes.io/component=<component>` (the load hook's: `load`) this starts
    its one container's command and args (`python` is this interpreter, whose environment has the operator
    installed) with the container's env values; stdout and stderr go to `<workdir>/<pod>.log`. When the process
    ends, the pod's status becomes Succeeded or Failed with the container's exit code (kwok's stages leave a pod
    that is no longer Pending alone), so the real Job controller counts it; when the pod goes (the Job was
    deleted) the process gets SIGTERM, as from a kubelet.

    `claims` maps a PersistentVolumeClaim's name to a directory here: a container's mount of that claim is that
    directory, so every env value and argument that starts with the mount path is rewritten to it (the process
    runs on this machine's filesystem, not in the pod's)."""

    api: client.ApiClient
    namespace: str
    workdir: Path
    component: str = "load"
    claims: dict[str, Path] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    ended: dict[str, int] = field(default_factory=dict)  # pod -> exit code, for those that ended by themselves
    started: list[str] = field(default_factory=list)  # every pod started, in order
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self, period: float = 1.0) -> JobPods:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._thread = _syncing(self, period, "jobpods")
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)
        for name in list(self.procs):
            self._end(self.procs.pop(name))

    def kill(self, name: str) -> bool:
        """SIGKILL the process of pod `name` (a node lost, an eviction); the next sync reports the pod Failed."""
        p = self.procs.get(name)
        if p is None or p.poll() is not None:
            return False
        os.killpg(p.pid, signal.SIGKILL)
        return True

    @staticmethod
    def _end(p: subprocess.Popen) -> None:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)

    def sync(self) -> None:
        core = client.CoreV1Api(self.api)
        pods = core.list_namespaced_pod(self.namespace,
                                        label_selector=f"app.kubernetes.io/component={self.component}").items
        live = {p.metadata.name: p for p in pods if not p.metadata.deletion_timestamp}
        for name in list(self.procs):
            p = self.procs[name]
            if name not in live:
                self._end(self.procs.pop(name))
            elif p.poll() is not None:
                self.procs.pop(name)
                # killed by signal N: exit code 128 + N, as a container runtime reports it
                self.ended[name] = 128 - p.returncode if p.returncode < 0 else p.returncode
                self._report(core, live[name], self.ended[name])
        for name, pod in live.items():
            if name in self.procs or name in self.ended or pod.status.phase != "Running":
                continue
            c = pod.spec.containers[0]
            mounts = self._mounts(pod, c)
            cmd = [sys.executable if x in ("python", "python3") else x for x in (c.command or [])]
            cmd += [self._local(a, mounts) for a in (c.args or [])]
            env = {**os.environ, **{e.name: self._local(e.value, mounts) for e in (c.env or []) if e.value is not None}}
            log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
            self.procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)
            self.started.append(name)

    def _mounts(self, pod: Any, c: Any) -> list[tuple[str, Path]]:
        """(mount path, local directory) of the container's mounts of `claims`, longest path first."""
        by_volume = {v.name: self.claims[v.persistent_volume_claim.claim_name] for v in (pod.spec.volumes or [])
                     if v.persistent_volume_claim and v.persistent_volume_claim.claim_name in self.claims}
        out = [(m.mount_path.rstrip("/"), by_volume[m.name]) for m in (c.volume_mounts or []) if m.name in by_volume]
        return sorted(out, key=lambda x: -len(x[0]))

    @staticmethod
    def _local(value: str, mounts: list[tuple[str, Path]]) -> str:
        for path, local in mounts:
            if value == path or value.startswith(path + "/"):
                return str(local) + value[len(path):]
        return value

    @staticmethod
    def _report(core: client.CoreV1Api, pod: Any, code: int) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        c = pod.spec.containers[0]
        phase = "Succeeded" if code == 0 else "Failed"
        status = {"phase": phase, "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted",
                                                  "lastTransitionTime": now}],
                  "containerStatuses": [{"name": c.name, "image": c.image, "imageID": "", "ready": False,
                                         "restartCount": 0, "started": False,
                                         "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0
                                                                  else "Error", "finishedAt": now,
                                                                  "startedAt": now}}}]}
        core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})
