"""The whole health loop in the operator: kopf timer -> snapshot -> diagnose -> decide -> act, on the simulated
cluster, with engine pod states injected through the simulated kubelet and engine metrics from fake vLLM engines
scraped by a real Prometheus.

Checked: repeated EngineOOM moves the pool one rung down and the new rung reaches the rendered Deployment's args,
with status history and events; a Stalled engine's pod is deleted (once, within budget); while Prometheus is down
nothing is deleted and MetricsAvailable=False says why, and the deletion happens once it is back.
Fault-to-action times are logged (and appended to $HEALTH_TIMINGS when set).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
import yaml

from fakevllm.engine import FakeVllm
from tests.support.health_harness import Engine, client_loop, engines, record_timing
from tests.support.operator import running_operator
from tests.support.paths import EXAMPLES
from tests.support.prometheus import Prometheus, running_prometheus
from tests.support.waiting import eventually
from vllm_operator import constants, names
from vllm_operator.demo import nodes_for
from vllm_operator.handlers.reconcile import reconcile
from vllm_operator.health import loop
from vllm_operator.k8s import DEPLOYMENTS, EVENTS, PODS, VLLM_DEPLOYMENTS, ClientKubeApi, Resource
from vllm_operator.sim.cluster import SimCluster
from vllm_operator.sim.controllers.scheduling import ContainerState

pytestmark = pytest.mark.integration

NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
CHAT = yaml.safe_load((EXAMPLES / "chat.yaml").read_text())
NS, NAME = CHAT["metadata"]["namespace"], CHAT["metadata"]["name"]
REMEDIATION = {"restartBudget": 3, "thresholds": {"oomCount": 2, "oomWindowSeconds": 600, "stallSeconds": 3,
                                                  "windowSeconds": 6}}


def record(kind: str, seconds: float) -> None:
    record_timing(kind, seconds, tier="operator on simulated cluster", health_interval_s=1, scrape_interval_s=1,
                  stall_s=3, window_s=6)


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    async with SimCluster(nodes=nodes_for([CHAT])) as sim:
        assert sim.client is not None
        await sim.client.create(NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": NS}})
        yield sim
    assert sim.controller_errors == []


@pytest.fixture
def prom() -> Iterator[Prometheus]:
    with running_prometheus() as p:
        yield p


def chat() -> dict[str, Any]:
    obj: dict[str, Any] = copy.deepcopy(CHAT)
    obj["spec"]["remediation"] = copy.deepcopy(REMEDIATION)
    return obj


def cond(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return dict(next((c for c in (obj or {}).get("status", {}).get("conditions", []) if c["type"] == type_), {}))


async def pool_pods(kube: ClientKubeApi, pool: str) -> list[dict[str, Any]]:
    pods = await kube.list(PODS, NS, f"{constants.LABEL_DEPLOYMENT}={NAME},{constants.LABEL_POOL}={pool}")
    return sorted((p for p in pods if not p["metadata"].get("deletionTimestamp")), key=lambda p: p["metadata"]["name"])


async def started_pool_pods(kube: ClientKubeApi, pool: str) -> list[dict[str, Any]] | None:
    """The pool's pods once the kubelet has started them all: a state driven before the kubelet's first report
    would be overwritten by it."""
    pods = await pool_pods(kube, pool)
    started = all(p.get("status", {}).get("containerStatuses") for p in pods)
    return pods if pods and started else None


async def ready_obj(kube: ClientKubeApi) -> dict[str, Any] | None:
    obj = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
    return obj if cond(obj, constants.COND_READY).get("status") == "True" else None


def engine_args(dep: dict[str, Any] | None) -> list[str]:
    return list((dep or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0]
                .get("args", []))


def oom(restarts: int) -> ContainerState:
    message = json.dumps({"reason": constants.REASON_ENGINE_OOM, "exitCode": constants.EXIT_ENGINE_OOM,
                          "detail": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"})
    return ContainerState(ready=False, restart_count=restarts,
                          last_terminated={"exitCode": constants.EXIT_ENGINE_OOM, "reason": "Error",
                                           "message": message})


async def reasons(kube: ClientKubeApi) -> list[str]:
    return [e.get("reason", "") for e in await kube.list(EVENTS, NS)]


async def test_repeated_engine_oom_steps_the_pool_down_into_the_deployment(cluster: SimCluster) -> None:
    async with running_operator(cluster, health_enabled=True, health_interval_override=1.0) as kube:
        await kube.create(VLLM_DEPLOYMENTS, NS, chat())
        await eventually(lambda: ready_obj(kube), timeout=30)
        dep_name = names.pool(NAME, "short")
        before = engine_args(await kube.get(DEPLOYMENTS, NS, dep_name))
        util_before = next(a for a in before if a.startswith("--gpu-memory-utilization="))
        pod = (await pool_pods(kube, "short"))[0]["metadata"]["name"]

        cluster.kubelet.set_state(NS, pod, oom(1))

        async def counted() -> bool:
            obj = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
            short = (obj or {}).get("status", {}).get("pools", {}).get("short", {})
            return len(short.get("restartBudget", {}).get("oomEvents", [])) == 1

        await eventually(counted, timeout=20)
        injected = time.monotonic()
        cluster.kubelet.set_state(NS, pod, oom(2))

        async def stepped() -> list[str] | None:
            args = engine_args(await kube.get(DEPLOYMENTS, NS, dep_name))
            return args if util_before not in args else None

        after = await eventually(stepped, timeout=30)
        record("EngineOOM x2 -> step-down in Deployment args", time.monotonic() - injected)
        util_after = next(a for a in after if a.startswith("--gpu-memory-utilization="))
        assert float(util_after.split("=")[1]) == pytest.approx(float(util_before.split("=")[1]) - 0.05)
        obj = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
        assert obj is not None
        step = obj["status"]["pools"]["short"]["stepDown"]
        assert step["level"] == 1 and "gpu-memory-utilization" in step["history"][-1]["rung"]
        assert "EngineOOM x2" in step["history"][-1]["reason"]
        assert obj["status"]["stepDownLevel"] == 1
        assert obj["status"]["pools"]["long"]["stepDown"].get("level", 0) == 0
        assert cond(obj, constants.COND_METRICS_AVAILABLE)["reason"] == "PrometheusNotConfigured"
        events = await reasons(kube)
        assert "ObservedEngineOOM" in events and "SteppedDown" in events
        assert (await kube.list(PODS, NS, f"{constants.LABEL_POOL}=short")), "pods were rolled, not deleted"


async def test_stalled_engine_deleted_and_nothing_while_prometheus_is_down(cluster: SimCluster,
                                                                          prom: Prometheus) -> None:
    async with running_operator(cluster, health_enabled=True, health_interval_override=1.0,
                                prometheus_url=prom.url) as kube:
        await kube.create(VLLM_DEPLOYMENTS, NS, chat())
        await eventually(lambda: ready_obj(kube), timeout=30)
        specs = [(p["metadata"]["name"], pool) for pool in ("short", "long") for p in await pool_pods(kube, pool)]
        async with engines(specs, prom, namespace=NS, deployment=NAME) as fleet:

            async def scraped() -> bool:
                obj = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
                pools = (obj or {}).get("status", {}).get("pools", {})
                return (cond(obj, constants.COND_METRICS_AVAILABLE).get("status") == "True"
                        and all(pools.get(p, {}).get("diagnosis") == "Healthy" for p in ("short", "long")))

            await eventually(scraped, timeout=40, interval=0.5)
            obj = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
            assert obj is not None and obj["status"]["pools"]["short"]["observedKVTokens"] == 32768

            stalled = fleet[0]
            stalled.fake.configure(stall=True)
            injected = time.monotonic()

            async def deleted(pod: str) -> bool:
                return pod not in {p["metadata"]["name"] for p in await kube.list(PODS, NS)}

            await eventually(lambda: deleted(stalled.pod), timeout=40, interval=0.25)
            record("Stalled -> pod deleted", time.monotonic() - injected)
            obj = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
            assert obj is not None and obj["status"]["pools"]["short"]["restartBudget"]["used"] == 1
            assert "RestartedStalledPod" in await reasons(kube)

            # Prometheus goes away; then the long pool's engine stalls. Nothing may be deleted meanwhile.
            prom.stop()
            victim = next(e for e in fleet if e.pool == "long")
            victim.fake.configure(stall=True)

            async def blind() -> bool:
                return cond(await kube.get(VLLM_DEPLOYMENTS, NS, NAME),
                            constants.COND_METRICS_AVAILABLE).get("reason") == "PrometheusUnreachable"

            await eventually(blind, timeout=30, interval=0.5)
            await asyncio.sleep(10)  # three stall windows with a check every second: long enough to have acted
            assert not await deleted(victim.pod), "a pod was deleted while Prometheus was down"
            obj = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
            assert obj is not None and obj["status"]["pools"]["long"]["restartBudget"].get("used", 0) == 0

            prom.start()
            back = time.monotonic()
            await eventually(lambda: deleted(victim.pod), timeout=40, interval=0.25)
            record("Prometheus back -> stalled pod deleted", time.monotonic() - back)



async def test_kv_cache_too_small_takes_the_kv_path_into_the_deployment(cluster: SimCluster) -> None:
    obj = chat()
    obj["spec"]["remediation"]["allowLowerMaxModelLen"] = True
    async with running_operator(cluster, health_enabled=True, health_interval_override=1.0) as kube:
        await kube.create(VLLM_DEPLOYMENTS, NS, obj)
        await eventually(lambda: ready_obj(kube), timeout=30)
        dep_name = names.pool(NAME, "long")
        before = engine_args(await kube.get(DEPLOYMENTS, NS, dep_name))
        pod = (await pool_pods(kube, "long"))[0]["metadata"]["name"]
        message = json.dumps({"reason": constants.REASON_KV_CACHE_TOO_SMALL,
                              "exitCode": constants.EXIT_KV_CACHE_TOO_SMALL,
                              "detail": "(4.00 GiB KV cache is needed, which is larger than the available KV cache "
                                        "memory (2.10 GiB)"})
        injected = time.monotonic()
        cluster.kubelet.set_state(NS, pod, ContainerState(
            ready=False, restart_count=1, waiting_reason="CrashLoopBackOff",
            last_terminated={"exitCode": constants.EXIT_KV_CACHE_TOO_SMALL, "reason": "Error", "message": message}))

        async def changed() -> list[str] | None:
            args = engine_args(await kube.get(DEPLOYMENTS, NS, dep_name))
            return args if args != before else None

        after = await eventually(changed, timeout=30)
        record("KVCacheTooSmall -> KV rung in Deployment args", time.monotonic() - injected)
        moved = sorted(set(after) ^ set(before))
        assert moved and all(a.startswith(("--kv-cache-dtype=", "--max-model-len=")) for a in moved), moved
        current = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
        assert current is not None
        step = current["status"]["pools"]["long"]["stepDown"]
        assert step["kvLevel"] == 1 and step.get("level", 0) == 0
        assert step["history"][-1]["reason"] == "KVCacheTooSmall at start-up"
        assert "SteppedKVPath" in await reasons(kube)


async def test_storm_every_pod_stalls_budget_caps_deletions(cluster: SimCluster, prom: Prometheus) -> None:
    """Every engine stalls, replacements too: one pod per pool at a time, never more than the budget."""
    budget = 2
    obj = chat()
    obj["spec"]["remediation"]["restartBudget"] = budget
    fleet: dict[str, Engine] = {}
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def follow_pods(kube: ClientKubeApi) -> None:
        """Give every engine pod, old or new, a stalled fake engine under traffic, registered with Prometheus."""
        while True:
            pods = {p["metadata"]["name"]: p["metadata"]["labels"][constants.LABEL_POOL]
                    for pool in ("short", "long") for p in await pool_pods(kube, pool)}
            for name, pool in pods.items():
                if name not in fleet:
                    fake = await FakeVllm(stall=True, kv_cache_size_tokens=32768).start()
                    engine = Engine(pod=name, pool=pool, fake=fake)
                    engine.tasks = [asyncio.create_task(client_loop(session, engine)) for _ in range(2)]
                    fleet[name] = engine
            prom.set_targets([fleet[n].target(NS, NAME) for n in pods])
            await asyncio.sleep(0.3)

    async with running_operator(cluster, health_enabled=True, health_interval_override=1.0,
                                prometheus_url=prom.url) as kube:
        await kube.create(VLLM_DEPLOYMENTS, NS, obj)
        await eventually(lambda: ready_obj(kube), timeout=30)
        started = time.monotonic()
        follower = asyncio.create_task(follow_pods(kube))
        try:
            async def exhausted() -> dict[str, Any] | None:
                current = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
                pools = (current or {}).get("status", {}).get("pools", {})
                used = [pools.get(p, {}).get("restartBudget", {}).get("used", 0) for p in ("short", "long")]
                return current if used == [budget, budget] else None

            await eventually(exhausted, timeout=60, interval=0.5)
            record(f"storm: budget {budget}/pool spent", time.monotonic() - started)
            await asyncio.sleep(10)  # ten more checks with every pod stalled: nothing more may go
            current = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
            assert current is not None
            for pool in ("short", "long"):
                assert current["status"]["pools"][pool]["restartBudget"]["used"] == budget
            assert len(fleet) == 3 + 2 * budget, f"pods seen: {sorted(fleet)}"
            remediating = cond(current, constants.COND_REMEDIATING)
            assert remediating["status"] == "False" and remediating["reason"] == "BudgetExhausted"
            assert (await reasons(kube)).count("RestartedStalledPod") == 2 * budget
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
            for engine in fleet.values():
                for task in engine.tasks:
                    task.cancel()
                await asyncio.gather(*engine.tasks, return_exceptions=True)
                await engine.fake.stop()
            await session.close()


async def test_a_decision_on_a_stale_status_is_not_acted_on(cluster: SimCluster) -> None:
    """The controller writes the status between the loop's read and its write: the loop's write gets 409 and it
    does nothing this round (no rung, no event, no lost controller update); the next check, on fresh data, acts."""
    kube = ClientKubeApi.from_environment(kubeconfig=str(cluster.kubeconfig))
    try:
        await kube.create(VLLM_DEPLOYMENTS, NS, chat())
        created = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
        assert created is not None
        await reconcile(kube, created)
        pods = await eventually(lambda: started_pool_pods(kube, "long"), timeout=20)
        dep_name = names.pool(NAME, "long")
        before = engine_args(await kube.get(DEPLOYMENTS, NS, dep_name))
        message = json.dumps({"reason": constants.REASON_KV_CACHE_TOO_SMALL,
                              "exitCode": constants.EXIT_KV_CACHE_TOO_SMALL})
        cluster.kubelet.set_state(NS, pods[0]["metadata"]["name"], ContainerState(
            ready=False, restart_count=1, waiting_reason="CrashLoopBackOff",
            last_terminated={"exitCode": constants.EXIT_KV_CACHE_TOO_SMALL, "reason": "Error", "message": message}))

        async def kv_seen() -> Any:
            obj = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
            result = await loop.check(kube, None, obj or {})
            return (obj, result) if result is not None and result.decision.rung_changes else None

        obj, result = await eventually(kv_seen, timeout=20)
        await kube.patch_status(VLLM_DEPLOYMENTS, NS, NAME, {"status": {"ready": "controller-was-here"}})
        await loop.execute(kube, obj, result, reconcile=reconcile)
        after = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
        assert after is not None and after["status"]["ready"] == "controller-was-here"
        assert after["status"]["pools"]["long"]["stepDown"].get("kvLevel", 0) == 0
        assert engine_args(await kube.get(DEPLOYMENTS, NS, dep_name)) == before
        assert "SteppedKVPath" not in await reasons(kube)
        fresh = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
        assert fresh is not None
        again = await loop.check(kube, None, fresh)
        assert again is not None
        await loop.execute(kube, fresh, again, reconcile=reconcile)
        done = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
        assert done is not None and done["status"]["pools"]["long"]["stepDown"]["kvLevel"] == 1
        assert engine_args(await kube.get(DEPLOYMENTS, NS, dep_name)) != before
    finally:
        kube.close()


async def test_quiet_checks_write_nothing(cluster: SimCluster) -> None:
    """Once the health loop has said its piece, checks on an unchanged, healthy deployment make zero writes."""
    async with running_operator(cluster, health_enabled=True, health_interval_override=1.0) as kube:
        await kube.create(VLLM_DEPLOYMENTS, NS, chat())

        async def settled() -> dict[str, Any] | None:
            obj = await ready_obj(kube)
            return obj if cond(obj, constants.COND_METRICS_AVAILABLE).get("reason") == "PrometheusNotConfigured" \
                and cond(obj, constants.COND_DEGRADED).get("status") == "False" else None

        await eventually(settled, timeout=30)
        await asyncio.sleep(2)  # let the last in-flight check land
        before = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
        events_before = len(await kube.list(EVENTS, NS))
        await asyncio.sleep(5)  # five checks
        after = await kube.get(VLLM_DEPLOYMENTS, NS, NAME)
        assert before is not None and after is not None
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert len(await kube.list(EVENTS, NS)) == events_before
