"""Timeouts towards engines (connect, first byte, idle, total → 504 OpenAI-style) and cancellation: a client that
goes away makes the router close the engine connection, so the engine stops generating.

Durations: timeouts are set well below the engine delays (0.3-0.5 s against 3-30 s) so a slow CI machine cannot
turn a pass into a failure or the other way round; only lower bounds on elapsed time are asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from fakevllm.engine import FakeVllm
from tests.support.router import MODEL, router_config, running_router, sample, words
from tests.support.waiting import eventually
from vllm_operator.router.tokens import TokenCounter

CHAT = "/v1/chat/completions"


def chat(stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": words(5)}], "stream": stream, **extra}


@pytest.fixture
def unaccepting_url() -> Iterator[str]:
    """A listener whose accept queue is full: a TCP connect to it hangs (SYNs are dropped)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port))
    yield f"http://127.0.0.1:{port}"
    filler.close()
    listener.close()


async def test_connect_timeout_is_504(unaccepting_url: str, long_engine: FakeVllm, counter: TokenCounter,
                                      http: aiohttp.ClientSession) -> None:
    config = router_config([unaccepting_url], [long_engine.url], **{
        "timeouts.connectSeconds": 0.3, "health.intervalSeconds": 60, "health.timeoutSeconds": 30})
    async with running_router(config, counter) as (url, metrics):
        began = time.monotonic()
        async with http.post(url + CHAT, json=chat()) as response:
            assert response.status == 504
            error = (await response.json())["error"]
        assert time.monotonic() - began >= 0.3
    assert "connect timeout of 0.3 s" in error["message"]
    assert error["code"] == "upstream_timeout"
    assert sample(metrics, "vllm_operator_router_upstream_errors_total", pool="short", kind="timeout_connect") == 1
    assert sample(metrics, "vllm_operator_router_ejections_total", pool="short", cause="connect") == 1


async def test_first_byte_timeout_streaming_is_504(short_engine: FakeVllm, long_engine: FakeVllm,
                                                   counter: TokenCounter, http: aiohttp.ClientSession) -> None:
    short_engine.configure(ttft_s=30)
    config = router_config([short_engine.url], [long_engine.url], **{"timeouts.firstByteSeconds": 0.4})
    async with running_router(config, counter) as (url, metrics):
        async with http.post(url + CHAT, json=chat(stream=True)) as response:
            assert response.status == 504
            error = (await response.json())["error"]
        assert "first-byte timeout of 0.4 s" in error["message"]
        await eventually(lambda: asyncio.sleep(0, short_engine.requests()[0].outcome == "disconnected"))
    assert sample(metrics, "vllm_operator_router_upstream_errors_total", pool="short",
                  kind="timeout_first_byte") == 1


async def test_non_streaming_waits_past_first_byte_until_total(short_engine: FakeVllm, long_engine: FakeVllm,
                                                               counter: TokenCounter,
                                                               http: aiohttp.ClientSession) -> None:
    """vLLM answers a non-streamed request only at the end, so first-byte does not apply; total does."""
    short_engine.configure(ttft_s=0.8)
    config = router_config([short_engine.url], [long_engine.url], **{"timeouts.firstByteSeconds": 0.2})
    async with running_router(config, counter) as (url, _), http.post(url + CHAT, json=chat()) as response:
        assert response.status == 200
    short_engine.configure(ttft_s=30)
    config = router_config([short_engine.url], [long_engine.url], **{"timeouts.totalSeconds": 0.5})
    async with running_router(config, counter) as (url, metrics), http.post(url + CHAT, json=chat()) as response:
        assert response.status == 504
        assert "total timeout of 0.5 s" in (await response.json())["error"]["message"]
    assert sample(metrics, "vllm_operator_router_upstream_errors_total", pool="short", kind="timeout_total") == 1


