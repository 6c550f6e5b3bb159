"""One writer per condition: MetricsAvailable is the health loop's (it knows whether samples arrive); the reconcile's
status writers never set it, keep the loop's value as it is, and add none of their own — with or without the
Prometheus operator's CRDs (a missing one is a plan warning, not a second reason on this condition)."""

from __future__ import annotations

from tests.unit.rendering.plans import gpu_case
from vllm_operator import constants
from vllm_operator.api.conditions import get_condition, set_condition
from vllm_operator.api.status import VLLMDeploymentStatus
from vllm_operator.handlers import conditions

NOW, LATER = "2026-12-02T05:00:00Z", "2026-12-02T05:10:00Z"


def loop_status() -> VLLMDeploymentStatus:
    """A status whose MetricsAvailable the health loop wrote (targets down)."""
    return VLLMDeploymentStatus(conditions=set_condition(
        [], constants.COND_METRICS_AVAILABLE, False, "TargetsDown", "pod p1: up == 0", generation=1, now=NOW))


def test_the_controllers_status_writers_leave_metrics_available_to_the_health_loop() -> None:
    plan, _ = gpu_case()
    before = get_condition(loop_status(), constants.COND_METRICS_AVAILABLE)
    after_plan = conditions.with_plan(loop_status(), plan, {"short": None, "long": None}, None, generation=2,
                                      now=LATER)
    after_error = conditions.with_spec_error(loop_status(), "spec.pools", "both pools are disabled", generation=2,
                                             now=LATER)
    after_scaling = conditions.with_autoscaling(after_plan, (False, "KEDAMissing", "no KEDA"), generation=2,
                                                now=LATER)
    for status in (after_plan, after_error, after_scaling):
        assert get_condition(status, constants.COND_METRICS_AVAILABLE) == before
    fresh = conditions.with_plan(None, plan, {"short": None, "long": None}, None, generation=1, now=NOW)
    assert get_condition(fresh, constants.COND_METRICS_AVAILABLE) is None
