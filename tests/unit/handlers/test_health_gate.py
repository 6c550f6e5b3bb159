"""The health timer skips a VLLMDeployment its reconcile has not written status for yet."""

from __future__ import annotations

from vllm_operator.handlers.health import reconciled_once


def test_only_a_reconciled_object_is_checked() -> None:
    assert not reconciled_once({"metadata": {"name": "a"}})
    assert not reconciled_once({"metadata": {"name": "a"}, "status": {}})
    assert not reconciled_once({"metadata": {"name": "a"}, "status": {"kopf": {"progress": {}}}})
    assert reconciled_once({"metadata": {"name": "a"}, "status": {"observedGeneration": 1}})
    assert reconciled_once({"metadata": {"name": "a", "generation": 3}, "status": {"observedGeneration": 2}})
