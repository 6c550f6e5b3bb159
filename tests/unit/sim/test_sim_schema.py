"""Structural schema pruning, defaulting, validation and CEL rules (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_operator.sim.schema import Structural

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "n": {"type": "integer", "default": 1, "minimum": 0},
                "q": {"x-kubernetes-int-or-string": True},
                "kv": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
                       "items": {"type": "object", "properties": {"k": {"type": "string"}, "v": {"type": "string"}},
                                 "x-kubernetes-validations": [{"rule": "self.v == oldSelf.v",
                                                               "message": "v is immutable"}]}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "any": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            },
            "x-kubernetes-validations": [{"rule": "self.n < 5", "messageExpression": "'n is ' + string(self.n)"}],
        },
    },
}


def build() -> Structural:
    structural, problems = Structural.build(SCHEMA)
    assert problems == []
    return structural


def test_prune_reports_dropped_paths_and_keeps_preserved_subtrees() -> None:
    pruned, dropped = build().prune({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a", "odd": 1},
                                     "spec": {"n": 2, "zzz": 1, "free": {"any": {"thing": 1}},
                                              "kv": [{"k": "a", "extra": True}]}, "top": 1})
    assert dropped == ["metadata.odd", "spec.zzz", "spec.kv[0].extra", "top"]
    assert pruned["spec"]["free"] == {"any": {"thing": 1}}


def test_defaults_fill_missing_and_non_nullable_nulls() -> None:
    assert build().apply_defaults({"spec": {}})["spec"]["n"] == 1
    assert build().apply_defaults({"spec": {"n": None}})["spec"]["n"] == 1


@pytest.mark.parametrize(("spec", "expected"), [
    ({"n": 2, "q": "50%"}, []),
    ({"n": 2, "q": 3}, []),
    ({"n": 2, "q": 1.5}, ["spec.q"]),
    ({"n": -1}, ["spec.n"]),
    ({"n": 7}, ["spec"]),
    ({"n": 2, "kv": [{"k": "a"}, {"k": "a"}]}, ["spec.kv[1]"]),
    ({"n": 2, "any": True}, ["spec.any"]),
], ids=["int-or-string-string", "int-or-string-int", "int-or-string-float", "minimum", "cel", "list-map-dup",
        "any-of"])
def test_validation_paths(spec: dict[str, Any], expected: list[str]) -> None:
    issues = build().validate({"spec": spec}, None)
    assert [i.cause.field for i in issues] == expected


def test_message_expression_and_transition_rule_on_list_map_items() -> None:
    structural = build()
    [issue] = structural.validate({"spec": {"n": 9}}, None)
    assert issue.cause.message == 'Invalid value: "object": n is 9'
    old = {"spec": {"n": 1, "kv": [{"k": "a", "v": "1"}]}}
    assert structural.validate({"spec": {"n": 1, "kv": [{"k": "a", "v": "1"}, {"k": "b", "v": "2"}]}}, old) == []
    [changed] = structural.validate({"spec": {"n": 1, "kv": [{"k": "a", "v": "2"}]}}, old)
    assert (changed.cause.field, changed.cause.message) == ("spec.kv[0]", 'Invalid value: "object": v is immutable')


def test_schema_problems_are_reported() -> None:
    _, problems = Structural.build({"type": "object", "properties": {"x": {}, "y": {
        "type": "string", "x-kubernetes-validations": [{"rule": "self ==="}]}}})
    paths = [p for p, _ in problems]
    assert "openAPIV3Schema.properties[x].type" in paths
    assert "openAPIV3Schema.properties[y].x-kubernetes-validations[0].rule" in paths
