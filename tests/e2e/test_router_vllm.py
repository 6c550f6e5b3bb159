"""The router's tier caps and length routing, checked inside real vLLM engines: the session's `cpu_dev` system
(tests/e2e/conftest.py), so the router is the chart's pod discovering the operator's engines through
EndpointSlices, not a copy of its configuration with static endpoints. What is checked happens in the engines, read
from their own responses and `/metrics`:

* an omitted max_tokens is capped (tier default 64, not vLLM's 16 for completions nor its own default for chat);
* an over-cap max_tokens is clamped to the tier cap and, being above the short pool's fuse, served by the long pool;
* a long prompt goes to the long engine (its `vllm:prompt_tokens_total` moves, the short one's does not), and the
  router's prompt count matches vLLM's;
* a chat prompt far from every boundary is decided on an upper bound, and the router's exact count (the real chat
  template's overhead) is vLLM's;
* a prompt over the long pool's maxModelLen gets the router's 400 and never reaches either engine.
"""

from __future__ import annotations

import re
from pathlib import Path

import openai
import pytest
import tokenizers

from tests.support.e2e_stack import Stack, engine_url, metrics_text, model_name, router_metric, the_plan
from vllm_operator.api.plan import Plan
from vllm_operator.api.router_config import TokenizerConfig
from vllm_operator.router.tokens import Prompt, TokenCounter, extract_prompt, load_counter

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # the first module to ask for cpu-dev starts it


class Setup:
    def __init__(self, stack: Stack, model_dir: Path) -> None:
        self.stack = stack
        self.plan: Plan = the_plan()
        self.client = openai.OpenAI(base_url=stack.router_url() + "/v1", api_key="unused", max_retries=0,
                                    timeout=120)
        self.tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.counter: TokenCounter = load_counter(TokenizerConfig(path=str(model_dir)))
        assert self.counter.chat.source == "template"
        self.model = model_name()
        self.short = "short"
        self.long = "long"

    def router_metric(self, name: str, **labels: str) -> float:
        return router_metric(self.stack, name, **labels)


@pytest.fixture
def setup(healthy: Stack, tiny_model_dir: Path) -> Setup:
    return Setup(healthy, tiny_model_dir)


def engine_counter(setup: Setup, pool: str, name: str) -> float:
    """Sum of a vLLM counter of the pool's engine over its series (tolerates the `vllm_` spelling)."""
    text = metrics_text(engine_url(setup.stack, pool))
    total = 0.0
    for line in text.splitlines():
        if re.match(rf"^vllm[:_]{name}(\{{|\s)", line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def prompt_of(tokenizer: tokenizers.Tokenizer, n_tokens: int) -> str:
    """A completions prompt that the model's tokenizer (BOS included) turns into exactly n_tokens tokens."""
    words = " ".join(f"w{i % 97}" for i in range(n_tokens * 2))
    ids = tokenizer.encode(words, add_special_tokens=False).ids[: n_tokens - 1]
    text = tokenizer.decode(ids)
    assert len(tokenizer.encode(text).ids) == n_tokens, "prompt construction drifted"
    return text


def test_omitted_max_tokens_is_capped_by_the_tier_default(setup: Setup) -> None:
    tier = setup.plan.router.tiers[0]
    raw = setup.client.completions.with_raw_response.create(
        model=setup.model, prompt=prompt_of(setup.tokenizer, 20), extra_body={"ignore_eos": True})
    completion = raw.parse()
    assert raw.headers["x-vllm-operator-pool"] == "short"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == tier.default_max_tokens == 64, "not vLLM's own default of 16"
    chat = setup.client.chat.completions.create(
        model=setup.model, messages=[{"role": "user", "content": "Tell me everything."}],
        extra_body={"ignore_eos": True})
    assert chat.usage is not None and chat.usage.completion_tokens == 64
    assert chat.choices[0].finish_reason == "length"


def test_over_cap_max_tokens_is_clamped_and_served_long(setup: Setup) -> None:
    tier = setup.plan.router.tiers[0]
    before = engine_counter(setup, setup.long, "generation_tokens_total")
    stream = setup.client.chat.completions.create(
        model=setup.model, messages=[{"role": "user", "content": "Go on."}], max_tokens=10_000, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == tier.max_tokens == 256
    # 256 > the short pool's fuse (128): the long engine generated them.
    assert engine_counter(setup, setup.long, "generation_tokens_total") - before == 256
    assert setup.router_metric("vllm_operator_router_clamps_total", pool="long", cap="tier") >= 1


def test_long_prompt_goes_to_the_long_engine(setup: Setup) -> None:
    threshold = setup.plan.router.prompt_length_threshold
    n_tokens = threshold + 100
    short_before = engine_counter(setup, setup.short, "prompt_tokens_total")
    long_before = engine_counter(setup, setup.long, "prompt_tokens_total")
    raw = setup.client.completions.with_raw_response.create(
        model=setup.model, prompt=prompt_of(setup.tokenizer, n_tokens), max_tokens=4)
    completion = raw.parse()
    assert raw.headers["x-vllm-operator-pool"] == "long"
    assert completion.usage is not None and completion.usage.prompt_tokens == n_tokens
    assert raw.headers["x-vllm-operator-prompt-tokens"] == str(n_tokens), "router counts as vLLM does"
    assert engine_counter(setup, setup.long, "prompt_tokens_total") - long_before == n_tokens
    assert engine_counter(setup, setup.short, "prompt_tokens_total") == short_before


def test_chat_counts_against_the_real_template(setup: Setup) -> None:
    """Far from every boundary the router decides on an upper bound (no tokenizing) and says so; its exact count
    (content + the template overhead measured at start) is what vLLM counts after rendering the template."""
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": prompt_of(setup.tokenizer, 50)}]
    raw = setup.client.chat.completions.with_raw_response.create(model=setup.model, messages=messages,
                                                                 max_tokens=2)
    chat = raw.parse()
    assert chat.usage is not None
    assert raw.headers["x-vllm-operator-prompt-tokens-method"] == "bound"
    assert int(raw.headers["x-vllm-operator-prompt-tokens"]) >= chat.usage.prompt_tokens
    prompt = extract_prompt(True, {"messages": messages})
    assert isinstance(prompt, Prompt)
    assert abs(setup.counter.exact(prompt) - chat.usage.prompt_tokens) <= len(messages)


def test_over_limit_prompt_is_refused_before_any_engine(setup: Setup) -> None:
    limit = setup.plan.router.pools.long.max_model_len
    counters = {p: (engine_counter(setup, p, "prompt_tokens_total"), engine_counter(setup, p, "request_success_total"))
                for p in (setup.short, setup.long)}
    refusals = setup.router_metric("vllm_operator_router_refusals_total", reason="prompt_too_long")
    with pytest.raises(openai.BadRequestError) as caught:
        setup.client.completions.create(model=setup.model, prompt=prompt_of(setup.tokenizer, limit + 10))
    error = caught.value
    assert error.code == "context_length_exceeded"
    assert str(limit + 10) in error.message and str(limit) in error.message
    for pool in (setup.short, setup.long):
        after = (engine_counter(setup, pool, "prompt_tokens_total"),
                 engine_counter(setup, pool, "request_success_total"))
        assert after == counters[pool], f"the {pool} engine saw the refused prompt"
    assert setup.router_metric("vllm_operator_router_refusals_total", reason="prompt_too_long") == refusals + 1
