"""Autoscaling in the planner: class defaults fill what the spec leaves out, the starting count, and the refusals
that keep a sleeping long pool from breaking short requests."""

from __future__ import annotations

import pytest

from tests.unit.planning.helpers import make_plan, make_spec
from vllm_operator.api.errors import SpecError
from vllm_operator.api.spec import AutoscalingMetric, WorkloadClass
from vllm_operator.api.workload_class import VLLMWorkloadClassSpec
from vllm_operator.planning import RemediationState, plan, profiles


def test_no_autoscaling_keeps_replicas() -> None:
    p = make_plan(pools={"long": {"replicas": 3}})
    assert p.pools["long"].autoscaling is None and p.pools["long"].replicas == 3


@pytest.mark.parametrize(("klass", "pool", "low", "metric", "target", "idle"), [
    ("chat", "short", 1, "num-requests-waiting", 4, 600),
    ("chat", "long", 0, "num-requests-waiting", 2, 600),
    ("multi-turn", "long", 0, "num-requests-waiting", 2, 900),
    ("rag", "long", 1, "num-requests-waiting", 2, 600),
    ("long-doc", "long", 1, "kv-cache-usage", 0.8, 600),
])
def test_class_defaults_fill_unset_fields(klass: str, pool: str, low: int, metric: str, target: float,
                                         idle: int) -> None:
    p = make_plan(workloadClass=klass, pools={pool: {"autoscaling": {"maxReplicas": 4}}})
    a = p.pools[pool].autoscaling
    assert a is not None
    assert (a.min_replicas, a.max_replicas, a.metric, a.target, a.scale_down_stabilization_seconds,
            a.idle_seconds) == (low, 4, metric, target, 300, idle)


def test_spec_overrides_class_and_replicas_start_at_least_one() -> None:
    p = make_plan(pools={"long": {"autoscaling": {"minReplicas": 0, "maxReplicas": 2, "metric": "num-requests-running",
                                                  "scaleDownStabilizationSeconds": 5, "idleSeconds": 7}}})
    a = p.pools["long"].autoscaling
    assert a is not None and (a.min_replicas, a.metric, a.target, a.scale_down_stabilization_seconds,
                              a.idle_seconds) == (0, "num-requests-running", 4, 5, 7)
    assert p.pools["long"].replicas == 1, "a new minReplicas-0 pool starts with one replica and sleeps when idle"
    assert make_plan(pools={"short": {"autoscaling": {"minReplicas": 3, "maxReplicas": 5}}}).pools["short"].replicas \
        == 3


def test_class_min_is_capped_by_max() -> None:
    p = make_plan(workloadClass="rag", pools={"long": {"autoscaling": {"maxReplicas": 1}}})
    assert p.pools["long"].autoscaling is not None and p.pools["long"].autoscaling.min_replicas == 1


def test_class_default_zero_needs_a_running_short_pool() -> None:
    """chat's long pool sleeps by default; with the short pool off nothing would answer, so the plan is refused."""
    with pytest.raises(SpecError) as err:
        make_plan(pools={"short": {"enabled": False}, "long": {"autoscaling": {"maxReplicas": 2}}})
    assert err.value.field == "spec.pools.long.autoscaling.minReplicas"
    assert "needs a running short pool (short is disabled)" in err.value.message


def test_custom_class_cannot_put_the_short_pool_to_sleep() -> None:
    builtin = profiles.BUILTINS[WorkloadClass.CHAT].to_wire()
    builtin["pools"]["short"]["autoscaling"] = {"minReplicas": 0, "metric": "num-requests-waiting", "target": 4,
                                                "scaleDownStabilizationSeconds": 60, "idleSeconds": 60}
    with pytest.raises(ValueError, match=r"short\.autoscaling\.minReplicas must be at least 1"):
        VLLMWorkloadClassSpec.model_validate(builtin)


def test_class_without_autoscaling_gets_generic_defaults() -> None:
    spec = profiles.BUILTINS[WorkloadClass.CHAT]
    bare = spec.model_copy(update={"pools": spec.pools.model_copy(update={
        "long": spec.pools.long.model_copy(update={"autoscaling": None})})})
    klass = profiles.NamedClass("mine", bare)
    assert klass.autoscaling("long") == profiles.LONG_AUTOSCALING
    p = plan(make_spec(pools={"long": {"autoscaling": {"maxReplicas": 2}}}), None, RemediationState(), name="demo",
             namespace="ns", workload_class=klass)
    assert p.pools["long"].autoscaling is not None and p.pools["long"].autoscaling.min_replicas == 1


def test_builtin_classes_state_their_autoscaling() -> None:
    for spec in profiles.BUILTINS.values():
        assert spec.pools.short.autoscaling is not None and spec.pools.long.autoscaling is not None
    assert profiles.builtin("long-doc").autoscaling("long").metric is AutoscalingMetric.KV_CACHE_USAGE


ON_CLAIM = {"source": {"pvc": {"claimName": "models"}}}
"""Weights on the user's claim: on every node, so the wake chain has no download in it."""


def test_router_holds_requests_only_for_a_pool_that_sleeps() -> None:
    sleeping = make_plan(model=ON_CLAIM, pools={"long": {"autoscaling": {"minReplicas": 0, "maxReplicas": 2}}})
    assert sleeping.router.pools.long.wake_seconds == 330.0, "scrape 30 + KEDA 15 + HPA 15 + pod 30 + engine 240"
    assert sleeping.router.pools.short.wake_seconds is None
    awake = make_plan(pools={"long": {"autoscaling": {"minReplicas": 1, "maxReplicas": 2}}})
    assert awake.router.pools.long.wake_seconds is None
    short_total = make_plan(pools={"long": {"autoscaling": {"minReplicas": 0, "maxReplicas": 2}}},
                            routing={"timeouts": {"totalSeconds": 100}})
    assert short_total.router.pools.long.wake_seconds == 90.0, "within the request's own total timeout"


def test_polling_interval_defaults_to_15_s_and_a_shorter_one_shortens_the_wake_hold() -> None:
    """KEDA's pollingInterval is a link of a sleeping pool's wake chain, so the router's hold for it follows."""
    default = make_plan(model=ON_CLAIM, pools={"long": {"autoscaling": {"minReplicas": 0, "maxReplicas": 2}}})
    fast = make_plan(model=ON_CLAIM, pools={"long": {"autoscaling": {"minReplicas": 0, "maxReplicas": 2,
                                                                     "pollingIntervalSeconds": 5}}})
    a, b = default.pools["long"].autoscaling, fast.pools["long"].autoscaling
    assert a is not None and b is not None
    assert (a.polling_interval_seconds, b.polling_interval_seconds) == (15, 5)
    held = default.router.pools.long.wake_seconds, fast.router.pools.long.wake_seconds
    assert held[0] is not None and held[1] is not None and held[0] - held[1] == 10


def test_polling_interval_out_of_range_names_the_field() -> None:
    with pytest.raises(SpecError) as err:
        make_plan(pools={"long": {"autoscaling": {"maxReplicas": 2, "pollingIntervalSeconds": 0}}})
    assert "pollingIntervalSeconds" in err.value.field + err.value.message
