"""Shared by tests (moved out of tests/integration/test_operator.py, so no test imports another test module)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from vlm_testing.cluster import REPO, wait_for
from vlm_testing.operator_proc import (
    GROUP,
    PLURAL,
    VERSION,
    condition,
    dump,
    get_vlms,
    vlms,
)

EXAMPLES = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((REPO / "examples").glob("*.yaml"))}


def create(kube, namespace: str, doc: dict) -> dict:
    body = copy.deepcopy(doc)
    body["metadata"] = {"name": doc["metadata"]["name"]}
    return vlms(kube).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def patch_spec(kube, namespace: str, name: str, spec_patch: dict) -> None:
    vlms(kube).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": spec_patch})


def wait_condition(kube, namespace, name, type_, status, reason=None, timeout=60.0, op=None):
    def check():
        obj = get_vlms(kube, namespace, name)
        c = condition(obj, type_)
        if c and c["status"] == status and (reason is None or c["reason"] == reason):
            return obj
        return None

    try:
        return wait_for(check, timeout, f"{name} {type_}={status} {reason or ''}")
    except AssertionError:
        obj = get_vlms(kube, namespace, name)
        raise AssertionError(f"{type_}={status}/{reason} not reached; status:\n{dump(obj.get('status'))}\n"
                             f"operator log:\n{op.log_tail() if op else ''}") from None


LABEL = "serving.vlmops.dev/profile"


IMAGE = "vlmops/vlm-sidecar:inject-test"


def render_webhook(cluster, release: str, operator_ns: str, namespaces: list[str]) -> list[dict]:
    """The chart's templates/webhook.yaml (helm template, injection.enabled), its namespaces narrowed to the
    given ones (an extra matchExpression, ANDed with the chart's own selectors)."""
    selector = json.dumps([{"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}])
    out = subprocess.run(
        [str(cluster.bin_dir / "helm"), "template", release, str(REPO / "charts" / "vlm-operator"), "--namespace",
         operator_ns, "--kube-version", "1.34.4", "--show-only", "templates/webhook.yaml",
         "--set", "injection.enabled=true",
         "--set-json", f"injection.namespaceSelector.matchExpressions={selector}"],
        capture_output=True, text=True, check=True, timeout=60,
        env={**os.environ, "HELM_CACHE_HOME": "/tmp/vlm-helm-cache", "HELM_CONFIG_HOME": "/tmp/vlm-helm-config",
             "HELM_DATA_HOME": "/tmp/vlm-helm-data"}).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def webhook_configuration(cluster, name: str, port: int, operator_ns: str, namespaces: list[str]) -> dict:
    """The chart's MutatingWebhookConfiguration, renamed, calling 127.0.0.1:port instead of the Service."""
    (mwc,) = [d for d in render_webhook(cluster, "vlm", operator_ns, namespaces)
              if d["kind"] == "MutatingWebhookConfiguration"]
    mwc["metadata"] = {"name": name}
    for hook in mwc["webhooks"]:
        assert hook["failurePolicy"] == "Ignore"
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/mutate"}
    return mwc


def _delete_later(request, adm, name: str) -> None:
    """Delete the (cluster-scoped) configuration after the test, whatever happens in it."""
    def delete() -> None:
        try:
            adm.delete_mutating_webhook_configuration(name)
        except ApiException as e:
            if e.status != 404:
                raise
    request.addfinalizer(delete)


def _token(kube: client.ApiClient, namespace: str, sa: str) -> str:
    """A token for the ServiceAccount from the TokenRequest API (what `kubectl create token` asks)."""
    req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
    return client.CoreV1Api(kube).create_namespaced_service_account_token(sa, namespace, req).status.token


def _established(crd: dict) -> bool:
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


def _in(namespace: str, path: Path) -> list[dict]:
    out = []
    for d in yaml.safe_load_all(path.read_text()):
        if d:
            d["metadata"]["namespace"] = namespace
            for s in (d.get("subjects") or []):
                s["namespace"] = namespace
            out.append(d)
    return out


def _dry_run(cluster, obj: dict) -> dict:
    got = cluster.kubectl("apply", "--server-side", "--dry-run=server", "--field-manager=vlm-test", "-o", "json",
                          "-f", "-", stdin=json.dumps(obj))
    return json.loads(got)


def _kept(sent: Any, got: Any, where: str = "") -> list[str]:
    """Paths of `sent` missing or changed in `got` (what the schema pruned or rewrote)."""
    if isinstance(sent, dict):
        if not isinstance(got, dict):
            return [where]
        return [p for k, v in sent.items() for p in (_kept(v, got[k], f"{where}.{k}") if k in got else [f"{where}.{k}"])]
    if isinstance(sent, list):
        if not isinstance(got, list) or len(got) != len(sent):
            return [where]
        return [p for i, (a, b) in enumerate(zip(sent, got, strict=True)) for p in _kept(a, b, f"{where}[{i}]")]
    return [] if sent == got or str(sent) == str(got) else [where]


def _monitoring_crd(plural: str, kind: str) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
        },
    }


def ensure_monitoring_crds(kube) -> None:
    """The Prometheus Operator's PodMonitor and PrometheusRule CRDs, Established: minimal stand-ins (same group,
    kinds and scope; schema left open) unless another worker installed them (or the real ones) already. They stay
    for the session on the shared testbed; a test whose operators must all see the same CRDs (one that restarts
    its operator) installs them first, so a worker installing them meanwhile changes nothing for it."""
    ext = client.ApiextensionsV1Api(kube)
    names = {c.metadata.name for c in ext.list_custom_resource_definition().items}
    for plural, kind in (("podmonitors", "PodMonitor"), ("prometheusrules", "PrometheusRule")):
        if f"{plural}.monitoring.coreos.com" not in names:
            try:
                ext.create_custom_resource_definition(_monitoring_crd(plural, kind))
            except ApiException as e:
                if e.status != 409:  # another worker installed the real ones meanwhile (shared testbed)
                    raise
        # Polled, not `kubectl wait --for=condition`: that fails at once on a CRD the API server has given no
        # condition yet (one another worker applied a moment ago, on a shared testbed).
        wait_for(lambda p=plural: any(c.type == "Established" and c.status == "True" for c in
                                      ext.read_custom_resource_definition(f"{p}.monitoring.coreos.com").status.conditions
                                      or []),
                 60, f"CRD {plural}.monitoring.coreos.com Established", interval=0.5)
