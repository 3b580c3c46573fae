"""The weights Job's entry point: fill the model cache once, with huggingface_hub's own download.

Run by the Job the operator makes for a service with `model.cache` and a hub id (builders.build_weights_job)::

    python -m vlm_operator.jobs.weights --repo Qwen/Qwen2.5-VL-3B-Instruct [--revision main]

It calls `huggingface_hub.snapshot_download`, which writes the hub cache layout under `$HF_HOME/hub` (the Job sets
HF_HOME on the cache volume) and resumes a file from its `.incomplete` part when the Job's pod is restarted
(a killed pod, a node drained half-way: the Job's backoffLimit retries). The serving pods then run with the same
HF_HOME and `HF_HUB_OFFLINE=1`: they read that cache and never download. `HF_ENDPOINT` (a mirror) and
`HF_TOKEN` (a gated model; from a Secret, never in the spec) are the client's own variables.

Every `--progress-every` seconds one JSON line on stdout says how many bytes are on the volume for the repo
(`kubectl logs job/<name>`). The last line is written to the container's termination message as well, so the
pod's status says how it ended: the commit and the size, or the error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path

TERMINATION_LOG = "/dev/termination-log"


def repo_dir(repo: str) -> Path:
    """Where huggingface_hub keeps `repo` under HF_HOME (models--org--name)."""
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    return home / "hub" / ("models--" + repo.replace("/", "--"))


def on_volume(repo: str) -> int:
    """Bytes of the repo's blobs on the volume, finished and partial."""
    blobs = repo_dir(repo) / "blobs"
    if not blobs.is_dir():
        return 0
    return sum(p.stat().st_size for p in blobs.iterdir() if p.is_file())


def _say(line: dict, *, final: bool = False) -> None:
    text = json.dumps(line, separators=(",", ":"))
    print(text, flush=True)
    if final:
        with contextlib.suppress(OSError):  # not in a pod
            Path(os.environ.get("VLM_TERMINATION_LOG", TERMINATION_LOG)).write_text(text[:4000])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vlm_operator.jobs.weights", description=__doc__.split("\n")[0])
    p.add_argument("--repo", required=True, help="hub id, e.g. Qwen/Qwen2.5-VL-3B-Instruct")
    p.add_argument("--revision", default=None, help="branch, tag or commit (default: main)")
    p.add_argument("--progress-every", type=float, default=10.0)
    a = p.parse_args(argv)
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:  # the operator image carries it; a bare install may not
        _say({"error": f"huggingface_hub is not installed: {e}"}, final=True)
        return 2

    start = time.monotonic()
    done = threading.Event()

    def progress() -> None:
        while not done.wait(a.progress_every):
            _say({"repo": a.repo, "bytes": on_volume(a.repo), "elapsed_s": round(time.monotonic() - start, 1)})

    threading.Thread(target=progress, daemon=True).start()
    try:
        path = snapshot_download(a.repo, revision=a.revision)
    except Exception as e:  # every failure ends as one line the pod's status carries
        done.set()
        _say({"repo": a.repo, "revision": a.revision, "error": f"{type(e).__name__}: {e}"}, final=True)
        return 1
    done.set()
    _say({"repo": a.repo, "revision": a.revision, "commit": Path(path).name, "path": path,
          "bytes": on_volume(a.repo), "elapsed_s": round(time.monotonic() - start, 1)}, final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
