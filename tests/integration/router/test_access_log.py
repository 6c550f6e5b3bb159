"""The router's access log: one INFO line per model request under the `vllm_operator.router.access` logger name, with
what the router decided (pool, tier, prompt count, max_tokens as sent and as forwarded, upstream, latency); none
when `accessLog` is false or the logger is not enabled for INFO; none for the probes and /metrics."""

from __future__ import annotations

import io
import logging
import re
from typing import Any

import aiohttp
import pytest

from fakevllm.engine import FakeVllm
from tests.support.router import MODEL, router_config, running_router, words
from vllm_operator.router.tokens import TokenCounter

CHAT = "/v1/chat/completions"
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO vllm_operator.router.access: "
                  r"(?P<method>\S+) (?P<path>\S+) (?P<status>\d+) pool=(?P<pool>\S+) tier=(?P<tier>\S+) "
                  r"prompt_tokens=(?P<tokens>\S+) count=(?P<count>\S+) requested_max_tokens=(?P<requested>\S+) "
                  r"max_tokens=(?P<sent>\S+) upstream=(?P<upstream>\S+) latency_ms=(?P<ms>\d+\.\d)$")


def access_lines(stream: io.StringIO) -> list[dict[str, str]]:
    out = []
    for line in stream.getvalue().splitlines():
        match = LINE.match(line)
        assert match, line
        out.append(match.groupdict())
    return out


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    async with http.post(url + CHAT, json=body) as response:
        await response.read()
        return response.status


async def test_one_line_per_request_with_the_decision(short_engine: FakeVllm, long_engine: FakeVllm,
                                                      counter: TokenCounter, http: aiohttp.ClientSession,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="vllm_operator.router.access")
    config = router_config([short_engine.url], [long_engine.url])
    stream = io.StringIO()
    async with running_router(config, counter, access_stream=stream) as (url, _):
        # clamped by the free tier's cap (32); short pool
        assert await post(http, url, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": 500}) == 200
        # no max_tokens: the tier default (16); a prompt past the threshold (50 words) goes to the long pool
        assert await post(http, url, {"model": MODEL, "messages": [{"role": "user", "content": words(80)}]}) == 200
        # refused before any pool: unknown model
        assert await post(http, url, {"model": "other", "messages": [{"role": "user", "content": "hi"}]}) == 404
        async with http.get(url + "/health") as response, http.get(url + "/metrics") as scraped:
            assert response.status == 200 and scraped.status == 200
    clamped, long, refused = access_lines(stream)
    assert {k: clamped[k] for k in ("method", "path", "status", "pool", "tier", "requested", "sent", "upstream")} == {
        "method": "POST", "path": CHAT, "status": "200", "pool": "short", "tier": "free", "requested": "500",
        "sent": "32", "upstream": short_engine.url}
    assert int(clamped["tokens"]) > 0 and clamped["count"] in ("bound", "exact")
    assert (long["pool"], long["requested"], long["sent"], long["upstream"]) == ("long", "-", "16", long_engine.url)
    assert int(long["tokens"]) >= 80
    assert (refused["status"], refused["pool"], refused["sent"], refused["upstream"]) == ("404", "none", "-", "-")


@pytest.mark.parametrize("off", ["config", "log-level"])
async def test_access_log_off(short_engine: FakeVllm, long_engine: FakeVllm, counter: TokenCounter,
                              http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture, off: str) -> None:
    caplog.set_level(logging.WARNING if off == "log-level" else logging.INFO, logger="vllm_operator.router.access")
    config = router_config([short_engine.url], [long_engine.url], accessLog=off != "config")
    stream = io.StringIO()
    async with running_router(config, counter, access_stream=stream) as (url, _):
        assert await post(http, url, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}) == 200
    assert stream.getvalue() == ""
