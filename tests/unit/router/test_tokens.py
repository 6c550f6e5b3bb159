"""Prompt extraction, token bounds, and when the router tokenizes (only when the bounds disagree on a decision)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tokenizers
import tokenizers.decoders
import tokenizers.models
import tokenizers.pre_tokenizers
import tokenizers.trainers

from tests.support.router import write_word_tokenizer
from vllm_operator.api.router_config import TierConfig, TokenizerConfig
from vllm_operator.api.spec import OverLimit
from vllm_operator.router import decide as d
from vllm_operator.router import tokens as t

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Large language models generate text one token at a time.",
    "Routers count prompt tokens before choosing a pool; long prompts go to the long pool.",
    "Ünïcödé text, emoji 🚀 and CJK 漢字 are bytes too.",
] * 20
TEXTS = [
    pytest.param("hello", id="one-word"),
    pytest.param("The quick brown fox jumps over the lazy dog. " * 30, id="english"),
    pytest.param("漢字 🚀 Ünïcödé " * 40, id="unicode"),
    pytest.param("x" * 3000, id="one-long-run"),
    pytest.param("", id="empty"),
]


@pytest.fixture(scope="module")
def bpe() -> tokenizers.Tokenizer:
    """A small byte-level BPE with ChatML special tokens, trained here (no download)."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|im_start|>", "<|im_end|>", "<s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


@pytest.fixture(scope="module")
def bpe_counter(bpe: tokenizers.Tokenizer) -> t.TokenCounter:
    return t.TokenCounter(bpe, t.measure_chat_overhead(bpe, {"chat_template": CHATML}))


@pytest.mark.parametrize("text", TEXTS)
def test_bounds_contain_the_exact_count_completions(bpe_counter: t.TokenCounter, text: str) -> None:
    prompt = t.Prompt((text,), chat=False)
    lower, upper = bpe_counter.bounds(prompt)
    assert lower <= bpe_counter.exact(prompt) <= upper


@pytest.mark.parametrize("text", TEXTS)
def test_bounds_contain_the_exact_count_chat(bpe_counter: t.TokenCounter, text: str) -> None:
    prompt = t.Prompt(("You are terse.", text, "ok", text), chat=True, messages=4)
    lower, upper = bpe_counter.bounds(prompt)
    assert lower <= bpe_counter.exact(prompt) <= upper


def test_chatml_overhead_measured_from_the_template(bpe: tokenizers.Tokenizer) -> None:
    overhead = t.measure_chat_overhead(bpe, {"chat_template": CHATML})
    assert overhead.source == "template"
    # <|im_start|> role \n ... <|im_end|> \n around every message; <|im_start|>assistant\n once.
    assert overhead.per_message >= 4
    assert overhead.fixed >= 2


@pytest.mark.parametrize("messages", [
    pytest.param([{"role": "user", "content": "How long is this prompt?"}], id="one-message"),
    pytest.param([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The quick brown fox."},
                  {"role": "assistant", "content": "Jumps."}, {"role": "user", "content": "Over what? " * 20}],
                 id="four-messages"),
])
def test_chat_count_matches_the_rendered_template(bpe: tokenizers.Tokenizer, bpe_counter: t.TokenCounter,
                                                  messages: list[dict[str, str]]) -> None:
    """The approximation (content + measured overhead) against the real rendering: within one token per message."""
    import jinja2.sandbox

    rendered = jinja2.sandbox.ImmutableSandboxedEnvironment().from_string(CHATML).render(
        messages=messages, add_generation_prompt=True)
    truth = len(bpe.encode(rendered, add_special_tokens=False).ids)
    prompt = t.extract_prompt(True, {"messages": messages})
    assert isinstance(prompt, t.Prompt)
    assert abs(bpe_counter.exact(prompt) - truth) <= len(messages)


@pytest.mark.parametrize("config", [
    pytest.param({}, id="no-template"),
    pytest.param({"chat_template": "{{ raise_exception('no system role') }}"}, id="template-raises"),
    pytest.param({"chat_template": "{% for %}"}, id="template-syntax-error"),
])
def test_unusable_template_falls_back_to_default(bpe: tokenizers.Tokenizer, config: dict[str, Any]) -> None:
    assert t.measure_chat_overhead(bpe, config) == t.DEFAULT_CHAT_OVERHEAD


