"""Weights loaded once (model.cache.download): the download Job's program with the real huggingface_hub client
against a local hub endpoint (testing/vlm_testing/standin/hub.py), killed half-way and resumed; the Job; ModelReady and the pods
that wait for it, through reconcile.

The end-to-end run (the Job through the testbed's Job controller, its pod killed and retried) is
tests/e2e/test_weights.py."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.settings import Settings
from vlm_operator.desired import builders
from vlm_testing.fakekube import T0, SidecarCluster
from vlm_testing.standin.hub import Hub, Repo

REPO_ID = "org/tiny-vl"
# 32 MB of weights: the client writes in 10 MiB chunks (huggingface_hub's DOWNLOAD_CHUNK_SIZE), so a kill after
# 16 MB leaves at least one chunk in its .incomplete file.
BIG = hashlib.sha256(b"seed").digest() * (32_000_000 // 32)
CUT = 16_000_000


def files() -> dict[str, bytes]:
    return {"config.json": b'{"model_type": "qwen2_5_vl"}', "model.safetensors": BIG}


def run_weights(home: Path, hub: Hub, *extra: str, token: str | None = None, wait: bool = True):
    home.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HOME": str(home), "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_TELEMETRY": "1",
           "VLM_TERMINATION_LOG": str(home.parent / "termination-log")}
    env.pop("HF_TOKEN", None)
    if token:
        env["HF_TOKEN"] = token
    cmd = [sys.executable, "-m", "vlm_operator.jobs.weights", "--repo", REPO_ID, "--progress-every", "0.2", *extra]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    if wait:
        out, _ = p.communicate(timeout=120)
        return p.returncode, out
    return p


def last_json(out: str) -> dict:
    return json.loads([x for x in out.splitlines() if x.startswith("{")][-1])


def test_download_killed_half_way_resumes_from_its_partial_file(tmp_path):
    hub = Hub({REPO_ID: Repo(files())}, rate=5_000_000).start()  # 32 MB at 5 MB/s: 6 s
    home = tmp_path / "hf"
    try:
        p = run_weights(home, hub, wait=False)
        deadline = time.time() + 60
        while time.time() < deadline and not any(r["sent"] > CUT for r in hub.served("model.safetensors")):
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGKILL)  # as a node lost, or the pod evicted
        p.wait(10)
        first = hub.served("model.safetensors")
        assert len(first) == 1 and CUT < first[0]["sent"] < len(BIG), first
        partial = list((home / "hub" / "models--org--tiny-vl" / "blobs").glob("*.incomplete"))
        assert partial and partial[0].stat().st_size > 0, "the client keeps what it had"
        hub.rate = 0
        code, out = run_weights(home, hub)
    finally:
        hub.stop()
    assert code == 0, out
    again = hub.served("model.safetensors")[1]
    start = int(again["range"].removeprefix("bytes=").rstrip("-"))
    assert start > 0 and again["sent"] == len(BIG) - start, again  # resumed, not started over
    done = last_json(out)
    snap = Path(done["path"])
    assert (snap / "model.safetensors").read_bytes() == BIG and done["commit"] == hub.repos[REPO_ID].commit
    assert json.loads((tmp_path / "termination-log").read_text())["commit"] == done["commit"]
    # the serving pods' view: the same HF_HOME, offline, resolves the model from the cache alone
    probe = ("from huggingface_hub import snapshot_download; "
             f"print(snapshot_download({REPO_ID!r}))")
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert got.returncode == 0 and got.stdout.strip() == str(snap), got.stderr[-500:]


def test_a_gated_model_needs_the_token_and_a_failure_says_why(tmp_path):
    hub = Hub({REPO_ID: Repo(files())}, token="hf_secret").start()
    try:
        code, out = run_weights(tmp_path / "a" / "hf", hub)
        assert code == 1 and "error" in last_json(out), out
        why = json.loads((tmp_path / "a" / "termination-log").read_text())
        assert why["repo"] == REPO_ID and why["error"], why
        code, out = run_weights(tmp_path / "b" / "hf", hub, token="hf_secret")
        assert code == 0, out
    finally:
        hub.stop()


CACHED = {"model": {"path": REPO_ID, "revision": "v1",
                    "cache": {"claimName": "weights", "mountPath": "/models",
                              "download": {"tokenSecretRef": {"name": "hf", "key": "token"},
                                           "endpoint": "http://hub.internal"}}}}


def spec_with(**over) -> api.VLMServiceSpec:
    from vlm_testing.fakekube import SPEC
    return api.parse_spec({**SPEC, **over})


def test_weights_job_and_pod_env():
    spec = spec_with(**CACHED)
    owner = builders.Owner("svc", "ns", "uid-1")
    job = builders.build_weights_job(owner, spec, Settings(operator_image="reg/op:1"))
    pod = job["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["args"] == ["-m", "vlm_operator.jobs.weights", "--repo", REPO_ID, "--revision", "v1"]
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_HOME"]["value"] == "/models/hf" and env["HF_ENDPOINT"]["value"] == "http://hub.internal"
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert {"name": "model-cache", "mountPath": "/models"} in c["volumeMounts"]  # read-write: it fills the claim
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": "weights"}
    assert c["resources"]["requests"] == c["resources"]["limits"] and pod["securityContext"]["fsGroup"] == 65532
    assert builders.LABEL_MANAGED_BY not in job["spec"]["template"]["metadata"]["labels"]
    other = builders.build_weights_job(owner, spec_with(**{"model": {**CACHED["model"], "revision": "v2"}}), Settings())
    assert other["metadata"]["name"] != job["metadata"]["name"], "one Job per model and revision"
    # the serving pods read the claim's hub cache, offline; the token never reaches them
    tpl = builders.build_desired(owner, spec, Settings()).template
    sg = next(x for x in tpl["spec"]["containers"] if x["name"] == "sglang")
    senv = {e["name"]: e.get("value") for e in sg["env"]}
    assert senv["HF_HOME"] == "/models/hf" and senv["HF_HUB_OFFLINE"] == "1" and "HF_TOKEN" not in senv
    # a local path, or download Never: no Job, no env
    for s in (spec_with(**{"model": {**CACHED["model"], "path": "/models/qwen"}}),
              spec_with(**{"model": {**CACHED["model"], "cache": {**CACHED["model"]["cache"],
                                                                   "download": {"mode": "Never"}}}})):
        assert not builders.wants_download(s)
        with pytest.raises(ValueError):
            builders.build_weights_job(owner, s, Settings())
        sg = next(x for x in builders.build_desired(owner, s, Settings()).template["spec"]["containers"]
                  if x["name"] == "sglang")
        assert "HF_HUB_OFFLINE" not in {e["name"] for e in sg.get("env", [])}


def cond(c: SidecarCluster, type_: str) -> dict:
    return next(x for x in c.status["conditions"] if x["type"] == type_)


def finish_job(c: SidecarCluster, ok: bool = True) -> str:
    (key, job), = [(k, o) for k, o in c.kube.objects.items() if k[:2] == ("batch/v1", "Job")]
    kind = "Complete" if ok else "Failed"
    job["status"] = {"conditions": [{"type": kind, "status": "True",
                                     **({} if ok else {"reason": "BackoffLimitExceeded",
                                                       "message": "Job has reached the specified backoff limit"})}],
                     **({"succeeded": 1} if ok else {"failed": 7})}
    return key[3]


def gated(c: SidecarCluster) -> int:
    return sum(1 for p in c.kube.pods("svc") if p.gated)


def test_pods_wait_behind_the_gate_for_the_weights_and_start_after():
    from vlm_testing.fakekube import SPEC
    c = SidecarCluster({**SPEC, **CACHED, "replicas": 2}, gpus=8)
    c.run(T0)
    c.kube.settle("svc")
    c.run(T0 + 1)
    c.kube.settle("svc")
    c.run(T0 + 2)
    assert [w.name for w in c.kube.written("apply", "Job")] and gated(c) == 2, "the pods wait, holding no GPU"
    assert (cond(c, "ModelReady")["status"], cond(c, "ModelReady")["reason"]) == ("False", "Downloading")
    assert cond(c, "Ready")["reason"] == "WaitingForModel"
    finish_job(c, ok=False)
    c.run(T0 + 3)
    assert cond(c, "ModelReady")["reason"] == "DownloadFailed" and cond(c, "Degraded")["reason"] == "DownloadFailed"
    assert "delete the Job to try again" in cond(c, "ModelReady")["message"]
    finish_job(c, ok=True)
    c.run(T0 + 4)
    c.kube.settle("svc")
    c.run(T0 + 5)
    assert cond(c, "ModelReady")["status"] == "True" and gated(c) == 0
    assert cond(c, "Ready")["status"] == "True", c.status["conditions"]
    assert len(c.kube.written("apply", "Job")) == 1, "made once"


def test_a_new_model_changes_nothing_until_its_weights_are_there():
    from vlm_testing.fakekube import SPEC
    c = SidecarCluster({**SPEC, **CACHED, "replicas": 2}, gpus=8)
    c.run(T0)
    c.kube.settle("svc")
    finish_job(c)
    for t in (1, 2, 3):
        c.run(T0 + t)
        c.kube.settle("svc")
    assert cond(c, "Ready")["status"] == "True"
    stable = c.status["stableRevision"]
    c.kube.update_spec("svc", {**SPEC, **CACHED, "replicas": 2, "model": {**CACHED["model"], "revision": "v2"}})
    for t in (10, 11, 12):
        c.run(T0 + t)
        c.kube.settle("svc")
    assert set(c.kube.deployments("ns", "svc")) == {stable}, "no canary while the new weights download"
    assert len(c.kube.written("apply", "Job")) == 2 and cond(c, "ModelReady")["reason"] == "Downloading"
    assert cond(c, "Ready")["status"] == "True", "the running revision keeps serving"
    v2 = builders.weights_job_name(builders.Owner("svc", "ns", ""),
                                   spec_with(**{"model": {**CACHED["model"], "revision": "v2"}}))
    job = c.kube.objects[("batch/v1", "Job", "ns", v2)]
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}
    for t in (20, 21, 22):
        c.run(T0 + t)
        c.kube.settle("svc")
    assert len(c.kube.deployments("ns", "svc")) == 2 or c.status["stableRevision"] != stable, "the change goes ahead"
