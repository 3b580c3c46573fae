"""The judge's Argo Rollouts and Flagger wiring in examples/ (docs/judge.md): parsed, and checked against the judge
itself. The AnalysisTemplate's `web` metric has what the provider needs (url, method, headers with the token,
body, jsonPath) and the body it sends, with the Rollout's args filled in, is a request the judge accepts; its
success and failure conditions read the verdicts as docs/judge.md says; the Rollout passes every arg the
template needs, the pod-template hashes as podTemplateHashValue Stable and Latest. Flagger's load-tester command
sends a payload the judge's Flagger endpoint accepts. The RBAC names are the ones the judge asks about."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml

from vlm_operator.api.names import GROUP
from vlm_operator.judge import evaluate as judge
from vlm_operator.judge import server as judge_server

REPO = Path(__file__).resolve().parents[3]
ARGO = REPO / "examples" / "argo-rollouts"
FLAGGER = REPO / "examples" / "flagger"
OPERATOR = REPO / "examples" / "judge" / "operator.yaml"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def one(path: Path, kind: str) -> dict:
    (d,) = [d for d in docs(path) if d["kind"] == kind]
    return d


def substitute(text: str, args: dict[str, str]) -> str:
    """Argo's {{args.NAME}} substitution; every placeholder must have a value."""
    def sub(m: re.Match) -> str:
        assert m.group(1) in args, f"{{{{args.{m.group(1)}}}}} has no value"
        return args[m.group(1)]

    return re.sub(r"\{\{\s*args\.([A-Za-z0-9_-]+)\s*\}\}", sub, text)


def condition(expr: str, result: dict) -> bool:
    """The template's conditions are `result.verdict == "X"` (or a disjunction of them)."""
    terms = [t.strip() for t in expr.split("||")]
    for t in terms:
        m = re.fullmatch(r'result\.verdict\s*==\s*"([A-Za-z]+)"', t)
        assert m, f"a condition the test cannot read: {t}"
    return any(result["verdict"] == re.search(r'"([A-Za-z]+)"', t).group(1) for t in terms)  # type: ignore[union-attr]


def test_the_analysis_template_is_a_web_metric_the_judge_accepts():
    t = one(ARGO / "analysis-template.yaml", "AnalysisTemplate")
    assert t["apiVersion"] == "argoproj.io/v1alpha1"
    (metric,) = t["spec"]["metrics"]
    web = metric["provider"]["web"]
    assert web["method"] == "POST" and web["jsonPath"] == "{$}" and 0 < web["timeoutSeconds"] <= 60
    headers = {h["key"]: h["value"] for h in web["headers"]}
    assert headers == {"Authorization": "Bearer {{args.judge-token}}", "Content-Type": "application/json"}
    args = {a["name"]: a for a in t["spec"]["args"]}
    assert args["judge-token"]["valueFrom"]["secretKeyRef"] == {"name": "vlm-judge-caller-token", "key": "token"}
    assert args["judge-url"]["value"].endswith("/v1/judge")
    # The body with the Rollout's values is a request the judge takes, for the canary's hash against the stable's.
    values = {"namespace": "serving", "app": "qwen-vl", "stable-hash": "6d5f8c", "canary-hash": "7b9c4d",
              "judge-token": "t", "judge-url": args["judge-url"]["value"]}
    req = judge.parse(json.loads(substitute(web["body"], values)))
    assert (req.namespace, req.baseline, req.canary) == (
        "serving", "app=qwen-vl,rollouts-pod-template-hash=6d5f8c", "app=qwen-vl,rollouts-pod-template-hash=7b9c4d")
    assert req.started_at is None  # stateless: from the canary pods
    # Promote ends the run Successful, Rollback Failed; the rest are inconclusive measurements, and the judge
    # decides at maxDuration before inconclusiveLimit runs out.
    for verdict in judge.PASS:
        ok, bad = condition(metric["successCondition"], {"verdict": verdict}), condition(
            metric["failureCondition"], {"verdict": verdict})
        assert (ok, bad) == (verdict == "Promote", verdict == "Rollback"), verdict
    assert metric["failureLimit"] == 0 and metric["consecutiveSuccessLimit"] == 1
    from vlm_operator.api.units import parse_duration

    interval = parse_duration(metric["interval"])
    assert interval == parse_duration(req.analysis.interval)
    # A step's analysis needs a count (Argo refuses a metric that runs indefinitely there); both it and the
    # inconclusive limit outlast the judge's maxDuration.
    looks = parse_duration(req.analysis.max_duration) / interval + 1
    assert metric["count"] >= looks and metric["inconclusiveLimit"] >= looks


