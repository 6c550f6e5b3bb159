"""The health loop's pure helpers: status merge patches, the ladder view from a real plan, settings resolution."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.support.paths import EXAMPLES
from vllm_operator.api import remediation
from vllm_operator.api.resource import parse_resource
from vllm_operator.api.spec import RemediationSpec, RemediationThresholds
from vllm_operator.api.status import PoolsStatus, PoolStatus, StepDownStatus, VLLMDeploymentStatus
from vllm_operator.health.rungs import ladder_views
from vllm_operator.k8s import merge_diff
from vllm_operator.planning import RemediationState, plan


@pytest.mark.parametrize(("old", "new", "patch"), [
    ({"a": 1}, {"a": 1}, None),
    ({"a": 1, "b": 2}, {"a": 1}, {"b": None}),
    ({"a": {"x": 1, "y": 2}}, {"a": {"x": 1}}, {"a": {"y": None}}),
    ({"a": [1, 2]}, {"a": [1]}, {"a": [1]}),
    ({}, {"a": {"x": 1}}, {"a": {"x": 1}}),
    ({"a": {"x": 1}}, {"a": 5}, {"a": 5}),
], ids=["equal", "removed-key", "nested-removal", "list-replaced", "added", "type-change"])
def test_merge_diff(old: dict[str, Any], new: dict[str, Any], patch: dict[str, Any] | None) -> None:
    assert merge_diff(old, new) == patch


def chat_plan(level: int = 0, kv_level: int = 0) -> Any:
    resource = parse_resource(yaml.safe_load((EXAMPLES / "chat.yaml").read_text()))
    status = VLLMDeploymentStatus(pools=PoolsStatus(short=PoolStatus(step_down=StepDownStatus(level=level,
                                                                                              kv_level=kv_level))))
    return plan(resource.spec, None, RemediationState.from_status(status), name="chat", namespace="ml")


def test_ladder_view_from_the_plan_in_effect() -> None:
    views = ladder_views(chat_plan(), allow_lower_max_model_len=False)
    assert views["short"].next_memory == (1, "gpu-memory-utilization 0.9->0.85")
    assert views["short"].next_kv == (1, "kv-cache-dtype auto->fp8")
    assert not views["short"].host_memory
    moved = ladder_views(chat_plan(level=1), allow_lower_max_model_len=False)
    assert moved["short"].next_memory is not None and moved["short"].next_memory[0] == 2
    assert "max-num-batched-tokens" in moved["short"].next_memory[1]
    assert ladder_views(chat_plan(kv_level=1), allow_lower_max_model_len=False)["short"].next_kv is None


def test_cpu_pools_count_host_oom() -> None:
    resource = parse_resource(yaml.safe_load((EXAMPLES / "cpu-dev.yaml").read_text()))
    the_plan = plan(resource.spec, None, RemediationState(), name="dev", namespace="dev")
    assert all(v.host_memory for v in ladder_views(the_plan, False).values())


def test_settings_defaults_and_overrides() -> None:
    d = remediation.resolve(None)
    assert (d.interval_s, d.stall_s, d.window_s, d.restart_budget, d.oom_count) == (30, 120, 600, 3, 2)
    assert (d.length_share_watch, d.length_share_alert, d.kv_pressure) == (0.05, 0.20, 0.95)
    assert d.stale_after_s == 60
    spec = RemediationSpec.model_validate({"intervalSeconds": 10, "restartBudget": 0, "stepDown": False,
                                           "thresholds": {"stallSeconds": 30, "oomCount": 3}})
    s = remediation.resolve(spec, interval_override=1)
    assert (s.interval_s, s.restart_budget, s.step_down, s.stall_s, s.oom_count) == (1, 0, False, 30, 3)
    assert s.stale_after_s == 15


def test_thresholds_merge_field_by_field() -> None:
    klass = RemediationThresholds(stall_seconds=60, window_seconds=300)
    own = RemediationThresholds(stall_seconds=30)
    merged = remediation.merge_thresholds(own, klass)
    assert merged is not None and (merged.stall_seconds, merged.window_seconds, merged.oom_count) == (30, 300, None)
    assert remediation.merge_thresholds(None, klass) == klass and remediation.merge_thresholds(own, None) == own
    assert remediation.merge_thresholds(None, None) is None
    s = remediation.resolve(RemediationSpec.model_validate({"thresholds": {"stallSeconds": 5}}), thresholds=merged)
    assert (s.stall_s, s.window_s) == (30, 300), "the plan's merged thresholds replace the spec's own"
