"""Rendering: a Plan (plus the spec it came from) in, the list of Kubernetes manifests the operator applies out.

Pure (no kopf, no kubernetes client, no I/O) and deterministic: one renderer module per kind group builds plain
dicts, and `render` normalises key order, stamps every object with the hash of its own content
(`constants.ANNOTATION_SPEC_HASH`) and sorts the result by kind order, then name (`common.KIND_ORDER`). The handler
adds ownerReferences and patches a child only when that hash differs from the live object's.
"""

from __future__ import annotations

from vllm_operator.api.plan import Plan
from vllm_operator.api.spec import VLLMDeploymentSpec
from vllm_operator.rendering import common, engine, services

__all__ = ["render"]


def render(plan: Plan, spec: VLLMDeploymentSpec) -> list[common.Manifest]:
    """Every child object of one VLLMDeployment, sorted by (kind order, name), each with a spec-hash annotation."""
    objects: list[common.Manifest] = []
    for pool in sorted(plan.pools.values(), key=lambda p: p.name):
        if not pool.enabled:
            continue
        objects.append(engine.deployment(plan, pool, spec))
        objects.append(services.pool_service(plan, pool))
    objects.append(services.router_service(plan))
    return sorted((common.finalize(obj) for obj in objects), key=common.sort_key)
