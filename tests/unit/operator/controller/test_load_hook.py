"""The load hook (spec.rollout.load) and a step without traffic.

- The generator (vlm_operator.jobs.loadgen) against real HTTP servers on loopback: every target gets the same
  requests at the same rate, the image share is exact, each image is a fresh valid PNG, and a target that does
  not answer costs the others nothing.
- The Job (builders.build_load_job) and when the reconcile makes it: while the canary is analysed, aimed at
  every Ready canary and stable pod; replaced when that set changes; gone once the rollout ends.
- Without traffic and without the hook, a step pauses at maxDuration (NoTraffic, with advice); it is never
  rolled back for want of traffic.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.settings import Settings
from vlm_operator.desired import builders
from vlm_operator.jobs import loadgen
from vlm_testing.fakekube import SidecarCluster
from vlm_testing.steps import STEPS, is_canary, start, walk


class Recorder:
    """A loopback HTTP server answering chat completions; keeps every request body."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        rec = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                rec.bodies.append({"path": self.path, "body": json.loads(self.rfile.read(n))})
                out = b'{"choices":[{"message":{"content":"ok"}}]}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def read_png(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, raw scanlines) of an 8-bit RGB PNG, checking its signature and every chunk's CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    i, idat, size = 8, b"", None
    while i < len(data):
        (n,) = struct.unpack(">I", data[i:i + 4])
        kind, payload = data[i + 4:i + 8], data[i + 8:i + 8 + n]
        (crc,) = struct.unpack(">I", data[i + 8 + n:i + 12 + n])
        assert crc == zlib.crc32(kind + payload) & 0xFFFFFFFF, kind
        if kind == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", payload[:10])
            assert (depth, color) == (8, 2)
            size = (w, h)
        elif kind == b"IDAT":
            idat += payload
        i += 12 + n
    assert size is not None
    return size[0], size[1], zlib.decompress(idat)


def test_png_is_valid_and_unique():
    a, b = loadgen.png(64, b"\x01" * 16), loadgen.png(64, b"\x02" * 16)
    w, h, raw = read_png(a)
    assert (w, h) == (64, 64) and len(raw) == 64 * (1 + 3 * 64)
    assert a != b and read_png(b)[2][1:17] == b"\x02" * 16


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.5, 1.0])
def test_image_share_is_exact_over_any_run(fraction):
    flags = [loadgen.carries_images(k, fraction) for k in range(200)]
    assert sum(flags) == round(200 * fraction)
    assert abs(sum(flags[:10]) - 10 * fraction) <= 1  # spread, not bunched


def test_every_target_gets_the_same_requests_at_the_same_rate():
    servers = [Recorder() for _ in range(3)]
    dead = "127.0.0.1:9"  # discard port: nothing listens, every request fails at once
    cfg = loadgen.Config(targets=[s.target for s in servers] + [dead], rate=8.0, image_fraction=0.5,
                         images_per_request=2, image_size=32, max_tokens=7, model="m", duration_s=2.0,
                         report_every_s=0.5, timeout_s=2.0)
    lines: list[str] = []

    class Out:
        def write(self, s):
            lines.append(s)

        def flush(self):
            pass

    try:
        counts = asyncio.run(loadgen.drive(cfg, asyncio.Event(), out=Out()))
    finally:
        for s in servers:
            s.close()
    got = [len(s.bodies) for s in servers]
    assert min(got) >= 14 and max(got) - min(got) <= 1, got  # 8/s for 2 s each, interleaved
    for s in servers:
        images = [sum(1 for c in b["body"]["messages"][0]["content"] if c["type"] == "image_url") for b in s.bodies]
        assert set(images) <= {0, 2} and abs(sum(1 for n in images if n) - len(images) / 2) <= 1, images
        first = s.bodies[0]["body"]
        assert s.bodies[0]["path"] == "/v1/chat/completions" and first["model"] == "m" and first["max_tokens"] == 7
        urls = [c["image_url"]["url"] for b in s.bodies for c in b["body"]["messages"][0]["content"]
                if c["type"] == "image_url"]
        assert len(set(urls)) == len(urls), "every image is a fresh one"
        assert read_png(base64.b64decode(urls[0].split(",", 1)[1]))[:2] == (32, 32)
    assert counts[dead].ok == 0 and counts[dead].errors >= 14 and counts[dead].last_error
    reports = [json.loads(x) for x in "".join(lines).splitlines() if x.strip()]
    assert reports and reports[-1]["targets"][servers[0].target]["ok"] == got[0]


def test_bad_target_is_refused_at_the_command_line(capsys):
    with pytest.raises(SystemExit) as e:
        loadgen.parse_args(["--target", "no-port"])
    assert e.value.code == 2 and "host:port" in capsys.readouterr().err


LOAD = {"requestsPerSecond": 2, "imageFraction": 0.25, "maxTokens": 8}


