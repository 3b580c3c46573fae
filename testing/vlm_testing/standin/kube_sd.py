"""Prometheus on the configuration the Prometheus Operator generates, where `kubernetes_sd` is missing.

The Prometheus Operator turns ServiceMonitors and PodMonitors into scrape jobs that discover their
targets with `kubernetes_sd_configs` and then select and label them with `relabel_configs` over the
`__meta_kubernetes_*` labels. Debian's Prometheus (what hack/install-system-deps.sh installs) is built
without kubernetes_sd, so this module stands in for that one piece: `discover` lists what kubernetes_sd
(role pod, endpoints or endpointslice) would hand each scrape job and each Alertmanager set of the
`alerting` section (the Operator discovers a Prometheus object's `spec.alerting.alertmanagers` through the
Alertmanager Service's Endpoints, `role: endpoints`, or its EndpointSlices under
`serviceDiscoveryRole: EndpointSlice`), from the API server's Pods, Services, Endpoints and EndpointSlices,
with the same meta labels, and `runnable` rewrites each `kubernetes_sd_configs` into a `file_sd_configs`
over a file holding exactly that. Everything else is the generated text: relabelings (the Alertmanagers'
keep rules on Service name and port name included), honor_labels, intervals, and the rule files from the
`prometheus-<name>-rulefiles-N` ConfigMaps, with the config-reloader's `$(SHARD)` and `$(POD_NAME)`
substituted as it does.

`Reloader` is the moving part for a live test: every `period` seconds it re-reads the generated secret
and rule ConfigMaps (rewriting the config and asking Prometheus to reload when they changed, as the
Operator's config-reloader sidecar does) and rewrites the file_sd files from a fresh discovery, so pods
that come and go (canaries) are picked up within about a second plus Prometheus' file_sd refresh.

With the Prometheus hack/build-binaries.sh builds (`built_prometheus`: Prometheus 3 with kubernetes_sd
compiled in), none of that emulation is needed: `native` writes the generated configuration as it is, with
one change. The Operator's kubernetes_sd_configs carry no `api_server`, so an in-cluster Prometheus uses
its service account (in-cluster config); outside the cluster each one gets the `api_server`, `tls_config`
and `authorization` of the API server the tests talk to (`api_access`), which is what in-cluster config
amounts to. `Reloader(native=...)` picks the mode (by default: native when that binary exists).

Used by tests/integration/test_prometheus_operator.py and the e2e monitoring (testing/vlm_testing/standin/monitoring.py).
"""

from __future__ import annotations

import base64
import copy
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import yaml
from kubernetes import client

SHARD = "0"
REPO = Path(__file__).resolve().parents[3]


def built_prometheus() -> Path | None:
    """The Prometheus hack/build-binaries.sh builds (kubernetes_sd compiled in), or None where it was not built."""
    out = subprocess.run(["bash", str(REPO / "hack" / "build-binaries.sh"), "--print-dir"], capture_output=True,
                         text=True, check=False).stdout.strip()
    path = Path(out) / "prometheus" if out else None
    return path if path and os.access(path, os.X_OK) else None


class Objects(Protocol):
    """What discovery reads from the API server (kubernetes client models); `Cluster` is the real one,
    unit tests pass lists."""

    def namespaces(self) -> list[str]: ...
    def pods(self, namespace: str) -> list[client.V1Pod]: ...
    def services(self, namespace: str) -> list[client.V1Service]: ...
    def endpoints(self, namespace: str) -> list[client.V1Endpoints]: ...
    def endpoint_slices(self, namespace: str) -> list[client.V1EndpointSlice]: ...


class Cluster:
    """`Objects` from the API server."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core, self.discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)

    def namespaces(self) -> list[str]:
        return [n.metadata.name for n in self.core.list_namespace().items]

    def pods(self, namespace: str) -> list[client.V1Pod]:
        return self.core.list_namespaced_pod(namespace).items

    def services(self, namespace: str) -> list[client.V1Service]:
        return self.core.list_namespaced_service(namespace).items

    def endpoints(self, namespace: str) -> list[client.V1Endpoints]:
        return self.core.list_namespaced_endpoints(namespace).items

    def endpoint_slices(self, namespace: str) -> list[client.V1EndpointSlice]:
        return self.discovery.list_namespaced_endpoint_slice(namespace).items


def sanitize(name: str) -> str:
    """A Kubernetes label name as kubernetes_sd writes it into a meta label name."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def labels(prefix: str, values: dict[str, str] | None, kind: str = "label") -> dict[str, str]:
    out = {}
    for k, v in (values or {}).items():
        out[f"{prefix}_{kind}_{sanitize(k)}"] = v
        out[f"{prefix}_{kind}present_{sanitize(k)}"] = "true"
    return out


