"""The simulated cluster's controllers behave as a real cluster's do, seen through real clients."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.paths import ROOT
from tests.support.waiting import eventually
from vllm_operator import constants
from vllm_operator.api.resource import parse_spec
from vllm_operator.planning import RemediationState, plan
from vllm_operator.rendering import engine
from vllm_operator.sim.client import DEPLOYMENTS, ENDPOINT_SLICES, PODS, REPLICA_SETS, SERVICES, SimClient
from vllm_operator.sim.cluster import SimCluster, gpu_node
from vllm_operator.sim.controllers.scheduling import ContainerState

H100 = {"product": "NVIDIA-H100-80GB-HBM3", "memory_mib": 81559, "compute": (9, 0)}
L4 = {"product": "NVIDIA-L4", "memory_mib": 23034, "compute": (8, 9)}


def deployment(name: str, replicas: int, *, gpus: int = 1, image: str = "engine:1", surge: int = 0,
               selector: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas, "selector": {"matchLabels": labels},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": 1}},
            "template": {"metadata": {"labels": labels}, "spec": {
                "nodeSelector": selector or {},
                "containers": [{"name": "engine", "image": image, "ports": [{"name": "http", "containerPort": 8000}],
                                "resources": {"limits": {constants.GPU_RESOURCE: str(gpus)}}}]}},
        },
    }


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    nodes = [gpu_node("h100-0", gpus=2, **H100), gpu_node("l4-0", gpus=1, **L4)]  # type: ignore[arg-type]
    async with SimCluster(nodes=nodes) as sim:
        yield sim
    assert sim.controller_errors == []
    assert sim.api.internal_errors == []


async def ready_pods(client: SimClient, app: str) -> list[dict[str, Any]]:
    pods, _ = await client.list(PODS, "default", f"app={app}")
    return [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                   for c in p.get("status", {}).get("conditions", []))]


async def test_deployment_becomes_replicaset_and_ready_pods(cluster: SimCluster) -> None:
    client = cluster.client
    assert client is not None
    await client.create(DEPLOYMENTS, "default", deployment("web", 2, gpus=0))

    async def done() -> dict[str, Any] | None:
        dep = await client.get(DEPLOYMENTS, "default", "web")
        return dep if dep and dep.get("status", {}).get("readyReplicas") == 2 else None

    dep = await eventually(done)
    (rs,) = (await client.list(REPLICA_SETS, "default"))[0]
    assert rs["metadata"]["ownerReferences"][0]["uid"] == dep["metadata"]["uid"]
    assert rs["metadata"]["name"].startswith("web-") and "pod-template-hash" in rs["metadata"]["labels"]
    pods = await ready_pods(client, "web")
    assert {p["metadata"]["ownerReferences"][0]["name"] for p in pods} == {rs["metadata"]["name"]}
    assert {c["type"] for c in dep["status"]["conditions"]} == {"Available", "Progressing"}
    assert dep["status"]["observedGeneration"] == dep["metadata"]["generation"]


async def test_deleted_pod_is_replaced(cluster: SimCluster) -> None:
    client = cluster.client
    assert client is not None
    await client.create(DEPLOYMENTS, "default", deployment("web", 1, gpus=0))
    (first,) = await eventually(lambda: ready_pods(client, "web"))
    await client.delete(PODS, "default", first["metadata"]["name"])

    async def replaced() -> list[dict[str, Any]]:
        pods = await ready_pods(client, "web")
        return [p for p in pods if p["metadata"]["name"] != first["metadata"]["name"]]

    await eventually(replaced)


async def test_gpu_scheduling_by_product_label_and_unschedulable(cluster: SimCluster) -> None:
    client = cluster.client
    assert client is not None
    await client.create(DEPLOYMENTS, "default", deployment("big", 1, selector={constants.GFD_PRODUCT: H100["product"]}))
    await client.create(DEPLOYMENTS, "default", deployment("small", 2, selector={constants.GFD_PRODUCT: L4["product"]}))
    (big,) = await eventually(lambda: ready_pods(client, "big"))
    assert big["spec"]["nodeName"] == "h100-0"
    (small,) = await eventually(lambda: ready_pods(client, "small"))
    assert small["spec"]["nodeName"] == "l4-0"

    async def pending() -> list[dict[str, Any]]:
        pods, _ = await client.list(PODS, "default", "app=small")
        return [p for p in pods if any(c.get("reason") == "Unschedulable"
                                       for c in p.get("status", {}).get("conditions", []))]

    (stuck,) = await eventually(pending)
    cond = next(c for c in stuck["status"]["conditions"] if c["type"] == "PodScheduled")
    assert cond["status"] == "False" and "Insufficient nvidia.com/gpu" in cond["message"]
    assert "didn't match Pod's node affinity/selector" in cond["message"]


async def test_rendered_gpu_pool_schedules_on_every_variant_and_never_on_time_sliced_nodes() -> None:
    """Issue 21: an A100-80GB pool was pinned to the SXM4 product string, so a PCIe node stayed unused and the pods
    Pending; a time-sliced node (GFD's -SHARED product, nvidia.com/gpu.replicas) must not take them either."""
    spec = parse_spec({"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "workloadClass": "chat",
                       "accelerator": {"type": "nvidia-a100-80gb"}, "pools": {"short": {"replicas": 2}}})
    the_plan = plan(spec, None, RemediationState(), name="chat", namespace="default")
    engine_dep = engine.deployment(the_plan, the_plan.pools["short"])
    a100 = {"memory_mib": 81920, "compute": (8, 0)}
    nodes = [gpu_node("pcie-0", product="NVIDIA-A100-80GB-PCIe", gpus=1, **a100),  # type: ignore[arg-type]
             gpu_node("shared-0", product="NVIDIA-A100-80GB-PCIe-SHARED", gpus=4,  # type: ignore[arg-type]
                      labels={constants.GFD_REPLICAS: "4"}, **a100),
             gpu_node("sliced-0", product="NVIDIA-A100-SXM4-80GB", gpus=4,  # type: ignore[arg-type]
                      labels={constants.GFD_REPLICAS: "4"}, **a100)]
    async with SimCluster(nodes=nodes) as sim:
        client = sim.client
        assert client is not None
        await client.create(DEPLOYMENTS, "default", engine_dep)
        selector = ",".join(f"{k}={v}" for k, v in engine_dep["spec"]["selector"]["matchLabels"].items())

        async def placed() -> list[dict[str, Any]] | None:
            pods, _ = await client.list(PODS, "default", selector)
            bound = [p for p in pods if p["spec"].get("nodeName")]
            stuck = [p for p in pods if any(c.get("reason") == "Unschedulable"
                                            for c in p.get("status", {}).get("conditions", []))]
            return pods if len(bound) == 1 and len(stuck) == 1 else None

        pods = await eventually(placed)
        assert {p["spec"].get("nodeName") for p in pods} == {"pcie-0", None}
        stuck = next(p for p in pods if not p["spec"].get("nodeName"))
        cond = next(c for c in stuck["status"]["conditions"] if c["type"] == "PodScheduled")
        assert "2 node(s) didn't match Pod's node affinity/selector" in cond["message"]
    assert sim.controller_errors == []


async def test_rollout_with_max_surge_zero_replaces_pods_one_at_a_time(cluster: SimCluster) -> None:
    """Two pods fill both H100 GPUs; a template change can only proceed by deleting one old pod at a time."""
    client = cluster.client
    assert client is not None
    sel = {constants.GFD_PRODUCT: H100["product"]}
    await client.create(DEPLOYMENTS, "default", deployment("eng", 2, selector=sel))
    await eventually(lambda: _count_ready(client, "eng", 2))
    seen_max_pods = 0

    async def watch_counts() -> None:
        nonlocal seen_max_pods
        while True:
            pods, _ = await client.list(PODS, "default", "app=eng")
            seen_max_pods = max(seen_max_pods, len([p for p in pods if p["spec"].get("nodeName")]))
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch_counts())
    await client.patch(DEPLOYMENTS, "default", "eng", {"spec": {"template": {"spec": {"containers": [
        {"name": "engine", "image": "engine:2", "resources": {"limits": {constants.GPU_RESOURCE: "1"}}}]}}}})

    async def rolled() -> bool:
        pods = await ready_pods(client, "eng")
        return len(pods) == 2 and all(p["spec"]["containers"][0]["image"] == "engine:2" for p in pods)

    await eventually(rolled, timeout=20)
    watcher.cancel()
    assert seen_max_pods <= 2, "maxSurge 0 on a full node must never run a third GPU pod"
    rs_list, _ = await client.list(REPLICA_SETS, "default")
    assert sorted(int(rs["spec"]["replicas"]) for rs in rs_list) == [0, 2]


