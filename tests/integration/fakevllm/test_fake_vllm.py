"""The fake vLLM server against real clients: the official `openai` client (sync and async, streaming and not),
aiohttp, and prometheus_client's text parser for /metrics.

Other tiers trust this server to speak vLLM, so its shapes, length rules, failure modes and metrics are pinned here.
Timing assertions are lower bounds only (a busy 2-core CI machine may be slower, never faster).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fakevllm.engine import Behaviour, FakeVllm, ThreadedFakeVllm, run_in_thread

MODEL = "fake-model"


def sample(text: str, name: str, **labels: str) -> float:
    """Value of one series in a /metrics text (prometheus_client's parser drops `_total` from counter families)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no sample {name}{labels} in /metrics")


@pytest.fixture
def threaded() -> Iterator[ThreadedFakeVllm]:
    with run_in_thread(natural_tokens=5) as fake:
        yield fake


@pytest.fixture
def client(threaded: ThreadedFakeVllm) -> openai.OpenAI:
    return openai.OpenAI(base_url=threaded.url + "/v1", api_key="unused", max_retries=0, timeout=10)


@pytest.fixture
async def fake() -> AsyncIterator[FakeVllm]:
    async with FakeVllm(Behaviour(natural_tokens=5)) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def metrics_text(http: aiohttp.ClientSession, fake: FakeVllm) -> str:
    async with http.get(fake.url + "/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


# ------------------------------------------------------------------ OpenAI shapes, official client


def test_chat_non_streaming_stops_at_natural_length(client: openai.OpenAI, threaded: ThreadedFakeVllm) -> None:
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "three little words"}], max_tokens=100
    )
    assert resp.object == "chat.completion"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == " tok" * 5
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens) == (3, 5, 8)


def test_chat_max_tokens_ends_with_length(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=3)
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == 3


def test_chat_max_completion_tokens_wins_over_max_tokens(client: openai.OpenAI, threaded: ThreadedFakeVllm) -> None:
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_completion_tokens=2, max_tokens=4
    )
    assert resp.usage is not None and resp.usage.completion_tokens == 2
    assert threaded.requests()[-1].max_tokens == 2


def test_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "a b c d"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert content == [" tok"] * 4
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (4, 4)
    assert len({c.id for c in chunks}) == 1


def test_completions_default_max_tokens_is_16(client: openai.OpenAI, threaded: ThreadedFakeVllm) -> None:
    threaded.configure(natural_tokens=100)
    resp = client.completions.create(model=MODEL, prompt="hello world")
    assert resp.object == "text_completion"
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == 16
    assert threaded.requests("/v1/completions")[-1].max_tokens == 16


async def test_async_client_streams_completions(fake: FakeVllm) -> None:
    client = openai.AsyncOpenAI(base_url=fake.url + "/v1", api_key="unused", max_retries=0, timeout=10)
    stream = await client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=7, stream=True)
    texts, reasons = [], []
    async for chunk in stream:
        texts.append(chunk.choices[0].text)
        reasons.append(chunk.choices[0].finish_reason)
    assert texts == [" tok"] * 5
    assert reasons[-1] == "stop"
    assert fake.requests()[-1].prompt_tokens == 3
    await client.close()


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].owned_by == "vllm"


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    assert "The model `other` does not exist." in str(err.value)


# ------------------------------------------------------------------ length rules as vLLM applies them


@pytest.mark.parametrize(
    ("max_model_len", "prompt_words", "max_tokens", "ignore_eos", "want_tokens", "want_reason"),
    [
        pytest.param(64, 10, 5, True, 5, "length", id="ignore-eos-exact"),
        pytest.param(64, 10, 50, False, 5, "stop", id="natural-stop-before-max"),
        pytest.param(64, 60, 30, True, 4, "length", id="clamped-to-context"),
        pytest.param(64, 63, None, True, 1, "length", id="one-token-room"),
    ],
)
def test_length_rules(
    threaded: ThreadedFakeVllm,
    client: openai.OpenAI,
    max_model_len: int,
    prompt_words: int,
    max_tokens: int | None,
    ignore_eos: bool,
    want_tokens: int,
    want_reason: str,
) -> None:
    threaded.configure(max_model_len=max_model_len)
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": " ".join(["w"] * prompt_words)}],
        max_tokens=max_tokens,
        extra_body={"ignore_eos": ignore_eos},
    )
    assert resp.usage is not None and resp.usage.completion_tokens == want_tokens
    assert resp.choices[0].finish_reason == want_reason


