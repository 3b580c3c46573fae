"""The generated configuration for the Prometheus with kubernetes_sd (testing/vlm_testing/standin/kube_sd.py `native`):
the Operator's text as it is, each kubernetes_sd_config given the API server and credentials that
in-cluster config would supply, and the Reloader that writes it instead of the file_sd emulation.

The scrape job is the shape prometheus-operator v0.85.0 generates for a PodMonitor (its `kubernetes_sd_configs`
carry no `api_server`: in a cluster Prometheus uses its service account).
"""

from __future__ import annotations

import copy
import stat
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from vlm_testing.standin import kube_sd

NS = "mon"
SERVER = "https://127.0.0.1:46443"

POD_JOB = {
    "job_name": f"podMonitor/{NS}/vlm-operator-pods/0",
    "honor_labels": True,
    "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [NS]}}],
    "scrape_interval": "15s",
    "metrics_path": "/metrics",
    "relabel_configs": [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name",
                                             "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name"],
         "regex": "(vlm-sidecar);true"},
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics"},
        {"source_labels": ["__address__", "__tmp_hash"], "target_label": "__tmp_hash", "modulus": 1,
         "action": "hashmod"},
        {"source_labels": ["__tmp_hash"], "regex": "$(SHARD)", "action": "keep"},
    ],
}
STATIC_JOB = {"job_name": "static", "static_configs": [{"targets": ["127.0.0.1:1"]}]}
ALERTING = {"alertmanagers": [{
    "path_prefix": "/", "scheme": "http", "api_version": "v2",
    "kubernetes_sd_configs": [{"role": "endpoints", "namespaces": {"names": [NS]}}],
    "relabel_configs": [{"action": "keep", "source_labels": ["__meta_kubernetes_service_name"],
                         "regex": "kps-alertmanager"}],
}]}
GENERATED = {"global": {"evaluation_interval": "15s", "external_labels": {"prometheus_replica": "$(POD_NAME)"}},
             "scrape_configs": [POD_JOB, STATIC_JOB], "alerting": ALERTING}
RULES = {"mon-vlm-operator-rules.yaml": "groups: []\n"}


def _api(tmp_path: Path, token: str | None = "s3cret", verify: bool = True) -> client.ApiClient:
    """A client configured as kubernetes.config builds it from the testbed's kubeconfig (CA file, token)."""
    conf = client.Configuration()
    conf.host = SERVER
    ca = tmp_path / "client-ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    conf.ssl_ca_cert = str(ca)
    conf.verify_ssl = verify
    if token:
        conf.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(conf)


def test_api_access_is_the_server_ca_and_token_as_private_files(tmp_path):
    access = kube_sd.api_access(_api(tmp_path), tmp_path / "w")
    assert access["api_server"] == SERVER
    ca, token = Path(access["tls_config"]["ca_file"]), Path(access["authorization"]["credentials_file"])
    assert access["authorization"]["type"] == "Bearer"
    assert token.read_text() == "s3cret"  # the bare token: Prometheus adds "Bearer " itself
    assert ca.read_text() == (tmp_path / "client-ca.crt").read_text()
    assert ca.parent == tmp_path / "w" / "kube"  # a copy Prometheus owns, not the client's temp file
    for f in (ca, token):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert "insecure_skip_verify" not in access["tls_config"]


def test_api_access_without_token_or_verification(tmp_path):
    access = kube_sd.api_access(_api(tmp_path, token=None, verify=False), tmp_path / "w")
    assert "authorization" not in access
    assert access["tls_config"]["insecure_skip_verify"] is True


