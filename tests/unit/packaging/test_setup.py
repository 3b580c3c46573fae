"""The setup the Makefile does: the project's venv, what the demo builds, and the fetches before the tests.

What the tests read from a registry is fetched by the setup step (`make fetch`), never by the tests.

The integration tier runs inside the testbed's network namespace, where no registry answers (a fresh clone's CI
run failed there on an empty CRD cache), and a test that downloads makes a cold run depend on the network midway.
So hack/fetch-crds.sh, hack/fetch-sglang-wheels.sh, hack/fetch-checkov.sh and hack/fetch-image-wheels.sh run
before the tests, and a test
finding its cache empty fails naming `make fetch`.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from vlm_testing import fetched, wheels

REPO = Path(__file__).resolve().parents[3]
MAKEFILE = (REPO / "Makefile").read_text()


def _rule(target: str) -> tuple[list[str], list[str]]:
    """A Makefile rule's prerequisites and recipe lines."""
    m = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n)*)", MAKEFILE, re.M)
    assert m, f"no rule {target} in the Makefile"
    return m.group(1).split(), [line.strip() for line in m.group(2).splitlines()]


def test_the_sets_the_tests_read_are_the_ones_the_script_fetches() -> None:
    listed = subprocess.run(["bash", str(fetched.FETCH), "--list"], capture_output=True, text=True, timeout=30,
                            check=True).stdout.split()
    assert {*fetched.STACKS, fetched.FLAGGER, fetched.ARGO_ROLLOUTS, fetched.KEDA} <= set(listed), listed


def test_make_test_fetches_before_the_tests() -> None:
    prereqs, recipe = _rule("test")
    # The background Go build first of all, then the tools and the fetches side by side, then lint, then the tests.
    assert prereqs[0] == "build-behind", prereqs
    fetch_at = next(i for i, line in enumerate(recipe) if "$(MAKE)" in line and " fetch" in line)
    lint_at = next(i for i, line in enumerate(recipe) if "$(MAKE)" in line and " lint" in line)
    run_at = next(i for i, line in enumerate(recipe) if "run-tests.sh" in line)
    assert fetch_at < lint_at < run_at, recipe
    assert "fetch" in _rule("setup")[0]
    _, recipe = _rule("fetch")
    for script in ("hack/fetch-crds.sh", "hack/fetch-sglang-wheels.sh", "hack/fetch-checkov.sh",
                   "hack/fetch-image-wheels.sh"):
        assert any(script in line for line in recipe), (script, recipe)


@pytest.mark.parametrize("state", ["missing", "half-fetched"])
def test_a_crd_set_not_in_the_cache_fails_naming_make_fetch(state: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetched, "CRD_CACHE", tmp_path)
    if state == "half-fetched":  # files, but no .complete marker: an interrupted fetch
        (tmp_path / fetched.FLAGGER).mkdir()
        (tmp_path / fetched.FLAGGER / "crd.yaml").write_text("kind: CustomResourceDefinition\n")
    with pytest.raises(pytest.fail.Exception, match=r"run `make fetch` \(hack/fetch-crds.sh\)"):
        fetched.crds(fetched.FLAGGER)
    (tmp_path / fetched.FLAGGER).mkdir(exist_ok=True)
    (tmp_path / fetched.FLAGGER / "crd.yaml").write_text("kind: CustomResourceDefinition\n")
    (tmp_path / fetched.FLAGGER / ".complete").touch()
    assert fetched.crds(fetched.FLAGGER) == [tmp_path / fetched.FLAGGER / "crd.yaml"]


def test_a_wheel_not_in_the_cache_fails_naming_make_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wheels, "WHEELS", tmp_path)
    (tmp_path / "sglang-0.5.10-py3-none-any.whl").touch()
    assert wheels.fetch_wheels(["0.5.10"]) == {"0.5.10": tmp_path / "sglang-0.5.10-py3-none-any.whl"}
    with pytest.raises(pytest.fail.Exception, match=r"0\.5\.23 are not in .*run `make fetch`"):
        wheels.fetch_wheels(["0.5.10", "0.5.23"])


def test_no_test_downloads() -> None:
    """No test or fixture runs pip, `go mod download`/`go get`/`go install` or a hack/fetch-* script."""
    forbidden = re.compile(r"""["'](pip["'],\s*["'](install|download)|mod["'],\s*["']download|go["'],\s*["'](get|install))["']"""
                           r"""|subprocess\.[a-zA-Z]+\(.*fetch-[a-z-]+\.sh""")
    found = [f"{p.relative_to(REPO)}:{i}" for p in (REPO / "tests").rglob("*.py") if p != Path(__file__)
             for i, line in enumerate(p.read_text().splitlines(), 1) if forbidden.search(line)]
    assert not found, found


def test_every_target_runs_the_project_venv() -> None:
    """Python, ruff and lint-imports come from .venv; the system python3 only makes the venv."""
    assert re.search(r"^VENV \?= \.venv$", MAKEFILE, re.M) and re.search(r"^PY := \$\(VENV\)/bin/python$", MAKEFILE, re.M)
    recipes = [line.strip() for line in MAKEFILE.splitlines() if line.startswith("\t")]
    bare = [line for line in recipes
            if re.search(r"(^|[\s;{])(python3?|pip3?|uv|ruff|lint-imports|pytest)(\s|$)",
                         re.sub(r"-m \S+|\$\(VENV\)/bin/uv pip", "", line))  # the venv's uv is no bare pip
            and "-m venv" not in line]
    assert not bare, bare
    _, lint = _rule("lint")
    assert lint[:2] == ["$(VENV)/bin/ruff check --no-cache .", "$(VENV)/bin/lint-imports"], lint
    _, install = _rule("$(VENV_STAMP)")
    # uv into the venv with the venv's pip, then the project with the venv's uv, for the venv's Python only
    assert install[-3:] == ["@test -x $(VENV)/bin/uv || $(PY) -m pip install -q --disable-pip-version-check "
                            "'uv==$(UV_VERSION)'",
                            "$(VENV)/bin/uv pip install -q --python $(PY) -e '.[test]'", "@touch $@"], install
    assert _rule("$(VENV_STAMP)")[0][0] == "pyproject.toml"  # installed again only when pyproject.toml changed


def test_make_demo_builds_only_what_the_demo_runs() -> None:
    """The control plane and py-spy: no helm, no Prometheus Operator, no kubernetes_sd Prometheus (the demo's
    monitoring is the hand-written file_sd configuration on Debian's), no Argo Rollouts."""
    prereqs, _ = _rule("demo")
    assert "setup" not in prereqs and "binaries" not in prereqs and "demo-binaries" in prereqs, prereqs
    assert _rule("demo-binaries")[1] == ["bash hack/build-binaries.sh --stage pyspy,cluster"]
    demo = (REPO / "hack" / "demo.py").read_text()
    assert "Monitoring(" in demo and "generated=" not in demo and "helm" not in demo.lower()
