"""The generated reference tables in docs/ (hack/gen-docs.py) match the models: docs/settings.md from
`Settings`, docs/api.md from the VLMService spec and status models. A field added without running
`python hack/gen-docs.py` fails here (and in `make lint`)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.settings import Settings, env_name

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gen() -> dict:
    return runpy.run_path(str(REPO / "hack" / "gen-docs.py"))


def test_generated_tables_are_current(gen, capsys):
    assert gen["main"](["--check"]) == 0, capsys.readouterr().err


def test_every_setting_and_field_is_in_the_generated_tables(gen):
    settings = (REPO / "docs" / "settings.md").read_text()
    for f in Settings.model_fields:
        assert f"| `{env_name(f)}` |" in settings, env_name(f)
    doc = (REPO / "docs" / "api.md").read_text()
    for model in (api.VLMServiceSpec, api.VLMServiceStatus):
        for path, _ in gen["_walk"](model):
            assert f"| `{path}` |" in doc, path


def test_check_fails_with_a_diff_on_drift(gen, tmp_path, monkeypatch, capsys):
    stale = tmp_path / "settings.md"
    stale.write_text(gen["SETTINGS_DOC"].read_text().replace("| `VLM_METRICS_PORT` |", "| `VLM_METRICS_PORTX` |", 1))
    monkeypatch.setitem(gen["documents"].__globals__, "SETTINGS_DOC", stale)
    monkeypatch.setitem(gen["documents"].__globals__, "REPO", tmp_path)
    assert gen["main"](["--check"]) == 1
    err = capsys.readouterr().err
    assert "VLM_METRICS_PORTX" in err and "is stale" in err
