#!/usr/bin/env python3
"""Write the values table of charts/vlm-operator/README.md from the chart's values.schema.json.

    python hack/chart-readme.py           # rewrite the table between the README's markers
    python hack/chart-readme.py --check   # exit 1 when the table is stale (run by `make lint`)

One row per leaf of the schema (a property without nested properties): key, type, default and
description. The schema is the one place a value is described, since it is also what Helm validates
against; defaults come from values.yaml, which the schema validates. A leaf without a description
fails the run, so a new value cannot reach the README undocumented. The rest of the README is prose
written by hand and left as it is.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "vlm-operator"
BEGIN, END = "<!-- values-table:begin (hack/chart-readme.py) -->", "<!-- values-table:end -->"
_MISSING = object()


def _leaves(schema: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    for key, node in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        if "properties" in node:
            yield from _leaves(node, path + ".")
        else:
            yield path, node


def _default(values: dict[str, Any], path: str) -> Any:
    cur: Any = values
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def _type(node: dict[str, Any]) -> str:
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    return node.get("type", "any")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(schema: dict[str, Any], values: dict[str, Any]) -> str:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    undocumented = []
    for path, node in _leaves(schema):
        if not node.get("description"):
            undocumented.append(path)
            continue
        default = _default(values, path)
        shown = "" if default is _MISSING else f"`{_cell(json.dumps(default, separators=(', ', ': ')))}`"
        rows.append(f"| `{path}` | {_type(node)} | {shown} | {_cell(node['description'])} |")
    if undocumented:
        raise SystemExit(f"values.schema.json: no description for {', '.join(undocumented)}")
    return "\n".join(rows)


def render(readme: str, schema: dict[str, Any], values: dict[str, Any]) -> str:
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{CHART / 'README.md'}: markers {BEGIN} ... {END} not found")
    return readme[: start + len(BEGIN)] + "\n" + table(schema, values) + "\n" + readme[end:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="fail when the README's table is stale")
    p.add_argument("--chart", type=Path, default=CHART, help="chart directory")
    args = p.parse_args(argv)
    path = args.chart / "README.md"
    current = path.read_text()
    schema = json.loads((args.chart / "values.schema.json").read_text())
    values = yaml.safe_load((args.chart / "values.yaml").read_text())
    text = render(current, schema, values)
    if args.check:
        if text != current:
            diff = difflib.unified_diff(current.splitlines(), text.splitlines(), str(path), "generated", lineterm="", n=0)
            print("\n".join(list(diff)[:40]), file=sys.stderr)
            print(f"{path} is stale: run `python hack/chart-readme.py`", file=sys.stderr)
            return 1
        return 0
    if text != current:
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
