"""Fixtures for router integration tests: two fake vLLM engines (short and long pool) and a word tokenizer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from fakevllm.engine import FakeVllm
from tests.support.router import MODEL, word_counter
from vllm_operator.router.tokens import TokenCounter


@pytest.fixture
def counter(tmp_path: Path) -> TokenCounter:
    return word_counter(tmp_path / "tokenizer")


@pytest.fixture
async def short_engine() -> AsyncIterator[FakeVllm]:
    async with FakeVllm(model=MODEL, max_model_len=200, natural_tokens=5) as fake:
        yield fake


@pytest.fixture
async def long_engine() -> AsyncIterator[FakeVllm]:
    async with FakeVllm(model=MODEL, max_model_len=1000, natural_tokens=5) as fake:
        yield fake


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        yield session
