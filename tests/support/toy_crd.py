"""A small CRD that exercises every schema feature the emulator must enforce (used by the fidelity suite)."""

from __future__ import annotations

import copy
from typing import Any

GROUP = "toys.example.com"
VERSION = "v1"
PLURAL = "widgets"
KIND = "Widget"

_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["size"],
            "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 10},
                "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
                "mode": {"type": "string", "enum": ["fast", "safe"], "default": "safe"},
                "label": {"type": "string", "maxLength": 8, "pattern": "^[a-z]+$"},
                "tags": {"type": "array", "maxItems": 3, "items": {"type": "string"},
                         "x-kubernetes-list-type": "set"},
                "note": {"type": "string", "nullable": True},
                "immutable": {"type": "string",
                              "x-kubernetes-validations": [{"rule": "self == oldSelf",
                                                            "message": "immutable is immutable"}]},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "limits": {"type": "object", "additionalProperties": {"type": "integer"}},
            },
            "x-kubernetes-validations": [
                {"rule": "self.size < 8 || self.mode == 'safe'", "message": "big widgets must be safe"},
            ],
        },
        "status": {
            "type": "object",
            "properties": {
                "phase": {"type": "string"},
                "observedGeneration": {"type": "integer"},
                "conditions": {"type": "array", "items": {"type": "object", "properties": {
                    "type": {"type": "string"}, "status": {"type": "string"}}}},
            },
        },
    },
}


def toy_crd(*, status_subresource: bool = True) -> dict[str, Any]:
    """The toy CRD (a fresh copy each call)."""
    version: dict[str, Any] = {"name": VERSION, "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": copy.deepcopy(_SCHEMA)}}
    if status_subresource:
        version["subresources"] = {"status": {}, "scale": {"specReplicasPath": ".spec.size",
                                                           "statusReplicasPath": ".status.observedGeneration"}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "widget", "kind": KIND, "shortNames": ["wdg"],
                      "categories": ["toys"]},
            "versions": [version],
        },
    }


def widget(name: str, size: int = 3, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": name},
            "spec": {"size": size, **spec}}


def path(namespace: str = "default", name: str | None = None, sub: str | None = None) -> str:
    out = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    if name:
        out += f"/{name}"
    if sub:
        out += f"/{sub}"
    return out