async def test_idle_timeout_ends_the_stream_with_an_error_event(short_engine: FakeVllm, long_engine: FakeVllm,
                                                                counter: TokenCounter,
                                                                http: aiohttp.ClientSession) -> None:
    short_engine.configure(natural_tokens=10, chunk_delay_s=5)
    config = router_config([short_engine.url], [long_engine.url], **{"timeouts.idleSeconds": 0.4})
    async with running_router(config, counter) as (url, metrics):
        async with http.post(url + CHAT, json=chat(stream=True)) as response:
            assert response.status == 200
            text = (await response.read()).decode()
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        assert events[-1]["error"]["code"] == "upstream_timeout"
        assert "idle timeout of 0.4 s" in events[-1]["error"]["message"]
        assert any(e.get("choices") for e in events[:-1]), "the chunks before the gap were relayed"
        await eventually(lambda: asyncio.sleep(0, short_engine.requests()[0].outcome == "disconnected"))
    assert sample(metrics, "vllm_operator_router_finished_total", pool="short", finished_reason="error") == 1
    assert sample(metrics, "vllm_operator_router_upstream_errors_total", pool="short", kind="timeout_idle") == 1


async def test_client_disconnect_mid_stream_cancels_the_engine_request(
        short_engine: FakeVllm, long_engine: FakeVllm, counter: TokenCounter) -> None:
    short_engine.configure(natural_tokens=1000, chunk_delay_s=0.2)  # 32 tokens take 6 s: the client leaves first
    config = router_config([short_engine.url], [long_engine.url])
    async with running_router(config, counter) as (url, metrics):
        async with aiohttp.ClientSession() as session:
            response = await session.post(url + CHAT, json=chat(stream=True, max_tokens=32))
            assert response.status == 200
            await response.content.readline()
            response.close()  # the client goes away mid-stream
        record = await eventually(lambda: asyncio.sleep(0, short_engine.requests()[0]))
        await eventually(lambda: asyncio.sleep(0, record.outcome == "disconnected"))
        assert record.completion_tokens < 32
        await eventually(lambda: asyncio.sleep(0, sample(
            metrics, "vllm_operator_router_finished_total", pool="short", finished_reason="abort") == 1))
    assert sample(metrics, "vllm_operator_router_in_flight_requests", pool="short") == 0


async def test_client_disconnect_while_waiting_cancels_the_engine_request(
        short_engine: FakeVllm, long_engine: FakeVllm, counter: TokenCounter) -> None:
    short_engine.configure(ttft_s=30)
    config = router_config([short_engine.url], [long_engine.url])
    async with running_router(config, counter) as (url, metrics):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as session:
            with pytest.raises(TimeoutError):
                await session.post(url + CHAT, json=chat())
        await eventually(lambda: asyncio.sleep(0, short_engine.requests()
                                               and short_engine.requests()[0].outcome == "disconnected"))
        await eventually(lambda: asyncio.sleep(0, sample(
            metrics, "vllm_operator_router_client_disconnects_total", pool="short") == 1))
    assert sample(metrics, "vllm_operator_router_requests_total", pool="short", endpoint="chat", status="499") == 1


async def test_engine_dropping_mid_stream_counts_as_error(short_engine: FakeVllm, long_engine: FakeVllm,
                                                          counter: TokenCounter, http: aiohttp.ClientSession) -> None:
    short_engine.configure(natural_tokens=10, fail_mode="drop_mid_stream", fail_after_chunks=3, fail_count=1)
    config = router_config([short_engine.url], [long_engine.url])
    async with running_router(config, counter) as (url, metrics), \
            http.post(url + CHAT, json=chat(stream=True)) as response:
        assert response.status == 200
        text = (await response.read()).decode()
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    assert events[-1]["error"]["code"] == "upstream_disconnected"
    assert "[DONE]" not in text
    assert sample(metrics, "vllm_operator_router_finished_total", pool="short", finished_reason="error") == 1
    assert sample(metrics, "vllm_operator_router_upstream_errors_total", pool="short", kind="disconnected") == 1


async def test_engine_dropping_before_answering_fails_over(short_engine: FakeVllm, long_engine: FakeVllm,
                                                           counter: TokenCounter,
                                                           http: aiohttp.ClientSession) -> None:
    async with FakeVllm(model=MODEL, max_model_len=200, fail_mode="drop") as dropper:
        config = router_config([dropper.url, short_engine.url], [long_engine.url],
                               **{"health.intervalSeconds": 60})
        async with running_router(config, counter) as (url, metrics):
            statuses = []
            for _ in range(2):
                async with http.post(url + CHAT, json=chat()) as response:
                    statuses.append(response.status)
    assert statuses == [200, 200]
    assert len(short_engine.requests()) == 2
    assert sample(metrics, "vllm_operator_router_failovers_total", pool="short") == 1


