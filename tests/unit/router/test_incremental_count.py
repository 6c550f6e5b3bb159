"""Counting a long prompt a slice at a time on the event loop (tokens.settle_incrementally) decides exactly as
counting it whole does and reports the same exact count (or a bound the whole count agrees with, when it stopped
early)."""

from __future__ import annotations

from typing import Any

import pytest
import tokenizers
import tokenizers.decoders
import tokenizers.models
import tokenizers.normalizers
import tokenizers.pre_tokenizers
import tokenizers.trainers

from vllm_operator.api.router_config import TierConfig
from vllm_operator.api.spec import OverLimit
from vllm_operator.router import decide as d
from vllm_operator.router import tokens as t

CORPUS = [
    "The quick brown fox jumps over the lazy dog, 12 times; it's 4.5 km away.",
    "Large language models generate text one token at a time.\nRouters count prompt tokens first.",
    "Ünïcödé text, emoji 🚀 and CJK 漢字 are bytes too — naïve café.",
] * 30
PROSE = " ".join(CORPUS)


def byte_level() -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, tokenizers.trainers.BpeTrainer(
        vocab_size=500, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    return tok


def metaspace() -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    tok.decoder = tokenizers.decoders.Metaspace()
    tok.train_from_iterator(CORPUS, tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>"]))
    return tok


def prepend_normalizer() -> tokenizers.Tokenizer:
    """Llama 2's shape: the normalizer prepends '▁' to every text, so a slice gains a token the whole text lacks."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = tokenizers.normalizers.Sequence([tokenizers.normalizers.Prepend("▁"),
                                                      tokenizers.normalizers.Replace(" ", "▁")])
    tok.train_from_iterator(CORPUS, tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>"]))
    return tok


TIER = TierConfig(name="free", default_max_tokens=100, max_tokens=100)


def limits_near(n: int) -> list[d.Limits]:
    """Limits that put a threshold, a short maxModelLen and the long maxModelLen around a count of n."""
    out = []
    for delta in (-3, -1, 0, 1, 2, 60):
        out.append(d.Limits(n + delta, OverLimit.CLAMP, d.PoolLimits("short", True, n + delta + 500, 512),
                            d.PoolLimits("long", True, 10 * n, 1024)))
        out.append(d.Limits(max(1, n // 4), OverLimit.CLAMP, d.PoolLimits("short", True, n // 2, 512),
                            d.PoolLimits("long", True, n + delta + 50, 1024)))
        out.append(d.Limits(max(1, n // 4), OverLimit.REJECT, d.PoolLimits("short", True, n // 2, 512),
                            d.PoolLimits("long", True, n + delta, 1024)))
    return out


@pytest.mark.parametrize("make", [byte_level, metaspace], ids=["byte-level", "metaspace"])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completion"])
def test_incremental_count_decides_as_the_whole_count(make: Any, chat: bool) -> None:
    tok = make()
    counter = t.TokenCounter(tok)
    assert counter.sliceable
    texts = (PROSE * 3, "A second message. " + PROSE) if chat else (PROSE * 4,)
    prompt = t.Prompt(texts, chat=chat, messages=len(texts) if chat else 0)
    whole = counter.exact(prompt)
    assert sum(map(len, texts)) > 4 * t.SLICE_CHARS
    for limits in limits_near(whole):
        def decide_at(n: int, limits: d.Limits = limits) -> d.Decision:
            return d.decide(n, None, TIER, limits)
        expected, expected_count = counter.settle(prompt, decide_at)
        decision, count = counter.settle_sliced(prompt, decide_at)
        assert decision == expected, limits
        if count.method == t.METHOD_EXACT:
            assert count.tokens == whole == expected_count.tokens
        else:  # decided before the whole prompt was counted: a bound, and one the whole count agrees with
            assert count.method == t.METHOD_BOUND and count.tokens >= whole


def test_a_tokenizer_whose_slices_do_not_add_up_is_counted_whole() -> None:
    counter = t.TokenCounter(prepend_normalizer())
    assert not counter.sliceable
    prompt = t.Prompt((PROSE * 3,), chat=True, messages=1)
    limits = limits_near(counter.exact(prompt))[0]
    _, count = counter.settle_sliced(prompt, lambda n: d.decide(n, None, TIER, limits))
    assert count == t.Count(counter.exact(prompt), t.METHOD_EXACT)


def test_a_text_with_no_safe_cut_is_counted_whole() -> None:
    counter = t.TokenCounter(byte_level())
    prompt = t.Prompt(("漢字" * 5000,), chat=False)
    limits = limits_near(counter.exact(prompt))[0]
    _, count = counter.settle_sliced(prompt, lambda n: d.decide(n, None, TIER, limits))
    assert count == t.Count(counter.exact(prompt), t.METHOD_EXACT)