def test_prompt_at_context_limit_is_400_naming_numbers(client: openai.OpenAI, threaded: ThreadedFakeVllm) -> None:
    threaded.configure(max_model_len=32)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=" ".join(["w"] * 40), max_tokens=1)
    assert err.value.status_code == 400
    body: Any = err.value.body
    assert body["type"] == "BadRequestError" and body["code"] == 400
    assert "maximum context length is 32 tokens" in body["message"] and "contains 40 input tokens" in body["message"]
    assert threaded.requests()[-1].outcome == "rejected:400"


def test_max_tokens_over_context_is_400(client: openai.OpenAI, threaded: ThreadedFakeVllm) -> None:
    threaded.configure(max_model_len=32)
    with pytest.raises(openai.BadRequestError, match="max_tokens=33 cannot be greater than max_model_len=32"):
        client.completions.create(model=MODEL, prompt="a", max_tokens=33)


def test_server_cap_is_chat_default_and_ceiling(client: openai.OpenAI, threaded: ThreadedFakeVllm) -> None:
    threaded.configure(max_tokens_cap=7, natural_tokens=1000)
    omitted = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    over = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=100)
    under = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=3)
    assert [r.usage.completion_tokens for r in (omitted, over, under) if r.usage] == [7, 7, 3]


def test_chat_without_any_limit_runs_to_the_context(client: openai.OpenAI, threaded: ThreadedFakeVllm) -> None:
    """The runaway case: no client or server max_tokens and no EOS means max_model_len - prompt."""
    threaded.configure(max_model_len=50)
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "a b"}], extra_body={"ignore_eos": True}
    )
    assert resp.usage is not None and resp.usage.completion_tokens == 48


# ------------------------------------------------------------------ request log


def test_request_log_keeps_path_body_headers_and_decisions(client: openai.OpenAI, threaded: ThreadedFakeVllm) -> None:
    threaded.clear_requests()
    client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a b c"}]},
        ],
        max_tokens=9,
        extra_headers={"X-Trace": "t-1"},
    )
    (rec,) = threaded.requests()
    assert rec.method == "POST" and rec.path == "/v1/chat/completions"
    assert rec.headers["x-trace"] == "t-1"
    assert rec.body["max_tokens"] == 9 and rec.body["model"] == MODEL
    assert (rec.prompt_tokens, rec.max_tokens, rec.completion_tokens, rec.outcome) == (5, 9, 5, "stop")


async def test_request_log_over_http_and_malformed_body(fake: FakeVllm, http: aiohttp.ClientSession) -> None:
    async with http.post(
        fake.url + "/v1/completions", data=b"{not json", headers={"Content-Type": "application/json"}
    ) as r:
        assert r.status == 400
        assert (await r.json())["error"]["type"] == "BadRequestError"
    async with http.get(fake.url + "/_control/requests", params={"path": "/v1/completions"}) as r:
        (entry,) = await r.json()
    assert entry["body"] is None and entry["raw"] == "{not json" and entry["outcome"] == "rejected:400"
    async with http.delete(fake.url + "/_control/requests") as r:
        assert r.status == 204
    assert fake.requests() == []


async def test_record_off_keeps_no_log(http: aiohttp.ClientSession) -> None:
    async with FakeVllm(record=False) as fake:
        async with http.post(fake.url + "/v1/completions", json={"prompt": "a"}) as r:
            assert r.status == 200
        assert fake.requests() == []


