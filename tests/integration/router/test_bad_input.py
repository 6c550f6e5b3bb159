"""Bad requests get a specific OpenAI-style error, never a traceback or a hung connection, and never reach an engine."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fakevllm.engine import FakeVllm
from tests.support.router import MODEL, router_config, running_router, sample

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
OK_CHAT: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}

CASES = [
    pytest.param(CHAT, b"{not json", "application/json", 400, "not valid JSON", None, id="malformed-json"),
    pytest.param(CHAT, b"\xff\xfe", "application/json", 400, "not valid JSON", None, id="not-utf8"),
    pytest.param(CHAT, b"[1, 2]", "application/json", 400, "must be a JSON object, got list", None,
                 id="json-array"),
    pytest.param(CHAT, b"", "application/json", 400, "not valid JSON", None, id="empty-body"),
    pytest.param(CHAT, json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), "application/json",
                 400, "'model' is a required field", "model", id="missing-model"),
    pytest.param(CHAT, json.dumps({"model": MODEL}).encode(), "application/json", 400,
                 "'messages' is a required field", "messages", id="missing-messages"),
    pytest.param(COMPLETIONS, json.dumps({"model": MODEL}).encode(), "application/json", 400,
                 "'prompt' is a required field", "prompt", id="missing-prompt"),
    pytest.param(CHAT, json.dumps({**OK_CHAT, "max_tokens": "ten"}).encode(), "application/json", 400,
                 "max_tokens must be an integer, got 'ten'", "max_tokens", id="max-tokens-string"),
    pytest.param(CHAT, json.dumps({**OK_CHAT, "stream": "yes"}).encode(), "application/json", 400,
                 "'stream' must be a boolean", "stream", id="stream-not-bool"),
    pytest.param(CHAT, json.dumps(OK_CHAT).encode(), "text/plain", 415, "Content-Type must be application/json",
                 None, id="text-plain"),
    pytest.param(CHAT, json.dumps(OK_CHAT).encode(), "application/x-www-form-urlencoded", 415,
                 "Content-Type must be application/json", None, id="form"),
    pytest.param(CHAT, json.dumps({**OK_CHAT, "padding": "x" * 70000}).encode(), "application/json", 413,
                 "exceeds the limit of 65536 bytes", None, id="too-large"),
]


@pytest.mark.parametrize(("path", "body", "content_type", "status", "message", "param"), CASES)
async def test_bad_input(short_engine: FakeVllm, long_engine: FakeVllm, counter: Any,
                         http: aiohttp.ClientSession, path: str, body: bytes, content_type: str, status: int,
                         message: str, param: str | None) -> None:
    config = router_config([short_engine.url], [long_engine.url])
    async with running_router(config, counter) as (url, metrics), \
            http.post(url + path, data=body, headers={"Content-Type": content_type}) as response:
        assert response.status == status
        assert response.content_type == "application/json"
        error = (await response.json())["error"]
    assert message in error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert short_engine.requests() == [] and long_engine.requests() == []
    assert sample(metrics, "vllm_operator_router_requests_total", pool="none",
                  endpoint="chat" if path == CHAT else "completions", status=str(status)) == 1


async def test_too_large_chunked_body_is_413(short_engine: FakeVllm, long_engine: FakeVllm, counter: Any,
                                             http: aiohttp.ClientSession) -> None:
    """Without Content-Length the limit is enforced while reading."""

    async def chunks() -> Any:
        yield b'{"model": "fake-model", "padding": "'
        for _ in range(20):
            yield b"x" * 8192
        yield b'"}'

    config = router_config([short_engine.url], [long_engine.url])
    async with running_router(config, counter) as (url, _):
        headers = {"Content-Type": "application/json"}
        async with http.post(url + CHAT, data=chunks(), headers=headers) as response:
            assert response.status == 413
            assert "65536" in (await response.json())["error"]["message"]


async def test_truncated_body_does_not_hang_the_router(short_engine: FakeVllm, long_engine: FakeVllm,
                                                      counter: Any, http: aiohttp.ClientSession) -> None:
    """A client that promises more bytes than it sends and goes away: the router serves the next request."""
    config = router_config([short_engine.url], [long_engine.url])
    async with running_router(config, counter) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        _reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"model\"")
        await writer.drain()
        writer.close()
        async with http.post(url + CHAT, json=OK_CHAT) as response:
            assert response.status == 200


async def test_routes_outside_the_api_are_404(short_engine: FakeVllm, long_engine: FakeVllm, counter: Any,
                                              http: aiohttp.ClientSession, tmp_path: Path) -> None:
    config = router_config([short_engine.url], [long_engine.url])
    async with running_router(config, counter) as (url, _):
        async with http.get(url + "/v1/embeddings") as response:
            assert response.status == 404
        async with http.get(url + CHAT) as response:
            assert response.status == 405
