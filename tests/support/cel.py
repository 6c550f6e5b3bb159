"""Evaluate a structural schema's CEL rules (`x-kubernetes-validations`) on an object, as an API server would."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import celpy


def rules_in(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, str]]]:
    """Every (schema path, rule) pair in a schema."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule
    for name, sub in schema.get("properties", {}).items():
        yield from rules_in(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from rules_in(schema["items"], f"{path}[]")


def violations(schema: dict[str, Any], obj: Any, path: str = "") -> list[tuple[str, str]]:
    """(object path, message) for every rule that evaluates to false on `obj`."""
    failed: list[tuple[str, str]] = []
    if obj is None:
        return failed
    env = celpy.Environment()
    for rule in schema.get("x-kubernetes-validations", []):
        program = env.program(env.compile(rule["rule"]))
        if not bool(program.evaluate({"self": celpy.json_to_cel(obj)})):
            failed.append((path, rule["message"]))
    if isinstance(obj, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in obj:
                failed += violations(sub, obj[name], f"{path}.{name}")
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            failed += violations(schema["items"], item, f"{path}[{i}]")
    return failed
