"""Moving children written by the release before server-side apply over to the apply manager (pure).

Why: that release created and merge-patched its children, so the API server recorded their fields under an
*Update* manager named after its user agent (`vllm-operator`), and it kept its own list of the fields it set in the
`vllm-operator.dev/applied-fields` annotation to remove dropped ones. Server-side apply removes a field the applied
configuration drops only when the *apply* manager owns it; fields owned by an Update manager stay forever. So before
the first apply to such a child its managedFields are rewritten the way client-go's `csaupgrade` does: the field sets
of the legacy Update entries are merged into the apply manager's entry and the legacy entries removed. The
annotation was one of those fields, so the apply that follows (which does not carry it) removes it.

One exception: `spec.replicas` of a Deployment whose replicas an external autoscaler owns is not handed to the
apply manager (the operator never applies it, and owning it would make the next apply reset it to the default).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vllm_operator import constants

LEGACY_MANAGERS = frozenset({constants.APP_NAME})
"""Managers the previous release wrote as (the API server derives a manager from the user agent `vllm-operator/…`)."""
LEGACY_ANNOTATION = constants.ANNOTATION_APPLIED_FIELDS
REPLICAS = ("f:spec", "f:replicas")


def _legacy_entry(entry: Mapping[str, Any], apply_manager: str) -> bool:
    return (entry.get("manager") in LEGACY_MANAGERS | {apply_manager} and entry.get("operation") == "Update"
            and not entry.get("subresource"))


def needs_upgrade(obj: Mapping[str, Any], apply_manager: str) -> bool:
    """Whether `obj` still carries the previous release's bookkeeping (its annotation or an Update entry)."""
    meta = obj.get("metadata", {})
    if LEGACY_ANNOTATION in (meta.get("annotations") or {}):
        return True
    return any(_legacy_entry(e, apply_manager) for e in meta.get("managedFields") or [])


def union(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """The union of two FieldsV1 sets (nested dicts whose leaves are `{}`)."""
    out = copy.deepcopy(dict(a))
    for key, value in b.items():
        out[key] = union(out[key], value) if isinstance(out.get(key), Mapping) and isinstance(value, Mapping) \
            else copy.deepcopy(value)
    return out


def without(fields: Mapping[str, Any], path: Sequence[str]) -> dict[str, Any]:
    """`fields` minus one path (and the parents it leaves empty but for their `.` marker)."""
    out = copy.deepcopy(dict(fields))
    if not path or path[0] not in out:
        return out
    if len(path) == 1:
        del out[path[0]]
        return out
    inner = without(out[path[0]], path[1:])
    if set(inner) - {"."}:
        out[path[0]] = inner
    else:
        del out[path[0]]
    return out


def upgraded(managed_fields: Iterable[Mapping[str, Any]], *, apply_manager: str, api_version: str,
             drop: Sequence[Sequence[str]] = ()) -> list[dict[str, Any]] | None:
    """managedFields with every legacy Update entry merged into `apply_manager`'s Apply entry; None when there is
    nothing to move. Other managers' entries (the Deployment controller's status, an autoscaler's replicas, someone's
    `kubectl edit`) are kept as they are."""
    entries = [dict(e) for e in managed_fields]
    legacy = [e for e in entries if _legacy_entry(e, apply_manager)]
    if not legacy:
        return None
    merged: dict[str, Any] = {}
    for entry in legacy:
        merged = union(merged, entry.get("fieldsV1") or {})
    current = next((e for e in entries if e.get("manager") == apply_manager and e.get("operation") == "Apply"
                    and not e.get("subresource")), None)
    if current is not None:
        merged = union(current.get("fieldsV1") or {}, merged)
    for path in drop:
        merged = without(merged, path)
    kept = [e for e in entries if e not in legacy and e is not current]
    entry = {"manager": apply_manager, "operation": "Apply", "apiVersion": api_version, "fieldsType": "FieldsV1",
             "fieldsV1": merged}
    if current is not None and current.get("time"):
        entry["time"] = current["time"]
    return [*kept, entry]


__all__ = ["LEGACY_ANNOTATION", "LEGACY_MANAGERS", "REPLICAS", "needs_upgrade", "union", "upgraded", "without"]