def test_load_job_shape():
    spec = api.parse_spec({**STEPS, "rollout": {**STEPS["rollout"], "load": LOAD}})
    owner = builders.Owner("svc", "ns", "uid-1")
    job = builders.build_load_job(owner, spec, Settings(operator_image="reg/op:1"), ["10.0.0.2", "10.0.0.1"], 900)
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "reg/op:1" and c["command"] == ["python"] and c["args"][:2] == ["-m", "vlm_operator.jobs.loadgen"]
    targets = [c["args"][i + 1] for i, a in enumerate(c["args"]) if a == "--target"]
    assert targets == ["10.0.0.1:30000", "10.0.0.2:30000"]
    assert c["args"][c["args"].index("--rate") + 1] == "2" and c["args"][c["args"].index("--image-fraction") + 1] == "0.25"
    assert c["resources"]["requests"] == c["resources"]["limits"]
    assert job["spec"]["activeDeadlineSeconds"] == 900 and job["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert job["metadata"]["labels"][builders.LABEL_SERVICE] == "svc"
    # its pods are not serving pods: none of the labels the operator's pod index selects on
    assert builders.LABEL_MANAGED_BY not in job["spec"]["template"]["metadata"]["labels"]
    other = builders.build_load_job(owner, spec, Settings(), ["10.0.0.1", "10.0.0.3"], 900)
    assert other["metadata"]["name"] != job["metadata"]["name"], "another set of pods is another Job"


def jobs(c: SidecarCluster) -> dict[str, dict]:
    return {k[3]: o for k, o in c.kube.objects.items() if k[:2] == ("batch/v1", "Job")}


def targets_of(job: dict) -> set[str]:
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    return {args[i + 1].rsplit(":", 1)[0] for i, a in enumerate(args) if a == "--target"}


def test_reconcile_runs_the_load_job_while_analysing_and_removes_it_after():
    spec = {**STEPS, "rollout": {**STEPS["rollout"], "load": LOAD}}
    c = SidecarCluster(spec, gpus=16)
    seen: list[tuple[str, int, set[str], set[str]]] = []

    def on_look(t: float, r: dict) -> None:
        js = jobs(c)
        ready = {p.ip for p in c.kube.pods("svc") if p.ready and p.ip}  # stable, canary and the fresh baseline
        canary = {p.ip for p in c.kube.pods("svc") if p.ready and p.ip and is_canary(c, p.name)}
        if r["phase"] in ("Analysing", "Promoting") and canary:
            assert len(js) == 1, (r["phase"], list(js))
            got = targets_of(next(iter(js.values())))
            seen.append((r["phase"], r.get("step"), got, ready))
            assert canary <= got, "every Ready canary pod gets load"
        elif r["phase"] == "Progressing":
            assert not js, f"no load before the step's canary pods are analysed: {list(js)}"

    t = start(c, spec)
    looks = walk(c, t, on_look=on_look)
    assert looks[-1]["phase"] == "Promoted", looks
    assert {s[1] for s in seen if s[0] == "Analysing"} == {0, 1, 2}, "every step got load"
    # the canary and every Ready stable pod of the look (a pod made Ready after the reconcile waits for the next)
    bad = [(ph, st, sorted(got - ready)) for ph, st, got, ready in seen if not got <= ready]
    assert not bad, bad
    assert len({frozenset(s[2]) for s in seen}) >= 3, "a new Job when the compared pods change"
    assert not jobs(c), "the rollout ended: no load Job left"
    creates = [w for w in c.kube.written("apply", "Job")]
    deletes = [w for w in c.kube.written("delete", "Job")]
    assert len(creates) == len({w.name for w in creates}), "each Job created once"
    assert {w.name for w in deletes} == {w.name for w in creates}


def test_a_step_without_traffic_pauses_with_advice_never_rolls_back():
    spec = {**STEPS, "rollout": {**STEPS["rollout"], "steps": [{"replicas": 1, "analysis": "2m"}],
                                 "analysis": {**STEPS["rollout"]["analysis"], "maxDuration": "4m"}}}
    c = SidecarCluster(spec, gpus=16, extra=lambda pod, k: {"samples": 0} if is_canary(c, pod) else {})
    t = start(c, spec)
    looks = []
    for _ in range(12):
        t += 60
        c.run(t)
        r = c.status["rollout"]
        looks.append((r["phase"], r.get("reason")))
        if r["phase"] not in ("Progressing", "Analysing"):
            break
        c.kube.settle("svc")
    assert looks[-1] == ("Paused", "NoTraffic"), looks
    assert ("Analysing", "NoTraffic") in looks, looks
    assert "spec.rollout.load" in c.status["rollout"]["message"], c.status["rollout"]["message"]
    assert not any(e[1] == "CanaryRolledBack" for e in c.events)
    assert any(e[1] == "CanaryPaused" and "never rolled back" in e[2] for e in c.events), c.events
