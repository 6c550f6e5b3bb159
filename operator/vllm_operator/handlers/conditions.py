"""Status building without I/O: conditions that keep their transition time, pool counters, printer columns.

Kept apart from the reconcile routine so the rules ("Ready means every enabled pool and the router are at their
desired ready count") are unit-testable as tables, and so the health loop can reuse `set_condition`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_operator import constants
from vllm_operator.api.conditions import get_condition, set_condition
from vllm_operator.api.plan import Plan
from vllm_operator.api.status import (
    PlanSummary,
    PoolPlanSummary,
    PoolsStatus,
    PoolStatus,
    ResolvedAccelerator,
    VLLMDeploymentStatus,
    WorkloadClassRef,
)


def deployment_counts(deployment: Mapping[str, Any] | None) -> tuple[int, int, int]:
    """(desired, existing, ready) replicas of a Deployment object (zeros when absent)."""
    if not deployment:
        return 0, 0, 0
    spec, status = deployment.get("spec", {}), deployment.get("status", {}) or {}
    return int(spec.get("replicas", 1)), int(status.get("replicas", 0)), int(status.get("readyReplicas", 0))


def plan_summary(plan: Plan) -> PlanSummary:
    pools: dict[str, PoolPlanSummary] = {}
    for name, pool in plan.pools.items():
        if pool.enabled:
            pools[name] = PoolPlanSummary(
                max_model_len=pool.max_model_len, max_tokens=pool.max_tokens, max_num_seqs=pool.max_num_seqs,
                max_num_batched_tokens=pool.max_num_batched_tokens, kv_cache_dtype=pool.kv_cache_dtype,
                kv_tokens=pool.kv.planned_tokens,
                concurrency_at_full_length=round(pool.kv.concurrency_at_full_length, 2))
    warnings = plan.all_warnings()
    return PlanSummary(hash=plan.hash, engine_version=plan.engine_version,
                       prompt_length_threshold=plan.router.prompt_length_threshold,
                       short=pools.get(constants.POOL_SHORT), long=pools.get(constants.POOL_LONG),
                       warnings=warnings[:32])


def with_plan(prev: VLLMDeploymentStatus | None, plan: Plan, deployments: Mapping[str, Mapping[str, Any] | None],
              router: Mapping[str, Any] | None, *, generation: int | None, now: str) -> VLLMDeploymentStatus:
    """Status after a successful plan: SpecValid, Ready, Progressing, pool counters, plan summary.

    Remediation state (stepDown, restartBudget, observedKVTokens, stableSince, diagnosis) is carried over untouched:
    the health loop owns it.
    """
    status = prev.model_copy(deep=True) if prev else VLLMDeploymentStatus()
    pools = status.pools.model_copy(deep=True) if status.pools else PoolsStatus()
    ready_total = desired_total = 0
    lagging: list[str] = []
    columns: dict[str, str] = {}
    for name in constants.POOLS:
        pool_plan = plan.pools.get(name)
        current: PoolStatus | None = getattr(pools, name)
        if pool_plan is None or not pool_plan.enabled:
            setattr(pools, name, None)
            columns[name] = "-"
            continue
        desired, existing, ready = deployment_counts(deployments.get(name))
        entry = current.model_copy(deep=True) if current else PoolStatus()
        entry.replicas, entry.ready_replicas = existing, ready
        entry.desired_replicas = desired if deployments.get(name) is not None else None
        entry.planned_kv_tokens = pool_plan.kv.planned_tokens
        entry.max_model_len, entry.max_tokens = pool_plan.max_model_len, pool_plan.max_tokens
        setattr(pools, name, entry)
        ready_total += ready
        desired_total += desired
        columns[name] = f"{ready}/{desired}"
        if ready < desired or deployments.get(name) is None:
            lagging.append(f"pool {name}: {ready}/{desired} engine pods ready")
    r_desired, _, r_ready = deployment_counts(router)
    if router is None or r_ready < r_desired:
        lagging.append(f"router: {r_ready}/{r_desired} pods ready")
    status.pools = pools
    status.observed_generation = generation
    status.plan = plan_summary(plan)
    status.accelerator = ResolvedAccelerator(type=plan.accelerator.type, count=plan.accelerator.count,
                                             product=plan.accelerator.product)
    status.workload_class = WorkloadClassRef(name=plan.workload_class, generation=plan.workload_class_generation)
    status.ready = f"{ready_total}/{desired_total}"
    status.short_replicas, status.long_replicas = columns[constants.POOL_SHORT], columns[constants.POOL_LONG]
    levels = [p.step_down.level + p.step_down.kv_level for p in (pools.short, pools.long) if p]
    status.step_down_level = max(levels, default=0)
    conds = set_condition(status.conditions, constants.COND_SPEC_VALID, True, "Planned",
                          f"plan {plan.hash[:12]} for {plan.accelerator.type} (vLLM {plan.engine_version})",
                          generation=generation, now=now)
    if lagging:
        conds = set_condition(conds, constants.COND_READY, False, "PodsNotReady", "; ".join(lagging),
                              generation=generation, now=now)
        conds = set_condition(conds, constants.COND_PROGRESSING, True, "RollingOut", "; ".join(lagging),
                              generation=generation, now=now)
    else:
        conds = set_condition(conds, constants.COND_READY, True, "AllPodsReady",
                              f"{ready_total} engine pods and {r_ready} router pods ready",
                              generation=generation, now=now)
        conds = set_condition(conds, constants.COND_PROGRESSING, False, "Converged",
                              "all children match the plan", generation=generation, now=now)
    status.conditions = conds
    return status


def with_autoscaling(status: VLLMDeploymentStatus, condition: tuple[bool, str, str] | None, *,
                     generation: int | None, now: str) -> VLLMDeploymentStatus:
    """The Autoscaling condition set to (status, reason, message), or removed when no pool asks for autoscaling."""
    out = status.model_copy(deep=True)
    if condition is None:
        out.conditions = [c for c in out.conditions or [] if c.type != constants.COND_AUTOSCALING]
        return out
    ok, reason, message = condition
    out.conditions = set_condition(out.conditions, constants.COND_AUTOSCALING, ok, reason, message,
                                   generation=generation, now=now)
    return out


def with_spec_error(prev: VLLMDeploymentStatus | None, field: str, message: str, *, generation: int | None,
                    now: str) -> VLLMDeploymentStatus:
    """Status after a refused spec: SpecValid=False with the planner's message; everything else kept as it was."""
    status = prev.model_copy(deep=True) if prev else VLLMDeploymentStatus()
    status.observed_generation = generation
    text = f"{field}: {message}" if field and not message.startswith(field) else message
    status.conditions = set_condition(status.conditions, constants.COND_SPEC_VALID, False, "SpecInvalid", text,
                                      generation=generation, now=now)
    return status


__all__ = ["get_condition", "set_condition", "with_autoscaling", "with_plan", "with_spec_error"]
