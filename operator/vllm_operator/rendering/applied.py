"""The fields the operator set on a child, and the merge patch that also removes the ones it stopped setting.

Why: children are updated with JSON merge patches (RFC 7386), which only add and change keys. When a spec edit makes
the rendering drop a key — every toleration removed, a nodeSelector entry or an annotation gone — a plain merge
patch leaves the old value in place forever. kubectl solves this with a last-applied annotation; Kubernetes'
server-side apply with managedFields. We keep the same idea at its smallest: the annotation records only the *set
of fields* the operator wrote (the object's key tree with every leaf as `{}`, like managedFields' FieldsV1), and the
next patch sets every such key the new rendering lacks to null. Fields written by others (the Deployment
controller's revision annotation, an autoscaler's replicas) are never in the set, so they are never removed.

Lists are replaced whole by merge patches, so they need no bookkeeping below the list itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from vllm_operator import constants

ANNOTATION = constants.ANNOTATION_APPLIED_FIELDS


def field_set(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The key tree of `obj` (status and this annotation left out): dicts are followed, anything else is `{}`."""

    def walk(value: Any) -> dict[str, Any]:
        if isinstance(value, Mapping):
            return {str(k): walk(v) for k, v in value.items()}
        return {}

    tree = walk({k: v for k, v in obj.items() if k != "status"})
    annotations = tree.get("metadata", {}).get("annotations")
    if annotations is not None:
        annotations.pop(ANNOTATION, None)
    return tree


def annotate(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` with its field set recorded in its annotations (compact JSON, keys sorted: stable across runs)."""
    fields = json.dumps(field_set(obj), sort_keys=True, separators=(",", ":"))
    meta = dict(obj.get("metadata", {}))
    meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION: fields}
    return {**obj, "metadata": meta}


def recorded(obj: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The field set recorded on a live object; None when absent or unreadable (then nothing is removed)."""
    raw = ((obj or {}).get("metadata", {}).get("annotations") or {}).get(ANNOTATION)
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def with_removals(previous: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch that writes `desired` and sets to null every key of `previous` (a field set) it lacks."""
    patch: dict[str, Any] = dict(desired)
    for key, sub in (previous or {}).items():
        if key not in desired:
            patch[key] = None
        elif isinstance(desired[key], Mapping) and isinstance(sub, Mapping) and sub:
            patch[key] = with_removals(sub, desired[key])
    return patch


__all__ = ["ANNOTATION", "annotate", "field_set", "recorded", "with_removals"]
