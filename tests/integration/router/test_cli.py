"""`vllm-operator router --config FILE` as a process: serves with a config file, refuses bad configs and unreadable
tokenizer sources at start (exit 2, message naming the problem), downloads tokenizer.json from a Hugging Face
endpoint (a local server standing in for huggingface.co via HF_ENDPOINT), and says when it has no tokenizer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from fakevllm.engine import FakeVllm
from tests.support.net import free_port
from tests.support.router import MODEL, router_config, words, write_word_tokenizer
from tests.support.waiting import eventually


@contextlib.asynccontextmanager
async def router_process(config_file: Path, port: int, env: dict[str, str] | None = None,
                         extra: tuple[str, ...] = ()) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vllm_operator.cli", "router", "--config", str(config_file), "--port", str(port),
        "--host", "127.0.0.1", *extra, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})})
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 15)


async def ready(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url + "/health") as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def metric_value(http: aiohttp.ClientSession, url: str, line_start: str) -> str:
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    (line,) = [x for x in text.splitlines() if x.startswith(line_start)]
    return line.rsplit(" ", 1)[1]


async def test_serves_from_a_config_file_and_stops_on_sigterm(short_engine: FakeVllm, long_engine: FakeVllm,
                                                             tmp_path: Path, http: aiohttp.ClientSession) -> None:
    config = router_config([short_engine.url], [long_engine.url],
                           tokenizer={"path": str(write_word_tokenizer(tmp_path / "tok"))})
    config_file = tmp_path / "router.json"
    config_file.write_text(json.dumps(config.to_wire()))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with router_process(config_file, port) as proc:
        await eventually(lambda: ready(http, url), timeout=30)
        async with http.post(url + "/v1/completions", json={"model": MODEL, "prompt": words(60)}) as response:
            assert response.status == 200
            assert response.headers["x-vllm-operator-pool"] == "long"
            assert response.headers["x-vllm-operator-prompt-tokens"] == "60"
        assert await metric_value(http, url, "vllm_operator_router_tokenizer_missing ") == "0.0"
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        assert proc.stderr is not None
        log = (await proc.stderr.read()).decode()
    (line,) = [x for x in log.splitlines() if " INFO vllm_operator.router.access: " in x]
    assert line.split(": ", 1)[1].startswith("POST /v1/completions 200 pool=long tier=free prompt_tokens=60 ")


async def test_no_access_log_flag(short_engine: FakeVllm, long_engine: FakeVllm, tmp_path: Path,
                                  http: aiohttp.ClientSession) -> None:
    config_file = tmp_path / "router.json"
    config_file.write_text(json.dumps(router_config([short_engine.url], [long_engine.url]).to_wire()))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with router_process(config_file, port, extra=("--no-access-log",)) as proc:
        await eventually(lambda: ready(http, url), timeout=30)
        async with http.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi"}) as response:
            assert response.status == 200
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        assert proc.stderr is not None
        log = (await proc.stderr.read()).decode()
    assert "Started router" in log and "vllm_operator.router.access" not in log


async def test_without_tokenizer_estimates_and_says_so(short_engine: FakeVllm, long_engine: FakeVllm,
                                                       tmp_path: Path, http: aiohttp.ClientSession) -> None:
    config_file = tmp_path / "router.json"
    config_file.write_text(json.dumps(router_config([short_engine.url], [long_engine.url]).to_wire()))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with router_process(config_file, port):
        await eventually(lambda: ready(http, url), timeout=30)
        async with http.post(url + "/v1/completions", json={"model": MODEL, "prompt": words(20)}) as response:
            assert response.status == 200
            # 20 words = 99 bytes: the byte bound (100) says long, though the engine counts 20.
            assert response.headers["x-vllm-operator-prompt-tokens-method"] == "no-tokenizer"
            assert response.headers["x-vllm-operator-pool"] == "long"
        assert await metric_value(http, url, "vllm_operator_router_tokenizer_missing ") == "1.0"
        assert await metric_value(
            http, url, 'vllm_operator_router_prompt_counts_total{method="no-tokenizer"}') == "1.0"


@pytest.fixture
async def hf_hub(tmp_path: Path) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A local stand-in for huggingface.co's `/<repo>/resolve/<revision>/<file>` downloads; records requests."""
    files = write_word_tokenizer(tmp_path / "hub")
    seen: list[dict[str, Any]] = []

    async def resolve(request: web.Request) -> web.StreamResponse:
        seen.append({"path": request.path, "auth": request.headers.get("Authorization")})
        if request.match_info["repo"] != "acme/tiny" or request.match_info["rev"] != "v1":
            return web.Response(status=404)
        path = files / request.match_info["file"]
        return web.FileResponse(path) if path.is_file() else web.Response(status=404)

    app = web.Application()
    app.router.add_get("/{repo:[^/]+/[^/]+}/resolve/{rev}/{file}", resolve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", seen
    await runner.cleanup()


async def test_downloads_the_tokenizer_from_the_hub(short_engine: FakeVllm, long_engine: FakeVllm, tmp_path: Path,
                                                    http: aiohttp.ClientSession,
                                                    hf_hub: tuple[str, list[dict[str, Any]]]) -> None:
    endpoint, seen = hf_hub
    token_file = tmp_path / "hf-token"
    token_file.write_text("hf_secret\n")
    config = router_config([short_engine.url], [long_engine.url], tokenizer={
        "hfRepo": "acme/tiny", "hfRevision": "v1", "hfTokenFile": str(token_file)})
    config_file = tmp_path / "router.json"
    config_file.write_text(json.dumps(config.to_wire()))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with router_process(config_file, port, env={"HF_ENDPOINT": endpoint}):
        await eventually(lambda: ready(http, url), timeout=30)
        async with http.post(url + "/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": words(20)}]}) as response:
            assert response.status == 200
            assert response.headers["x-vllm-operator-prompt-tokens"] == "20"
            assert response.headers["x-vllm-operator-pool"] == "short"
    assert {s["path"] for s in seen} == {"/acme/tiny/resolve/v1/tokenizer.json",
                                         "/acme/tiny/resolve/v1/tokenizer_config.json"}
    assert all(s["auth"] == "Bearer hf_secret" for s in seen)


