"""Endpoint discovery through EndpointSlices in the simulated cluster (docs/architecture.md, Endpoint discovery): the
router lists and watches the pool Service's slices over HTTP, follows additions, readiness changes and deletions, and
only routes to ready endpoints. The slices are written here with the official client (the endpoints controller comes
later)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import kubernetes.client
import pytest

from fakevllm.engine import FakeVllm
from tests.support.cluster import SimApi
from tests.support.router import MODEL, router_config, running_router, sample, words
from tests.support.waiting import eventually
from vllm_operator.router.tokens import TokenCounter

NS = "default"
CHAT = "/v1/chat/completions"


def port_of(fake: FakeVllm) -> int:
    return int(fake.url.rsplit(":", 1)[1])


def endpoint_slice(name: str, service: str, port: int, ready: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready}}],
    }


@pytest.fixture
def discovery(sim_api: SimApi) -> Iterator[kubernetes.client.DiscoveryV1Api]:
    with kubernetes.client.ApiClient(sim_api.client_configuration()) as client:
        yield kubernetes.client.DiscoveryV1Api(client)


@pytest.fixture
async def other_short() -> AsyncIterator[FakeVllm]:
    async with FakeVllm(model=MODEL, max_model_len=200, natural_tokens=5) as fake:
        yield fake


async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """The official client is blocking: keep the router (same loop) serving while it runs."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def test_router_follows_endpoint_slices(sim_api: SimApi, discovery: kubernetes.client.DiscoveryV1Api,
                                              short_engine: FakeVllm, other_short: FakeVllm,
                                              long_engine: FakeVllm, counter: TokenCounter,
                                              http: aiohttp.ClientSession) -> None:
    config = router_config(**{
        "pools.short.service": {"namespace": NS, "name": "demo-short", "port": 8000},
        "pools.long.service": {"namespace": NS, "name": "demo-long", "port": 8000},
    })
    async with running_router(config, counter, kubeconfig=str(sim_api.kubeconfig)) as (url, metrics):

        async def endpoints(pool: str) -> float:
            return sample(metrics, "vllm_operator_router_endpoints", pool=pool, state="healthy")

        async with http.get(url + "/health") as response:
            assert response.status == 503, "no slices yet: nothing to route to"
        await call(discovery.create_namespaced_endpoint_slice, NS,
                   endpoint_slice("demo-short-a", "demo-short", port_of(short_engine)))
        await call(discovery.create_namespaced_endpoint_slice, NS,
                   endpoint_slice("demo-long-a", "demo-long", port_of(long_engine)))
        # A slice of another Service must be ignored.
        await call(discovery.create_namespaced_endpoint_slice, NS,
                   endpoint_slice("unrelated", "something-else", port_of(other_short)))
        await eventually(lambda: endpoints("short"))
        await eventually(lambda: endpoints("long"))
        async with http.get(url + "/health") as response:
            assert response.status == 200

        for n_words in (5, 80):
            async with http.post(url + CHAT, json={"model": MODEL, "messages": [
                    {"role": "user", "content": words(n_words)}]}) as response:
                assert response.status == 200
        assert len(short_engine.requests()) == 1 and len(long_engine.requests()) == 1

        # A second ready endpoint joins; a not-ready one is not used.
        await call(discovery.create_namespaced_endpoint_slice, NS,
                   endpoint_slice("demo-short-b", "demo-short", port_of(other_short)))
        await eventually(lambda: asyncio.sleep(0, sample(metrics, "vllm_operator_router_endpoints",
                                                         pool="short", state="healthy") == 2))
        await call(discovery.patch_namespaced_endpoint_slice, "demo-short-a", NS,
                   {"endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": False}}]})
        await eventually(lambda: asyncio.sleep(0, sample(metrics, "vllm_operator_router_endpoints",
                                                         pool="short", state="healthy") == 1))
        short_engine.clear_requests()
        for _ in range(3):
            async with http.post(url + CHAT, json={"model": MODEL, "messages": [
                    {"role": "user", "content": "hi"}]}) as response:
                assert response.status == 200
        assert short_engine.requests() == [] and len(other_short.requests()) == 3

        # All short slices gone: short requests fall back to the long pool.
        for name in ("demo-short-a", "demo-short-b"):
            await call(discovery.delete_namespaced_endpoint_slice, name, NS)
        await eventually(lambda: asyncio.sleep(0, sample(metrics, "vllm_operator_router_endpoints",
                                                         pool="short", state="healthy") == 0
                                               and sample(metrics, "vllm_operator_router_endpoints",
                                                          pool="short", state="ejected") == 0))
        async with http.post(url + CHAT, json={"model": MODEL, "messages": [
                {"role": "user", "content": "hi"}]}) as response:
            assert response.status == 200
            assert response.headers["x-vllm-operator-pool"] == "long"
    assert sample(metrics, "vllm_operator_router_discovery_synced", pool="short") == 1


