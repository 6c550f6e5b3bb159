"""Helpers for router tests: a word-level tokenizer that counts like the fake engine, configs, running routers.

The fake vLLM counts one token per whitespace-separated word and adds nothing for the chat template. A WordLevel
tokenizer with a whitespace pre-tokenizer and a template that only joins the contents counts the same, so a test
can say "a 60-word prompt" and know what both the router and the engine count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TextIO

import tokenizers
import tokenizers.models
import tokenizers.pre_tokenizers

from vllm_operator.api.router_config import RouterConfig, TokenizerConfig
from vllm_operator.router.app import build_app, serve
from vllm_operator.router.metrics import RouterMetrics
from vllm_operator.router.tokens import TokenCounter, load_counter

MODEL = "fake-model"
WORD_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def write_word_tokenizer(directory: Path, template: str | None = WORD_TEMPLATE) -> Path:
    """tokenizer.json (+ tokenizer_config.json with a chat template) that counts whitespace-separated words."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "word": 3}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(directory / "tokenizer.json"))
    if template is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return directory


def word_counter(directory: Path) -> TokenCounter:
    return load_counter(TokenizerConfig(path=str(write_word_tokenizer(directory))))


def words(n: int) -> str:
    return " ".join(["word"] * n)


def router_config(short: Sequence[str] = (), long: Sequence[str] = (), **overrides: Any) -> RouterConfig:
    """A small deployment: threshold 50 words; short 200/32; long 1000/64; tiers free (16/32) and pro (64/64)."""
    wire: dict[str, Any] = {
        "model": MODEL,
        "deployment": "demo",
        "namespace": "default",
        "promptLengthThreshold": 50,
        "overLimit": "clamp",
        "tiers": [{"name": "free", "defaultMaxTokens": 16, "maxTokens": 32},
                  {"name": "pro", "defaultMaxTokens": 64, "maxTokens": 64}],
        "pools": {
            "short": {"enabled": True, "maxModelLen": 200, "maxTokens": 32, "endpoints": list(short)},
            "long": {"enabled": True, "maxModelLen": 1000, "maxTokens": 64, "endpoints": list(long)},
        },
        "tokenizer": {},
        # Generous where a test does not probe the limit itself: on a loaded 2-core CI machine an event loop can
        # stall for a second, and a health poll or connect timing out then ejects a healthy fake engine.
        "timeouts": {"connectSeconds": 5, "firstByteSeconds": 5, "idleSeconds": 5, "totalSeconds": 20},
        "maxBodyBytes": 65536,
        "health": {"intervalSeconds": 0.2, "timeoutSeconds": 5},
    }
    for key, value in overrides.items():
        target = wire
        *path, last = key.split(".")
        for part in path:
            target = target[part]
        target[last] = value
    return RouterConfig.model_validate(wire)


@contextlib.asynccontextmanager
async def running_router(config: RouterConfig, counter: TokenCounter, *, kubeconfig: str | None = None,
                         access_stream: TextIO | None = None) -> AsyncIterator[tuple[str, RouterMetrics]]:
    """Serve a router on a free port of 127.0.0.1; yields (base URL, its metrics)."""
    metrics = RouterMetrics()
    app = build_app(config, counter, kubeconfig=kubeconfig, metrics=metrics, access_stream=access_stream)
    async with serve(app) as url:
        yield url, metrics


@contextlib.contextmanager
def router_in_thread(config: RouterConfig, counter: TokenCounter) -> Iterator[tuple[str, RouterMetrics]]:
    """The same on its own thread and loop, for the synchronous openai client."""
    loop = asyncio.new_event_loop()
    started: Future[tuple[str, RouterMetrics]] = Future()
    stop = asyncio.Event()

    async def run() -> None:
        try:
            async with running_router(config, counter) as handle:
                started.set_result(handle)
                await stop.wait()
        except BaseException as err:
            if not started.done():
                started.set_exception(err)
            raise

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), name="router", daemon=True)
    thread.start()
    try:
        yield started.result(timeout=10)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)
        loop.close()


def sample(metrics: RouterMetrics, name: str, **labels: str) -> float:
    """Current value of a metric sample (0 when absent)."""
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value
