"""The router process freezes its start-up objects out of the garbage collector's scans (benchmarks/router: full
collections over them were the router's tail latency), says how many at start, and still serves afterwards."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import aiohttp

from fakevllm.engine import FakeVllm
from tests.integration.router.test_cli import router_process
from tests.support.net import free_port
from tests.support.router import MODEL, router_config, words, write_word_tokenizer

STARTED = re.compile(rb"Started router for .* \((\d+) start-up objects frozen out of GC scans\)")


async def test_router_freezes_startup_objects_and_serves(short_engine: FakeVllm, long_engine: FakeVllm,
                                                         tmp_path: Path, http: aiohttp.ClientSession) -> None:
    config = router_config([short_engine.url], [long_engine.url],
                           tokenizer={"path": str(write_word_tokenizer(tmp_path / "tok"))})
    config_file = tmp_path / "router.json"
    config_file.write_text(json.dumps(config.to_wire()))
    port = free_port()
    async with router_process(config_file, port) as proc:  # logs at INFO by default: the start line says the count
        assert proc.stderr is not None
        seen = b""
        async with asyncio.timeout(60):
            while (match := STARTED.search(seen)) is None:
                line = await proc.stderr.readline()
                assert line, f"router exited before starting: {seen.decode(errors='replace')}"
                seen += line
        # modules, pydantic models, aiohttp and the tokenizer wrapper: tens of thousands of objects
        assert int(match.group(1)) > 10_000, seen
        async with http.post(f"http://127.0.0.1:{port}/v1/completions",
                             json={"model": MODEL, "prompt": words(10)}) as response:
            assert response.status == 200
            assert response.headers["x-vllm-operator-pool"] == "short"
    assert proc.returncode == 0
