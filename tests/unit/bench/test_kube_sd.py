"""The kubernetes_sd emulation (testing/vlm_testing/standin/kube_sd.py) for the alerting section the Prometheus Operator
generates: an Alertmanager found through its Service's Endpoints (role endpoints) or EndpointSlices (role
endpointslice), selected by the generated keep relabelings, and written as file_sd Prometheus can load.

The alerting sections are what prometheus-operator v0.85.0 generated for a Prometheus object with
`spec.alerting.alertmanagers: [{namespace: mon, name: kps-alertmanager, port: web}]`, with the default
service discovery role and with `serviceDiscoveryRole: EndpointSlice` (read from its secret on the testbed).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from vlm_testing.standin import kube_sd, prom_operator

NS = "mon"
AM_PORT = 41234


def _alerting(role: str, port_label: str) -> dict:
    return {
        "alert_relabel_configs": [{"action": "labeldrop", "regex": "prometheus_replica"}],
        "alertmanagers": [{
            "path_prefix": "/", "scheme": "http", "api_version": "v2",
            "kubernetes_sd_configs": [{"role": role, "namespaces": {"names": [NS]}}],
            "relabel_configs": [
                {"action": "keep", "source_labels": ["__meta_kubernetes_service_name"], "regex": "kps-alertmanager"},
                {"action": "keep", "source_labels": [port_label], "regex": "web"},
            ],
        }],
    }


GENERATED = {
    "endpoints": _alerting("endpoints", "__meta_kubernetes_endpoint_port_name"),
    "endpointslice": _alerting("endpointslice", "__meta_kubernetes_endpointslice_port_name"),
}


def _pod(name: str, ip: str, labels: dict, port_name: str, port: int) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace=NS, labels=labels, uid=f"uid-{name}"),
        spec=client.V1PodSpec(node_name="gpu-node-0", containers=[client.V1Container(
            name=name.split("-")[0], image="x", ports=[client.V1ContainerPort(name=port_name, container_port=port)])]),
        status=client.V1PodStatus(pod_ip=ip, phase="Running", host_ip="10.0.0.1",
                                  conditions=[client.V1PodCondition(type="Ready", status="True")]))


class Objects:
    """What the API server would list: the Alertmanager's Service and pod from prom_operator's builder,
    and the `prometheus-operated` Service the Prometheus Operator creates (port `web` too, other name)."""

    def __init__(self) -> None:
        svc_doc, pod_doc = prom_operator.alertmanager_objects("kps-alertmanager", NS, AM_PORT)
        sel = pod_doc["metadata"]["labels"]
        self.am_pod = _pod(pod_doc["metadata"]["name"], "10.244.0.3", sel, "web", AM_PORT)
        self.prom_pod = _pod("prometheus-kps-0", "10.244.0.4", {"app.kubernetes.io/name": "prometheus"}, "web", 9090)
        self._services = [
            client.V1Service(metadata=client.V1ObjectMeta(name=svc_doc["metadata"]["name"], namespace=NS,
                                                          labels=svc_doc["metadata"]["labels"])),
            client.V1Service(metadata=client.V1ObjectMeta(name="prometheus-operated", namespace=NS)),
        ]
        self._pods = [self.am_pod, self.prom_pod]

    def _addr(self, pod: client.V1Pod) -> client.V1EndpointAddress:
        return client.V1EndpointAddress(ip=pod.status.pod_ip, node_name="gpu-node-0",
                                        target_ref=client.V1ObjectReference(kind="Pod", name=pod.metadata.name))

    def namespaces(self):
        return [NS]

    def pods(self, namespace):
        return self._pods if namespace == NS else []

    def services(self, namespace):
        return self._services if namespace == NS else []

    def endpoints(self, namespace):
        def ep(name, pod, port):
            return client.V1Endpoints(metadata=client.V1ObjectMeta(name=name, namespace=NS), subsets=[
                client.V1EndpointSubset(addresses=[self._addr(pod)],
                                        ports=[client.CoreV1EndpointPort(name="web", port=port, protocol="TCP")])])
        return [ep("kps-alertmanager", self.am_pod, AM_PORT), ep("prometheus-operated", self.prom_pod, 9090)]

    def endpoint_slices(self, namespace):
        def es(svc, pod, port):
            return client.V1EndpointSlice(
                address_type="IPv4",
                metadata=client.V1ObjectMeta(name=f"{svc}-abcde", namespace=NS,
                                             labels={"kubernetes.io/service-name": svc}),
                endpoints=[client.V1Endpoint(addresses=[pod.status.pod_ip], node_name="gpu-node-0",
                                             conditions=client.V1EndpointConditions(ready=True, serving=True,
                                                                                    terminating=False),
                                             target_ref=client.V1ObjectReference(kind="Pod", name=pod.metadata.name))],
                ports=[client.DiscoveryV1EndpointPort(name="web", port=port, protocol="TCP")])
        return [es("kps-alertmanager", self.am_pod, AM_PORT), es("prometheus-operated", self.prom_pod, 9090)]


def _keep(groups: list[dict], relabel: list[dict]) -> list[str]:
    """The targets the generated `keep` relabelings leave (the only action they use)."""
    out = []
    for g in groups:
        lab = g["labels"]
        if all(r["action"] == "keep" and re.fullmatch(r["regex"], ";".join(lab.get(s, "") for s in r["source_labels"]))
               for r in relabel):
            out += g["targets"]
    return out


@pytest.mark.parametrize("role", sorted(GENERATED))
def test_the_generated_alerting_section_finds_the_alertmanager_pod(role):
    cfg = {"scrape_configs": [], "alerting": copy.deepcopy(GENERATED[role])}
    found = kube_sd.discover(Objects(), cfg)
    assert set(found) == {"alertmanager/0"}
    groups = found["alertmanager/0"]
    assert sorted(t for g in groups for t in g["targets"]) == [f"10.244.0.3:{AM_PORT}", "10.244.0.4:9090"]
    # The keep rules on Service name and port name leave exactly the Alertmanager's pod IP and port.
    assert _keep(groups, cfg["alerting"]["alertmanagers"][0]["relabel_configs"]) == [f"10.244.0.3:{AM_PORT}"]
    am = next(g["labels"] for g in groups if g["targets"] == [f"10.244.0.3:{AM_PORT}"])
    assert am["__meta_kubernetes_pod_name"] == "kps-alertmanager-0"
    assert am["__meta_kubernetes_pod_container_port_name"] == "web"
    assert am["__meta_kubernetes_service_label_release"] == prom_operator.RELEASE
    if role == "endpointslice":
        assert am["__meta_kubernetes_endpointslice_endpoint_conditions_ready"] == "true"
        assert am["__meta_kubernetes_endpointslice_address_target_name"] == "kps-alertmanager-0"
        assert am["__meta_kubernetes_endpointslice_port"] == str(AM_PORT)
    else:
        assert am["__meta_kubernetes_endpoint_ready"] == "true"


def test_an_unemulated_role_is_refused():
    cfg = {"alerting": {"alertmanagers": [{"kubernetes_sd_configs": [{"role": "ingress"}]}]}}
    with pytest.raises(ValueError, match="role ingress is not emulated"):
        kube_sd.discover(Objects(), cfg)


def test_runnable_turns_the_discovered_alertmanagers_into_file_sd_without_a_static_one(tmp_path):
    cfg = {"global": {"evaluation_interval": "30s"}, "scrape_configs": [], "alerting": GENERATED["endpoints"]}
    path = kube_sd.runnable(cfg, {}, tmp_path, kube_sd.discover(Objects(), cfg), alertmanager="127.0.0.1:9093")
    out = yaml.safe_load(path.read_text())
    (am,) = out["alerting"]["alertmanagers"]
    assert "kubernetes_sd_configs" not in am and "static_configs" not in am  # the caller's fallback is unused
    assert am["relabel_configs"] == GENERATED["endpoints"]["alertmanagers"][0]["relabel_configs"]
    (sd,) = am["file_sd_configs"]
    groups = json.loads(Path(sd["files"][0]).read_text())
    assert f"10.244.0.3:{AM_PORT}" in [t for g in groups for t in g["targets"]]
    assert cfg["alerting"]["alertmanagers"][0]["kubernetes_sd_configs"]  # the generated config is not changed
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: run hack/install-system-deps.sh (Debian package prometheus)")
    res = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_static_alertmanager_only_for_a_caller_that_passes_one_and_a_config_without_any(tmp_path):
    bare = {"scrape_configs": []}
    with_static = yaml.safe_load(kube_sd.runnable(bare, {}, tmp_path / "a", {}, alertmanager="127.0.0.1:9093")
                                 .read_text())
    assert with_static["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": ["127.0.0.1:9093"]}]}]}
    without = yaml.safe_load(kube_sd.runnable(bare, {}, tmp_path / "b", {}).read_text())
    assert "alerting" not in without


def test_write_targets_refreshes_the_alertmanager_file(tmp_path):
    cfg = {"scrape_configs": [], "alerting": GENERATED["endpointslice"]}
    kube_sd.runnable(cfg, {}, tmp_path, {})
    f = kube_sd.sd_file(tmp_path, "alertmanager/0")
    assert json.loads(f.read_text()) == []
    kube_sd.write_targets(cfg, tmp_path, kube_sd.discover(Objects(), cfg))
    assert len(json.loads(f.read_text())) == 2
