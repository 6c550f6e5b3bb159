"""Endpoints behind the router: least-outstanding choice, ejection on connect errors and 5xx, re-admission by the
/health poller, failover, 503 + Retry-After with nobody healthy, the short→long fallback, and /health itself."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from fakevllm.engine import FakeVllm
from tests.support.router import MODEL, router_config, running_router, sample, words
from tests.support.waiting import eventually
from vllm_operator.router.metrics import RouterMetrics
from vllm_operator.router.tokens import TokenCounter

CHAT = "/v1/chat/completions"


def chat(n_words: int = 5, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": words(n_words)}], **extra}


def closed_port_url() -> str:
    """A URL where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
async def second_short() -> AsyncIterator[FakeVllm]:
    async with FakeVllm(model=MODEL, max_model_len=200, natural_tokens=5) as fake:
        yield fake


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    async with http.post(url + CHAT, json=body) as response:
        return response.status, dict(response.headers), await response.json(content_type=None)


def healthy(metrics: RouterMetrics, pool: str) -> float:
    return sample(metrics, "vllm_operator_router_endpoints", pool=pool, state="healthy")


async def test_least_outstanding_spreads_concurrent_requests(short_engine: FakeVllm, second_short: FakeVllm,
                                                             long_engine: FakeVllm, counter: TokenCounter,
                                                             http: aiohttp.ClientSession) -> None:
    for engine in (short_engine, second_short):
        engine.configure(ttft_s=1.0)  # no request finishes while the 8 are being dispatched: the split is exact
    config = router_config([short_engine.url, second_short.url], [long_engine.url])
    async with running_router(config, counter) as (url, _):
        results = await asyncio.gather(*(post(http, url, chat()) for _ in range(8)))
    assert [r[0] for r in results] == [200] * 8
    assert len(short_engine.requests()) == 4 and len(second_short.requests()) == 4


async def test_connect_error_fails_over_and_ejects(short_engine: FakeVllm, long_engine: FakeVllm,
                                                   counter: TokenCounter, http: aiohttp.ClientSession) -> None:
    dead = closed_port_url()
    config = router_config([dead, short_engine.url], [long_engine.url], **{"health.intervalSeconds": 30})
    async with running_router(config, counter) as (url, metrics):
        await eventually(lambda: asyncio.sleep(0, healthy(metrics, "short") == 1))  # first poll ejects `dead`
        statuses = [(await post(http, url, chat()))[0] for _ in range(3)]
    assert statuses == [200, 200, 200]
    assert len(short_engine.requests()) == 3
    assert sample(metrics, "vllm_operator_router_ejections_total", pool="short", cause="health_check") == 1


async def test_connect_error_on_request_fails_over(short_engine: FakeVllm, long_engine: FakeVllm,
                                                   counter: TokenCounter, http: aiohttp.ClientSession) -> None:
    """An engine that dies between polls: the request goes to the other endpoint, the dead one is ejected."""
    async with FakeVllm(model=MODEL, max_model_len=200) as doomed:
        doomed_url = doomed.url
        config = router_config([doomed_url, short_engine.url], [long_engine.url], **{"health.intervalSeconds": 30})
        async with running_router(config, counter) as (url, metrics):
            await eventually(lambda: asyncio.sleep(0, sample(
                metrics, "vllm_operator_router_health_checks_total", pool="short", result="ok") == 2))
            await doomed.stop()
            statuses = [(await post(http, url, chat()))[0] for _ in range(4)]
            assert statuses == [200] * 4
            assert healthy(metrics, "short") == 1
    assert len(short_engine.requests()) == 4
    assert sample(metrics, "vllm_operator_router_upstream_errors_total", pool="short", kind="connect") == 1
    assert sample(metrics, "vllm_operator_router_failovers_total", pool="short") == 1
    assert sample(metrics, "vllm_operator_router_ejections_total", pool="short", cause="connect") == 1


async def test_5xx_ejects_fails_over_and_health_readmits(short_engine: FakeVllm, second_short: FakeVllm,
                                                         long_engine: FakeVllm, counter: TokenCounter,
                                                         http: aiohttp.ClientSession) -> None:
    config = router_config([short_engine.url, second_short.url], [long_engine.url])
    async with running_router(config, counter) as (url, metrics):
        for engine in (short_engine, second_short):
            engine.configure(fail_mode="status", fail_status=500, fail_count=1)
        # The first engine tried answers 500 → ejected → the other one answers 500 too → both ejected, the 500
        # is passed on. Then the poller (their /health is 200) re-admits both.
        status, _, body = await post(http, url, chat())
        assert status == 500 and "error" in body
        assert sample(metrics, "vllm_operator_router_ejections_total", pool="short", cause="status_5xx") == 2
        await eventually(lambda: asyncio.sleep(0, healthy(metrics, "short") == 2), timeout=10)
        status, _, _ = await post(http, url, chat())
        assert status == 200
        second_short.configure(fail_mode="status", fail_status=503, fail_count=1)
        # Ties rotate, so one of the next two requests meets the 503 and fails over to the other engine.
        results = [await post(http, url, chat()) for _ in range(2)]
        assert [r[0] for r in results] == [200, 200], "a 5xx before any byte reached the client fails over"
    assert sample(metrics, "vllm_operator_router_failovers_total", pool="short") == 2
    assert sample(metrics, "vllm_operator_router_readmissions_total", pool="short") >= 2