async def test_tokenize_counts_words(fake: FakeVllm, http: aiohttp.ClientSession) -> None:
    async with http.post(fake.url + "/tokenize", json={"model": MODEL, "prompt": "one two  three\nfour"}) as r:
        body = await r.json()
    assert body["count"] == 4 and body["max_model_len"] == 4096 and body["tokens"] == [0, 1, 2, 3]
    async with http.post(fake.url + "/tokenize", json={"messages": [{"role": "user", "content": "x y"}]}) as r:
        assert (await r.json())["count"] == 2


# ------------------------------------------------------------------ metrics


async def test_metrics_are_plain_text_with_vllm_names(fake: FakeVllm, http: aiohttp.ClientSession) -> None:
    for max_tokens in (2, 50):
        async with http.post(fake.url + "/v1/completions", json={"prompt": "a b c", "max_tokens": max_tokens}) as r:
            assert r.status == 200
    # Prometheus asks for OpenMetrics first; vLLM names survive only in the plain format.
    headers = {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"}
    async with http.get(fake.url + "/metrics", headers=headers) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await r.text()
    assert "# EOF" not in text
    base = {"model_name": MODEL, "engine": "0"}
    assert sample(text, "vllm:request_success_total", finished_reason="length", **base) == 1
    assert sample(text, "vllm:request_success_total", finished_reason="stop", **base) == 1
    for reason in ("abort", "error", "repetition"):
        assert sample(text, "vllm:request_success_total", finished_reason=reason, **base) == 0
    assert sample(text, "vllm:prompt_tokens_total", **base) == 6
    assert sample(text, "vllm:generation_tokens_total", **base) == 7
    assert sample(text, "vllm:num_requests_running", **base) == 0
    assert sample(text, "vllm:num_preemptions_total", **base) == 0
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert families["vllm:request_success"] == "counter"
    assert families["vllm:kv_cache_usage_perc"] == "gauge"


async def test_cache_config_info_labels(http: aiohttp.ClientSession) -> None:
    async with FakeVllm(kv_cache_size_tokens=8192, block_size=16, cache_dtype="fp8", max_model_len=2048) as fake:
        text = await metrics_text(http, fake)
    (info,) = [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "vllm:cache_config_info"]
    assert info.value == 1
    assert info.labels["kv_cache_size_tokens"] == "8192"
    assert info.labels["num_gpu_blocks"] == "512"
    assert info.labels["block_size"] == "16"
    assert info.labels["cache_dtype"] == "fp8"
    assert info.labels["kv_cache_max_concurrency"] == "4.00"
    assert info.labels["engine"] == "0"


async def test_set_metric_pins_gauges_sets_counters_and_adds_series(
    fake: FakeVllm, http: aiohttp.ClientSession
) -> None:
    fake.set_metric("vllm:num_requests_running", 3)
    fake.set_metric("vllm:kv_cache_usage_perc", 0.97)
    fake.set_metric("vllm:request_success_total", 40, {"finished_reason": "length"})
    fake.set_metric("vllm:num_preemptions_total", 12)
    fake.set_metric("vllm:custom_gauge", 5, {"kind": "x"})
    async with http.post(fake.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1}) as r:
        assert r.status == 200
    text = await metrics_text(http, fake)
    assert sample(text, "vllm:num_requests_running") == 3
    assert sample(text, "vllm:kv_cache_usage_perc") == 0.97
    assert sample(text, "vllm:request_success_total", finished_reason="length") == 41
    assert sample(text, "vllm:num_preemptions_total") == 12
    assert sample(text, "vllm:custom_gauge", kind="x") == 5
    fake.set_metric("vllm:num_requests_running", None)
    assert sample(await metrics_text(http, fake), "vllm:num_requests_running") == 0
    with pytest.raises(ValueError, match="finished_reason"):
        fake.set_metric("vllm:request_success_total", 1, {"finished_reason": "bogus"})


