"""The router in front of two REAL vLLM servers on CPU (the short and the long pool of examples/cpu-dev.yaml).

Both engines and the router run from the planner's own output for that example (engine args and router.json), with
three local substitutions: static endpoints instead of EndpointSlices, the tokenizer read from the model directory
instead of the Hugging Face repo, and a smaller `--kv-cache-memory-bytes` (the tiny model needs 1 KiB per token;
the planned 1.2 GiB per engine would only take memory from a 2-core CI machine). What is checked happens in the
engines, read from their own responses and `/metrics`:

* an omitted max_tokens is capped (tier default 64, not vLLM's 16 for completions nor its own default for chat);
* an over-cap max_tokens is clamped to the tier cap and, being above the short pool's fuse, served by the long pool;
* a long prompt goes to the long engine (its `vllm:prompt_tokens_total` moves, the short one's does not), and the
  router's prompt count matches vLLM's;
* a prompt over the long pool's maxModelLen gets the router's 400 and never reaches either engine.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import openai
import pytest
import tokenizers
import yaml

from tests.support import vllm_cpu
from tests.support.paths import ROOT
from tests.support.router import router_in_thread, sample
from vllm_operator.api.plan import Plan
from vllm_operator.api.resource import parse_spec
from vllm_operator.api.router_config import RouterConfig
from vllm_operator.planning import RemediationState, plan
from vllm_operator.router.metrics import RouterMetrics
from vllm_operator.router.tokens import Prompt, TokenCounter, extract_prompt, load_counter

pytestmark = pytest.mark.e2e
KV_BYTES = "--kv-cache-memory-bytes=128M"
EXAMPLE = ROOT / "examples" / "cpu-dev.yaml"


def cpu_dev_plan() -> Plan:
    spec = parse_spec(yaml.safe_load(EXAMPLE.read_text())["spec"])
    return plan(spec, None, RemediationState(pools={}), name="cpu-dev", namespace="dev")


def engine_args(args: list[str]) -> list[str]:
    return [KV_BYTES if a.startswith("--kv-cache-memory-bytes") else a for a in args]


class Setup:
    def __init__(self, plan_: Plan, short: vllm_cpu.VllmServer, long: vllm_cpu.VllmServer,
                 client: openai.OpenAI, metrics: RouterMetrics, tokenizer: tokenizers.Tokenizer,
                 counter: TokenCounter) -> None:
        self.plan = plan_
        self.short = short
        self.long = long
        self.client = client
        self.metrics = metrics
        self.tokenizer = tokenizer
        self.counter = counter
        self.model = plan_.router.model


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    model_dir = vllm_cpu.make_model("tiny", tmp_path_factory.mktemp("models") / "tiny-llama")
    the_plan = cpu_dev_plan()
    logs = tmp_path_factory.mktemp("logs")
    servers = [vllm_cpu.start_vllm(model_dir, engine_args(the_plan.pools[name].engine_args), wait=False,
                                   log_path=logs / f"{name}.log") for name in ("short", "long")]
    try:
        for server in servers:
            server.wait_healthy()
        short, long = servers
        wire = the_plan.router.to_wire()
        wire["pools"]["short"].pop("service")
        wire["pools"]["long"].pop("service")
        wire["pools"]["short"]["endpoints"] = [short.url]
        wire["pools"]["long"]["endpoints"] = [long.url]
        wire["tokenizer"] = {"path": str(model_dir)}
        config = RouterConfig.model_validate(wire)
        counter = load_counter(config.tokenizer)
        assert counter.chat.source == "template"
        with router_in_thread(config, counter) as (url, metrics):
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
            tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
            yield Setup(the_plan, short, long, client, metrics, tokenizer, counter)
    finally:
        for server in servers:
            server.stop()


def engine_counter(server: vllm_cpu.VllmServer, name: str) -> float:
    """Sum of a vLLM counter over its series (tolerates the `vllm_` spelling)."""
    text = server.metrics_text()
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
    before = engine_counter(setup.long, "generation_tokens_total")
    stream = setup.client.chat.completions.create(
        model=setup.model, messages=[{"role": "user", "content": "Go on."}], max_tokens=10_000, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == tier.max_tokens == 256
    # 256 > the short pool's fuse (128): the long engine generated them.
    assert engine_counter(setup.long, "generation_tokens_total") - before == 256
    assert sample(setup.metrics, "vllm_operator_router_clamps_total", pool="long", cap="tier") >= 1


def test_long_prompt_goes_to_the_long_engine(setup: Setup) -> None:
    threshold = setup.plan.router.prompt_length_threshold
    n_tokens = threshold + 100
    short_before = engine_counter(setup.short, "prompt_tokens_total")
    long_before = engine_counter(setup.long, "prompt_tokens_total")
    raw = setup.client.completions.with_raw_response.create(
        model=setup.model, prompt=prompt_of(setup.tokenizer, n_tokens), max_tokens=4)
    completion = raw.parse()
    assert raw.headers["x-vllm-operator-pool"] == "long"
    assert completion.usage is not None and completion.usage.prompt_tokens == n_tokens
    assert raw.headers["x-vllm-operator-prompt-tokens"] == str(n_tokens), "router counts as vLLM does"
    assert engine_counter(setup.long, "prompt_tokens_total") - long_before == n_tokens
    assert engine_counter(setup.short, "prompt_tokens_total") == short_before


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
    counters = {s.url: (engine_counter(s, "prompt_tokens_total"), engine_counter(s, "request_success_total"))
                for s in (setup.short, setup.long)}
    with pytest.raises(openai.BadRequestError) as caught:
        setup.client.completions.create(model=setup.model, prompt=prompt_of(setup.tokenizer, limit + 10))
    error = caught.value
    assert error.code == "context_length_exceeded"
    assert str(limit + 10) in error.message and str(limit) in error.message
    for server in (setup.short, setup.long):
        after = (engine_counter(server, "prompt_tokens_total"), engine_counter(server, "request_success_total"))
        assert after == counters[server.url], f"{server.url} saw the refused prompt"
    assert sample(setup.metrics, "vllm_operator_router_refusals_total", reason="prompt_too_long") == 1
