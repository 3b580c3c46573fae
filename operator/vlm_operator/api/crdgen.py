"""Generate the VLMService CRD from the pydantic models (the only source of the schema).

    python -m vlm_operator.api.crdgen           # write crds/ and the chart's copy (files/crds/)
    python -m vlm_operator.api.crdgen --check   # exit 1 when the committed YAML differs

The API server wants a *structural* schema: every $ref inlined, `nullable`
instead of `anyOf [.., null]`, no `additionalProperties` next to `properties`
(an open object, `additionalProperties: true`, becomes `x-kubernetes-preserve-unknown-fields`),
no `title`. Defaults of nested objects become `{}` so the API server's own
defaulting fills their fields; CEL rules come from each model's `cel` tuple.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from vlm_operator.api import v1alpha1 as api
from vlm_operator.api.generated import write_or_check
from vlm_operator.api.names import CATEGORIES, GROUP, KIND, OPERATOR, PLURAL, SHORT_NAMES, SINGULAR, VERSION

CRD_FILE = f"{GROUP}_{PLURAL}.yaml"
# The chart's copy is read by charts/vlm-operator/templates/crds.yaml (not Helm's crds/ directory,
# which `helm upgrade` never applies), so a chart upgrade carries the CRD with it.
DEFAULT_OUTPUTS = ("crds", "charts/vlm-operator/files/crds")
# Optional spec fields are simply absent when unset (the API server drops nulls from non-nullable
# fields, so `revision: null` means the same as leaving it out, and CEL `has()` stays simple);
# status fields are nullable because the operator clears them by writing null in a merge patch.


def _models(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """All models reachable from root, by class name (pydantic's $defs keys)."""
    found: dict[str, type[BaseModel]] = {}

    def visit(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp.__name__ in found:
                return
            found[tp.__name__] = tp
            for f in tp.model_fields.values():
                visit(f.annotation)
        for arg in getattr(tp, "__args__", ()) or ():
            visit(arg)

    visit(root)
    return found


def _alias(model: type[BaseModel], name: str) -> str:
    f = model.model_fields[name]
    return f.alias or name


def _structural(
    node: Any, defs: dict[str, Any], models: dict[str, type[BaseModel]], model: str | None, nullable: bool
) -> Any:
    """Rewrite one pydantic JSON-schema node into a structural OpenAPI v3 node."""
    if not isinstance(node, dict):
        return node
    node = dict(node)
    ref = node.pop("$ref", None)
    if ref:
        name = ref.rsplit("/", 1)[-1]
        target = _structural(defs[name], defs, models, name, nullable)
        target = {**target, **{k: v for k, v in node.items() if k in ("description", "default")}}
        return _structural_defaults(target)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot make a structural schema of anyOf {options}")
        inner = _structural(options[0], defs, models, None, nullable)
        merged = {**inner, **{k: v for k, v in node.items() if k not in ("default", "title")}}
        if node.get("default", "absent") is not None and "default" in node:
            merged["default"] = node["default"]
        if nullable:
            merged["nullable"] = True
        return merged
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k == "title":
            continue
        if k == "additionalProperties" and v is False:
            continue
        if k == "additionalProperties" and v is True:
            # A passed-through Kubernetes type (api.OpenKubeModel, dict[str, Any]): the API server keeps the
            # fields the schema does not name, and checks them where the operator applies them (the Deployment).
            out["x-kubernetes-preserve-unknown-fields"] = True
            continue
        if k == "properties":
            out[k] = {p: _structural(s, defs, models, None, nullable) for p, s in v.items()}
        elif k in ("items", "additionalProperties"):
            out[k] = _structural(v, defs, models, None, nullable)
        else:
            out[k] = v
    if model and model in models:
        cls = models[model]
        _apply_factory_defaults(cls, out)
        rules = getattr(cls, "cel", ())
        if rules:
            out["x-kubernetes-validations"] = [
                {"rule": r, "message": m, **({"fieldPath": fp} if fp else {})} for r, m, fp in rules
            ]
    if out.get("type") == "object" and "properties" in out and "required" in out:
        out["required"] = sorted(out["required"])
    return out


def _structural_defaults(node: dict[str, Any]) -> dict[str, Any]:
    # An object default filled by pydantic would freeze nested defaults into the CRD; `{}` lets the
    # API server apply each nested field's own default instead.
    if node.get("type") == "object" and isinstance(node.get("default"), dict) and "properties" in node:
        node["default"] = {}
    return node


def _apply_factory_defaults(cls: type[BaseModel], schema: dict[str, Any]) -> None:
    props = schema.get("properties", {})
    for name, field in cls.model_fields.items():
        if field.default_factory is None:
            continue
        key = _alias(cls, name)
        if key not in props:
            continue
        value = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            props[key]["default"] = {}
        elif isinstance(value, list):
            props[key]["default"] = [
                v.model_dump(by_alias=True, exclude_none=True, mode="json") if isinstance(v, BaseModel) else v
                for v in value
            ]
        else:
            props[key]["default"] = value


def schema_for(model: type[BaseModel], *, nullable: bool = False) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _structural(raw, defs, _models(model), model.__name__, nullable)


def _status_schema() -> dict[str, Any]:
    s = schema_for(api.VLMServiceStatus, nullable=True)
    conds = s["properties"]["conditions"]
    conds["x-kubernetes-list-type"] = "map"
    conds["x-kubernetes-list-map-keys"] = ["type"]
    return s


def build_crd() -> dict[str, Any]:
    spec = schema_for(api.VLMServiceSpec)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": OPERATOR},
            "annotations": {"vlmops.dev/generated-by": "python -m vlm_operator.api.crdgen (do not edit by hand)"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "VLMService runs a vision-language model on SGLang with a profiler "
                            "sidecar and canary rollouts gated on scheduler signals.",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": _status_schema(),
                            },
                            "required": ["spec"],
                        }
                    },
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": copy.deepcopy(api.PRINTER_COLUMNS),
                }
            ],
        },
    }


def render() -> str:
    header = "# Generated by `python -m vlm_operator.api.crdgen` from vlm_operator/api/v1alpha1.py. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vlm_operator.api.crdgen", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="fail when the committed CRDs differ")
    p.add_argument("--root", type=Path, default=_repo_root(), help="repository root")
    args = p.parse_args(argv)
    return write_or_check(
        args.root, [Path(o) / CRD_FILE for o in DEFAULT_OUTPUTS], render(), check=args.check,
        command="python -m vlm_operator.api.crdgen",
    )


if __name__ == "__main__":
    sys.exit(main())