async def _count_ready(client: SimClient, app: str, n: int) -> bool:
    return len(await ready_pods(client, app)) == n


async def test_endpointslices_follow_readiness_for_headless_service(cluster: SimCluster) -> None:
    client = cluster.client
    assert client is not None
    await client.create(SERVICES, "default", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"clusterIP": "None", "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]}})
    await client.create(DEPLOYMENTS, "default", deployment("web", 2, gpus=0))

    async def slice_ready(n: int) -> dict[str, Any] | None:
        slices, _ = await client.list(ENDPOINT_SLICES, "default", "kubernetes.io/service-name=web")
        if slices and sum(e["conditions"]["ready"] for e in slices[0]["endpoints"]) == n:
            return slices[0]
        return None

    eps = await eventually(lambda: slice_ready(2))
    assert eps["ports"] == [{"name": "http", "port": 8000, "protocol": "TCP"}]
    pod_name = eps["endpoints"][0]["targetRef"]["name"]
    cluster.kubelet.set_state("default", pod_name, ContainerState(ready=False))
    eps = await eventually(lambda: slice_ready(1))
    assert next(e for e in eps["endpoints"] if e["targetRef"]["name"] == pod_name)["conditions"]["ready"] is False


async def test_container_states_can_be_driven(cluster: SimCluster) -> None:
    client = cluster.client
    assert client is not None
    await client.create(DEPLOYMENTS, "default", deployment("web", 1, gpus=0))
    (pod,) = await eventually(lambda: ready_pods(client, "web"))
    name = pod["metadata"]["name"]
    cluster.kubelet.set_state("default", name, ContainerState(
        ready=False, restart_count=3, waiting_reason="CrashLoopBackOff",
        last_terminated={"reason": "OOMKilled", "exitCode": 137, "message": "engine OOM"}))

    async def crashed() -> dict[str, Any] | None:
        current = await client.get(PODS, "default", name)
        status = (current or {}).get("status", {}).get("containerStatuses", [{}])[0]
        return status if status.get("restartCount") == 3 else None

    status = await eventually(crashed)
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert status["lastState"]["terminated"]["reason"] == "OOMKilled"
    assert status["lastState"]["terminated"]["exitCode"] == 137


async def test_kubectl_sees_the_rollout(cluster: SimCluster) -> None:
    client = cluster.client
    assert client is not None
    await client.create(DEPLOYMENTS, "default", deployment("web", 1, gpus=0))
    await eventually(lambda: ready_pods(client, "web"))
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    out = await asyncio.to_thread(
        subprocess.run, [str(ROOT / ".venv/bin/kubectl"), "get", "deploy,rs,pods,endpointslices", "-o", "json"],
        env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    kinds = sorted({item["kind"] for item in json.loads(out.stdout)["items"]})
    assert kinds == ["Deployment", "Pod", "ReplicaSet"]