def _ready(pod: client.V1Pod) -> str:
    for c in (pod.status.conditions or []) if pod.status else []:
        if c.type == "Ready":
            return "true" if c.status == "True" else "false"
    return "unknown"


def pod_meta(pod: client.V1Pod) -> dict[str, str]:
    """The pod-level meta labels of kubernetes_sd's pod role (also on endpoints targets backed by a pod)."""
    meta = pod.metadata
    out = {"__meta_kubernetes_namespace": meta.namespace, "__meta_kubernetes_pod_name": meta.name,
           "__meta_kubernetes_pod_ip": pod.status.pod_ip or "", "__meta_kubernetes_pod_phase": pod.status.phase or "",
           "__meta_kubernetes_pod_node_name": pod.spec.node_name or "",
           "__meta_kubernetes_pod_host_ip": pod.status.host_ip or "",
           "__meta_kubernetes_pod_uid": meta.uid or "", "__meta_kubernetes_pod_ready": _ready(pod),
           **labels("__meta_kubernetes_pod", meta.labels),
           **labels("__meta_kubernetes_pod", meta.annotations, "annotation")}
    for ref in meta.owner_references or []:
        if ref.controller:
            out["__meta_kubernetes_pod_controller_kind"] = ref.kind
            out["__meta_kubernetes_pod_controller_name"] = ref.name
    return out


def _namespaces(sd: dict[str, Any], objs: Objects) -> list[str]:
    names = (sd.get("namespaces") or {}).get("names")
    return list(names) if names else objs.namespaces()


def _pod_targets(objs: Objects, namespace: str) -> list[dict]:
    groups = []
    for p in objs.pods(namespace):
        if not p.status.pod_ip:  # kubernetes_sd gives a pod without an IP no targets
            continue
        for c in p.spec.containers:
            base = {**pod_meta(p), "__meta_kubernetes_pod_container_name": c.name,
                    "__meta_kubernetes_pod_container_image": c.image or "",
                    "__meta_kubernetes_pod_container_init": "false"}
            if not c.ports:  # a container without ports: one target on the pod IP alone
                groups.append({"targets": [p.status.pod_ip], "labels": base})
            for port in c.ports or []:
                groups.append({"targets": [f"{p.status.pod_ip}:{port.container_port}"], "labels": {
                    **base, "__meta_kubernetes_pod_container_port_name": port.name or "",
                    "__meta_kubernetes_pod_container_port_number": str(port.container_port),
                    "__meta_kubernetes_pod_container_port_protocol": port.protocol or "TCP"}})
    return groups


def _service_meta(svc: client.V1Service) -> dict[str, str]:
    return {"__meta_kubernetes_namespace": svc.metadata.namespace, "__meta_kubernetes_service_name": svc.metadata.name,
            **labels("__meta_kubernetes_service", svc.metadata.labels),
            **labels("__meta_kubernetes_service", svc.metadata.annotations, "annotation")}


def _container_port(pod: client.V1Pod, number: int | None) -> dict[str, str]:
    """The pod container labels of the container port an endpoint's port is (kubernetes_sd adds them)."""
    for c in pod.spec.containers:
        for cp in c.ports or []:
            if cp.container_port == number:
                return {"__meta_kubernetes_pod_container_name": c.name,
                        "__meta_kubernetes_pod_container_port_name": cp.name or "",
                        "__meta_kubernetes_pod_container_port_number": str(cp.container_port),
                        "__meta_kubernetes_pod_container_port_protocol": cp.protocol or "TCP"}
    return {}


def _endpoints_targets(objs: Objects, namespace: str) -> list[dict]:
    pods = {p.metadata.name: p for p in objs.pods(namespace) if p.status.pod_ip}
    endpoints = {e.metadata.name: e for e in objs.endpoints(namespace)}
    groups = []
    for svc in objs.services(namespace):
        ep = endpoints.get(svc.metadata.name)
        if ep is None:
            continue
        svc_meta = {**_service_meta(svc), "__meta_kubernetes_namespace": namespace,
                    "__meta_kubernetes_endpoints_name": ep.metadata.name,
                    **labels("__meta_kubernetes_endpoints", ep.metadata.labels)}
        for subset in ep.subsets or []:
            for addr, ready in [(a, "true") for a in subset.addresses or []] + \
                               [(a, "false") for a in subset.not_ready_addresses or []]:
                pod = pods.get(addr.target_ref.name) if addr.target_ref and addr.target_ref.kind == "Pod" else None
                for port in subset.ports or []:
                    lab = {**svc_meta, "__meta_kubernetes_endpoint_port_name": port.name or "",
                           "__meta_kubernetes_endpoint_port_protocol": port.protocol or "TCP",
                           "__meta_kubernetes_endpoint_ready": ready,
                           "__meta_kubernetes_endpoint_address_target_kind": addr.target_ref.kind if addr.target_ref else "",
                           "__meta_kubernetes_endpoint_address_target_name": addr.target_ref.name if addr.target_ref else ""}
                    if addr.node_name:
                        lab["__meta_kubernetes_endpoint_node_name"] = addr.node_name
                    if pod:
                        lab |= pod_meta(pod) | _container_port(pod, port.port)
                    groups.append({"targets": [f"{addr.ip}:{port.port}"], "labels": lab})
    return groups


