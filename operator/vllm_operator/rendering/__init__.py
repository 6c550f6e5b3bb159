"""Rendering: a Plan in, the list of Kubernetes manifests the operator applies out.

Pure (no kopf, no kubernetes client, no I/O) and deterministic: one renderer module per kind group builds plain
dicts (engine: pool Deployments and the weights cache's claim; services: pool and router Services; router:
ConfigMap, RBAC, router Deployment;
policy: PodDisruptionBudgets, NetworkPolicy; autoscaling: KEDA ScaledObjects; monitoring + alerts: PodMonitor,
PrometheusRule), and `render` normalises
key order, stamps every object with the hash of its own content (`constants.ANNOTATION_SPEC_HASH`, computed without
that annotation) and sorts the result by kind order, then name (`common.KIND_ORDER`). The handler adds
ownerReferences, patches a child only when that hash differs from the live object's, and drops the monitoring objects
when their CRDs are absent.
"""

from __future__ import annotations

from vllm_operator.api import remediation
from vllm_operator.api.plan import Plan
from vllm_operator.rendering import adapters, autoscaling, common, engine, monitoring, policy, router, services
from vllm_operator.rendering.options import RenderOptions

__all__ = ["RenderOptions", "render"]


def render(plan: Plan, *, options: RenderOptions | None = None) -> list[common.Manifest]:
    """Every child object of one VLLMDeployment, sorted by (kind order, name), each with a spec-hash annotation.

    The plan is the whole input (cluster-wide settings aside: `options`). Disabled pools get no objects;
    `plan.monitoring` may leave the PodMonitor or the PrometheusRule out; a pool with `autoscaling` gets a KEDA
    ScaledObject when `options.prometheus_url` is set.
    """
    opts = options or RenderOptions()
    objects: list[common.Manifest] = []
    for pool in sorted(plan.pools.values(), key=lambda p: p.name):
        if not pool.enabled:
            continue
        objects += [engine.deployment(plan, pool), services.pool_service(plan, pool), policy.pool_pdb(plan, pool)]
        if pool.autoscaling is not None and opts.prometheus_url:
            objects.append(autoscaling.scaled_object(plan, pool, opts.prometheus_url))
    cache_claim = engine.claim(plan)
    if cache_claim is not None:
        objects.append(cache_claim)
    lora = adapters.config_map(plan)
    if lora is not None:
        objects.append(lora)
    objects += [
        router.config_map(plan),
        router.service_account(plan),
        router.role(plan),
        router.role_binding(plan),
        router.deployment(plan),
        services.router_service(plan),
        policy.router_pdb(plan, plan.router_pod.replicas),
        policy.engines_network_policy(plan, opts),
    ]
    if plan.monitoring.pod_monitor:
        objects.append(monitoring.pod_monitor(plan))
    if plan.monitoring.prometheus_rule:
        objects.append(monitoring.prometheus_rule(plan, remediation.resolve(None, thresholds=plan.thresholds)))
    return sorted((common.finalize(obj) for obj in objects), key=common.sort_key)
