"""The three PATCH flavours the API server accepts: JSON merge, JSON patch (RFC 6902) and strategic merge.

Clients choose the flavour by Content-Type and behave differently per flavour: the official Python client sends
strategic merge patches for built-in kinds and merge patches for custom objects, kopf uses merge patches, kubectl
apply uses strategic merge with `$setElementOrder` directives. Treating all of them as a naive dict merge (as kmock
does) hides bugs such as a merge patch silently replacing a whole container list.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = (MERGE_PATCH, JSON_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH)


class PatchError(ValueError):
    """A patch that cannot be applied; the API server answers these with 422 (JSON patch) or 400."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, `null` removes a key, anything else (lists too) replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}: must start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _resolve(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts:
        if isinstance(node, dict):
            if part not in node:
                raise PatchError(f"jsonpatch: path {path!r} does not exist (missing key {part!r})")
            node = node[part]
        elif isinstance(node, list):
            index = _index(node, part, path, allow_end=False)
            node = node[index]
        else:
            raise PatchError(f"jsonpatch: path {path!r} does not exist")
    return node


def _index(node: list[Any], part: str, path: str, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(node)
    if not part.isdigit():
        raise PatchError(f"jsonpatch: invalid array index {part!r} in {path!r}")
    index = int(part)
    if index > len(node) or (index == len(node) and not allow_end):
        raise PatchError(f"jsonpatch: array index {index} out of bounds in {path!r}")
    return index


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(value)
    parent = _resolve(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, path, allow_end=True), copy.deepcopy(value))
    else:
        raise PatchError(f"jsonpatch add: parent of {path!r} is not a container")
    return doc


def _remove(doc: Any, path: str) -> tuple[Any, Any]:
    parts = _pointer(path)
    if not parts:
        raise PatchError("jsonpatch remove: cannot remove the document root")
    parent = _resolve(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"jsonpatch remove operation does not apply: doc is missing path: {path!r}")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, last, path, allow_end=False))
    raise PatchError(f"jsonpatch remove: parent of {path!r} is not a container")


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 with every op; a failing `test` raises PatchError like the server's 422."""
    if not isinstance(operations, list):
        raise PatchError("json patch must be a JSON array of operations")
    doc = copy.deepcopy(target)
    for number, op in enumerate(operations):
        if not isinstance(op, Mapping) or "op" not in op or "path" not in op:
            raise PatchError(f"jsonpatch: operation #{number} needs 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, op.get("value"))
        elif kind == "remove":
            doc, _ = _remove(doc, path)
        elif kind == "replace":
            _resolve(doc, _pointer(path), path)  # must exist
            doc, _ = _remove(doc, path) if _pointer(path) else (doc, None)
            doc = _add(doc, path, op.get("value"))
        elif kind == "move":
            doc, value = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "copy":
            value = _resolve(doc, _pointer(op["from"]), op["from"])
            doc = _add(doc, path, value)
        elif kind == "test":
            actual = _resolve(doc, _pointer(path), path)
            if actual != op.get("value"):
                raise PatchError(
                    f"testing value {path} failed: test operation does not apply: "
                    f"is {actual!r}, expected {op.get('value')!r}"
                )
        else:
            raise PatchError(f"jsonpatch: unexpected operation {kind!r}")
    return doc


# Patch merge keys of the built-in types (from the `patchMergeKey` tags of k8s.io/api), by field name.
# Lists not named here are atomic (replaced), as in the real server.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "resourceClaims": "name",
    "schedulingGates": "name",
    "podIPs": "ip",
    "hostIPs": "ip",
    "topologySpreadConstraints": "topologyKey",
}
# Primitive lists with patchStrategy "merge" (union instead of replace).
MERGED_PRIMITIVE_LISTS = frozenset({"finalizers"})


def _merge_key(field: str, items: list[Any]) -> str | None:
    if field == "ports":
        sample = next((item for item in items if isinstance(item, Mapping)), {})
        return "containerPort" if "containerPort" in sample else "port"
    return MERGE_KEYS.get(field)


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge for built-in kinds: lists with a merge key merge by it, directives are honoured."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result: dict[str, Any] = copy.deepcopy(dict(target)) if isinstance(target, Mapping) else {}
    retain = patch.get("$retainKeys")
    orders = {k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$setElementOrder/")}
    deletions = {k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$deleteFromPrimitiveList/")}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        elif isinstance(value, Mapping):
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = copy.deepcopy(value)
    for key, values in deletions.items():
        if isinstance(result.get(key), list):
            result[key] = [item for item in result[key] if item not in values]
    for key, order in orders.items():
        if isinstance(result.get(key), list):
            result[key] = _reorder(key, result[key], order)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    existing: list[Any] = copy.deepcopy(current) if isinstance(current, list) else []
    if field in MERGED_PRIMITIVE_LISTS and all(not isinstance(v, Mapping) for v in patch):
        return existing + [v for v in patch if v not in existing]
    key = _merge_key(field, patch + existing)
    if key is None or not all(isinstance(v, Mapping) for v in patch):
        return [item for item in copy.deepcopy(patch) if not (isinstance(item, Mapping) and "$patch" in item)]
    if any(isinstance(item, Mapping) and item.get("$patch") == "replace" for item in patch):
        return [{k: v for k, v in item.items() if k != "$patch"} for item in patch if item.get("$patch") != "replace"]
    for item in patch:
        if key not in item:
            raise PatchError(f"map: {dict(item)!r} does not contain declared merge key: {key}")
        position = next((i for i, old in enumerate(existing) if isinstance(old, Mapping)
                         and old.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if position is not None:
                existing.pop(position)
            continue
        if position is None:
            existing.append(strategic_merge_patch({}, item))
        else:
            existing[position] = strategic_merge_patch(existing[position], item)
    return existing


def _reorder(field: str, items: list[Any], order: list[Any]) -> list[Any]:
    if not order:
        return items
    if isinstance(order[0], Mapping):
        key = _merge_key(field, items + order) or "name"
        wanted = [o.get(key) for o in order]

        def rank(item: Any) -> int:
            value = item.get(key) if isinstance(item, Mapping) else None
            return wanted.index(value) if value in wanted else len(wanted)
    else:
        def rank(item: Any) -> int:
            return order.index(item) if item in order else len(order)
    return sorted(items, key=rank)
