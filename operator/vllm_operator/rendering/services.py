"""Services: one headless Service per pool (docs/architecture.md, Endpoint discovery) and the router's ClusterIP
Service.

Pool Services are headless (`clusterIP: None`) because nothing connects through them: the router watches their
EndpointSlices and balances over the pod IPs itself, and a virtual IP would hide which pod answered. They publish only
ready addresses, so an engine that is still loading never receives a request. No Service is ever named `vllm` (see
`names.py`): that name makes Kubernetes inject `VLLM_PORT=tcp://…` into pods, which vLLM refuses to start with.

The router Service listens on port 80 and forwards to the router's port 8080 (`http`): clients get a plain
`http://<name>-router.<namespace>/v1` base URL, while the router itself runs unprivileged on a high port.
"""

from __future__ import annotations

from vllm_operator import constants, names
from vllm_operator.api.plan import Plan, PoolPlan
from vllm_operator.rendering import common

ROUTER_SERVICE_PORT = 80


def pool_service(plan: Plan, pool: PoolPlan) -> common.Manifest:
    """The headless Service whose EndpointSlices list a pool's ready engine pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": common.metadata(plan, names.pool(plan.name, pool.name), common.pool_labels(plan, pool.name)),
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": common.engine_selector(plan, pool.name),
            "ports": [{"name": "http", "port": constants.ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def router_service(plan: Plan) -> common.Manifest:
    """The ClusterIP Service clients use."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": common.metadata(plan, names.router(plan.name),
                                    common.base_labels(plan, constants.COMPONENT_ROUTER)),
        "spec": {
            "type": "ClusterIP",
            "selector": common.router_selector(plan),
            "ports": [{"name": "http", "port": ROUTER_SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
