"""The router through the official `openai` client (sync and async, streaming and not): happy paths, the caps that
reach the engine, the response headers, and the error shapes the client turns into exceptions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import openai
import pytest

from fakevllm.engine import FakeVllm, ThreadedFakeVllm, run_in_thread
from tests.support.router import MODEL, router_config, router_in_thread, running_router, sample, word_counter, words
from vllm_operator.router.metrics import RouterMetrics


@pytest.fixture
def engines() -> Iterator[tuple[ThreadedFakeVllm, ThreadedFakeVllm]]:
    with run_in_thread(model=MODEL, max_model_len=200, natural_tokens=5) as short, \
            run_in_thread(model=MODEL, max_model_len=1000, natural_tokens=5) as long:
        yield short, long


@pytest.fixture
def routed(engines: tuple[ThreadedFakeVllm, ThreadedFakeVllm], tmp_path: Path
           ) -> Iterator[tuple[openai.OpenAI, RouterMetrics]]:
    short, long = engines
    with router_in_thread(router_config([short.url], [long.url]), word_counter(tmp_path / "tok")) as (url, metrics):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=15), metrics


def test_sync_chat_short_prompt_gets_tier_default(engines: tuple[ThreadedFakeVllm, ThreadedFakeVllm],
                                                  routed: tuple[openai.OpenAI, RouterMetrics]) -> None:
    client, metrics = routed
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": words(10)}])
    completion = raw.parse()
    assert completion.choices[0].finish_reason == "stop"
    assert raw.headers["x-vllm-operator-pool"] == "short"
    assert raw.headers["x-vllm-operator-prompt-tokens"] == "10"
    assert raw.headers["x-vllm-operator-max-tokens"] == "16"
    (seen,) = engines[0].requests("/v1/chat/completions")
    assert seen.body["max_tokens"] == 16 and seen.prompt_tokens == 10
    assert engines[1].requests() == []
    assert sample(metrics, "vllm_operator_router_finished_total", pool="short", finished_reason="stop") == 1
    assert sample(metrics, "vllm_operator_router_requests_total", pool="short", endpoint="chat", status="200") == 1
    assert sample(metrics, "vllm_operator_router_completion_tokens_total", pool="short") == 5


def test_sync_chat_stream_over_cap_is_clamped(engines: tuple[ThreadedFakeVllm, ThreadedFakeVllm],
                                              routed: tuple[openai.OpenAI, RouterMetrics]) -> None:
    client, metrics = routed
    engines[0].configure(natural_tokens=100)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": words(10)}], max_tokens=500, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.count("tok") == 32
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks), "the usage chunk the router asked for must not reach the client"
    (seen,) = engines[0].requests()
    assert seen.body["max_tokens"] == 32 and seen.max_tokens == 32
    assert sample(metrics, "vllm_operator_router_clamps_total", pool="short", cap="tier") == 1
    assert sample(metrics, "vllm_operator_router_finished_total", pool="short", finished_reason="length") == 1
    assert sample(metrics, "vllm_operator_router_completion_tokens_total", pool="short") == 32


def test_sync_completions_long_prompt_goes_long(engines: tuple[ThreadedFakeVllm, ThreadedFakeVllm],
                                                routed: tuple[openai.OpenAI, RouterMetrics]) -> None:
    client, _ = routed
    raw = client.completions.with_raw_response.create(model=MODEL, prompt=words(120))
    assert raw.headers["x-vllm-operator-pool"] == "long"
    assert raw.parse().usage is not None and raw.parse().usage.prompt_tokens == 120
    (seen,) = engines[1].requests()
    assert seen.body["max_tokens"] == 16, "completions' own default (16) is replaced by the tier default"
    assert engines[0].requests() == []


def test_sync_prompt_over_long_limit_is_a_400_that_never_reaches_an_engine(
        engines: tuple[ThreadedFakeVllm, ThreadedFakeVllm], routed: tuple[openai.OpenAI, RouterMetrics]) -> None:
    client, metrics = routed
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": words(1200)}])
    error = caught.value
    assert error.response.headers["x-vllm-operator-prompt-tokens"] == "1200"
    assert error.response.headers["x-vllm-operator-prompt-tokens-method"] == "exact"
    assert error.status_code == 400
    assert error.code == "context_length_exceeded"
    assert error.param == "messages"
    assert "1200" in error.message and "1000" in error.message
    assert engines[0].requests() == [] and engines[1].requests() == []
    assert sample(metrics, "vllm_operator_router_refusals_total", reason="prompt_too_long") == 1


def test_sync_unknown_model_is_404(routed: tuple[openai.OpenAI, RouterMetrics]) -> None:
    client, _ = routed
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "model_not_found"


def test_sync_models_lists_the_served_model(routed: tuple[openai.OpenAI, RouterMetrics]) -> None:
    client, _ = routed
    assert [m.id for m in client.models.list()] == [MODEL]


async def test_async_chat_and_stream(short_engine: FakeVllm, long_engine: FakeVllm, tmp_path: Path) -> None:
    config = router_config([short_engine.url], [long_engine.url])
    async with running_router(config, word_counter(tmp_path / "tok")) as (url, metrics):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=15)
        reply = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": words(60)}], max_completion_tokens=30)
        assert reply.choices[0].finish_reason == "stop"
        (seen,) = long_engine.requests()
        assert seen.body["max_completion_tokens"] == 30 and "max_tokens" not in seen.body
        stream = await client.completions.create(model=MODEL, prompt=words(5), stream=True,
                                                 stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
        assert short_engine.requests()[0].body["max_tokens"] == 16
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(model=MODEL, prompt=words(10), max_tokens=0)
        assert caught.value.param == "max_tokens"
        await client.close()
    assert sample(metrics, "vllm_operator_router_finished_total", pool="short", finished_reason="stop") == 1
    assert sample(metrics, "vllm_operator_router_refusals_total", reason="invalid_max_tokens") == 1


async def test_async_reject_policy_refuses_over_cap(short_engine: FakeVllm, long_engine: FakeVllm,
                                                    tmp_path: Path) -> None:
    config = router_config([short_engine.url], [long_engine.url], overLimit="reject")
    async with running_router(config, word_counter(tmp_path / "tok")) as (url, metrics):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=15)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=33, stream=True)
        assert "33" in caught.value.message and "32" in caught.value.message
        assert caught.value.code == "max_tokens_over_cap"
        reply = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=32)
        assert reply.choices[0].message.content
        await client.close()
    assert [r.body["max_tokens"] for r in short_engine.requests()] == [32]
    assert sample(metrics, "vllm_operator_router_refusals_total", reason="tier_cap") == 1


async def test_api_keys_pick_the_tier(short_engine: FakeVllm, long_engine: FakeVllm, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "free").write_text("k-free\n")
    (keys / "pro").write_text("k-pro\n")
    config = router_config([short_engine.url], [long_engine.url], apiKeysDir=str(keys))
    async with running_router(config, word_counter(tmp_path / "tok")) as (url, _):
        pro = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k-pro", max_retries=0, timeout=15)
        free = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k-free", max_retries=0, timeout=15)
        wrong = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k-wrong", max_retries=0, timeout=15)
        await pro.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        await free.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.AuthenticationError) as caught:
            await wrong.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert caught.value.code == "invalid_api_key"
        for client in (pro, free, wrong):
            await client.close()
        # No key at all: the first tier (docs/architecture.md, max_tokens).
        async with aiohttp.ClientSession() as http, http.post(url + "/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}]}) as response:
            assert response.status == 200
    # pro's default 64 exceeds the short pool's 32, so it goes long; free's 16 (and anonymous) stays short.
    assert [r.body["max_tokens"] for r in long_engine.requests()] == [64]
    assert [r.body["max_tokens"] for r in short_engine.requests()] == [16, 16]
    for engine in (short_engine, long_engine):
        assert all("k-" not in str(r.headers.get("Authorization", "")) for r in engine.requests())


async def test_engine_errors_pass_through(short_engine: FakeVllm, long_engine: FakeVllm, tmp_path: Path) -> None:
    """An engine's own 400 (here: it counts the prompt longer than the router did) reaches the client as is."""
    short_engine.configure(max_model_len=8)
    config = router_config([short_engine.url], [long_engine.url])
    async with running_router(config, word_counter(tmp_path / "tok")) as (url, metrics):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=15)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": words(10)}])
        assert "maximum context length is 8" in caught.value.message
        await client.close()
    assert sample(metrics, "vllm_operator_router_requests_total", pool="short", endpoint="chat", status="400") == 1
