#!/usr/bin/env python3
"""Write the reference tables of docs/settings.md and docs/api.md from the pydantic models.

    python hack/gen-docs.py           # rewrite the tables between the docs' markers
    python hack/gen-docs.py --check   # exit 1 with a diff when a table is stale (run by `make lint`)

docs/settings.md: one row per field of `vlm_operator.api.settings.Settings`: its variable (`VLM_<FIELD>`), type,
default and the field's `description`. docs/api.md: one row per field of `VLMServiceSpec` and
`VLMServiceStatus` (`vlm_operator.api.v1alpha1`), by its camelCase path: type, default, bounds and the field's
`description`; fields whose type is a copy of a core Kubernetes type (EnvVar, Volume, Affinity, ...) are one
row, as in Kubernetes. The models are the one place these are described (the CRD's schema and the
operator's start-up checks are built from them); the hand-written prose around the tables is left as it is.
It imports the installed `vlm_operator` (`make setup` installs the checkout, editable), as crdgen's check does.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from vlm_operator import __version__
from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.settings import Settings, env_name

REPO = Path(__file__).resolve().parents[1]

SETTINGS_DOC = REPO / "docs" / "settings.md"
API_DOC = REPO / "docs" / "api.md"
SETTINGS_MARK = "settings-table"
SPEC_MARK = "spec-table"
STATUS_MARK = "status-table"
# Copies of core Kubernetes types: one row each, not walked field by field (their meaning is Kubernetes').
CORE = {"EnvVar", "EnvFromSource", "VolumeMount", "SecurityContext", "Affinity", "TopologySpreadConstraint",
        "LocalObjectReference", "Volume", "Toleration", "Condition"}


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin (hack/gen-docs.py) -->", f"<!-- {name}:end -->"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _unwrap(tp: Any) -> Any:
    """`X | None` -> X."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _type(tp: Any, metadata: list[Any] = ()) -> str:
    tp = _unwrap(tp)
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(tp)
        return _type(base, [*metadata, *meta])
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(tp))
    if origin in (list, tuple):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return f"list of {_type(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_type(typing.get_args(tp)[1])}"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return f"`{tp.__name__}` (Kubernetes)" if tp.__name__ in CORE else "object"
    patterns = {getattr(m, "pattern", None) for m in metadata}  # Field(pattern=...) of the Duration, Quantity aliases
    if api.DURATION_PATTERN in patterns:
        return "duration"
    if api.QUANTITY_PATTERN in patterns:
        return "quantity"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(tp, getattr(tp, "__name__", str(tp)))


def _shown(value: Any) -> str:
    if isinstance(value, BaseModel) or value is None or value == "":
        return ""
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value.replace(__version__, '<version>')}`"
    if isinstance(value, tuple | list) and all(isinstance(x, str) for x in value):
        return ", ".join(f"`{x}`" for x in value) if value else "`[]`"
    if isinstance(value, tuple | list | dict):
        return f"`{_cell(json.dumps(value, separators=(', ', ': ')))}`"
    return f"`{value}`"


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        return _shown(field.default_factory())
    return "" if field.default is PydanticUndefined else _shown(field.default)


def _bounds(field: Any) -> str:
    out = []
    for m in field.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{sym} {v}")
        v = getattr(m, "max_length", None)
        if v is not None and typing.get_origin(_unwrap(field.annotation)) in (list, tuple):
            out.append(f"at most {v} items")
    return ", ".join(out)


def settings_table() -> str:
    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        rows.append(f"| `{env_name(name)}` | {_type(field.annotation, field.metadata)} | {_default(field)} | "
                    f"{_cell(field.description or '')} |")
    return "\n".join(rows)


def _walk(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, field in model.model_fields.items():
        path = f"{prefix}{field.alias or name}"
        yield path, field
        tp = _unwrap(field.annotation)
        listed = typing.get_origin(tp) is list
        inner = typing.get_args(tp)[0] if listed else tp
        if isinstance(inner, type) and issubclass(inner, BaseModel) and inner.__name__ not in CORE:
            yield from _walk(inner, f"{path}[]." if listed else f"{path}.")


def api_table(model: type[BaseModel]) -> str:
    rows = ["| field | type | default | bounds | description |", "|---|---|---|---|---|"]
    for path, field in _walk(model):
        rows.append(f"| `{path}` | {_type(field.annotation, field.metadata)} | {_default(field)} | {_bounds(field)} | "
                    f"{_cell(field.description or '')} |")
    return "\n".join(rows)


def render(text: str, mark: str, table: str, path: Path) -> str:
    begin, end = _markers(mark)
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise SystemExit(f"{path}: markers {begin} ... {end} not found")
    return text[: start + len(begin)] + "\n" + table + "\n" + text[stop:]


def documents() -> dict[Path, tuple[str, str]]:
    """path -> (current text, generated text)."""
    out = {}
    current = SETTINGS_DOC.read_text()
    out[SETTINGS_DOC] = (current, render(current, SETTINGS_MARK, settings_table(), SETTINGS_DOC))
    current = API_DOC.read_text()
    text = render(current, SPEC_MARK, api_table(api.VLMServiceSpec), API_DOC)
    out[API_DOC] = (current, render(text, STATUS_MARK, api_table(api.VLMServiceStatus), API_DOC))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="fail with a diff when a table is stale")
    args = p.parse_args(argv)
    stale = 0
    for path, (current, text) in documents().items():
        if text == current:
            continue
        if args.check:
            rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
            diff = difflib.unified_diff(current.splitlines(), text.splitlines(), str(rel), "generated", lineterm="", n=0)
            print("\n".join(list(diff)[:60]), file=sys.stderr)
            print(f"{rel} is stale: run `python hack/gen-docs.py`", file=sys.stderr)
            stale = 1
        else:
            path.write_text(text)
            print(f"wrote {path}")
    return stale


if __name__ == "__main__":
    sys.exit(main())
