"""A small Hugging Face hub endpoint for tests: what `huggingface_hub` (HF_ENDPOINT) needs to download a model.

Serves repos from memory (repo id -> {file name: bytes}) at one commit each:

- ``GET /api/models/<repo>/revision/<revision>``: the model info (``sha``, ``siblings``) snapshot_download lists;
- ``GET /api/models/<repo>/tree/<revision>[/<path>]``: the same files as a tree listing (newer clients);
- ``HEAD|GET /<repo>/resolve/<revision>/<file>``: the file, with the headers the client keys its cache on
  (``X-Repo-Commit``, ``ETag`` as the file's sha256, ``Content-Length``) and ``Range`` requests (206), which is how
  the client resumes a download from its ``.incomplete`` file.

Bodies go out at ``rate`` bytes per second (0: at once), so a test can stop a download half-way; with ``hold_at``
the first body stops after that many bytes (then a byte a second, so the client does not time out and
retry) until ``release()``, whatever the machine's speed. Every request
is logged in ``requests`` (method, path, Range header, bytes sent). A bearer token, when ``token`` is set, is
required on every request (401 without it). Never shipped; standard library only.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = ""

    def __post_init__(self) -> None:
        if not self.commit:
            h = hashlib.sha1()
            for name in sorted(self.files):
                h.update(name.encode() + hashlib.sha256(self.files[name]).digest())
            self.commit = h.hexdigest()


@dataclass
class Hub:
    repos: dict[str, Repo]
    host: str = "127.0.0.1"
    port: int = 0
    rate: float = 0.0  # bytes per second of every body (0: unthrottled)
    token: str | None = None
    hold_at: int = 0  # the first body stops after this many bytes until release() (0: never), so a test's order
    #                   does not race the download
    requests: list[dict] = field(default_factory=list)
    _httpd: ThreadingHTTPServer | None = None
    _released: threading.Event = field(default_factory=threading.Event)
    _held: bool = False

    def release(self) -> None:
        """Let a held body go on (and every later body run unheld)."""
        self._released.set()

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://{self.host}:{self._httpd.server_address[1]}"

    def start(self) -> Hub:
        self._httpd = ThreadingHTTPServer((self.host, self.port), self._handler())
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True, name="hub").start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def served(self, name: str) -> list[dict]:
        """The GETs of file `name` (any repo), in order."""
        return [r for r in self.requests if r["method"] == "GET" and r["path"].endswith(f"/resolve/{r['revision']}/{name}")]

    def _handler(self):
        hub = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _json(self, code: int, obj) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _authorized(self) -> bool:
                if hub.token is None or self.headers.get("Authorization") == f"Bearer {hub.token}":
                    return True
                self._json(401, {"error": "Invalid credentials"})
                return False

            def _repo(self, repo_id: str, revision: str) -> Repo | None:
                repo = hub.repos.get(repo_id)
                if repo is None or revision not in ("main", repo.commit):
                    self.send_response(404)
                    self.send_header("X-Error-Code", "RepoNotFound" if repo is None else "RevisionNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                return repo

            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                path = unquote(urlparse(self.path).path)
                rec = {"method": self.command, "path": path, "range": self.headers.get("Range"), "sent": 0,
                       "revision": ""}
                hub.requests.append(rec)
                if not self._authorized():
                    return
                m = re.fullmatch(r"/api/models/(.+?)/revision/([^/]+)", path)
                if m:
                    repo = self._repo(m.group(1), m.group(2))
                    if repo:
                        self._json(200, {"id": m.group(1), "modelId": m.group(1), "sha": repo.commit,
                                         "private": False, "tags": [],
                                         "siblings": [{"rfilename": f} for f in sorted(repo.files)]})
                    return
                m = re.fullmatch(r"/api/models/(.+?)/tree/([^/]+)(/.*)?", path)
                if m:
                    repo = self._repo(m.group(1), m.group(2))
                    if repo:
                        self._json(200, [{"type": "file", "path": f, "size": len(b),
                                          "oid": hashlib.sha1(b).hexdigest()} for f, b in sorted(repo.files.items())])
                    return
                m = re.fullmatch(r"/(.+?)/resolve/([^/]+)/(.+)", path)
                if not m:
                    self._json(404, {"error": "not found"})
                    return
                rec["revision"] = m.group(2)
                repo = self._repo(m.group(1), m.group(2))
                if repo is None:
                    return
                data = repo.files.get(m.group(3))
                if data is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("X-Repo-Commit", repo.commit)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = 0
                rng = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
                if rng:
                    start = min(int(rng.group(1)), len(data))
                self.send_response(206 if rng else 200)
                self.send_header("X-Repo-Commit", repo.commit)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Accept-Ranges", "bytes")
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if self.command == "HEAD":
                    return
                chunk = 64 * 1024
                hold = 0
                if hub.hold_at and not hub._held:
                    hub._held, hold = True, hub.hold_at
                try:
                    i = start
                    while i < len(data):
                        if hold and rec["sent"] >= hold and not hub._released.is_set():
                            # Held: a byte a second, so the client's read timeout (10 s in huggingface_hub) never
                            # fires and it does not retry with a Range request of its own; a killed client shows
                            # as a broken pipe here.
                            self.wfile.write(data[i:i + 1])
                            rec["sent"] += 1
                            i += 1
                            hub._released.wait(1.0)
                            continue
                        part = data[i:i + chunk]
                        self.wfile.write(part)
                        rec["sent"] += len(part)
                        i += len(part)
                        if hub.rate > 0:
                            time.sleep(len(part) / hub.rate)
                except (BrokenPipeError, ConnectionResetError):
                    return

        return H


def main(argv: list[str] | None = None) -> int:
    """Serve one small repo (org/tiny-vl: a config and 1 MB of weights) until SIGTERM: hack/build-images.sh runs the
    operator image's weights program against it."""
    import argparse
    import signal

    p = argparse.ArgumentParser(description="a small hub endpoint serving org/tiny-vl")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args(argv)
    hub = Hub({"org/tiny-vl": Repo({"config.json": b'{"model_type": "qwen2_5_vl"}',
                                    "model.safetensors": hashlib.sha256(b"tiny").digest() * 32768})},
              host=a.host, port=a.port).start()
    print(json.dumps({"msg": "hub serving", "url": hub.url}), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    hub.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
