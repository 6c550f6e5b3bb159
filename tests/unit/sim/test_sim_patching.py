"""Merge patch, JSON patch and strategic merge patch semantics (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_operator.sim import patching


@pytest.mark.parametrize(("target", "patch", "expected"), [
    ({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": None, "e": 4}}, {"a": 1, "b": {"d": 3, "e": 4}}),
    ({"l": [1, 2, 3]}, {"l": [9]}, {"l": [9]}),
    ({"a": 1}, {"a": {"nested": True}}, {"a": {"nested": True}}),
], ids=["null-deletes-and-nested-merge", "lists-replace", "scalar-to-object"])
def test_merge_patch(target: dict[str, Any], patch: dict[str, Any], expected: dict[str, Any]) -> None:
    assert patching.merge_patch(target, patch) == expected


def test_json_patch_ops_and_failing_test() -> None:
    doc = {"metadata": {"resourceVersion": "5", "finalizers": ["a"]}, "spec": {"x": 1}}
    out = patching.json_patch(doc, [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "5"},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "b"},
        {"op": "replace", "path": "/spec/x", "value": 2},
        {"op": "copy", "from": "/spec/x", "path": "/spec/y"},
        {"op": "move", "from": "/spec/y", "path": "/spec/z"},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ])
    assert out == {"metadata": {"resourceVersion": "5", "finalizers": ["b"]}, "spec": {"x": 2, "z": 2}}
    assert doc["spec"] == {"x": 1}  # the input is not mutated
    with pytest.raises(patching.PatchError, match="test operation does not apply"):
        patching.json_patch(doc, [{"op": "test", "path": "/metadata/resourceVersion", "value": "4"}])
    with pytest.raises(patching.PatchError, match="does not exist"):
        patching.json_patch(doc, [{"op": "replace", "path": "/spec/missing/deeper", "value": 1}])


def test_strategic_merge_merges_named_lists_and_honours_directives() -> None:
    target = {"spec": {"containers": [{"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
                                      {"name": "b", "image": "b:1"}],
                       "tolerations": [{"key": "t1"}]},
              "metadata": {"finalizers": ["f1"]}}
    patch = {"spec": {"containers": [{"name": "a", "env": [{"name": "Y", "value": "2"}]},
                                     {"name": "b", "$patch": "delete"},
                                     {"name": "c", "image": "c:1"}],
                      "tolerations": [{"key": "t2"}],
                      "$setElementOrder/containers": [{"name": "c"}, {"name": "a"}]},
             "metadata": {"finalizers": ["f2"]}}
    out = patching.strategic_merge_patch(target, patch)
    assert [c["name"] for c in out["spec"]["containers"]] == ["c", "a"]
    assert out["spec"]["containers"][1]["env"] == [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]
    assert out["spec"]["tolerations"] == [{"key": "t2"}]  # no merge key: atomic
    assert out["metadata"]["finalizers"] == ["f1", "f2"]  # patchStrategy merge on a primitive list
    replaced = patching.strategic_merge_patch(target, {"spec": {"$patch": "replace", "replicas": 1}})
    assert replaced["spec"] == {"replicas": 1}
    pruned = patching.strategic_merge_patch({"metadata": {"finalizers": ["a", "b"]}},
                                            {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}})
    assert pruned["metadata"]["finalizers"] == ["b"]