@pytest.mark.parametrize(("mutate", "message"), [
    pytest.param(lambda w: w.pop("model"), "model: Field required", id="missing-model"),
    pytest.param(lambda w: w.update(maxBodyBytes=10), "maxBodyBytes", id="body-limit-too-small"),
    pytest.param(lambda w: w.update(tokenizer={"path": "/nonexistent"}), "/nonexistent", id="tokenizer-path"),
    pytest.param(lambda w: w.update(tokenizer={"hfRepo": "acme/missing"}), "acme/missing", id="tokenizer-repo"),
    pytest.param(lambda w: w["pools"]["long"].update(endpoints=["https://engine:8000"]),
                 "pools.long.endpoints: engine endpoint 'https://engine:8000' must be http://host:port",
                 id="https-endpoint"),
    pytest.param(None, "cannot read router config", id="no-file"),
])
async def test_bad_start_exits_2_naming_the_problem(tmp_path: Path, hf_hub: tuple[str, list[dict[str, Any]]],
                                                    mutate: Any, message: str) -> None:
    config_file = tmp_path / "router.json"
    if mutate is not None:
        wire = router_config(["http://127.0.0.1:1"], ["http://127.0.0.1:1"]).to_wire()
        mutate(wire)
        config_file.write_text(json.dumps(wire))
    async with router_process(config_file, free_port(), env={"HF_ENDPOINT": hf_hub[0]}) as proc:
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert message in err.decode()
    assert "Traceback" not in err.decode()


async def test_busy_port_exits_2_with_one_line_naming_the_port(tmp_path: Path) -> None:
    config_file = tmp_path / "router.json"
    config_file.write_text(json.dumps(router_config(["http://127.0.0.1:1"], ["http://127.0.0.1:1"]).to_wire()))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        async with router_process(config_file, port) as proc:
            _, err = await asyncio.wait_for(proc.communicate(), 60)
    text = err.decode()
    assert proc.returncode == 2, text[-2000:]
    assert "Traceback" not in text and "Errno" not in text, text[-2000:]
    (line,) = [x for x in text.splitlines() if x.startswith("vllm-operator router: ")]
    assert f"cannot listen on 127.0.0.1:{port}: the port is already in use" in line