_ANSWERED = (
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"},'
    b'"finish_reason":"length"}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[],'
    b'"usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8}}\n\n'
    b"data: [DONE]\n\n")


@contextlib.asynccontextmanager
async def engine_holding_the_last_chunk(closed: asyncio.Event) -> AsyncIterator[str]:
    """A short-pool engine that streams `_ANSWERED` (through `data: [DONE]`) and then holds the stream's last chunk
    back until the router closes the connection (sets `closed`), as vLLM may between [DONE] and its zero chunk."""
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        while head.startswith(b"GET /health "):  # the router's health polls
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                head = await reader.readuntil(b"\r\n\r\n")
                continue
            return
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                     + f"{len(_ANSWERED):x}\r\n".encode() + _ANSWERED + b"\r\n")
        await writer.drain()
        await reader.read()
        closed.set()
        writer.close()

    server = await asyncio.start_server(engine, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def _stream_until_done(url: str) -> asyncio.StreamWriter:
    """POST a streaming chat to the router and read until `data: [DONE]`; the connection stays open."""
    host, router_port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(router_port))
    body = json.dumps(chat(stream=True, max_tokens=1)).encode()
    writer.write(f"POST {CHAT} HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    received = b""
    while b"data: [DONE]" not in received:
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        assert chunk, received
        received += chunk
    return writer


async def test_client_closing_right_after_done_is_served_not_aborted(long_engine: FakeVllm,
                                                                     counter: TokenCounter) -> None:
    """A client that closes as soon as it has read `data: [DONE]` (the OpenAI clients do) while the engine has not
    yet sent the stream's last chunk cancels the router's handler; the request was answered whole, so it counts as
    200 with its finish reason, not as a 499 client abort (issue 28: 5 of 24 long streams were false 499s)."""
    closed = asyncio.Event()
    async with (engine_holding_the_last_chunk(closed) as engine_url,
                running_router(router_config([engine_url], [long_engine.url]), counter) as (url, metrics)):
        writer = await _stream_until_done(url)
        writer.close()  # the client leaves right after [DONE]; the engine's stream has not ended yet
        await asyncio.wait_for(closed.wait(), 10)  # the router dropped the handler (and the engine connection)
        await eventually(lambda: asyncio.sleep(0, sample(
            metrics, "vllm_operator_router_requests_total", pool="short", endpoint="chat", status="200") == 1))
        assert sample(metrics, "vllm_operator_router_requests_total", pool="short", endpoint="chat",
                      status="499") == 0
        assert sample(metrics, "vllm_operator_router_client_disconnects_total", pool="short") == 0
        assert sample(metrics, "vllm_operator_router_finished_total", pool="short", finished_reason="length") == 1
        assert sample(metrics, "vllm_operator_router_finished_total", pool="short", finished_reason="abort") == 0
        assert sample(metrics, "vllm_operator_router_completion_tokens_total", pool="short") == 1


async def test_finish_is_counted_before_the_client_reads_done(long_engine: FakeVllm, counter: TokenCounter) -> None:
    """A client that has read `data: [DONE]` and looks at the router's metrics at once finds its request's finish
    reason and tokens counted, although the engine's stream has not ended (CI saw the `openai` client's stream end
    and finished_total still 0: the router counted only at the engine's end of stream)."""
    closed = asyncio.Event()
    async with (engine_holding_the_last_chunk(closed) as engine_url,
                running_router(router_config([engine_url], [long_engine.url]), counter) as (url, metrics)):
        writer = await _stream_until_done(url)
        assert sample(metrics, "vllm_operator_router_finished_total", pool="short", finished_reason="length") == 1
        assert sample(metrics, "vllm_operator_router_completion_tokens_total", pool="short") == 1
        assert not closed.is_set()
        writer.close()
        await asyncio.wait_for(closed.wait(), 10)
        assert sample(metrics, "vllm_operator_router_finished_total", pool="short", finished_reason="length") == 1
        assert sample(metrics, "vllm_operator_router_finished_total", pool="short", finished_reason="abort") == 0
