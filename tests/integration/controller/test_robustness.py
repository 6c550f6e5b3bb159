"""Convergence under operator restarts and API faults, and a no-op resync that writes nothing."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pytest

from tests.integration.controller.conftest import NAMESPACES, example
from tests.integration.controller.test_lifecycle import children, cond, converge
from tests.support.operator import running_operator
from tests.support.waiting import eventually
from vllm_operator import constants
from vllm_operator.demo import nodes_for
from vllm_operator.k8s import VLLM_DEPLOYMENTS, ClientKubeApi
from vllm_operator.sim.apiserver import ApiServer
from vllm_operator.sim.cluster import SimCluster
from vllm_operator.sim.faults import RandomFaults

EXPECTED_KINDS = Counter({"Deployment": 3, "Service": 3, "ConfigMap": 1, "ServiceAccount": 1, "Role": 1,
                          "RoleBinding": 1, "PodDisruptionBudget": 3, "NetworkPolicy": 1})


async def assert_converged(kube: ClientKubeApi, ns: str, name: str) -> None:
    obj = await converge(kube, ns, name, 1)
    kids = await children(kube, ns, name)
    counts = Counter(kind for kind, _ in kids)
    assert counts == EXPECTED_KINDS, f"duplicate or missing children: {counts}"
    uid = obj["metadata"]["uid"]
    for kid in kids.values():
        refs = kid["metadata"].get("ownerReferences", [])
        assert [r["uid"] for r in refs] == [uid], f"{kid['kind']} {kid['metadata']['name']} is orphaned or doubly owned"


@pytest.mark.parametrize("seed", range(20), ids=[f"seed{s}" for s in range(20)])
async def test_restart_at_random_points_converges(cluster: SimCluster, seed: int) -> None:
    rng = random.Random(seed)
    obj = example("long-doc")
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    async with running_operator(cluster) as kube:
        await kube.create(VLLM_DEPLOYMENTS, ns, obj)
        await asyncio.sleep(rng.uniform(0.0, 0.25))  # stopped somewhere inside the first reconcile
    async with running_operator(cluster) as kube:
        await assert_converged(kube, ns, name)


async def test_api_faults_converge() -> None:
    faults = RandomFaults(0.1, seed=7, user_agent=constants.APP_NAME)
    api = ApiServer(faults=faults)
    obj = example("long-doc")
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    async with SimCluster(api=api, nodes=nodes_for([obj])) as cluster:
        assert cluster.client is not None
        await cluster.client.create(NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": ns}})
        async with running_operator(cluster, timeout=2.0) as kube:
            await kube.create(VLLM_DEPLOYMENTS, ns, obj)
            await assert_converged(kube, ns, name)
        assert faults.injected, "the test must actually have injected faults"
        assert cluster.controller_errors == []


async def test_no_op_resync_makes_zero_writes(cluster: SimCluster) -> None:
    objs = [example("chat"), example("long-doc")]
    async with running_operator(cluster) as kube:
        for obj in objs:
            await kube.create(VLLM_DEPLOYMENTS, obj["metadata"]["namespace"], obj)
        for obj in objs:
            await converge(kube, obj["metadata"]["namespace"], obj["metadata"]["name"], 1)
        await asyncio.sleep(1.0)  # let trailing Deployment-status refreshes land
    start = cluster.api.request_log.next_seq
    async with running_operator(cluster) as kube:
        async def resynced() -> bool:
            reads = [r for r in cluster.api.request_log.since(start)
                     if r.resource == constants.PLURAL and r.verb in ("list", "watch")]
            return bool(reads)

        await eventually(resynced)
        await asyncio.sleep(3.0)  # resume handlers and watch-driven refreshes have run
        for obj in objs:
            current = await kube.get(VLLM_DEPLOYMENTS, obj["metadata"]["namespace"], obj["metadata"]["name"])
            assert cond(current, constants.COND_READY)["status"] == "True"
    writes: list[Any] = [r for r in cluster.api.request_log.since(start)
                         if r.is_write and "sim-" not in r.user_agent]
    assert writes == [], [f"{r.verb} {r.resource}/{r.name} ({r.user_agent})" for r in writes]
