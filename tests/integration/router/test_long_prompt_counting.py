"""A long prompt near a limit is counted exactly without holding the router's event loop: no tokenizer call on the
loop's thread gets more than THREAD_COUNT_CHARS characters, whatever the prompt's length (issue 28: prompts up to
32 KiB were tokenized whole on the loop, which a 30,000-character prompt held for 56-80 ms)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import tokenizers

from fakevllm.engine import FakeVllm
from tests.support.router import MODEL, router_config, running_router, words, write_word_tokenizer
from vllm_operator.api.router_config import TokenizerConfig
from vllm_operator.router import tokens as t
from vllm_operator.router.proxy import HEADER_COUNT_METHOD, HEADER_POOL, HEADER_PROMPT_TOKENS, THREAD_COUNT_CHARS


class Recording:
    """The real tokenizer, with the length of every text it is given on the loop's thread written down."""

    def __init__(self, tok: tokenizers.Tokenizer, loop_thread: threading.Thread) -> None:
        self._tok = tok
        self._loop_thread = loop_thread
        self.on_loop: list[int] = []
        self.elsewhere: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)

    def _note(self, chars: int) -> None:
        on_loop = threading.current_thread() is self._loop_thread
        (self.on_loop if on_loop else self.elsewhere).append(chars)

    def encode(self, text: str, *args: Any, **kwargs: Any) -> Any:
        self._note(len(text))
        return self._tok.encode(text, *args, **kwargs)

    def encode_batch(self, texts: list[str], *args: Any, **kwargs: Any) -> Any:
        self._note(sum(map(len, texts)))
        return self._tok.encode_batch(texts, *args, **kwargs)


@pytest.mark.parametrize("strategy", ["least-outstanding", "prefix"])
async def test_a_long_prompt_is_counted_off_the_event_loop(tmp_path: Path, strategy: str) -> None:
    """With the prefix strategy the new text is also named in blocks (tokenized), off the loop as well."""
    loaded = t.load_counter(TokenizerConfig(path=str(write_word_tokenizer(tmp_path / "tokenizer"))))
    assert loaded.tokenizer is not None
    recording = Recording(loaded.tokenizer, threading.current_thread())
    counter = t.TokenCounter(recording, loaded.chat)  # type: ignore[arg-type]
    n_words = 6000  # 30k characters: below the 32 KiB the router used to tokenize whole on its loop
    prompt_tokens = n_words + loaded.chat.fixed + loaded.chat.per_message
    long_len = prompt_tokens + 8 + 40  # fits, 40 tokens from the limit: only an exact count can tell
    async with FakeVllm(model=MODEL, max_model_len=200, natural_tokens=5) as short, \
            FakeVllm(model=MODEL, max_model_len=long_len, natural_tokens=5) as long:
        config = router_config([short.url], [long.url], **{"pools.long.maxModelLen": long_len,
                                                          "pools.long.strategy": strategy})
        async with running_router(config, counter) as (url, _), aiohttp.ClientSession() as session:
            recording.on_loop.clear()
            recording.elsewhere.clear()
            body = {"model": MODEL, "messages": [{"role": "user", "content": words(n_words)}], "max_tokens": 8}
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200, await response.text()
                assert response.headers[HEADER_COUNT_METHOD] == t.METHOD_EXACT
                assert response.headers[HEADER_POOL] == "long"
                assert int(response.headers[HEADER_PROMPT_TOKENS]) == prompt_tokens
    assert max(recording.on_loop, default=0) <= THREAD_COUNT_CHARS
    named = 2 if strategy == "prefix" else 1  # counted, and named for the prefix choice, in worker threads
    assert sum(recording.elsewhere) >= named * len(words(n_words))
