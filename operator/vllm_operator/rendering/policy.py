"""Policy objects: PodDisruptionBudgets for each pool and the router, and the engines' NetworkPolicy.

Pool budgets allow one engine pod down at a time (`maxUnavailable: 1`, docs/architecture.md, Pods): a node drain
proceeds pod by pod and a pool with one replica can still be drained (`minAvailable: 1` would block it forever). The
router's budget keeps one pod up when there are two or more (`minAvailable: 1`); a single router replica gets
`maxUnavailable: 1` for the same reason as the pools.

The NetworkPolicy admits traffic to the engines' port 8000 only from this deployment's router pods and from the metrics
scraper (see `options.RenderOptions`): nothing else may bypass the router's max_tokens caps and length limits by
calling an engine directly. The wrapper's status port 8001 (start-up phases) is open to the scraper only; the
kubelet's probes come from the node, which NetworkPolicy implementations do not filter. Egress stays open (engines
download weights from the Hub).
"""

from __future__ import annotations

from vllm_operator import constants, names
from vllm_operator.api.plan import Plan, PoolPlan
from vllm_operator.rendering import common
from vllm_operator.rendering.options import RenderOptions


def pool_pdb(plan: Plan, pool: PoolPlan) -> common.Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": common.metadata(plan, names.pool(plan.name, pool.name), common.pool_labels(plan, pool.name)),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": common.engine_selector(plan, pool.name)}},
    }


def router_pdb(plan: Plan, replicas: int) -> common.Manifest:
    budget = {"minAvailable": 1} if replicas >= 2 else {"maxUnavailable": 1}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": common.metadata(plan, names.router(plan.name),
                                    common.base_labels(plan, constants.COMPONENT_ROUTER)),
        "spec": {**budget, "selector": {"matchLabels": common.router_selector(plan)}},
    }


def engines_network_policy(plan: Plan, options: RenderOptions) -> common.Manifest:
    port = [{"port": constants.ENGINE_PORT, "protocol": "TCP"}]
    scraped = [*port, {"port": constants.ENGINE_STATUS_PORT, "protocol": "TCP"}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": common.metadata(plan, names.engines_network_policy(plan.name),
                                    common.base_labels(plan, constants.COMPONENT_ENGINE)),
        "spec": {
            "podSelector": {"matchLabels": common.engine_selector(plan)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": common.router_selector(plan)}}], "ports": port},
                {"from": [options.scraper_peer()], "ports": scraped},
            ],
        },
    }