def test_native_keeps_the_generated_config_and_only_adds_the_api_server(tmp_path):
    access = kube_sd.api_access(_api(tmp_path), tmp_path)
    path = kube_sd.native(GENERATED, RULES, tmp_path, access)
    out = yaml.safe_load(path.read_text())
    job, static = out["scrape_configs"]
    (sd,) = job["kubernetes_sd_configs"]
    assert sd == {"role": "pod", "namespaces": {"names": [NS]}, **access}
    (am_sd,) = out["alerting"]["alertmanagers"][0]["kubernetes_sd_configs"]
    assert am_sd == {"role": "endpoints", "namespaces": {"names": [NS]}, **access}
    assert "file_sd_configs" not in job and not (tmp_path / "sd").exists()  # no emulation
    assert static == STATIC_JOB
    # Everything else is the generated text, with the config-reloader's substitutions.
    want = copy.deepcopy(GENERATED)
    for section in (want["scrape_configs"][0], want["alerting"]["alertmanagers"][0]):
        section["kubernetes_sd_configs"][0].update(access)
    # A textual substitution, as the config-reloader's: `regex: 0` reads back as a YAML int.
    want["scrape_configs"][0]["relabel_configs"][-1]["regex"] = int(kube_sd.SHARD)
    want["global"]["external_labels"]["prometheus_replica"] = "prometheus-0"
    want["rule_files"] = [str(tmp_path / "rules" / "*")]
    assert out == want
    assert (tmp_path / "rules" / "mon-vlm-operator-rules.yaml").read_text() == "groups: []\n"
    assert "api_server" not in GENERATED["scrape_configs"][0]["kubernetes_sd_configs"][0]  # input untouched


def test_native_leaves_an_explicit_api_server_alone(tmp_path):
    own = {"role": "pod", "api_server": "https://elsewhere:6443"}
    cfg = {"scrape_configs": [{"job_name": "j", "kubernetes_sd_configs": [own]}]}
    out = yaml.safe_load(kube_sd.native(cfg, {}, tmp_path, {"api_server": SERVER}).read_text())
    assert out["scrape_configs"][0]["kubernetes_sd_configs"] == [own]


def test_native_rule_files_follow_the_generated_ones(tmp_path):
    kube_sd.native(GENERATED, {"a.yaml": "groups: []\n", "b.yaml": "groups: []\n"}, tmp_path, {})
    kube_sd.native(GENERATED, {"b.yaml": "groups: []\n"}, tmp_path, {})
    assert sorted(p.name for p in (tmp_path / "rules").iterdir()) == ["b.yaml"]


def _reloader(monkeypatch, tmp_path: Path, built: Path | None, native: bool | None) -> kube_sd.Reloader:
    monkeypatch.setattr(kube_sd, "built_prometheus", lambda: built)
    generated = [(GENERATED, RULES)]
    monkeypatch.setattr(kube_sd, "read_generated", lambda api, ns, name: generated[-1])
    return kube_sd.Reloader(_api(tmp_path), NS, "kps", tmp_path / "gen", native=native)


def test_the_reloader_runs_the_generated_config_natively_where_prometheus_was_built(monkeypatch, tmp_path):
    def no_discovery(*_):
        raise AssertionError("native mode must not emulate discovery")

    monkeypatch.setattr(kube_sd, "discover", no_discovery)
    rel = _reloader(monkeypatch, tmp_path, tmp_path / "prometheus", None)
    assert rel.native and rel.binary == tmp_path / "prometheus"
    assert rel.sync() is True and rel.generations == 1
    out = yaml.safe_load(rel.config_file.read_text())
    assert out["scrape_configs"][0]["kubernetes_sd_configs"][0]["api_server"] == SERVER
    assert rel.sync() is False and rel.generations == 1  # unchanged secret: no rewrite, no reload


def test_the_reloader_falls_back_to_the_emulation_without_the_built_prometheus(monkeypatch, tmp_path):
    monkeypatch.setattr(kube_sd, "discover", lambda api, cfg: {})
    rel = _reloader(monkeypatch, tmp_path, None, None)
    assert not rel.native and rel.binary is None
    assert rel.sync() is True
    job = yaml.safe_load(rel.config_file.read_text())["scrape_configs"][0]
    assert "kubernetes_sd_configs" not in job and job["file_sd_configs"]


def test_the_reloader_can_be_told_to_emulate_or_refuses_native_without_the_binary(monkeypatch, tmp_path):
    assert not _reloader(monkeypatch, tmp_path, tmp_path / "prometheus", False).native
    with pytest.raises(RuntimeError, match="build-binaries"):
        _reloader(monkeypatch, tmp_path, None, True)


def test_built_prometheus_is_the_cache_dirs_executable(monkeypatch, tmp_path):
    monkeypatch.setenv("VLM_CACHE", str(tmp_path))
    assert kube_sd.built_prometheus() is None
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "prometheus"
    exe.write_text("#!/bin/sh\n")
    assert kube_sd.built_prometheus() is None  # not executable
    exe.chmod(0o755)
    assert kube_sd.built_prometheus() == exe
