"""One health check of one VLLMDeployment: snapshot -> diagnose -> decide, then carry the decision out.

`check()` does the reading and the thinking and returns the decision (with the new status); `execute()` does the
writing, in an order chosen for crash safety: status first (the restart budget is spent and the rung recorded before
any pod goes or any Deployment changes, so a crash in between never spends more than the budget or loses a rung),
then pod deletions, events and counters, and finally — after a rung change — the controller's own reconcile with
the new status, because kopf does not fire update handlers for status-only changes (docs/architecture.md, Step-down
through status). The status write is the operator's one status writer (`k8s.write_status`: a diff with nulls, guarded
by the resourceVersion that was read): when the controller (or anyone) wrote the status in between, the write is
refused with 409, and the decision is made again on the object read afresh before anything is done, so neither side's
update is lost and nothing acts on a status it did not see. The caller should hand in a freshly read object.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from vllm_operator import constants
from vllm_operator.api import remediation
from vllm_operator.api.errors import SpecError
from vllm_operator.api.resource import VLLMDeployment, parse_resource
from vllm_operator.api.status import VLLMDeploymentStatus
from vllm_operator.health import diagnose as diagnose_mod
from vllm_operator.health import policy
from vllm_operator.health.rungs import ladder_views
from vllm_operator.health.source import Lister, MetricsSource, take_snapshot
from vllm_operator.k8s import PODS, KubeApi, KubeError, write_status
from vllm_operator.planning import PlanContext, plan_for

log = logging.getLogger(__name__)


class Reconciler(Protocol):
    async def __call__(self, kube: KubeApi, obj: Mapping[str, Any], *, status: VLLMDeploymentStatus | None = None
                       ) -> object: ...


class Counters(Protocol):
    """The operator metrics the loop feeds (handlers/metrics.py OperatorMetrics has them)."""

    engine_restarts: Any
    actions: Any
    step_down_level: Any


PlanContextOf = Callable[[VLLMDeployment], Awaitable[PlanContext]]
"""The operator's `handlers.reconcile.plan_context` bound to its client, images and classes."""


async def check(kube: KubeApi, source: MetricsSource | None, obj: Mapping[str, Any], *,
                interval_override: float | None = None, context: PlanContextOf | None = None,
                children: Lister | None = None) -> policy.Decision | None:
    """Read, diagnose, decide. None when the spec cannot be planned (the controller reports that).
    `context`: what the operator plans with (`planning.plan_for`), the same as its reconcile (None: the built-in
    classes and default images, catalog accelerators only). `children`: where pods, Deployments and PDBs are read
    (the operator's watch cache; None: LISTs through `kube`)."""
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    status = VLLMDeploymentStatus.of(obj)
    try:
        resource = parse_resource(dict(obj))
        the_plan = plan_for(resource, await context(resource) if context is not None else PlanContext(), status)
    except SpecError as err:
        log.info("Skipped the health check of VLLMDeployment %s/%s: %s", namespace, name, err)
        return None
    settings = remediation.resolve(resource.spec.remediation, thresholds=the_plan.thresholds,
                                  interval_override=interval_override)
    enabled = {p: pool.replicas for p, pool in the_plan.pools.items() if pool.enabled}
    snap = await take_snapshot(children or kube, source, namespace, name, settings, enabled)
    return policy.decide(diagnose_mod.diagnose(snap, settings), status, settings,
                         ladder_views(the_plan, settings.allow_lower_max_model_len),
                         generation=meta.get("generation"), metrics_configured=source is not None)


Recheck = Callable[[Mapping[str, Any]], Awaitable["policy.Decision | None"]]
"""`check` bound to its readers: the decision made again on an object read afresh."""


async def execute(kube: KubeApi, obj: Mapping[str, Any], decision: policy.Decision, *, reconcile: Reconciler,
                  recheck: Recheck, counters: Counters | None = None) -> None:
    """Carry out one decision (order: see module docstring). The status goes through the operator's one writer
    (`k8s.write_status`): when someone wrote since `obj` was read, the decision is made again on the object read
    afresh (`recheck`) and that one is carried out, so neither side's update is lost and nothing is done on a
    status that was not seen."""
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    chosen: policy.Decision | None = decision

    async def desired(current: Mapping[str, Any]) -> Mapping[str, Any] | None:
        nonlocal chosen
        if current is not obj:
            log.info("Decided again on VLLMDeployment %s/%s: its status changed since it was read", namespace, name)
            chosen = await recheck(current)
        return chosen.status.to_wire() if chosen is not None else None

    write = await write_status(kube, obj, desired)
    if chosen is None or write.obj is None:
        return
    decision = chosen  # made again when the status had changed since `obj` was read
    for deletion in decision.deletions:
        try:
            await kube.delete(PODS, namespace, deletion.pod, uid=deletion.uid,
                              grace_period_s=constants.STALLED_POD_GRACE_S)
            log.warning("Deleted pod %s/%s of VLLMDeployment %s (pool %s, grace %d s) for %s", namespace,
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
        await reconcile(kube, write.obj, status=decision.status)  # the object as written (or as last read)
