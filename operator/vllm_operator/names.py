"""Child object names, shared by the planner (RouterConfig's Service references) and the renderer.

Names are DNS labels (63 characters). A long VLLMDeployment name is truncated and suffixed with a short hash of
the full name, so two long names that share a prefix never collide. No child is ever named `vllm`: a Service of
that name injects `VLLM_PORT=tcp://…` into pods, which makes vLLM refuse to start.
"""

from __future__ import annotations

import hashlib

MAX_NAME = 63


def dns_label(*parts: str) -> str:
    """Join parts with '-' and fit the result into 63 characters (hash-suffixed when truncated)."""
    full = "-".join(p for p in parts if p)
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    return f"{full[: MAX_NAME - 9].rstrip('-')}-{digest}"


def pool(deployment: str, pool_name: str) -> str:
    """Engine Deployment, headless Service and PodDisruptionBudget of a pool."""
    return dns_label(deployment, pool_name)


def router(deployment: str) -> str:
    """Router Deployment, Service, ConfigMap, ServiceAccount, Role, RoleBinding and PodDisruptionBudget."""
    return dns_label(deployment, "router")


def engines_network_policy(deployment: str) -> str:
    return dns_label(deployment, "engines")


def monitoring(deployment: str) -> str:
    """PodMonitor and PrometheusRule."""
    return dns_label(deployment, "vllm-operator")


def adapters(deployment: str) -> str:
    """The adapters ConfigMap the engine wrappers follow (one key per pool)."""
    return dns_label(deployment, "adapters")


def weights_claim(deployment: str) -> str:
    """The weights cache's PersistentVolumeClaim of the claim form (model.cache.claim)."""
    return dns_label(deployment, "weights")