def test_named_template_list_uses_default(bpe: tokenizers.Tokenizer) -> None:
    config = {"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": CHATML}]}
    assert t.measure_chat_overhead(bpe, config) == t.measure_chat_overhead(bpe, {"chat_template": CHATML})


class CountingCounter(t.TokenCounter):
    exact_calls = 0

    def exact(self, prompt: t.Prompt) -> int:
        self.exact_calls += 1
        return super().exact(prompt)


TIER = TierConfig(name="free", default_max_tokens=100, max_tokens=100)
LIMITS = d.Limits(3000, OverLimit.CLAMP, d.PoolLimits("short", True, 4096, 512),
                  d.PoolLimits("long", True, 16384, 1024))


def decide_at(n: int) -> d.Decision:
    return d.decide(n, None, TIER, LIMITS)


SETTLE = [
    pytest.param("short english " * 10, False, d.Route("short", 100), id="small-prompt-no-tokenizing"),
    pytest.param("The quick brown fox. " * 200, True, d.Route("short", 100), id="near-threshold-tokenized"),
    pytest.param("x" * 200_000, True, None, id="over-long-limit-tokenized-for-the-message"),
]


@pytest.mark.parametrize(("text", "tokenized", "expected"), SETTLE)
def test_settle_tokenizes_only_near_a_boundary(bpe: tokenizers.Tokenizer, text: str, tokenized: bool,
                                               expected: d.Route | None) -> None:
    counter = CountingCounter(bpe)
    prompt = t.Prompt((text,), chat=False)
    decision, count = counter.settle(prompt, decide_at)
    assert (counter.exact_calls == 1) is tokenized
    assert count.method == (t.METHOD_EXACT if tokenized else t.METHOD_BOUND)
    if expected is None:
        assert isinstance(decision, d.Refusal)
        assert str(count.tokens) in decision.message
    else:
        assert decision == expected


def test_settle_exact_count_decides_near_boundary(bpe: tokenizers.Tokenizer) -> None:
    counter = t.TokenCounter(bpe)
    prompt = t.Prompt(("The quick brown fox. " * 200,), chat=False)
    decision, count = counter.settle(prompt, decide_at)
    assert count.tokens == len(bpe.encode(prompt.texts[0]).ids)
    assert decision == decide_at(count.tokens)


def test_without_tokenizer_the_upper_bound_is_used() -> None:
    counter = t.TokenCounter(None)
    prompt = t.Prompt(("héllo wörld",), chat=False)
    decision, count = counter.settle(prompt, decide_at)
    assert count == t.Count(len("héllo wörld".encode()) + 1, t.METHOD_NO_TOKENIZER)
    assert decision == decide_at(count.tokens)


def test_chat_without_tokenizer_adds_default_overhead() -> None:
    counter = t.TokenCounter(None)
    prompt = t.Prompt(("abc", "de"), chat=True, messages=2)
    _, upper = counter.bounds(prompt)
    assert upper == 5 + 2 + t.DEFAULT_FIXED_OVERHEAD + 2 * t.DEFAULT_PER_MESSAGE_OVERHEAD


def test_token_ids_are_counted_by_length() -> None:
    counter = t.TokenCounter(None)
    prompt = t.extract_prompt(False, {"prompt": [1, 2, 3, 4]})
    assert isinstance(prompt, t.Prompt)
    assert counter.settle(prompt, decide_at)[1] == t.Count(4, t.METHOD_IDS)


def test_word_level_tokenizer_has_no_lower_bound(tmp_path: Path) -> None:
    counter = t.load_counter(TokenizerConfig(path=str(write_word_tokenizer(tmp_path))))
    assert counter.max_token_bytes is None
    prompt = t.Prompt(("averyveryverylongunknownword",), chat=False)
    lower, upper = counter.bounds(prompt)
    assert lower == 0 and counter.exact(prompt) == 1 <= upper


