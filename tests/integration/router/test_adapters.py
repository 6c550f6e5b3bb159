"""LoRA adapters at the router (#24), through the official `openai` client: `/v1/models` lists the base model and the
adapters, `model: <adapter>` goes only to a pool that serves it (with the same length routing and caps), an unknown
model is OpenAI's 404, and vLLM's unauthenticated adapter endpoints are never forwarded.

The engines are the project's fake vLLM, which records every request it receives (it answers 404 for a model name it
does not serve, so only where a request went is asserted here; tests/e2e/test_lora_vllm.py has real vLLM answer).
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from fakevllm.engine import ThreadedFakeVllm, run_in_thread
from tests.support.router import MODEL, router_config, router_in_thread, word_counter
from vllm_operator import constants

ADAPTERS = {"both": ["short", "long"], "long-only": ["long"], "short-only": ["short"]}


@pytest.fixture
def routed(tmp_path: Path) -> Iterator[tuple[str, ThreadedFakeVllm, ThreadedFakeVllm]]:
    with run_in_thread(model=MODEL, max_model_len=200, natural_tokens=5) as short, \
            run_in_thread(model=MODEL, max_model_len=1000, natural_tokens=5) as long:
        config = router_config([short.url], [long.url], adapters=ADAPTERS)
        with router_in_thread(config, word_counter(tmp_path / "tok")) as (url, _):
            yield url, short, long


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=15)


def models_seen(engine: ThreadedFakeVllm) -> list[str]:
    return [r.body["model"] for r in engine.requests("/v1/completions")]


def send(url: str, model: str, words: int, max_tokens: int = 8) -> None:
    # the fake engine does not know the adapter's name (404); where the request went is what counts
    with contextlib.suppress(openai.NotFoundError):
        client(url).completions.create(model=model, prompt="w " * words, max_tokens=max_tokens)


def test_models_lists_the_base_model_and_every_adapter(routed: tuple[str, ThreadedFakeVllm, ThreadedFakeVllm]) -> None:
    url, _, _ = routed
    cards = {m.id: m for m in client(url).models.list().data}
    assert sorted(cards) == sorted([MODEL, *ADAPTERS])
    assert all(getattr(cards[a], "parent", None) == MODEL for a in ADAPTERS)
    assert getattr(cards["short-only"], "max_model_len", None) == 200
    assert getattr(cards["both"], "max_model_len", None) == 1000


def test_adapters_follow_length_routing_within_their_pools(
        routed: tuple[str, ThreadedFakeVllm, ThreadedFakeVllm]) -> None:
    url, short, long = routed
    send(url, "both", 5)       # short prompt: short pool
    send(url, "both", 80)      # above the 50-word threshold: long pool
    send(url, "long-only", 5)  # short prompt, but only the long pool serves it
    send(url, "short-only", 5)
    assert models_seen(short) == ["both", "short-only"]
    assert models_seen(long) == ["both", "long-only"]


def test_an_adapter_of_one_pool_gets_that_pools_limits(routed: tuple[str, ThreadedFakeVllm, ThreadedFakeVllm]) -> None:
    url, short, long = routed
    with pytest.raises(openai.BadRequestError) as err:  # 300 words > the short pool's 200 tokens; long not allowed
        client(url).completions.create(model="short-only", prompt="w " * 300, max_tokens=8)
    assert err.value.code == "context_length_exceeded"
    assert models_seen(short) == [] and models_seen(long) == []


def test_unknown_model_is_openais_404_and_reaches_no_engine(
        routed: tuple[str, ThreadedFakeVllm, ThreadedFakeVllm]) -> None:
    url, short, long = routed
    with pytest.raises(openai.NotFoundError) as err:
        client(url).chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert err.value.code == "model_not_found"
    assert err.value.body == {"message": "The model `nope` does not exist or you do not have access to it.",
                              "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
    assert [r.path for r in short.requests() + long.requests() if r.path != "/health"] == []


@pytest.mark.parametrize("path", constants.LORA_ENDPOINTS)
def test_the_adapter_endpoints_are_never_forwarded(routed: tuple[str, ThreadedFakeVllm, ThreadedFakeVllm],
                                                   path: str) -> None:
    url, short, long = routed
    req = urllib.request.Request(url + path, method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"lora_name": "x", "lora_path": "/tmp/x"}).encode())
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 404
    assert [r.path for r in short.requests() + long.requests() if r.path != "/health"] == []
