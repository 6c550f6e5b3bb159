"""The autoscaler's decision in a pool's status, and a wake from zero as two events."""

from __future__ import annotations

from typing import Any

from vllm_operator.api.status import AutoscalerStatus, PoolsStatus, PoolStatus, VLLMDeploymentStatus
from vllm_operator.handlers import scaling


def cond(type_: str, status: str, reason: str = "R", message: str = "m") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def test_at_zero_the_scaled_objects_active_condition_is_the_decision() -> None:
    hpa = {"status": {"currentReplicas": 0, "desiredReplicas": 0, "conditions": [
        cond("ScalingActive", "False", "ScalingDisabled", "scaling is disabled since the replica count of the "
                                                           "target is zero")]}}
    so = {"status": {"conditions": [cond("Active", "False", "ScalerNotActive", "Scaling is not performed because "
                                                                               "triggers are not active")]}}
    got = scaling.autoscaler_status(hpa, so)
    assert got.active is False and got.current_replicas == 0
    assert got.decision == "asleep at 0: Scaling is not performed because triggers are not active"


def test_above_zero_the_hpa_decides() -> None:
    hpa = {"status": {"currentReplicas": 1, "desiredReplicas": 3, "lastScaleTime": "2026-12-02T02:00:00Z",
                      "conditions": [cond("AbleToScale", "True", "SucceededRescale",
                                          "the HPA controller was able to update the target scale to 3"),
                                     cond("ScalingLimited", "False")]}}
    so = {"status": {"conditions": [cond("Active", "True", "ScalerActive", "Scaling is performed")]}}
    got = scaling.autoscaler_status(hpa, so)
    assert (got.desired_replicas, got.current_replicas, got.active) == (3, 1, True)
    assert got.decision == "AbleToScale SucceededRescale: the HPA controller was able to update the target scale to 3"
    assert got.last_scale_time == "2026-12-02T02:00:00Z"
    limited = {"status": {"conditions": [cond("ScalingLimited", "True", "TooManyReplicas", "at max 3")]}}
    assert scaling.autoscaler_status(limited, so).decision == "ScalingLimited TooManyReplicas: at max 3"
    assert scaling.autoscaler_status(None, so).decision == "waiting for KEDA to create the HPA"


def status(desired: int, ready: int, woke_at: str | None = None) -> VLLMDeploymentStatus:
    return VLLMDeploymentStatus(pools=PoolsStatus(long=PoolStatus(desired_replicas=desired, replicas=ready,
                                                                  ready_replicas=ready, woke_at=woke_at)))


def test_a_wake_is_two_events_with_the_time_between() -> None:
    scaler = {"long": AutoscalerStatus(decision="AbleToScale SucceededRescale: to 1")}
    asleep = status(0, 0)
    waking, events = scaling.with_autoscalers(asleep, status(1, 0), scaler, "2026-12-02T02:00:00Z")
    assert [e.reason for e in events] == ["PoolWaking"] and "from 0" in events[0].message
    assert waking.pools is not None and waking.pools.long is not None
    assert waking.pools.long.woke_at == "2026-12-02T02:00:00Z"
    still, events = scaling.with_autoscalers(waking, status(1, 0), scaler, "2026-12-02T02:00:10Z")
    assert events == [] and still.pools is not None and still.pools.long is not None
    assert still.pools.long.woke_at == "2026-12-02T02:00:00Z"
    awake, events = scaling.with_autoscalers(still, status(1, 1), scaler, "2026-12-02T02:00:42Z")
    assert [e.reason for e in events] == ["PoolWoke"]
    assert events[0].message == "Pool long woke: its first replica is Ready 42 s after it was asked to wake"
    assert awake.pools is not None and awake.pools.long is not None and awake.pools.long.woke_at is None


def test_a_wake_seen_at_once_is_one_event() -> None:
    scaler = {"long": AutoscalerStatus(active=True)}
    _, events = scaling.with_autoscalers(status(0, 0), status(1, 1), scaler, "2026-12-02T02:00:07Z")
    assert [(e.reason, e.message) for e in events] == [
        ("PoolWoke", "Pool long woke: its first replica is Ready when the wake was first seen (within one status "
                     "refresh)")]


def test_pools_without_autoscaling_carry_no_autoscaler() -> None:
    out, events = scaling.with_autoscalers(status(0, 0), status(1, 1), {}, "2026-12-02T02:00:00Z")
    assert events == [] and out.pools is not None and out.pools.long is not None
    assert out.pools.long.autoscaler is None