EXTRACT_OK = [
    pytest.param(True, {"messages": [{"role": "user", "content": "hi"}]}, t.Prompt(("hi",), True, 1), id="chat"),
    pytest.param(True, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                   {"type": "image_url", "image_url": {}}]}]},
                 t.Prompt(("a",), True, 1), id="chat-parts"),
    pytest.param(True, {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]},
                 t.Prompt(('[{"id":"1"}]',), True, 1), id="chat-tool-calls"),
    pytest.param(True, {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
                 t.Prompt(("x", '[{"type":"function"}]'), True, 1), id="chat-tools"),
    pytest.param(False, {"prompt": "abc"}, t.Prompt(("abc",), False), id="completion-string"),
    pytest.param(False, {"prompt": ["a", "bb"]}, t.Prompt(("a", "bb"), False), id="completion-batch"),
    pytest.param(False, {"prompt": [[1, 2], [3, 4, 5]]}, t.Prompt((), False, ids=3), id="completion-id-batch"),
]


@pytest.mark.parametrize(("chat", "body", "expected"), EXTRACT_OK)
def test_extract_prompt(chat: bool, body: dict[str, Any], expected: t.Prompt) -> None:
    assert t.extract_prompt(chat, body) == expected


EXTRACT_BAD = [
    pytest.param(True, {}, "'messages' is a required field", id="chat-no-messages"),
    pytest.param(True, {"messages": []}, "non-empty list", id="chat-empty-messages"),
    pytest.param(True, {"messages": "hi"}, "non-empty list", id="chat-messages-string"),
    pytest.param(True, {"messages": ["hi"]}, "messages[0] must be an object", id="chat-message-string"),
    pytest.param(True, {"messages": [{"content": "x"}]}, "messages[0].role is required", id="chat-no-role"),
    pytest.param(True, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content must be",
                 id="chat-content-number"),
    pytest.param(True, {"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0] must be",
                 id="chat-part-string"),
    pytest.param(False, {}, "'prompt' is a required field", id="completion-no-prompt"),
    pytest.param(False, {"prompt": 5}, "'prompt' must be", id="completion-prompt-number"),
    pytest.param(False, {"prompt": []}, "'prompt' must be", id="completion-prompt-empty"),
    pytest.param(False, {"prompt": ["a", 1]}, "'prompt' must be", id="completion-prompt-mixed"),
]


@pytest.mark.parametrize(("chat", "body", "message"), EXTRACT_BAD)
def test_extract_prompt_refuses(chat: bool, body: dict[str, Any], message: str) -> None:
    result = t.extract_prompt(chat, body)
    assert isinstance(result, d.Refusal)
    assert result.status == 400
    assert message in result.message
    assert result.param in {"messages", "prompt"}


def test_load_from_path_with_template(tmp_path: Path) -> None:
    counter = t.load_counter(TokenizerConfig(path=str(write_word_tokenizer(tmp_path))))
    assert counter.has_tokenizer
    assert counter.chat == t.ChatOverhead(0, 0, "template")


def test_load_without_source_estimates() -> None:
    assert not t.load_counter(TokenizerConfig()).has_tokenizer


@pytest.mark.parametrize("content", [None, "not json"], ids=["no-tokenizer-json", "garbage"])
def test_load_from_bad_path_fails_loudly(tmp_path: Path, content: str | None) -> None:
    if content is not None:
        (tmp_path / "tokenizer.json").write_text(content)
    with pytest.raises(t.TokenizerLoadError, match=str(tmp_path)):
        t.load_counter(TokenizerConfig(path=str(tmp_path)))


def test_bad_tokenizer_config_json_is_ignored(tmp_path: Path) -> None:
    write_word_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    assert t.load_counter(TokenizerConfig(path=str(tmp_path))).chat == t.DEFAULT_CHAT_OVERHEAD
    (tmp_path / "tokenizer_config.json").write_text(json.dumps([1]))
    assert t.load_counter(TokenizerConfig(path=str(tmp_path))).chat == t.DEFAULT_CHAT_OVERHEAD