async def test_control_metrics_over_http(fake: FakeVllm, http: aiohttp.ClientSession) -> None:
    body = {
        "set": [
            {"name": "vllm:num_requests_waiting", "value": 4},
            {"name": "vllm:generation_tokens_total", "value": 99},
        ]
    }
    async with http.post(fake.url + "/_control/metrics", json=body) as r:
        assert r.status == 200
    text = await metrics_text(http, fake)
    assert sample(text, "vllm:num_requests_waiting") == 4
    assert sample(text, "vllm:generation_tokens_total") == 99
    async with http.post(fake.url + "/_control/metrics", json={"name": "vllm:x", "value": "high"}) as r:
        assert r.status == 400
        assert "'value' must be a number" in (await r.json())["error"]["message"]


# ------------------------------------------------------------------ control API


async def test_control_changes_behaviour_and_refuses_bad_fields(fake: FakeVllm, http: aiohttp.ClientSession) -> None:
    async with http.post(fake.url + "/_control", json={"natural_tokens": 2, "ttft_s": 0.01}) as r:
        state = await r.json()
    assert state["behaviour"]["natural_tokens"] == 2 and fake.behaviour.ttft_s == 0.01
    for bad, words in [
        ({"natural_tokenz": 1}, "unknown behaviour field 'natural_tokenz'"),
        ({"natural_tokens": "2"}, "'natural_tokens' must be int"),
        ({"engine_dead": 1}, "'engine_dead' must be bool"),
        ({"max_model_len": 0}, "max_model_len must be > 0, got 0"),
        ({"fail_mode": "explode"}, "fail_mode must be one of"),
    ]:
        async with http.post(fake.url + "/_control", json=bad) as r:
            assert r.status == 400, bad
            assert words in (await r.json())["error"]["message"]
    assert fake.behaviour.natural_tokens == 2


async def test_reset_restores_constructed_state(fake: FakeVllm, http: aiohttp.ClientSession) -> None:
    fake.configure(natural_tokens=1, engine_dead=True)
    fake.set_metric("vllm:num_preemptions_total", 3)
    async with http.post(fake.url + "/_control/reset") as r:
        assert (await r.json())["behaviour"]["natural_tokens"] == 5
    assert not fake.behaviour.engine_dead and fake.requests() == []
    assert sample(await metrics_text(http, fake), "vllm:num_preemptions_total") == 0


def test_constructor_refuses_bad_knobs() -> None:
    with pytest.raises(ValueError, match="chunk_delay_s must be >= 0 seconds, got -1"):
        FakeVllm(chunk_delay_s=-1)
    with pytest.raises(ValueError, match="unknown behaviour field 'tokens'"):
        FakeVllm(tokens=3)


# ------------------------------------------------------------------ health, failures, stalls


async def test_engine_dead(fake: FakeVllm, http: aiohttp.ClientSession) -> None:
    async with http.get(fake.url + "/health") as r:
        assert r.status == 200 and await r.read() == b""
    fake.configure(engine_dead=True)
    async with http.get(fake.url + "/health") as r:
        assert r.status == 503
    async with http.post(fake.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}) as r:
        assert r.status == 500
    for path in ("/metrics", "/v1/models"):
        async with http.get(fake.url + path) as r:
            assert r.status == 200
    assert fake.requests()[-1].outcome == "engine_dead"


async def test_engine_death_cuts_in_flight_stream(fake: FakeVllm, http: aiohttp.ClientSession) -> None:
    fake.configure(chunk_delay_s=0.05)
    body = {"prompt": "a", "max_tokens": 100, "ignore_eos": True, "stream": True}
    async with http.post(fake.url + "/v1/completions", json=body) as r:
        await r.content.readuntil(b"\n\n")
        fake.configure(engine_dead=True)
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
    assert fake.requests()[-1].outcome == "engine_dead"


async def test_fail_status_counts_down(fake: FakeVllm, http: aiohttp.ClientSession) -> None:
    fake.configure(fail_mode="status", fail_status=503, fail_count=2)
    statuses = []
    for _ in range(3):
        async with http.post(fake.url + "/v1/completions", json={"prompt": "a"}) as r:
            statuses.append(r.status)
            if r.status == 503:
                assert "injected failure" in (await r.json())["error"]["message"]
    assert statuses == [503, 503, 200]
    assert fake.behaviour.fail_mode == "none"


