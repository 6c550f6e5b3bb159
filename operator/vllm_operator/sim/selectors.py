"""Label and field selectors, parsed the way the Kubernetes API server parses them.

Controllers find their children by label selector and kopf narrows watches with them, so a server that ignores
selectors hides real bugs (a controller that adopts every Pod in the namespace looks correct). The grammar follows
apimachinery's `labels.Parse`: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, joined by commas.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class SelectorError(ValueError):
    """A selector string that the real API server would refuse with 400 BadRequest."""


_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Requirement:
    """One clause of a label selector; `op` is one of =, !=, in, notin, exists, !."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        return not present  # "!"


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _check_key(key: str, clause: str) -> str:
    if not _KEY.match(key) or len(key.rsplit("/", maxsplit=1)[-1]) > 63:
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r} in {clause!r}")
    return key


def _check_value(value: str, clause: str) -> str:
    if len(value) > 63 or not _VALUE.match(value):
        raise SelectorError(f"unable to parse requirement: invalid label value {value!r} in {clause!r}")
    return value


_SET_CLAUSE = re.compile(r"^\s*(\S+)\s+(in|notin)\s*\((.*)\)\s*$")


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse a `labelSelector` query value; an empty or missing selector selects everything."""
    if not text or not text.strip():
        return []
    requirements: list[Requirement] = []
    for raw in _split_top_level(text):
        clause = raw.strip()
        if not clause:
            raise SelectorError(f"unable to parse requirement: empty clause in {text!r}")
        set_match = _SET_CLAUSE.match(clause)
        if set_match:
            key = _check_key(set_match.group(1), clause)
            values = tuple(_check_value(v.strip(), clause) for v in set_match.group(3).split(","))
            if values == ("",):
                raise SelectorError(f"unable to parse requirement: {clause!r}: for 'in', 'notin' operators, "
                                    "values set can't be empty")
            requirements.append(Requirement(key, set_match.group(2), values))
        elif clause.startswith("!"):
            requirements.append(Requirement(_check_key(clause[1:].strip(), clause), "!"))
        elif "!=" in clause:
            key, value = clause.split("!=", 1)
            requirements.append(Requirement(_check_key(key.strip(), clause), "!=",
                                            (_check_value(value.strip(), clause),)))
        elif "==" in clause or "=" in clause:
            key, value = clause.split("==", 1) if "==" in clause else clause.split("=", 1)
            requirements.append(Requirement(_check_key(key.strip(), clause), "=",
                                            (_check_value(value.strip(), clause),)))
        elif re.search(r"[\s()<>]", clause):
            raise SelectorError(f"unable to parse requirement: found {clause!r}, expected: in, notin, =, ==, !=")
        else:
            requirements.append(Requirement(_check_key(clause, clause), "exists"))
    return requirements


def labels_match(requirements: Sequence[Requirement], obj: Mapping[str, Any]) -> bool:
    """Whether an object's `metadata.labels` satisfy every requirement."""
    if not requirements:
        return True
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(req.matches(labels) for req in requirements)


@dataclass(frozen=True)
class FieldRequirement:
    """One clause of a field selector: `path` (dotted) compared with `=` or `!=`."""

    path: str
    op: str
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        actual = field_value(obj, self.path)
        return (actual == self.value) if self.op == "=" else (actual != self.value)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """A field as the API server's field-selector index renders it: missing is "", booleans lower case."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def parse_field_selector(text: str | None, allowed: Callable[[str], bool]) -> list[FieldRequirement]:
    """Parse a `fieldSelector`; fields that `allowed` rejects fail as on a real server (400)."""
    if not text or not text.strip():
        return []
    result: list[FieldRequirement] = []
    for raw in text.split(","):
        clause = raw.strip()
        if "!=" in clause:
            path, value = clause.split("!=", 1)
            op = "!="
        elif "==" in clause:
            path, value = clause.split("==", 1)
            op = "="
        elif "=" in clause:
            path, value = clause.split("=", 1)
            op = "="
        else:
            raise SelectorError(f"invalid selector: {text!r}; can't understand {clause!r}")
        path = path.strip()
        if not allowed(path):
            raise SelectorError(f'field label not supported: {path}')
        result.append(FieldRequirement(path, op, value.strip()))
    return result


def fields_match(requirements: Sequence[FieldRequirement], obj: Mapping[str, Any]) -> bool:
    return all(req.matches(obj) for req in requirements)
