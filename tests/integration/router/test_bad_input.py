"""Bad requests get a specific OpenAI-style error, never a traceback or a hung connection, and never reach an engine."""

from __future__ import annotations

import asyncio
import json
import logging
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
    pytest.param(CHAT, b"[1, 2]", "application/json", 400, "must be a JSON object, got an array", None,
                 id="json-array"),
    pytest.param(CHAT, b"null", "application/json", 400, "must be a JSON object, got null", None, id="json-null"),
    pytest.param(CHAT, b'{"model": "fake-model", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                 "application/json", 400, "nests arrays and objects too deeply", None, id="nested-100000"),
    pytest.param(CHAT, rb'{"model": "fake-model", "messages": [{"role": "user", "content": "\\ud800 is \ud800x"}]}',
                 "application/json", 400, r"\ud800 at byte 77 is an unpaired UTF-16 surrogate", None,
                 id="lone-high-surrogate"),
    pytest.param(CHAT, rb'{"model": "fake-model", "messages": [{"role": "user", "content": "\udc00"}]}',
                 "application/json", 400, "invalid utf-16 surrogate pair", None, id="lone-low-surrogate"),
    pytest.param(CHAT, b'{"model": "fake-model", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
                 "application/json", 400, "Invalid UTF-8", None, id="utf8-encoded-surrogate"),
    pytest.param(CHAT, b'\xef\xbb\xbf{"model": "fake-model"}', "application/json", 400, "not valid JSON", None,
                 id="byte-order-mark"),
    pytest.param(CHAT, b'{"model": "fake-model", "max_tokens": NaN}', "application/json", 400, "not valid JSON",
                 None, id="nan-literal"),
    pytest.param(CHAT, b'{"model": "fake-model", "temperature": 1e400}', "application/json", 400,
                 "Number out of range", None, id="float-out-of-range"),
    pytest.param(CHAT, b'{"model": "fake-model", "max_tokens": ' + b"9" * 4301 + b"}", "application/json", 400,
                 "Integer value out of range", None, id="int-of-4301-digits"),
    pytest.param(CHAT, json.dumps({**OK_CHAT, "max_tokens": [0]}).encode().replace(b"[0]", b"[" + b"9" * 4300 + b"]"),
                 "application/json", 400, "max_tokens must be an integer, got [999", "max_tokens",
                 id="int-of-4300-digits-echoed-short"),
    pytest.param(CHAT, json.dumps({"model": "m" * 60000, "messages": []}).encode(), "application/json", 404,
                 "The model `'mmmm", "model", id="long-model-echoed-short"),
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
                         http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture, path: str, body: bytes,
                         content_type: str, status: int, message: str, param: str | None) -> None:
    """The error names the reason, the echo of a client's value stays short, and nothing is logged as an error."""
    big = len(body) > 65536 and status != 413
    config = router_config([short_engine.url], [long_engine.url], **({"maxBodyBytes": 1 << 20} if big else {}))
    async with running_router(config, counter) as (url, metrics), \
            http.post(url + path, data=body, headers={"Content-Type": content_type}) as response:
        assert response.status == status
        assert response.content_type == "application/json"
        error = (await response.json())["error"]
    assert message in error["message"]
    assert len(error["message"]) < 300
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
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


@pytest.mark.parametrize("field", ["messages", "tools", "stream_options"])
async def test_nesting_at_the_decoders_edge_is_a_400_not_a_500(
        short_engine: FakeVllm, long_engine: FakeVllm, counter: Any, http: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture, field: str) -> None:
    """Every depth around the interpreter's limit, where the decoder just gets through and a later step of the
    request (counting `tools` with json.dumps, re-encoding the body for the engine) is one stack frame deeper:
    a 400 or the engine's answer, never a 5xx or an ERROR line."""
    config = router_config([short_engine.url], [long_engine.url])
    statuses = set()
    async with running_router(config, counter) as (url, _):
        for depth in range(900, 1010, 2):
            nested = b"[" * depth + b"]" * depth
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            raw = json.dumps(body).encode()
            if field == "messages":
                raw = raw.replace(b'"hi"}', b'"hi", "tool_calls": ' + nested + b"}")
            else:
                raw = raw[:-1] + f', "{field}": '.encode() + nested + b"}"
            async with http.post(url + CHAT, data=raw, headers={"Content-Type": "application/json"}) as response:
                assert response.status < 500, (depth, await response.text())
                statuses.add(response.status)
                if response.status == 400 and "x-vllm-operator-pool" not in response.headers:  # the router's
                    assert "too deeply" in (await response.json())["error"]["message"]
    assert 400 in statuses
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
