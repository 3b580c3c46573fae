"""The chart's operator settings that reach the operator as files and lists: Prometheus credentials from Secrets
(mounted whole, read at every query), the CA from a Secret or a ConfigMap, tenant headers, the sidecar image's
pull secrets and the NetworkPolicy's extra scrapers. The rendered environment is read back through the
operator's own settings (what it would start with), and every file it names lies in a mounted volume."""

from __future__ import annotations

import pytest

from vlm_operator.analysis.sources.base import PrometheusAuth
from vlm_operator.api.settings import Settings
from vlm_testing.chart import GOLDEN, by_kind, docs, helm, template

URL = "https://mimir-gateway.monitoring.svc:8080/prometheus"


def _operator(*values: str, golden: str | None = None) -> tuple[dict, dict]:
    """(the operator container, the pod spec) as rendered."""
    (dep,) = by_kind(docs(template(GOLDEN / f"{golden}.values.yaml" if golden else None, *values)), "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    return c, pod


def _env(c: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


def _mounted(c: dict, pod: dict, path: str) -> dict:
    """The volume the file `path` lies in (its mount whole: no subPath), and that the volume projects it."""
    (m,) = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert "subPath" not in m and m.get("readOnly") is True, m
    (v,) = [v for v in pod["volumes"] if v["name"] == m["name"]]
    source = v.get("secret") or v.get("configMap")
    assert [i["path"] for i in source["items"]] == [path[len(m["mountPath"]) + 1:]], (path, v)
    return v


def test_basic_auth_ca_headers_pull_secrets_and_scrapers_reach_the_operator():
    c, pod = _operator(golden="prometheus-auth")
    env = _env(c)
    s = Settings.from_env(env)  # the operator starts with what the chart renders
    auth = PrometheusAuth.from_settings(s)
    assert auth.url == URL and auth.basic_auth_username == "vlm-operator" and not auth.bearer_token_file
    assert auth.headers == (("X-Scope-OrgID", "ml-platform"),)
    pw = _mounted(c, pod, s.prometheus_basic_auth_password_file)
    assert pw["secret"] == {"secretName": "mimir-credentials", "items": [{"key": "password", "path": "password"}]}
    ca = _mounted(c, pod, s.prometheus_ca_file)
    assert ca["configMap"]["name"] == "cluster-ca-bundle" and ca["configMap"]["items"][0]["key"] == "ca-bundle.crt"
    assert s.sidecar_image_pull_secrets == ("registry-credentials",)
    assert s.profiler_scrapers == ("monitoring/alloy", "vmagent") and s.profiler_peer_cidrs == ("10.96.0.1/32",)
    assert "VLM_PROMETHEUS_BEARER_TOKEN_FILE" not in env


def test_bearer_token_and_a_ca_secret():
    c, pod = _operator("--set", f"operator.prometheusURL={URL}",
                       "--set", "operator.prometheusAuth.bearerToken.secretName=mimir-token",
                       "--set", "operator.prometheusAuth.ca.secretName=mimir-tls",
                       "--set", "operator.sidecarImagePullSecrets[0].name=a",
                       "--set", "operator.sidecarImagePullSecrets[1].name=b")
    s = Settings.from_env(_env(c))
    tok = _mounted(c, pod, s.prometheus_bearer_token_file)
    assert tok["secret"] == {"secretName": "mimir-token", "items": [{"key": "token", "path": "token"}]}
    assert _mounted(c, pod, s.prometheus_ca_file)["secret"]["secretName"] == "mimir-tls"
    assert not s.prometheus_basic_auth_username and not s.prometheus_headers
    assert s.sidecar_image_pull_secrets == ("a", "b")


def test_defaults_set_none_of_it():
    c, pod = _operator()
    assert not {n for n in _env(c) if n.startswith("VLM_PROMETHEUS_") and n != "VLM_PROMETHEUS_URL"}
    assert not {"VLM_SIDECAR_IMAGE_PULL_SECRETS", "VLM_PROFILER_SCRAPERS", "VLM_PROFILER_PEER_CIDRS"} & set(_env(c))
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]


@pytest.mark.parametrize(("values", "message"), [
    (["operator.prometheusAuth.bearerToken.secretName=t"], "needs operator.prometheusURL"),
    ([f"operator.prometheusURL={URL}", "operator.prometheusAuth.bearerToken.secretName=t",
      "operator.prometheusAuth.basicAuth.username=u", "operator.prometheusAuth.basicAuth.passwordSecretName=p"],
     "either bearerToken or basicAuth"),
    ([f"operator.prometheusURL={URL}", "operator.prometheusAuth.basicAuth.username=u"], "needs both username"),
    ([f"operator.prometheusURL={URL}", "operator.prometheusAuth.basicAuth.passwordSecretName=p"], "needs both username"),
    ([f"operator.prometheusURL={URL}", "operator.prometheusAuth.ca.secretName=a",
      "operator.prometheusAuth.ca.configMapName=b"], "either secretName or configMapName"),
    ([f"operator.prometheusURL={URL}", "operator.prometheusAuth.headers.X-A=a\tb"], "does not match pattern"),
    (["operator.prometheusAuth.bearerToken.secretName=Not_A_Secret"], "secretName"),
    (["operator.sidecarImagePullSecrets[0].name=Bad_Name"], "sidecarImagePullSecrets"),
    (["operator.profilerScrapers[0]=a/b/c"], "profilerScrapers"),
    (["operator.profilerPeerCIDRs[0]=10.0.0.1"], "profilerPeerCIDRs"),
    (["operator.prometheusAuth.token=x"], "token"),
])
def test_bad_settings_are_refused_at_render(values, message):
    args = [a for v in values for a in ("--set", v)]
    proc = helm("template", "vlm", str(GOLDEN.parents[2] / "charts" / "vlm-operator"), "--kube-version", "1.34.4",
                *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_autoscalings_prometheus_and_trigger_authentication_reach_the_operator():
    c, _ = _operator("--set", f"operator.prometheusURL={URL}",
                     "--set", "operator.autoscalingPrometheusURL=http://prometheus-operated.monitoring:9090",
                     "--set", "operator.autoscalingTriggerAuth=prometheus-credentials")
    s = Settings.from_env(_env(c))
    assert s.autoscaling_prometheus_url == "http://prometheus-operated.monitoring:9090"
    assert s.autoscaling_trigger_auth == "prometheus-credentials"
    # unset: nothing rendered, so the operator falls back to prometheusURL and no authentication
    c, _ = _operator("--set", f"operator.prometheusURL={URL}")
    assert not {"VLM_AUTOSCALING_PROMETHEUS_URL", "VLM_AUTOSCALING_TRIGGER_AUTH"} & set(_env(c))
