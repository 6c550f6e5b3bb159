"""Server-side apply, approximated: per-manager field ownership of applied configurations.

What a client of `application/apply-patch+yaml` relies on is: the applied configuration is merged in; fields the
same manager applied before and now omits are removed; a field another applier owns with a different value is a
409 conflict unless `force=true`, which takes the field over. This module keeps exactly that, on leaf paths
(dict keys; lists are atomic leaves). It does not track ownership from non-apply writes (PUT/PATCH) and exposes no
`managedFields` — the README lists those differences.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

Path = tuple[str, ...]
Owners = dict[str, set[Path]]
_IDENTITY = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace"),
             ("metadata", "resourceVersion"), ("metadata", "uid")}


class ApplyConflict(Exception):
    def __init__(self, conflicts: list[tuple[str, Path]]) -> None:
        self.conflicts = conflicts
        rendered = ", ".join(f'conflict with "{manager}": .{".".join(path)}' for manager, path in conflicts)
        count = len(conflicts)
        super().__init__(f"Apply failed with {count} conflict{'s' if count > 1 else ''}: {rendered}")


def leaf_paths(obj: Any, prefix: Path = ()) -> dict[Path, Any]:
    """Every leaf (scalar or list) of a configuration, by path; identity fields are not owned."""
    out: dict[Path, Any] = {}
    if isinstance(obj, dict) and obj:
        for key, value in obj.items():
            out.update(leaf_paths(value, (*prefix, str(key))))
    elif prefix and prefix not in _IDENTITY:
        out[prefix] = obj
    return out


def _get(obj: Any, path: Path) -> tuple[Any, bool]:
    node = obj
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None, False
        node = node[part]
    return node, True


def _remove(obj: dict[str, Any], path: Path) -> None:
    """Remove a leaf, and the maps its removal left empty: a real API server removes a map the manager owned as a
    whole (`nodeSelector` with its last key dropped is gone, not `{}`)."""
    node: Any = obj
    parents: list[tuple[dict[str, Any], str]] = []
    for part in path[:-1]:
        if not isinstance(node, dict) or part not in node:
            return
        parents.append((node, part))
        node = node[part]
    if isinstance(node, dict) and path[-1] in node:
        node.pop(path[-1])
        for parent, key in reversed(parents):
            if parent[key] == {}:
                del parent[key]
            else:
                break


def apply(current: dict[str, Any], applied: dict[str, Any], manager: str, owners: Owners, *, force: bool,
          merge: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]) -> tuple[dict[str, Any], Owners]:
    """Merge `applied` into `current` for `manager`; returns the new object and the new ownership table."""
    wanted = leaf_paths(applied)
    conflicts: list[tuple[str, Path]] = []
    for other, paths in sorted(owners.items()):
        if other == manager:
            continue
        for path in sorted(paths & set(wanted)):
            value, present = _get(current, path)
            if not present or value != wanted[path]:
                conflicts.append((other, path))
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    table = {m: set(p) for m, p in owners.items()}
    for other, path in conflicts:
        table[other].discard(path)
    new = merge(copy.deepcopy(current), applied)
    others = set().union(*(p for m, p in table.items() if m != manager)) if table else set()
    for path in table.get(manager, set()) - set(wanted):
        if path not in others:
            _remove(new, path)
    table[manager] = set(wanted)
    return new, {m: p for m, p in table.items() if p}