async def test_dead_engine_is_ejected_by_health_then_readmitted(short_engine: FakeVllm, second_short: FakeVllm,
                                                                long_engine: FakeVllm, counter: TokenCounter,
                                                                http: aiohttp.ClientSession) -> None:
    config = router_config([short_engine.url, second_short.url], [long_engine.url])
    async with running_router(config, counter) as (url, metrics):
        second_short.configure(engine_dead=True)
        await eventually(lambda: asyncio.sleep(0, healthy(metrics, "short") == 1))
        for _ in range(4):
            assert (await post(http, url, chat()))[0] == 200
        assert second_short.requests() == []
        second_short.configure(engine_dead=False)
        await eventually(lambda: asyncio.sleep(0, healthy(metrics, "short") == 2))
    assert len(short_engine.requests()) == 4


async def test_no_healthy_endpoint_is_503_with_retry_after(long_engine: FakeVllm, counter: TokenCounter,
                                                           http: aiohttp.ClientSession) -> None:
    config = router_config([closed_port_url()], [closed_port_url()])
    async with running_router(config, counter) as (url, metrics):
        await eventually(lambda: asyncio.sleep(0, healthy(metrics, "long") == 0 and healthy(metrics, "short") == 0
                                               and sample(metrics, "vllm_operator_router_ejections_total",
                                                          pool="long", cause="health_check") == 1))
        status, headers, body = await post(http, url, chat())
        assert status == 503
        assert headers["Retry-After"] == "1"
        assert body["error"]["code"] == "no_healthy_endpoint"
        assert "short pool" in body["error"]["message"]
        async with http.get(url + "/health") as response:
            assert response.status == 503
            state = await response.json()
        assert state["pools"]["short"] == {"enabled": True, "healthy": 0, "endpoints": 1}


async def test_short_requests_fall_back_to_long_pool(long_engine: FakeVllm, counter: TokenCounter,
                                                     http: aiohttp.ClientSession) -> None:
    config = router_config([closed_port_url()], [long_engine.url])
    async with running_router(config, counter) as (url, metrics):
        await eventually(lambda: asyncio.sleep(0, healthy(metrics, "short") == 0
                                               and sample(metrics, "vllm_operator_router_ejections_total",
                                                          pool="short", cause="health_check") == 1))
        status, headers, _ = await post(http, url, chat())
        assert status == 200
        assert headers["x-vllm-operator-pool"] == "long"
        async with http.get(url + "/health") as response:
            assert response.status == 200
    assert [r.body["max_tokens"] for r in long_engine.requests()] == [16]
    assert sample(metrics, "vllm_operator_router_pool_fallbacks_total") == 1


async def test_disabled_pool_gets_no_traffic(short_engine: FakeVllm, long_engine: FakeVllm, counter: TokenCounter,
                                             http: aiohttp.ClientSession) -> None:
    config = router_config([short_engine.url], [long_engine.url], **{"pools.short.enabled": False})
    async with running_router(config, counter) as (url, _):
        status, headers, _ = await post(http, url, chat())
        assert status == 200 and headers["x-vllm-operator-pool"] == "long"
    assert short_engine.requests() == []


async def test_prefix_pool_keeps_each_conversation_on_one_engine(short_engine: FakeVllm, long_engine: FakeVllm,
                                                                 counter: TokenCounter,
                                                                 http: aiohttp.ClientSession) -> None:
    """Through the whole router: a prefix pool sends every turn of a conversation to the engine that had its
    earlier turns, and spreads new conversations (least outstanding when nothing matches)."""
    import random

    async with FakeVllm(model=MODEL, max_model_len=1000, natural_tokens=5) as second_long:
        config = router_config([short_engine.url], [long_engine.url, second_long.url],
                               **{"pools.long.strategy": "prefix", "pools.long.prefix": {"blockTokens": 16}})
        rng = random.Random(3)
        vocab = ["hello", "world", "word"]
        convs = [[{"role": "user", "content": " ".join(rng.choice(vocab) for _ in range(60))}] for _ in range(6)]
        async with running_router(config, counter) as (url, metrics):
            for _turn in range(3):
                for conv in convs:
                    status, headers, body = await post(http, url, {"model": MODEL, "messages": conv})
                    assert status == 200 and headers["x-vllm-operator-pool"] == "long"
                    conv += [{"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                             {"role": "user", "content": " ".join(rng.choice(vocab) for _ in range(20))}]
            hits = sample(metrics, "vllm_operator_router_prefix_choices_total", pool="long", outcome="hit")
        first_words = {conv[0]["content"] for conv in convs}
        seen = {}
        for engine in (long_engine, second_long):
            for r in engine.requests(CHAT):
                seen.setdefault(r.body["messages"][0]["content"], set()).add(engine.url)
        assert set(seen) == first_words
        assert all(len(engines) == 1 for engines in seen.values())  # every turn where the first one went
        assert sorted(len([c for c in seen.values() if e.url in c]) for e in (long_engine, second_long)) == [3, 3]
        assert hits == 12  # turns 2 and 3 of six conversations