async def test_fail_drop_closes_without_answer(fake: FakeVllm, http: aiohttp.ClientSession) -> None:
    fake.configure(fail_mode="drop")
    with pytest.raises(aiohttp.ServerDisconnectedError):
        async with http.post(fake.url + "/v1/completions", json={"prompt": "a"}) as r:
            await r.read()
    assert fake.requests()[-1].outcome == "failed:drop"


async def test_fail_hang_until_client_gives_up(fake: FakeVllm, http: aiohttp.ClientSession) -> None:
    fake.configure(fail_mode="hang")
    with pytest.raises(TimeoutError):
        async with http.post(
            fake.url + "/v1/completions", json={"prompt": "a"}, timeout=aiohttp.ClientTimeout(total=0.3)
        ) as r:
            await r.read()
    assert fake.requests()[-1].outcome == "failed:hang"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
async def test_fail_drop_mid_stream(fake: FakeVllm, http: aiohttp.ClientSession, stream: bool) -> None:
    fake.configure(fail_mode="drop_mid_stream", fail_after_chunks=3)
    body = {"prompt": "a", "max_tokens": 10, "ignore_eos": True, "stream": stream}
    got = b""
    with pytest.raises((aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError)):
        async with http.post(fake.url + "/v1/completions", json=body) as r:
            async for piece in r.content.iter_any():
                got += piece
    if stream:
        assert got.count(b"data: ") == 3 and b"[DONE]" not in got
    rec = fake.requests()[-1]
    assert (rec.outcome, rec.completion_tokens) == ("failed:drop_mid_stream", 3)


async def test_stall_keeps_requests_running_without_tokens(fake: FakeVllm, http: aiohttp.ClientSession) -> None:
    fake.configure(stall=True)
    body = {"prompt": "a", "max_tokens": 4, "ignore_eos": True, "stream": True}
    async with http.post(fake.url + "/v1/completions", json=body) as r:
        assert r.status == 200  # vLLM sends stream headers at once
        await asyncio.sleep(0.2)
        before = await metrics_text(http, fake)
        await asyncio.sleep(0.3)
        after = await metrics_text(http, fake)
        assert sample(before, "vllm:num_requests_running") == 1 == sample(after, "vllm:num_requests_running")
        assert sample(after, "vllm:generation_tokens_total") == sample(before, "vllm:generation_tokens_total") == 0
        assert sample(after, "vllm:kv_cache_usage_perc") > 0
        fake.configure(stall=False)
        text = await r.text()
    assert text.endswith("data: [DONE]\n\n")
    final = await metrics_text(http, fake)
    assert sample(final, "vllm:generation_tokens_total") == 4
    assert sample(final, "vllm:num_requests_running") == 0


async def test_client_disconnect_stops_generation_and_is_not_counted(
    fake: FakeVllm, http: aiohttp.ClientSession
) -> None:
    fake.configure(chunk_delay_s=0.02)
    body = {"prompt": "a", "max_tokens": 500, "ignore_eos": True, "stream": True}
    async with http.post(fake.url + "/v1/completions", json=body) as r:
        await r.content.readuntil(b"\n\n")
        r.close()
    for _ in range(200):
        if fake.requests()[-1].outcome != "pending":
            break
        await asyncio.sleep(0.02)
    rec = fake.requests()[-1]
    assert rec.outcome == "disconnected" and rec.completion_tokens < 500
    text = await metrics_text(http, fake)
    assert sum(sample(text, "vllm:request_success_total", finished_reason=r) for r in ("stop", "length", "abort")) == 0
    assert sample(text, "vllm:num_requests_running") == 0


