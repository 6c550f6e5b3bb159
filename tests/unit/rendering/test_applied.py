"""The applied-fields annotation and the merge patch that removes fields the rendering dropped."""

from __future__ import annotations

import json
from typing import Any

from vllm_operator.rendering import applied
from vllm_operator.sim.patching import merge_patch


def deployment(**pod: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "annotations": {"x/spec-hash": "1"}, "labels": {"a": "1"}},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c", "args": ["--x"]}], **pod}}},
            "status": {"replicas": 2}}


def test_field_set_is_the_key_tree_without_status_or_itself() -> None:
    obj = applied.annotate(deployment(tolerations=[{"key": "k"}], nodeSelector={"pool": "gpu"}))
    fields = applied.recorded(obj)
    assert fields is not None
    assert "status" not in fields
    assert applied.ANNOTATION not in fields["metadata"]["annotations"]
    assert fields["spec"]["template"]["spec"] == {"containers": {}, "tolerations": {}, "nodeSelector": {"pool": {}}}
    assert json.loads(obj["metadata"]["annotations"][applied.ANNOTATION]) == fields


def test_dropped_keys_become_null_and_the_patch_removes_them() -> None:
    before = applied.annotate(deployment(tolerations=[{"key": "k"}], nodeSelector={"pool": "gpu", "zone": "a"}))
    live = {**before, "metadata": {**before["metadata"],
                                   "annotations": {**before["metadata"]["annotations"],
                                                   "deployment.kubernetes.io/revision": "3"}}}
    desired = applied.annotate(deployment(nodeSelector={"zone": "a"}))
    patch = applied.with_removals(applied.recorded(live), desired)
    pod = patch["spec"]["template"]["spec"]
    assert pod["tolerations"] is None
    assert pod["nodeSelector"] == {"pool": None, "zone": "a"}
    result = merge_patch(live, {k: v for k, v in patch.items() if k != "status"})
    assert "tolerations" not in result["spec"]["template"]["spec"]
    assert result["spec"]["template"]["spec"]["nodeSelector"] == {"zone": "a"}
    assert result["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "3", "not ours: kept"


def test_without_a_record_nothing_is_removed() -> None:
    desired = deployment()
    assert applied.with_removals(None, desired) == desired
    assert applied.recorded({"metadata": {"annotations": {applied.ANNOTATION: "not json"}}}) is None
    assert applied.recorded({"metadata": {"annotations": {applied.ANNOTATION: "[1]"}}}) is None
    assert applied.recorded(None) is None


def test_a_leaf_that_became_a_map_keeps_the_new_map() -> None:
    patch = applied.with_removals({"spec": {"x": {}}}, {"spec": {"x": {"a": 1}}})
    assert patch == {"spec": {"x": {"a": 1}}}
