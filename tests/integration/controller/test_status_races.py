"""Status writers race (the reconcile, the Deployment-watch refresh, the health loop); the last word must be true.

A slow API server (create responses delayed 2 s after the write committed) lets pods become ready while the
reconcile is still creating children. Before the fix, the reconcile then wrote the stale "0 ready" status last and
Ready=False stuck although every Deployment was ready.
"""

from __future__ import annotations

from typing import Any

from tests.integration.controller.conftest import NAMESPACES, example
from tests.support.operator import running_operator
from tests.support.waiting import eventually
from vllm_operator import constants
from vllm_operator.demo import nodes_for
from vllm_operator.k8s import DEPLOYMENTS, VLLM_DEPLOYMENTS
from vllm_operator.sim.apiserver import ApiServer
from vllm_operator.sim.cluster import SimCluster
from vllm_operator.sim.faults import Fault
from vllm_operator.sim.requestlog import RequestRecord


def slow_deployment_creates(record: RequestRecord) -> Fault | None:
    if record.resource == "deployments" and record.verb == "create" and constants.APP_NAME in record.user_agent:
        return Fault(delay=2.0, after_commit=True)
    return None


async def test_ready_is_not_lost_when_pods_get_ready_during_the_reconcile() -> None:
    obj = example("chat")
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    async with SimCluster(api=ApiServer(faults=slow_deployment_creates), nodes=nodes_for([obj]),
                          ready_after=0.2) as sim:
        assert sim.client is not None
        await sim.client.create(NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        async with running_operator(sim) as kube:
            await kube.create(VLLM_DEPLOYMENTS, ns, obj)

            async def all_ready() -> bool:
                deps = await kube.list(DEPLOYMENTS, ns, f"{constants.LABEL_DEPLOYMENT}={name}")
                return len(deps) == 3 and all(d.get("status", {}).get("readyReplicas") == d["spec"]["replicas"]
                                              for d in deps)

            await eventually(all_ready, timeout=60)

            async def ready_condition() -> dict[str, Any] | None:
                current = await kube.get(VLLM_DEPLOYMENTS, ns, name) or {}
                conds = {c["type"]: c for c in current.get("status", {}).get("conditions", [])}
                reconciled = current.get("status", {}).get("observedGeneration") == current["metadata"]["generation"]
                return current if reconciled and conds.get(constants.COND_READY, {}).get("status") == "True" else None

            current = await eventually(ready_condition, timeout=30)
            assert current["status"]["ready"] == "3/3"  # engine pods: 2 short + 1 long
