"""hack/build-images.sh (`make images`) without building: its --plan argv builds the Dockerfile's own targets,
replaces exactly the base images the Dockerfile names, and keeps everything under its cache, never in the
repository. The real build (buildah, minutes, root) is `make images`, not a test (docs/packaging.md,
"Images built here")."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "hack" / "build-images.sh"
DOCKERFILE = (REPO / "Dockerfile").read_text()
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> tuple[Path, list[list[str]]]:
    cache = tmp_path_factory.mktemp("images-cache")
    proc = subprocess.run(["bash", str(SCRIPT), "--plan"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cache), "VLM_IMAGES_CACHE": str(cache)})
    assert proc.returncode == 0, proc.stderr
    assert not any(cache.iterdir()), "--plan must not create anything"
    return cache, [shlex.split(line) for line in proc.stdout.splitlines()]


def _opt(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def _builds(cmds):
    return [c for c in cmds if c[:1] == ["buildah"] and "bud" in c]


def test_plan_builds_both_targets_of_the_dockerfile(plan):
    cache, cmds = plan
    builds = _builds(cmds)
    assert [_opt(b, "--target") for b in builds] == [["operator"], ["sidecar"]]
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", DOCKERFILE, re.M))
    for b in builds:
        assert _opt(b, "--target")[0] in stages
        assert _opt(b, "--file") == [str(REPO / "Dockerfile")] and b[-1] == str(REPO)
        assert {"--layers", "--pull=never"} <= set(b) and _opt(b, "--isolation") == ["chroot"]
        assert _opt(b, "--storage-driver") == ["vfs"] and _opt(b, "--root") == [str(cache / "storage")]
        assert f"VERSION={VERSION}" in _opt(b, "--build-arg")
    tags = [_opt(b, "--tag")[0] for b in builds]
    assert tags == [f"vlmops/vlm-operator:{VERSION}", f"vlmops/vlm-sidecar:{VERSION}"]  # the Dockerfile's names
    for target, tag in zip(("operator", "sidecar"), tags, strict=True):
        assert re.search(rf"docker build --target {target} +-t {re.escape(tag)} \.", DOCKERFILE), tag


def test_plan_replaces_exactly_the_dockerfiles_base_images(plan):
    """PYTHON_IMAGE through the Dockerfile's own build arg; the pyspy stage's rust image through a build
    context of the very name its FROM line uses (a different name would silently pull nothing and fail)."""
    _, cmds = plan
    rust = re.search(r"^FROM (rust:\S+) AS pyspy$", DOCKERFILE, re.M).group(1)
    assert re.search(r"^ARG PYTHON_IMAGE=", DOCKERFILE, re.M)
    for b in _builds(cmds):
        args = dict(a.split("=", 1) for a in _opt(b, "--build-arg"))
        assert args["PYTHON_IMAGE"].startswith("localhost/vlm-standin/python:3.11-bookworm-")
        [ctx] = _opt(b, "--build-context")
        name, target = ctx.split("=", 1)
        assert name == rust and target.startswith(f"container-image://localhost/vlm-standin/{rust}-")
        # the host's CA bundle is a RUN-time mount, never a layer
        assert all(v.endswith(":/etc/ssl/certs/ca-certificates.crt:ro") for v in _opt(b, "-v"))


def test_plan_bases_are_debian_bookworm_from_packages(plan):
    _, cmds = plan
    debs = [c for c in cmds if c[:1] == ["mmdebstrap"]]
    assert len(debs) == 2
    includes = [set(next(a for a in c if a.startswith("--include=")).split("=", 1)[1].split(",")) for c in debs]
    assert {"python3", "python3-venv", "python3-pip", "python-is-python3"} <= includes[0]
    assert {"gcc", "libc6-dev", "curl", "patch"} <= includes[1]
    for c in debs:
        assert "bookworm" in c and "--variant=minbase" in c


def test_plan_writes_only_under_its_cache(plan):
    cache, cmds = plan
    pushes = [c for c in cmds if c[:1] == ["buildah"] and "push" in c]
    assert [p[-1] for p in pushes] == [
        f"oci-archive:{cache}/out/vlm-{t}-{VERSION}.oci.tar:vlmops/vlm-{t}:{VERSION}" for t in ("operator", "sidecar")]
    for c in cmds:  # every path written is in the cache; the repository is only read (context, Dockerfile)
        for a in c:
            for path in re.findall(r"(?:^|[=:])(/[^/][^:=, ]*)", a):
                assert path.startswith((str(cache), "/etc/", "/usr/share/")) or path in (str(REPO), str(REPO / "Dockerfile")), a


def test_bad_arguments_are_refused():
    for argv in (["--target", "nope"], ["--bogus"]):
        proc = subprocess.run(["bash", str(SCRIPT), *argv], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and "build-images" in proc.stderr


def test_make_images_runs_the_script_and_stays_out_of_make_test():
    mk = (REPO / "Makefile").read_text()
    assert re.search(r"^images: venv\n\tPYTHON=\$\(PY\) bash hack/build-images.sh$", mk, re.M)
    test_deps = re.search(r"^test:(.*)$", mk, re.M).group(1).split()
    assert "images" not in test_deps
