"""The one reconcile routine: spec -> plan -> manifests -> children + status. Used by the lifecycle handlers and,
after a step-down, by the health loop (kopf does not fire update handlers for status-only changes).

Order of work, and why:
1. Resolve the accelerator (`auto` reads GPU feature discovery labels from nodes) and read the remediation state
   from status — the planner is pure and gets both as inputs.
2. Plan. A refusal (SpecError) sets SpecValid=False, posts one Warning event and returns *before touching any
   child*: a bad edit never takes a working deployment down.
3. Render, list the children, and let `childplan.plan_children` (pure) decide the writes by comparing spec-hash
   annotations (never rewriting an unchanged object): create what is missing, adopt same-named orphans, delete owned
   children the plan no longer has. `_execute` only carries that ChildPlan out, by server-side apply: the API
   server removes a field the rendering dropped (every toleration removed from the spec disappears from the pods),
   and keeps what other managers own (an HPA's replicas, the Deployment controller's annotations).
4. Write status through the one status writer (`k8s.write_status`): the diff against the object read, with nulls
   for what went away (a disabled pool's status goes), guarded by its resourceVersion; nothing when it is unchanged,
   so a no-op resync makes zero writes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_operator import constants, names
from vllm_operator.api.errors import SpecError
from vllm_operator.api.plan import AcceleratorFacts, Plan
from vllm_operator.api.resource import VLLMDeployment, parse_resource
from vllm_operator.api.spec import AcceleratorType, VLLMDeploymentSpec
from vllm_operator.api.status import VLLMDeploymentStatus
from vllm_operator.handlers import childplan, conditions, scaling
from vllm_operator.handlers.childplan import ChildAction, ChildPlan, is_owned_by
from vllm_operator.handlers.classes import ClassIndex
from vllm_operator.handlers.config import DEFAULT_CONFIG, OperatorConfig
from vllm_operator.health.source import Lister
from vllm_operator.k8s import (
    CHILD_RESOURCES,
    DEPLOYMENTS,
    HPAS,
    NODES,
    POD_MONITORS,
    PROMETHEUS_RULES,
    SCALED_OBJECTS,
    KubeApi,
    KubeError,
    Resource,
    now_rfc3339,
    write_status,
)
from vllm_operator.planning import PlanContext, plan_for
from vllm_operator.planning.catalog import accelerator_from_node_labels, shared_gpu
from vllm_operator.rendering import RenderOptions, render

log = logging.getLogger(__name__)

MONITORING_MISSING = ("monitoring.coreos.com CRDs are not installed: PodMonitor and PrometheusRule were not "
                      "created")
MONITORING_KINDS = {(POD_MONITORS.api_version, POD_MONITORS.kind), (PROMETHEUS_RULES.api_version,
                                                                    PROMETHEUS_RULES.kind)}
SCALED_OBJECT_KIND = (SCALED_OBJECTS.api_version, SCALED_OBJECTS.kind)


@dataclass(frozen=True)
class AutoscalingState:
    """Whether the pools that ask for autoscaling got their ScaledObjects (the Autoscaling condition)."""

    pools: tuple[str, ...]
    """Enabled pools with `autoscaling`."""
    keda: bool
    """scaledobjects.keda.sh is served."""
    prometheus: bool
    """The operator has a --prometheus-url for the triggers."""

    @property
    def active(self) -> bool:
        return bool(self.pools) and self.keda and self.prometheus

    def condition(self) -> tuple[bool, str, str]:
        """(status, reason, message) of the Autoscaling condition."""
        pools = ", ".join(self.pools)
        if not self.keda:
            return (False, "KEDANotInstalled",
                    f"pools {pools} ask for autoscaling but KEDA's ScaledObject CRD (scaledobjects.keda.sh) is not "
                    "installed: they run unscaled at max(minReplicas, 1) replicas until it is")
        if not self.prometheus:
            return (False, "NoPrometheus",
                    f"pools {pools} ask for autoscaling but the operator has no --prometheus-url for the triggers: "
                    "they run unscaled at max(minReplicas, 1) replicas")
        return True, "ScaledObjectsApplied", f"KEDA scales pools {pools} (ScaledObjects applied; its HPA owns replicas)"


@dataclass
class ReconcileOutcome:
    """What one reconcile did."""

    spec_error: SpecError | None = None
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    status_patched: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.deleted)


def child_selector(name: str) -> str:
    """Label selector of a VLLMDeployment's children (label values are capped at 63 characters, as names are)."""
    return f"{constants.LABEL_DEPLOYMENT}={names.dns_label(name)},{constants.LABEL_NAME}={constants.APP_NAME}"