def test_the_rollout_passes_the_hashes_and_runs_the_profiler():
    t = one(ARGO / "analysis-template.yaml", "AnalysisTemplate")
    needed = {a["name"] for a in t["spec"]["args"] if "value" not in a and "valueFrom" not in a}
    r = one(ARGO / "rollout.yaml", "Rollout")
    steps = [s["analysis"] for s in r["spec"]["strategy"]["canary"]["steps"] if "analysis" in s]
    assert steps
    for s in steps:
        assert [x["templateName"] for x in s["templates"]] == [t["metadata"]["name"]]
        given = {a["name"]: a for a in s["args"]}
        assert needed <= set(given)
        assert given["stable-hash"]["valueFrom"] == {"podTemplateHashValue": "Stable"}
        assert given["canary-hash"]["valueFrom"] == {"podTemplateHashValue": "Latest"}
        assert given["app"]["value"] == r["spec"]["selector"]["matchLabels"]["app"]
    pod = r["spec"]["template"]["spec"]
    assert pod["shareProcessNamespace"] is True
    (profiler,) = [c for c in pod["containers"] if c["name"] == "profiler"]
    assert "SYS_PTRACE" in profiler["securityContext"]["capabilities"]["add"]
    assert {p["containerPort"] for p in profiler["ports"]} == {9400}


def test_flaggers_load_tester_sends_what_the_judge_takes():
    c = one(FLAGGER / "canary.yaml", "Canary")
    (hook,) = c["spec"]["analysis"]["webhooks"]
    assert hook["type"] == "rollout" and hook["metadata"]["type"] == "bash"
    argv = shlex.split(hook["metadata"]["cmd"].replace("$(cat /var/run/secrets/kubernetes.io/serviceaccount/token)",
                                                       "TOKEN"))
    assert argv[0] == "curl" and "--fail-with-body" in argv
    url = next(a for a in argv if a.startswith("https://"))
    assert argv[argv.index("--cacert") + 1] == "/etc/vlm-judge/ca.crt"
    assert url.endswith("/v1/flagger")
    assert "Authorization: Bearer TOKEN" in argv
    call = judge.parse_flagger(json.loads(argv[argv.index("-d") + 1]))
    assert call.request is not None
    assert (call.request.baseline, call.request.canary) == ("app=qwen-vl-primary", "app=qwen-vl")
    assert c["spec"]["analysis"]["threshold"] >= 5
    binding = one(FLAGGER / "canary.yaml", "RoleBinding")
    assert binding["roleRef"]["name"] == "vlm-operator-judge-caller"


def test_the_rbac_and_the_service_are_what_the_judge_asks_for():
    objs = docs(OPERATOR)
    roles = {d["metadata"]["name"]: d for d in objs if d["kind"] == "ClusterRole"}
    rules = {(r["apiGroups"][0], r["resources"][0]): r["verbs"] for r in roles["vlm-operator-judge"]["rules"]}
    assert rules[("authentication.k8s.io", "tokenreviews")] == ["create"]
    assert rules[("authorization.k8s.io", "subjectaccessreviews")] == ["create"]
    assert "list" in rules[("", "pods")]
    (caller,) = roles["vlm-operator-judge-caller"]["rules"]
    assert (caller["apiGroups"], caller["resources"], caller["verbs"]) == (
        [GROUP], [judge_server.SAR_RESOURCE], [judge_server.SAR_VERB])
    svc = next(d for d in objs if d["kind"] == "Service")
    host = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:{svc['spec']['ports'][0]['port']}"
    t = one(ARGO / "analysis-template.yaml", "AnalysisTemplate")
    assert host in next(a["value"] for a in t["spec"]["args"] if a["name"] == "judge-url")
    assert host in one(FLAGGER / "canary.yaml", "Canary")["spec"]["analysis"]["webhooks"][0]["metadata"]["cmd"]