async def test_slices_existing_before_start_are_listed(sim_api: SimApi,
                                                           discovery: kubernetes.client.DiscoveryV1Api,
                                                           short_engine: FakeVllm, long_engine: FakeVllm,
                                                           counter: TokenCounter) -> None:
    """Slices that exist before the router starts are picked up by the initial list."""
    await call(discovery.create_namespaced_endpoint_slice, NS,
               endpoint_slice("pre-short", "demo-short", port_of(short_engine)))
    config = router_config([], [long_engine.url], **{
        "pools.short.service": {"namespace": NS, "name": "demo-short", "port": 8000}})
    async with running_router(config, counter, kubeconfig=str(sim_api.kubeconfig)) as (_, metrics):
        await eventually(lambda: asyncio.sleep(0, sample(metrics, "vllm_operator_router_endpoints",
                                                         pool="short", state="healthy") == 1))


class FailFirst:
    """Fault hook: the first `lists` lists and `watches` watches of EndpointSlices answer 500."""

    def __init__(self, lists: int, watches: int) -> None:
        self.left = {"list": lists, "watch": watches}

    def __call__(self, record: Any) -> Any:
        from vllm_operator.sim.faults import Fault

        if record.resource == "endpointslices" and self.left.get(record.verb, 0) > 0:
            self.left[record.verb] -= 1
            return Fault(status=500)
        return None


async def test_discovery_recovers_from_api_errors(make_sim_api: Any, short_engine: FakeVllm, long_engine: FakeVllm,
                                                  counter: TokenCounter) -> None:
    faults = FailFirst(lists=2, watches=1)
    api = make_sim_api(faults=faults)
    with kubernetes.client.ApiClient(api.client_configuration()) as client:
        slices = kubernetes.client.DiscoveryV1Api(client)
        await call(slices.create_namespaced_endpoint_slice, NS,
                   endpoint_slice("s1", "demo-short", port_of(short_engine)))
        config = router_config([], [long_engine.url], **{
            "pools.short.service": {"namespace": NS, "name": "demo-short", "port": 8000}})
        async with running_router(config, counter, kubeconfig=str(api.kubeconfig)) as (_, metrics):
            await eventually(lambda: asyncio.sleep(0, sample(metrics, "vllm_operator_router_endpoints",
                                                             pool="short", state="healthy") == 1), timeout=20)
            # The watch failed once too; after the relist the router still follows changes.
            await eventually(lambda: asyncio.sleep(0, faults.left == {"list": 0, "watch": 0}), timeout=20)
            await call(slices.delete_namespaced_endpoint_slice, "s1", NS)
            await eventually(lambda: asyncio.sleep(0, sample(metrics, "vllm_operator_router_endpoints",
                                                             pool="short", state="healthy") == 0), timeout=20)
    failed = [r for r in api.request_log if r.resource == "endpointslices" and r.status == 500]
    assert len(failed) == 3


async def test_large_slices_are_read_from_the_watch(sim_api: SimApi, discovery: kubernetes.client.DiscoveryV1Api,
                                                    short_engine: FakeVllm, long_engine: FakeVllm,
                                                    counter: TokenCounter) -> None:
    """A watch event is one JSON line; a full slice (1000 endpoints, ~250 KB) must not break the stream."""
    config = router_config([], [long_engine.url], **{
        "pools.short.service": {"namespace": NS, "name": "demo-short", "port": 8000}})
    async with running_router(config, counter, kubeconfig=str(sim_api.kubeconfig)) as (_, metrics):
        await eventually(lambda: asyncio.sleep(0, sample(metrics, "vllm_operator_router_discovery_synced",
                                                         pool="short") == 1))
        big = endpoint_slice("big", "demo-short", port_of(short_engine))
        big["endpoints"] += [
            {"addresses": [f"10.{i // 250}.{i % 250}.1"], "conditions": {"ready": False},
             "targetRef": {"kind": "Pod", "namespace": NS, "name": f"demo-short-{'x' * 120}-{i}"}}
            for i in range(999)]
        await call(discovery.create_namespaced_endpoint_slice, NS, big)
        await eventually(lambda: asyncio.sleep(0, sample(metrics, "vllm_operator_router_endpoints",
                                                         pool="short", state="healthy") == 1))