async def resolve_accelerator(kube: KubeApi, spec: VLLMDeploymentSpec) -> tuple[AcceleratorFacts | None, str | None]:
    """Catalog types resolve in the planner (None here); `auto` reads nodes the pools' nodeSelectors match.

    With several GPU types matching, the one with the least memory wins: a plan that fits the smallest node fits
    every node the scheduler may pick.
    """
    if spec.accelerator.type is not AcceleratorType.AUTO:
        return None, None
    selector: dict[str, str] = {}
    for pool in (spec.pools.short, spec.pools.long) if spec.pools else ():
        if pool and pool.node_selector:
            selector.update(pool.node_selector)
    label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or None
    try:
        nodes = await kube.list(NODES, None, label_selector)
    except KubeError as err:
        if err.status == 403:
            raise SpecError("spec.accelerator.type", "auto needs read access to Nodes (the operator runs "
                            "namespaced without the nodes ClusterRole); name the GPU type instead") from err
        raise
    candidates = []
    shared: list[str] = []
    for node in nodes:
        labels = node.get("metadata", {}).get("labels", {}) or {}
        facts = accelerator_from_node_labels(labels, spec.accelerator.count)
        if facts is not None:
            candidates.append((facts.memory_bytes, facts.type, facts))
        elif (how := shared_gpu(labels)) is not None:
            shared.append(f"{node.get('metadata', {}).get('name')} ({how})")
    if not candidates:
        where = f" matching nodeSelector {label_selector}" if label_selector else ""
        if shared:
            raise SpecError("spec.accelerator.type", f"auto: the GPU node(s){where} are time-sliced: "
                            f"{', '.join(shared[:3])}{' …' if len(shared) > 3 else ''}; pods there share one "
                            "card's memory and a pod planned for the whole card runs the next one out of memory; "
                            "the operator does not plan for shared GPUs: use nodes without time-slicing")
        raise SpecError("spec.accelerator.type", f"auto: no node{where} carries GPU feature discovery labels "
                        f"(nvidia.com/gpu.product) of a known GPU type; {len(nodes)} node(s) looked at")
    candidates.sort(key=lambda c: (c[0], c[1]))
    chosen = candidates[0][2]
    kinds = sorted({c[1] for c in candidates})
    note = None if len(kinds) == 1 else (f"accelerator auto matched {', '.join(kinds)}; planned for "
                                         f"{chosen.type}, the smallest")
    return chosen, note


async def plan_context(kube: KubeApi, resource: VLLMDeployment, config: OperatorConfig = DEFAULT_CONFIG,
                       classes: ClassIndex | None = None) -> PlanContext:
    """What the operator plans a VLLMDeployment with (`planning.plan_for`): `auto` resolved from the nodes, with
    its explanation; its class from `classes` (None: the built-in table); the operator's --image-repository and
    weights cache (`config`). Every
    reader — reconcile, the status refresh, the health loop, admission — plans with this, so they plan the same
    (the health loop once planned with the accelerator from status and the default images; the refresh without
    the note dropped it from status ~2 s after every reconcile)."""
    accelerator, note = await resolve_accelerator(kube, resource.spec)
    meta = resource.metadata
    klass = await classes.resolve(kube, (meta.namespace, meta.name), resource.spec) if classes else None
    return PlanContext(accelerator=accelerator, accelerator_note=note, workload_class=klass, images=config.images,
                       node_cache=config.node_cache)


