"""A request for a pool at zero replicas: held while the pool wakes, exported as held requests (KEDA's activation
signal), answered once an engine is healthy, and 503 + Retry-After once the pool's wake budget is spent.

The sleeping pool is a static endpoint where nothing listens yet: the /health poller ejects it (the router's view of
a pool with no ready replica), and a fake vLLM started on that port later is the engine that woke.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp

from fakevllm.engine import FakeVllm
from tests.support.router import MODEL, router_config, running_router, sample, words
from tests.support.waiting import eventually
from vllm_operator import constants
from vllm_operator.router.metrics import RouterMetrics
from vllm_operator.router.tokens import TokenCounter

CHAT = "/v1/chat/completions"
LONG_PROMPT = 80  # words: above the threshold (50), so the long pool


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def held(metrics: RouterMetrics) -> float:
    return sample(metrics, constants.METRIC_ROUTER_HELD, pool="long")


def ejected(metrics: RouterMetrics) -> float:
    return sample(metrics, "vllm_operator_router_endpoints", pool="long", state="ejected")


async def post(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, str], Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": words(LONG_PROMPT)}]}
    async with http.post(url + CHAT, json=body) as response:
        return response.status, dict(response.headers), await response.json(content_type=None)


async def test_held_request_is_answered_when_the_pool_wakes(short_engine: FakeVllm, counter: TokenCounter,
                                                           http: aiohttp.ClientSession) -> None:
    port = free_port()
    config = router_config([short_engine.url], [f"http://127.0.0.1:{port}"], **{"pools.long.wakeSeconds": 15.0})
    async with running_router(config, counter) as (url, metrics):
        await eventually(lambda: asyncio.sleep(0, ejected(metrics) == 1))
        request = asyncio.create_task(post(http, url))
        await eventually(lambda: asyncio.sleep(0, held(metrics) == 1))
        async with FakeVllm(model=MODEL, max_model_len=1000, natural_tokens=5, port=port) as woken:
            status, headers, body = await asyncio.wait_for(request, 15)
            assert status == 200, body
            assert headers["x-vllm-operator-pool"] == "long" and len(woken.requests()) == 1
        assert held(metrics) == 0
        assert sample(metrics, "vllm_operator_router_requests_total", pool="long", endpoint="chat",
                      status="200") == 1


async def test_past_the_budget_it_is_503_with_retry_after(short_engine: FakeVllm, counter: TokenCounter,
                                                          http: aiohttp.ClientSession) -> None:
    config = router_config([short_engine.url], [f"http://127.0.0.1:{free_port()}"],
                           **{"pools.long.wakeSeconds": 1.0})
    async with running_router(config, counter) as (url, metrics):
        await eventually(lambda: asyncio.sleep(0, ejected(metrics) == 1))
        status, headers, body = await post(http, url)
        assert status == 503 and headers["Retry-After"] == "30", (status, headers)
        assert body["error"]["code"] == "pool_waking" and "waking from zero replicas" in body["error"]["message"]
        assert held(metrics) == 0


async def test_without_a_wake_budget_nothing_is_held(short_engine: FakeVllm, counter: TokenCounter,
                                                     http: aiohttp.ClientSession) -> None:
    config = router_config([short_engine.url], [f"http://127.0.0.1:{free_port()}"])
    async with running_router(config, counter) as (url, metrics):
        await eventually(lambda: asyncio.sleep(0, ejected(metrics) == 1))
        status, _, body = await post(http, url)
        assert status == 503 and body["error"]["code"] == "no_healthy_endpoint"
        assert held(metrics) == 0


async def test_a_paused_deployment_answers_503_and_is_not_ready(counter: TokenCounter) -> None:
    """Both pools at replicas 0 with no autoscaling (no wake budget, no endpoint): what the README and the plan's
    warning say — /health (the router's readiness probe) is 503, so its Service has no ready endpoint, and a request
    that reaches the router anyway is a 503 `no_healthy_endpoint` with Retry-After, at once (nothing is held)."""
    config = router_config([], [])
    assert config.pools.short.wake_seconds is None and config.pools.long.wake_seconds is None
    async with running_router(config, counter) as (url, metrics), aiohttp.ClientSession() as http:
        async with http.get(url + "/health") as response:
            assert response.status == 503
            assert (await response.json())["pools"]["short"] == {"enabled": True, "healthy": 0, "endpoints": 0}
        for path, body in ((CHAT, {"messages": [{"role": "user", "content": words(5)}]}),
                           (CHAT, {"messages": [{"role": "user", "content": words(LONG_PROMPT)}]}),
                           ("/v1/completions", {"prompt": words(5)})):
            async with http.post(url + path, json={"model": MODEL, **body}) as response:
                assert response.status == 503
                assert response.headers["Retry-After"] == "1"
                error = (await response.json())["error"]
            assert error["code"] == "no_healthy_endpoint"
            assert error["message"].startswith("No healthy endpoint in the ")
        assert held(metrics) == 0