def _bool(v: bool | None) -> str:
    return "true" if v else "false"


def _endpointslice_targets(objs: Objects, namespace: str) -> list[dict]:
    """kubernetes_sd's endpointslice role: one target per endpoint address and port of each EndpointSlice,
    with the Service's labels (the slice's kubernetes.io/service-name) and, for pod-backed ones, the pod's."""
    pods = {p.metadata.name: p for p in objs.pods(namespace) if p.status.pod_ip}
    services = {s.metadata.name: s for s in objs.services(namespace)}
    groups = []
    for es in objs.endpoint_slices(namespace):
        meta = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_endpointslice_name": es.metadata.name,
                "__meta_kubernetes_endpointslice_address_type": es.address_type,
                **labels("__meta_kubernetes_endpointslice", es.metadata.labels),
                **labels("__meta_kubernetes_endpointslice", es.metadata.annotations, "annotation")}
        svc = services.get((es.metadata.labels or {}).get("kubernetes.io/service-name", ""))
        if svc is not None:
            meta |= _service_meta(svc)
        for ep in es.endpoints or []:
            ref = ep.target_ref
            pod = pods.get(ref.name) if ref and ref.kind == "Pod" else None
            cond = ep.conditions
            for port in es.ports or []:
                lab = {**meta, "__meta_kubernetes_endpointslice_port": str(port.port),
                       "__meta_kubernetes_endpointslice_port_name": port.name or "",
                       "__meta_kubernetes_endpointslice_port_protocol": port.protocol or "TCP",
                       "__meta_kubernetes_endpointslice_endpoint_conditions_ready": _bool(cond and cond.ready),
                       "__meta_kubernetes_endpointslice_endpoint_conditions_serving": _bool(cond and cond.serving),
                       "__meta_kubernetes_endpointslice_endpoint_conditions_terminating":
                           _bool(cond and cond.terminating)}
                if port.app_protocol:
                    lab["__meta_kubernetes_endpointslice_port_app_protocol"] = port.app_protocol
                if ref:
                    lab["__meta_kubernetes_endpointslice_address_target_kind"] = ref.kind or ""
                    lab["__meta_kubernetes_endpointslice_address_target_name"] = ref.name or ""
                if ep.hostname:
                    lab["__meta_kubernetes_endpointslice_endpoint_hostname"] = ep.hostname
                if ep.node_name:
                    lab["__meta_kubernetes_endpointslice_endpoint_node_name"] = ep.node_name
                if pod:
                    lab |= pod_meta(pod) | _container_port(pod, port.port)
                groups += [{"targets": [f"{a}:{port.port}"], "labels": lab} for a in ep.addresses]
    return groups


ROLES = {"pod": _pod_targets, "endpoints": _endpoints_targets, "endpointslice": _endpointslice_targets}


def sd_sections(cfg: dict) -> Iterator[tuple[str, dict]]:
    """Every part of `cfg` that discovers with kubernetes_sd, keyed by a name for its file: each scrape job
    (its job_name) and each Alertmanager set of the alerting section that does (`alertmanager/<index>`;
    a static one, e.g. from additionalAlertManagerConfigs, is left as it is)."""
    for job in cfg.get("scrape_configs") or []:
        yield job["job_name"], job
    for i, am in enumerate((cfg.get("alerting") or {}).get("alertmanagers") or []):
        if "kubernetes_sd_configs" in am:
            yield f"alertmanager/{i}", am