EVENT_MESSAGE_LIMIT = 1024
"""Event messages longer than this are cut by the API server's clients (kubectl describe) and by events.k8s.io."""


def change_message(verb: str, items: Sequence[str], limit: int = EVENT_MESSAGE_LIMIT) -> str:
    """One event per verb and reconcile, naming every child: "Created 14 children: Deployment ns/a, ...".

    One event per child doubled the writes of creating a VLLMDeployment (benchmarks/controller) and buried the
    object's other events; the list still names each child. A list too long for one message ends with how many
    were left out.
    """
    noun = "child" if len(items) == 1 else "children"
    head = f"{verb} {len(items)} {noun}: "
    text = head + ", ".join(items)
    if len(text) <= limit:
        return text
    shown: list[str] = []
    for item in items:
        left = len(items) - len(shown) - 1
        if len(head + ", ".join([*shown, item]) + f", ... and {left} more") > limit:
            break
        shown.append(item)
    return head + ", ".join(shown) + f"{', ' if shown else ''}... and {len(items) - len(shown)} more"


async def _emit(kube: KubeApi, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    try:
        await kube.emit_event(obj, type_, reason, message)
    except KubeError as err:  # an event that cannot be posted must not fail the reconcile
        log.warning("Could not post event %s for %s: %s", reason, obj["metadata"]["name"], err)


async def _existing_children(kube: KubeApi, namespace: str, name: str, monitoring: bool, keda: bool = False
                             ) -> dict[tuple[str, str, str], dict[str, Any]]:
    kinds = [res for key, res in CHILD_RESOURCES.items()
             if (monitoring or key not in MONITORING_KINDS) and (keda or key != SCALED_OBJECT_KIND)]
    listed = await asyncio.gather(*(kube.list(res, namespace, child_selector(name)) for res in kinds))
    return {(res.api_version, res.kind, item["metadata"]["name"]): item
            for res, items in zip(kinds, listed, strict=True) for item in items}


async def _execute(kube: KubeApi, parent: Mapping[str, Any], child_plan: ChildPlan,
                   outcome: ReconcileOutcome) -> None:
    """Carry out a ChildPlan: each wave's applies concurrently, then the deletes (the decisions are all made).

    Every apply is a server-side apply as `FIELD_MANAGER`. It is tried without force first: when another manager
    holds a field the operator renders with another value (someone edited the Deployment's image by hand), the API
    server refuses with the contested fields and their managers; the operator, the authority for what it renders,
    posts a Warning event naming them and applies again with force. Unconflicted applies cost one request.
    """
    namespace = parent["metadata"]["namespace"]

    async def apply(action: ChildAction) -> None:
        assert action.desired is not None
        res = CHILD_RESOURCES[(action.key[0], action.key[1])]
        label = f"{res.kind} {namespace}/{action.name}"
        try:
            await kube.apply(res, namespace, action.name, action.desired)
        except KubeError as err:
            if not err.conflict:
                raise
            await _emit(kube, parent, "Warning", "FieldsTakenOver", taken_over_message(label, err.causes))
            await kube.apply(res, namespace, action.name, action.desired, force=True)
        (outcome.created if action.reason is childplan.Reason.MISSING else outcome.updated).append(label)

    for wave in child_plan.applies:
        # A wave's applies run concurrently; when some fail, the others finish, then the first error is raised
        # (nothing is left running behind the reconcile's back, and whatever succeeded is reported).
        for result in await asyncio.gather(*(apply(a) for a in wave), return_exceptions=True):
            if isinstance(result, BaseException):
                raise result
    for action in child_plan.deletes:
        res = CHILD_RESOURCES[(action.key[0], action.key[1])]
        await kube.delete(res, namespace, action.name, uid=action.uid)
        outcome.deleted.append(f"{res.kind} {namespace}/{action.name}")


def taken_over_message(label: str, causes: Sequence[Mapping[str, Any]]) -> str:
    """The event text, from the server's conflict causes, e.g. "Took back from other field managers on Deployment
    ns/x: .spec.template.spec.containers[name="engine"].image ("kubectl-edit" using apps/v1)"."""
    fields = [f"{c.get('field') or '?'} ({str(c.get('message', '')).removeprefix('conflict with ')})"
              for c in causes] or ["fields another manager set"]
    return f"Took back from other field managers on {label}: {', '.join(fields)}"


async def _autoscaling_state(kube: KubeApi, the_plan: Plan, prometheus: bool) -> AutoscalingState:
    pools = tuple(p.name for p in the_plan.pools.values() if p.enabled and p.autoscaling is not None)
    # Discovery only where a pool asks: a VLLMDeployment without autoscaling costs no extra request.
    keda = bool(pools) and await kube.has_resource(SCALED_OBJECTS.group, SCALED_OBJECTS.version,
                                                   SCALED_OBJECTS.plural)
    return AutoscalingState(pools, keda, prometheus)


async def _with_autoscalers(kube: KubeApi, obj: Mapping[str, Any], prev: VLLMDeploymentStatus | None,
                            new: VLLMDeploymentStatus, the_plan: Plan, state: AutoscalingState, now: str
                            ) -> tuple[VLLMDeploymentStatus, list[scaling.WakeEvent]]:
    """`new` with the autoscaled pools' HPA/ScaledObject decisions (two lists, only when KEDA scales a pool)."""
    if not state.active:
        return scaling.with_autoscalers(prev, new, {}, now)
    meta = obj["metadata"]
    scaled, hpas = await asyncio.gather(kube.list(SCALED_OBJECTS, meta["namespace"], child_selector(meta["name"])),
                                        kube.list(HPAS, meta["namespace"], child_selector(meta["name"])))
    by_name = {o["metadata"]["name"]: o for o in scaled}
    hpa_by_name = {o["metadata"]["name"]: o for o in hpas}
    found = {}
    for pool in state.pools:
        so_name = names.pool(the_plan.name, pool)
        found[pool] = scaling.autoscaler_status(hpa_by_name.get(scaling.HPA_PREFIX + so_name), by_name.get(so_name))
    return scaling.with_autoscalers(prev, new, found, now)


async def _post_wake_events(kube: KubeApi, obj: Mapping[str, Any], events: Sequence[scaling.WakeEvent]) -> None:
    meta = obj["metadata"]
    for event in events:
        log.info("%s: VLLMDeployment %s/%s: %s", event.reason, meta["namespace"], meta["name"], event.message)
        await _emit(kube, obj, "Normal", event.reason, event.message)


async def reconcile(kube: KubeApi, obj: Mapping[str, Any], config: OperatorConfig = DEFAULT_CONFIG,
                    classes: ClassIndex | None = None, *, status: VLLMDeploymentStatus | None = None
                    ) -> ReconcileOutcome:
    """Bring one VLLMDeployment's children and status in line with its spec (see module docstring), planned as
    `plan_context` says; `config.prometheus_url`: the Prometheus the autoscaling triggers query."""
    meta = obj["metadata"]
    generation = meta.get("generation")
    now = now_rfc3339()
    outcome = ReconcileOutcome()
    prev_status = VLLMDeploymentStatus.of(obj)
    base_status = status if status is not None else prev_status

    def base(current: Mapping[str, Any]) -> VLLMDeploymentStatus | None:
        """The status to build on: `status` when given (the health loop's new rung), else the one read."""
        return base_status if current is obj else VLLMDeploymentStatus.of(current)

    def moved_on(current: Mapping[str, Any]) -> bool:
        """Deleted meanwhile, or the spec moved on: the handler for the new generation writes status."""
        return current["metadata"].get("generation") != generation or bool(current["metadata"].get(
            "deletionTimestamp"))

    try:
        resource: VLLMDeployment = parse_resource(dict(obj))
        the_plan = plan_for(resource, await plan_context(kube, resource, config, classes), base_status)
    except SpecError as err:
        outcome.spec_error = refusal = err
        new = conditions.with_spec_error(base_status, err.field, err.message, generation=generation, now=now)
        was = conditions.get_condition(prev_status, constants.COND_SPEC_VALID)
        now_cond = conditions.get_condition(new, constants.COND_SPEC_VALID)
        if was is None or now_cond is None or was.message != now_cond.message:
            await _emit(kube, obj, "Warning", "SpecInvalid", f"Refused the spec, children left as they were: {err}")
            log.warning("Refused VLLMDeployment %s/%s: %s", meta["namespace"], meta["name"], err)

        async def refused(current: Mapping[str, Any]) -> Mapping[str, Any] | None:
            if current is not obj and moved_on(current):
                return None
            return conditions.with_spec_error(base(current), refusal.field, refusal.message, generation=generation,
                                              now=now).to_wire()

        outcome.status_patched = (await write_status(kube, obj, refused)).written
        return outcome
    monitoring = await kube.has_resource(POD_MONITORS.group, POD_MONITORS.version, POD_MONITORS.plural)
    autoscaling = await _autoscaling_state(kube, the_plan, bool(config.prometheus_url))
    options = RenderOptions(prometheus_url=config.prometheus_url if autoscaling.active else None)
    manifests = [m for m in render(the_plan, options=options)
                 if monitoring or (m["apiVersion"], m["kind"]) not in MONITORING_KINDS]
    existing = await _existing_children(kube, meta["namespace"], meta["name"], monitoring, autoscaling.keda)
    # KEDA's HPA owns the replicas of a pool with a ScaledObject from its first apply; without KEDA (or without a
    # Prometheus for its triggers) the operator keeps writing the starting count, and the condition says so.
    autoscaled = childplan.autoscaled_deployments(
        manifests, {p.name for p in the_plan.pools.values()
                    if p.external_autoscaler or (p.autoscaling is not None and autoscaling.active)})
    await _execute(kube, obj, childplan.plan_children(obj, manifests, existing, autoscaled=autoscaled), outcome)
    order = {f"{m['kind']} {meta['namespace']}/{m['metadata']['name']}": i for i, m in enumerate(manifests)}
    outcome.created.sort(key=lambda label: order.get(label, len(order)))
    outcome.updated.sort(key=lambda label: order.get(label, len(order)))
    for verb, items in (("Created", outcome.created), ("Updated", outcome.updated), ("Deleted", outcome.deleted)):
        for item in items:
            log.info("%s %s for VLLMDeployment %s/%s", verb, item, meta["namespace"], meta["name"])
        if items:
            await _emit(kube, obj, "Normal", verb, change_message(verb, items))
    # Status comes from a fresh list, not from create/patch responses: pods may have become ready meanwhile. When
    # another writer (the Deployment watch, the health loop) wrote status since `obj` was read, the one status
    # writer re-reads the object (its status now carries their fields) and this computes again on it.
    wakes: list[scaling.WakeEvent] = []

    async def desired(current: Mapping[str, Any]) -> Mapping[str, Any] | None:
        if current is not obj and moved_on(current):
            return None
        listed = await kube.list(DEPLOYMENTS, meta["namespace"], child_selector(meta["name"]))
        new = _status_from_children(base(current), the_plan, listed, generation, now, monitoring, autoscaling)
        new, wakes[:] = await _with_autoscalers(kube, current, VLLMDeploymentStatus.of(current), new, the_plan,
                                                autoscaling, now)
        return new.to_wire()

    outcome.status_patched = (await write_status(kube, obj, desired)).written
    if outcome.status_patched:
        await _post_wake_events(kube, obj, wakes)
    return outcome


def _status_from_children(prev: VLLMDeploymentStatus | None, the_plan: Plan, children: Sequence[Mapping[str, Any]],
                          generation: int | None, now: str, monitoring: bool,
                          autoscaling: AutoscalingState | None = None) -> VLLMDeploymentStatus:
    """The status from the plan and the VLLMDeployment's Deployments (`children`: the pools' and the router's)."""
    deployments: dict[str, Mapping[str, Any] | None] = {p: None for p in constants.POOLS}
    router: Mapping[str, Any] | None = None
    for child in children:
        labels = child.get("metadata", {}).get("labels", {})
        if labels.get(constants.LABEL_COMPONENT) == constants.COMPONENT_ROUTER:
            router = child
        elif labels.get(constants.LABEL_POOL) in deployments:
            deployments[labels[constants.LABEL_POOL]] = child
    if not monitoring:
        # A warning of the plan summary, not a condition: MetricsAvailable has one writer, the health loop, which
        # knows whether samples arrive (a Prometheus may scrape the engines without the Prometheus operator).
        the_plan = the_plan.model_copy(update={"warnings": [*the_plan.warnings, MONITORING_MISSING]})
    status = conditions.with_plan(prev, the_plan, deployments, router, generation=generation, now=now)
    if autoscaling is not None:
        status = conditions.with_autoscaling(status, autoscaling.condition() if autoscaling.pools else None,
                                             generation=generation, now=now)
    return status


async def refresh_status(kube: KubeApi, obj: Mapping[str, Any], config: OperatorConfig = DEFAULT_CONFIG,
                         classes: ClassIndex | None = None, *, children: Lister | None = None) -> bool:
    """Cheap status refresh after an owned Deployment changed: replan (pure) and recount the pools.

    `obj` may come from the operator's watch of VLLMDeployments and the Deployments are read from `children` (its
    watch of them, handlers/watched.py; None: listed through `kube`), so that the only request is the status
    PATCH. The write goes through the one status writer: a 409 (someone wrote since, or the cache lagged) re-reads
    the object and computes again.
    """
    wakes: list[scaling.WakeEvent] = []

    async def desired(current: Mapping[str, Any]) -> Mapping[str, Any] | None:
        meta = current["metadata"]
        prev = VLLMDeploymentStatus.of(current)
        try:
            resource = parse_resource(dict(current))
            the_plan = plan_for(resource, await plan_context(kube, resource, config, classes), prev)
        except SpecError:
            return None  # the spec is refused; the lifecycle handler owns that status
        found = await (children or kube).list(DEPLOYMENTS, meta["namespace"], child_selector(meta["name"]))
        owned = [d for d in found if is_owned_by(d, meta["uid"])]
        has_monitoring = await kube.has_resource(POD_MONITORS.group, POD_MONITORS.version, POD_MONITORS.plural)
        # observedGeneration is the reconcile's to advance: a refresh may run before this generation's reconcile.
        observed = prev.observed_generation if prev else None
        now = now_rfc3339()
        new = _status_from_children(prev, the_plan, owned, observed, now, has_monitoring)
        # The refresh has no --prometheus-url; whether KEDA scales the pools is what the last reconcile said.
        autoscaling = await _autoscaling_state(kube, the_plan, _autoscaling_applied(prev))
        new, wakes[:] = await _with_autoscalers(kube, current, prev, new, the_plan, autoscaling, now)
        return new.to_wire()

    written = (await write_status(kube, obj, desired)).written
    if written:
        await _post_wake_events(kube, obj, wakes)
    return written


def _autoscaling_applied(status: VLLMDeploymentStatus | None) -> bool:
    cond = conditions.get_condition(status, constants.COND_AUTOSCALING)
    return cond is not None and cond.status == "True"


__all__ = ["ReconcileOutcome", "Resource", "reconcile", "refresh_status", "resolve_accelerator"]