async def test_max_num_seqs_queues_requests(fake: FakeVllm, http: aiohttp.ClientSession) -> None:
    # stalled, the first request holds its slot for as long as the test needs
    fake.configure(max_num_seqs=1, stall=True)
    body = {"prompt": "a", "max_tokens": 3, "ignore_eos": True}

    async def one() -> int:
        async with http.post(fake.url + "/v1/completions", json=body) as r:
            return r.status

    tasks = [asyncio.create_task(one()) for _ in range(3)]
    for _ in range(500):
        if fake.metrics.waiting == 2:
            break
        await asyncio.sleep(0.01)
    text = await metrics_text(http, fake)
    assert sample(text, "vllm:num_requests_running") == 1
    assert sample(text, "vllm:num_requests_waiting") == 2
    fake.configure(stall=False)
    assert await asyncio.gather(*tasks) == [200, 200, 200]
    assert sample(await metrics_text(http, fake), "vllm:num_requests_waiting") == 0


# ------------------------------------------------------------------ timing (lower bounds only)


async def test_ttft_and_chunk_delay(fake: FakeVllm, http: aiohttp.ClientSession) -> None:
    fake.configure(ttft_s=0.2, chunk_delay_s=0.05)
    body = {"prompt": "a", "max_tokens": 5, "ignore_eos": True, "stream": True}
    t0 = time.monotonic()
    arrivals = []
    async with http.post(fake.url + "/v1/completions", json=body) as r:
        while line := await r.content.readline():
            if line.startswith(b"data: {"):
                arrivals.append(time.monotonic() - t0)
    assert len(arrivals) == 5
    assert arrivals[0] >= 0.2
    # single gaps can look short when one chunk was read late; the last token cannot come before this
    assert arrivals[-1] >= 0.2 + 4 * 0.05
    t0 = time.monotonic()
    async with http.post(fake.url + "/v1/completions", json={**body, "stream": False}) as r:
        assert (await r.json())["usage"]["completion_tokens"] == 5
    assert time.monotonic() - t0 >= 0.2 + 4 * 0.05


async def test_headers_held_back_with_ttft(fake: FakeVllm, http: aiohttp.ClientSession) -> None:
    fake.configure(ttft_s=2.0, headers_before_ttft=False)
    body = {"prompt": "a", "max_tokens": 1, "stream": True}
    with pytest.raises(TimeoutError):
        async with http.post(fake.url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=0.3)):
            pass


# ------------------------------------------------------------------ standalone process


def test_standalone_cli_serves_and_refuses_bad_flags() -> None:
    cmd = [sys.executable, "-m", "fakevllm", "--port", "0", "--tokens", "3", "--model", "m1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("fake vLLM serving m1 on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1].strip()
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=10)
        resp = client.completions.create(model="m1", prompt="a", max_tokens=10)
        assert resp.usage is not None and resp.usage.completion_tokens == 3
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    bad = subprocess.run([*cmd[:3], "--ttft-ms", "-5"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2
    assert "ttft_s must be >= 0 seconds, got -0.005" in bad.stderr


def test_usage_chunk_json_roundtrip(threaded: ThreadedFakeVllm) -> None:
    """Raw SSE framing: every event is `data: <json>` then a blank line, ending with `data: [DONE]`."""
    import urllib.request

    req = urllib.request.Request(
        threaded.url + "/v1/chat/completions",
        data=json.dumps({"messages": [{"role": "user", "content": "q"}], "stream": True, "max_tokens": 2}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = resp.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for event in events[:-2]:
        assert event.startswith("data: ")
        json.loads(event[len("data: ") :])


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"], ids=["completions", "chat"])
async def test_continuous_usage_stats_in_every_chunk(fake: FakeVllm, http: aiohttp.ClientSession, path: str) -> None:
    body: dict[str, Any] = {
        "max_tokens": 3,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    body.update({"messages": [{"role": "user", "content": "a b"}]} if "chat" in path else {"prompt": "a b"})
    async with http.post(fake.url + path, json=body) as r:
        raw = await r.text()
    events = [json.loads(e[len("data: ") :]) for e in raw.split("\n\n") if e.startswith("data: {")]
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert counts == ([0, 1, 2, 3, 3] if "chat" in path else [1, 2, 3, 3])
    assert all(e["usage"]["prompt_tokens"] == 2 for e in events)
    assert events[-1]["choices"] == []
