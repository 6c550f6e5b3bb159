"""Rendering: a Plan (plus the spec it came from) in, the list of Kubernetes manifests the operator applies out.

Pure (no kopf, no kubernetes client, no I/O) and deterministic: one renderer module per kind group builds plain
dicts (engine: pool Deployments; services: pool and router Services; router: ConfigMap, RBAC, router Deployment;
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
from vllm_operator.api.spec import VLLMDeploymentSpec
from vllm_operator.rendering import adapters, autoscaling, common, engine, monitoring, policy, router, services
from vllm_operator.rendering.options import RenderOptions

__all__ = ["RenderOptions", "render"]


def render(plan: Plan, spec: VLLMDeploymentSpec, *, options: RenderOptions | None = None) -> list[common.Manifest]:
    """Every child object of one VLLMDeployment, sorted by (kind order, name), each with a spec-hash annotation.

    Disabled pools get no objects; `spec.monitoring.podMonitor` / `prometheusRule` set to false leave those out; a
    pool with `autoscaling` gets a KEDA ScaledObject when `options.prometheus_url` is set.
    """
    opts = options or RenderOptions()
    objects: list[common.Manifest] = []
    for pool in sorted(plan.pools.values(), key=lambda p: p.name):
        if not pool.enabled:
            continue
        objects += [engine.deployment(plan, pool, spec, opts.images), services.pool_service(plan, pool),
                    policy.pool_pdb(plan, pool)]
        if pool.autoscaling is not None and opts.prometheus_url:
            objects.append(autoscaling.scaled_object(plan, pool, opts.prometheus_url))
    lora = adapters.config_map(plan, spec)
    if lora is not None:
        objects.append(lora)
    objects += [
        router.config_map(plan),
        router.service_account(plan),
        router.role(plan),
        router.role_binding(plan),
        router.deployment(plan, spec, opts.images),
        services.router_service(plan),
        policy.router_pdb(plan, router.replicas(spec)),
        policy.engines_network_policy(plan, opts),
    ]
    mon = spec.monitoring
    extra_labels = mon.labels if mon is not None else None
    if mon is None or mon.pod_monitor is not False:
        objects.append(monitoring.pod_monitor(plan, extra_labels))
    if mon is None or mon.prometheus_rule is not False:
        settings = remediation.resolve(spec.remediation, thresholds=plan.thresholds)
        objects.append(monitoring.prometheus_rule(plan, extra_labels, settings))
    return sorted((common.finalize(obj) for obj in objects), key=common.sort_key)
