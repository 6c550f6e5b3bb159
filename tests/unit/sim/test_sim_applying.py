"""Server-side apply ownership rules (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_operator.sim import applying, patching


def merge(target: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = patching.merge_patch(target, config)
    return result


def test_leaf_paths_skip_identity_and_treat_lists_as_atomic() -> None:
    paths = applying.leaf_paths({"apiVersion": "v1", "kind": "X", "metadata": {"name": "n", "labels": {"a": "b"}},
                                 "spec": {"list": [1, 2], "empty": {}, "n": 1}})
    assert paths == {("metadata", "labels", "a"): "b", ("spec", "list"): [1, 2], ("spec", "empty"): {},
                     ("spec", "n"): 1}


def test_same_value_is_shared_ownership_not_a_conflict() -> None:
    current = {"spec": {"n": 1}}
    owners = {"alice": {("spec", "n")}}
    new, table = applying.apply(current, {"spec": {"n": 1}}, "bob", owners, force=False, merge=merge)
    assert new == {"spec": {"n": 1}} and table == {"alice": {("spec", "n")}, "bob": {("spec", "n")}}
    after, table = applying.apply(new, {}, "alice", table, force=False, merge=merge)
    assert after == {"spec": {"n": 1}}  # still owned by bob, so alice dropping it removes nothing


def test_conflict_message_lists_every_conflict() -> None:
    owners = {"alice": {("spec", "a"), ("spec", "b")}}
    with pytest.raises(applying.ApplyConflict, match=r'2 conflicts: conflict with "alice": \.spec\.a, conflict'):
        applying.apply({"spec": {"a": 1, "b": 2}}, {"spec": {"a": 9, "b": 9}}, "bob", owners, force=False,
                       merge=merge)
