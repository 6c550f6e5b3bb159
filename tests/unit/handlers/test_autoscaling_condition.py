"""The Autoscaling condition: present only when a pool asks for autoscaling, False with a reason that says what is
missing (never a crash, never a silently unscaled pool)."""

from __future__ import annotations

from vllm_operator import constants
from vllm_operator.api.status import VLLMDeploymentStatus
from vllm_operator.handlers.conditions import get_condition, with_autoscaling
from vllm_operator.handlers.reconcile import AutoscalingState

NOW = "2026-12-02T00:00:00Z"


def test_reasons() -> None:
    assert AutoscalingState(("long",), keda=False, prometheus=True).condition()[:2] == (False, "KEDANotInstalled")
    _, _, message = AutoscalingState(("long",), keda=False, prometheus=True).condition()
    assert "scaledobjects.keda.sh" in message and "unscaled" in message
    assert AutoscalingState(("long",), keda=True, prometheus=False).condition()[:2] == (False, "NoPrometheus")
    assert AutoscalingState(("short", "long"), keda=True, prometheus=True).condition()[:2] == (
        True, "ScaledObjectsApplied")
    assert not AutoscalingState((), keda=True, prometheus=True).active


def test_condition_set_then_removed() -> None:
    status = with_autoscaling(VLLMDeploymentStatus(), (False, "KEDANotInstalled", "m"), generation=1, now=NOW)
    cond = get_condition(status, constants.COND_AUTOSCALING)
    assert cond is not None and cond.status == "False" and cond.reason == "KEDANotInstalled"
    cleared = with_autoscaling(status, None, generation=2, now=NOW)
    assert get_condition(cleared, constants.COND_AUTOSCALING) is None
