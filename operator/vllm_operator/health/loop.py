"""One health check of one VLLMDeployment: snapshot -> diagnose -> decide, then carry the decision out.

`check()` does the reading and the thinking and returns the decision and the new status; `execute()` does the
writing, in an order chosen for crash safety: status first (the restart budget is spent and the rung recorded before
any pod goes or any Deployment changes, so a crash in between never spends more than the budget or loses a rung),
then pod deletions, events and counters, and finally — after a rung change — the controller's own reconcile with
the new status, because kopf does not fire update handlers for status-only changes (docs/architecture.md, Step-down
through status). The status write carries the resourceVersion that was read: when the controller (or anyone) wrote the
status in between, the write is refused with 409 and nothing is done this round, so neither side's update is lost. The
caller should therefore hand in a freshly read object, not a cached one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from vllm_operator import constants
from vllm_operator.api import remediation
from vllm_operator.api.errors import SpecError
from vllm_operator.api.plan import AcceleratorFacts, Plan
from vllm_operator.api.resource import parse_resource
from vllm_operator.api.spec import AcceleratorType, VLLMDeploymentSpec
from vllm_operator.api.status import VLLMDeploymentStatus
from vllm_operator.health import diagnose as diagnose_mod
from vllm_operator.health import policy
from vllm_operator.health.rungs import ladder_views
from vllm_operator.health.snapshot import Snapshot
from vllm_operator.health.source import Lister, MetricsSource, take_snapshot
from vllm_operator.k8s import PODS, VLLM_DEPLOYMENTS, KubeApi, KubeError
from vllm_operator.planning import RemediationState, plan
from vllm_operator.planning.catalog import gpu_facts, gpu_type
from vllm_operator.planning.profiles import ClassProfile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckResult:
    snapshot: Snapshot
    diagnosis: diagnose_mod.Diagnosis
    decision: policy.Decision
    settings: remediation.HealthSettings
    plan: Plan


class Reconciler(Protocol):
    async def __call__(self, kube: KubeApi, obj: Mapping[str, Any], *, status: VLLMDeploymentStatus | None = None
                       ) -> object: ...


class Counters(Protocol):
    """The operator metrics the loop feeds (handlers/metrics.py OperatorMetrics has them)."""

    engine_restarts: Any
    actions: Any
    step_down_level: Any


def current_status(obj: Mapping[str, Any]) -> VLLMDeploymentStatus | None:
    raw = obj.get("status")
    if not isinstance(raw, Mapping) or not raw:
        return None
    return VLLMDeploymentStatus.model_validate({k: v for k, v in raw.items() if not k.startswith("kopf")})


def accelerator_in_effect(spec: VLLMDeploymentSpec, status: VLLMDeploymentStatus | None) -> AcceleratorFacts | None:
    """Catalog types resolve in the planner (None); `auto` uses what the controller resolved into status."""
    if spec.accelerator.type is not AcceleratorType.AUTO:
        return None
    if status is None or status.accelerator is None:
        raise SpecError("spec.accelerator.type", "auto is not resolved yet (status.accelerator is empty)")
    return gpu_facts(gpu_type(status.accelerator.type), status.accelerator.count, status.accelerator.product)


async def check(kube: KubeApi, source: MetricsSource | None, obj: Mapping[str, Any], *,
                interval_override: float | None = None,
                resolve_class: Callable[[VLLMDeploymentSpec], Awaitable[ClassProfile]] | None = None,
                children: Lister | None = None) -> CheckResult | None:
    """Read, diagnose, decide. None when the spec cannot be planned (the controller reports that).
    `resolve_class`: the operator's VLLMWorkloadClass lookup (None: the built-in table). `children`: where pods,
    Deployments and PDBs are read (the operator's watch cache; None: LISTs through `kube`)."""
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    status = current_status(obj)
    try:
        resource = parse_resource(dict(obj))
        klass = await resolve_class(resource.spec) if resolve_class is not None else None
        the_plan = plan(resource.spec, accelerator_in_effect(resource.spec, status),
                        RemediationState.from_status(status), name=name, namespace=namespace, workload_class=klass)
    except SpecError as err:
        log.info("Skipped the health check of VLLMDeployment %s/%s: %s", namespace, name, err)
        return None
    settings = remediation.resolve(resource.spec.remediation, thresholds=the_plan.thresholds,
                                  interval_override=interval_override)
    enabled = {p: pool.replicas for p, pool in the_plan.pools.items() if pool.enabled}
    snap = await take_snapshot(children or kube, source, namespace, name, settings, enabled)
    diag = diagnose_mod.diagnose(snap, settings)
    decision = policy.decide(diag, status, settings, ladder_views(the_plan, settings.allow_lower_max_model_len),
                             generation=meta.get("generation"), metrics_configured=source is not None)
    return CheckResult(snapshot=snap, diagnosis=diag, decision=decision, settings=settings, plan=the_plan)


def merge_patch(old: Any, new: Any) -> Any:
    """RFC 7386 merge patch turning `old` into `new` (keys that disappeared become null); None when equal."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return None if old == new else new
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            sub = merge_patch(old[key], value)
            patch[key] = value if not isinstance(value, dict) else sub
    return patch or None


async def execute(kube: KubeApi, obj: Mapping[str, Any], result: CheckResult, *, reconcile: Reconciler,
                  counters: Counters | None = None) -> None:
    """Carry out one decision (order: see module docstring)."""
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    decision = result.decision
    old = {k: v for k, v in (obj.get("status") or {}).items() if not str(k).startswith("kopf")}
    patch = merge_patch(old, decision.status.to_wire())
    if patch:
        body: dict[str, Any] = {"status": patch}
        if meta.get("resourceVersion"):
            # Optimistic concurrency: the decision rests on the status it read; if anyone wrote since, act on nothing
            # now (no deletion, no rung) and decide again from fresh data at the next check.
            body["metadata"] = {"resourceVersion": meta["resourceVersion"]}
        try:
            await kube.patch_status(VLLM_DEPLOYMENTS, namespace, name, body)
        except KubeError as err:
            if not err.conflict:
                raise
            log.info("Skipped acting on VLLMDeployment %s/%s: its status changed since it was read", namespace, name)
            return
    for deletion in decision.deletions:
        try:
            await kube.delete(PODS, namespace, deletion.pod, uid=deletion.uid,
                              grace_period_s=constants.STALLED_POD_GRACE_S)
            log.warning("Deleted stalled pod %s/%s of VLLMDeployment %s (pool %s, grace %d s): %s", namespace,
                        deletion.pod, name, deletion.pool, constants.STALLED_POD_GRACE_S, deletion.message)
        except KubeError as err:
            if err.status != 409:  # 409: the uid precondition failed — the pod was already replaced
                raise
            log.info("Did not delete pod %s/%s: it was replaced meanwhile (%s)", namespace, deletion.pod, err)
    for event in decision.events:
        try:
            await kube.emit_event(obj, event.type, event.reason, event.message)
        except KubeError as err:
            log.warning("Could not post event %s for VLLMDeployment %s/%s: %s", event.reason, namespace, name, err)
    if counters is not None:
        for seen in decision.observed:
            counters.engine_restarts.labels(name, namespace, seen.pool, seen.reason).inc()
        for pool, action in decision.actions:
            counters.actions.labels(name, namespace, pool, action).inc()
        for pool in constants.POOLS:
            entry = getattr(decision.status.pools, pool, None) if decision.status.pools else None
            if entry is not None:
                for reason in policy.OOM_METRIC_REASONS:  # present at 0, so increase() counts the first OOM
                    counters.engine_restarts.labels(name, namespace, pool, reason)
                counters.step_down_level.labels(name, namespace, pool).set(entry.step_down.level
                                                                           + entry.step_down.kv_level)
    if decision.reconcile_needed:
        for change in decision.rung_changes:
            log.warning("Moved pool %s of VLLMDeployment %s/%s from %s rung %d to %d (%s)", change.pool, namespace,
                        name, change.ladder, change.from_level, change.to_level, change.description)
        fresh = await kube.get(VLLM_DEPLOYMENTS, namespace, name)
        await reconcile(kube, fresh if fresh is not None else obj, status=decision.status)