def discover(api: client.ApiClient | Objects, cfg: dict) -> dict[str, list[dict]]:
    """What kubernetes_sd (role pod / endpoints / endpointslice) would hand each scrape job and each
    Alertmanager set of `cfg` (keys as `sd_sections` names them): one file_sd group per target."""
    objs = Cluster(api) if isinstance(api, client.ApiClient) else api
    out: dict[str, list[dict]] = {}
    for key, section in sd_sections(cfg):
        sds = section.get("kubernetes_sd_configs") or []
        if len(sds) != 1:
            raise ValueError(f"{key}: expected one kubernetes_sd_configs, got {len(sds)}")
        (sd,) = sds
        if sd.get("selectors"):
            raise ValueError(f"{key}: kubernetes_sd selectors are not emulated")
        if sd["role"] not in ROLES:
            raise ValueError(f"{key}: kubernetes_sd role {sd['role']} is not emulated")
        groups = out.setdefault(key, [])
        for ns in _namespaces(sd, objs):
            groups += ROLES[sd["role"]](objs, ns)
    return out


def sd_file(workdir: Path, job_name: str) -> Path:
    return workdir / "sd" / (re.sub(r"[^A-Za-z0-9]+", "_", job_name).strip("_") + ".json")


def _write(path: Path, text: str) -> bool:
    """Write atomically, only when the content changed; whether it did."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return True


def write_targets(cfg: dict, workdir: Path, targets: dict[str, list[dict]]) -> None:
    for key, _ in sd_sections(cfg):
        _write(sd_file(workdir, key), json.dumps(targets.get(key, []), indent=1, sort_keys=True))


def _write_rules(rules: dict[str, str], workdir: Path) -> Path:
    """The rule files under workdir/rules (stale ones removed); the directory."""
    rules_dir = workdir / "rules"
    rules_dir.mkdir(parents=True, exist_ok=True)
    for old in rules_dir.glob("*"):
        if old.name not in rules:
            old.unlink()
    for fname, text in rules.items():
        _write(rules_dir / fname, text)
    return rules_dir


def _write_config(cfg: dict, workdir: Path, alertmanager: str | None) -> Path:
    """The config as the config-reloader would hand it over (`$(SHARD)`, `$(POD_NAME)` substituted), plus
    the static Alertmanager (see `runnable`); its path."""
    if alertmanager and not (cfg.get("alerting") or {}).get("alertmanagers"):
        cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    text = yaml.safe_dump(cfg, sort_keys=False).replace("$(SHARD)", SHARD).replace("$(POD_NAME)", "prometheus-0")
    path = workdir / "prometheus.yaml"
    _write(path, text)
    return path


def runnable(cfg: dict, rules: dict[str, str], workdir: Path, targets: dict[str, list[dict]] | None = None,
             alertmanager: str | None = None, sd_refresh: str = "1s") -> Path:
    """Write the generated config as Debian's Prometheus can load it (see the module docstring) and its
    rule files and file_sd files under `workdir`; the config's path. `alertmanager` (host:port): a static
    Alertmanager, only for a caller that passes one and only when the generated config has no Alertmanagers
    (a Prometheus object without spec.alerting); the generated ones are discovered like the scrape targets."""
    rules_dir = _write_rules(rules, workdir)
    cfg = copy.deepcopy(cfg)
    cfg["rule_files"] = [str(rules_dir / "*")]
    for key, section in list(sd_sections(cfg)):
        section.pop("kubernetes_sd_configs", None)
        path = sd_file(workdir, key)
        if targets is not None or not path.exists():
            _write(path, json.dumps((targets or {}).get(key, []), indent=1, sort_keys=True))
        section["file_sd_configs"] = [{"files": [str(path)], "refresh_interval": sd_refresh}]
    return _write_config(cfg, workdir, alertmanager)


def api_access(api: client.ApiClient, workdir: Path) -> dict[str, Any]:
    """What a kubernetes_sd_config needs to reach the API server `api` talks to, as in-cluster config would
    give it (server, CA, token): `api_server`, `tls_config` and, for a token, `authorization`, with the CA,
    client certificate and token as files under workdir/kube (Prometheus reads the token file anew on each
    request)."""
    conf = api.configuration
    kdir = workdir / "kube"
    kdir.mkdir(parents=True, exist_ok=True)
    tls: dict[str, Any] = {}
    if not conf.verify_ssl:
        tls["insecure_skip_verify"] = True
    for key, src in (("ca_file", conf.ssl_ca_cert), ("cert_file", conf.cert_file), ("key_file", conf.key_file)):
        if src:  # the client's copies are temp files of its process: Prometheus gets its own
            dst = kdir / key.removesuffix("_file")
            shutil.copyfile(src, dst)
            dst.chmod(0o600)
            tls[key] = str(dst)
    out: dict[str, Any] = {"api_server": conf.host}
    if tls:
        out["tls_config"] = tls
    bearer = (conf.api_key or {}).get("authorization") or (conf.api_key or {}).get("BearerToken")
    if bearer:
        token = kdir / "token"
        _write(token, bearer.removeprefix("Bearer ").strip())
        token.chmod(0o600)
        out["authorization"] = {"type": "Bearer", "credentials_file": str(token)}
    return out


def native(cfg: dict, rules: dict[str, str], workdir: Path, access: dict[str, Any],
           alertmanager: str | None = None) -> Path:
    """Write the generated config for a Prometheus with kubernetes_sd (see the module docstring) and its rule
    files under `workdir`; the config's path. The only change to the generated text besides the rule files'
    place and the reloader's substitutions: each kubernetes_sd_config without an `api_server` (all the
    Operator generates without spec.apiserverConfig) gets `access` (`api_access`). `alertmanager` as in
    `runnable`."""
    rules_dir = _write_rules(rules, workdir)
    cfg = copy.deepcopy(cfg)
    cfg["rule_files"] = [str(rules_dir / "*")]
    for _, section in sd_sections(cfg):
        for sd in section.get("kubernetes_sd_configs") or []:
            if "api_server" not in sd and "kubeconfig_file" not in sd:
                sd.update(copy.deepcopy(access))
    return _write_config(cfg, workdir, alertmanager)


def read_generated(api: client.ApiClient, namespace: str, prometheus: str) -> tuple[dict, dict[str, str]] | None:
    """What the Prometheus Operator generated for Prometheus `prometheus`: (config, {rule file: text}), or
    None while it has not (yet) written the secret."""
    core = client.CoreV1Api(api)
    try:
        secret = core.read_namespaced_secret(f"prometheus-{prometheus}", namespace)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise
    raw = (secret.data or {}).get("prometheus.yaml.gz")
    if not raw:
        return None
    cfg = yaml.safe_load(gzip.decompress(base64.b64decode(raw))) or {}
    rules: dict[str, str] = {}
    sel = f"prometheus-name={prometheus}"
    for cm in core.list_namespaced_config_map(namespace, label_selector=sel).items:
        if cm.metadata.name.startswith(f"prometheus-{prometheus}-rulefiles-"):
            rules.update(cm.data or {})
    return cfg, rules


class Reloader:
    """Keeps `workdir` in step with the cluster: the generated config and rules (calls `reload` after
    rewriting them) and, emulating, the file_sd files (discovery), every `period` seconds, on a daemon
    thread. `native`: whether the config is for the built Prometheus with kubernetes_sd (`native`, no
    emulation) or for Debian's (`runnable`); by default, whether that Prometheus was built. `binary` is the
    Prometheus to run it with (None: Debian's)."""

    def __init__(self, api: client.ApiClient, namespace: str, prometheus: str, workdir: Path,
                 alertmanager: str | None = None, period: float = 1.0, native: bool | None = None) -> None:
        self.api, self.namespace, self.prometheus, self.workdir = api, namespace, prometheus, workdir
        self.alertmanager, self.period = alertmanager, period
        built = built_prometheus() if native is not False else None
        if native and built is None:
            raise RuntimeError("native kubernetes_sd needs the Prometheus hack/build-binaries.sh builds")
        self.native = built is not None
        self.binary: Path | None = built
        self.reload: Callable[[], None] = lambda: None
        self.cfg: dict | None = None
        self.rules: dict[str, str] = {}
        self.generations = 0  # how many distinct generated configs/rule sets were applied
        self.errors = 0
        self._key: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def config_file(self) -> Path:
        return self.workdir / "prometheus.yaml"

    def sync(self) -> bool:
        """One round; whether the config or the rules changed (Prometheus should reload)."""
        with self._lock:
            got = read_generated(self.api, self.namespace, self.prometheus)
            if got is None:
                return False
            cfg, rules = got
            key = json.dumps([cfg, rules], sort_keys=True)
            changed = key != self._key
            if self.native:
                if changed:
                    native(cfg, rules, self.workdir, api_access(self.api, self.workdir), self.alertmanager)
            else:
                targets = discover(self.api, cfg)
                if changed:
                    runnable(cfg, rules, self.workdir, targets, alertmanager=self.alertmanager)
                else:
                    write_targets(cfg, self.workdir, targets)
            if changed:
                self.cfg, self.rules, self._key = cfg, rules, key
                self.generations += 1
            return changed

    def start(self) -> Reloader:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="kube-sd")
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                if self.sync():
                    self.reload()
            except Exception as e:  # a flaky API call must not end the loop; the next round retries
                self.errors += 1
                print(f"[kube_sd] sync failed: {e}", file=sys.stderr)

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)
