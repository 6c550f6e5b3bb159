"""managedFields of the release before server-side apply moved to the apply manager, as client-go's csaupgrade does."""

from __future__ import annotations

from typing import Any

from vllm_operator.handlers.managedfields import union, upgraded, without


def entry(manager: str, operation: str, fields: dict[str, Any], **extra: str) -> dict[str, Any]:
    return {"manager": manager, "operation": operation, "apiVersion": "apps/v1", "fieldsType": "FieldsV1",
            "fieldsV1": fields, **extra}


def test_union_and_without() -> None:
    a = {"f:metadata": {"f:labels": {".": {}, "f:a": {}}}}
    b = {"f:metadata": {"f:labels": {"f:b": {}}}, "f:spec": {"f:replicas": {}}}
    assert union(a, b) == {"f:metadata": {"f:labels": {".": {}, "f:a": {}, "f:b": {}}}, "f:spec": {"f:replicas": {}}}
    assert without(union(a, b), ("f:spec", "f:replicas")) == {"f:metadata": {"f:labels": {".": {}, "f:a": {},
                                                                                          "f:b": {}}}}
    assert without(a, ("f:spec", "f:replicas")) == a


def test_legacy_entries_merge_into_the_existing_apply_entry_and_others_stay() -> None:
    hpa = entry("kube-controller-manager", "Update", {"f:spec": {"f:replicas": {}}}, subresource="scale")
    edit = entry("kubectl-edit", "Update", {"f:metadata": {"f:annotations": {"f:team": {}}}})
    out = upgraded([
        entry("vllm-operator", "Update", {"f:spec": {"f:template": {"f:a": {}}}}),
        entry("vllm-operator", "Apply", {"f:spec": {"f:template": {"f:b": {}}}}, time="2026-01-01T00:00:00Z"),
        hpa, edit], apply_manager="vllm-operator", api_version="apps/v1")
    assert out == [hpa, edit, entry("vllm-operator", "Apply", {"f:spec": {"f:template": {"f:a": {}, "f:b": {}}}},
                                    time="2026-01-01T00:00:00Z")]


def test_nothing_to_move() -> None:
    assert upgraded([entry("vllm-operator", "Apply", {})], apply_manager="vllm-operator", api_version="v1") is None
    assert upgraded([], apply_manager="vllm-operator", api_version="v1") is None
