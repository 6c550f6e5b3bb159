"""config.json of mixture-of-experts and latent-attention models: experts counted, MLA KV, refusals, sliding windows.

The configs under hf_configs/ are the models' Hugging Face config.json files (DeepSeek-V2-Lite and Mistral-7B-v0.1
trimmed to the keys that matter). Published parameter totals: Qwen3-30B-A3B 30.5 B, Mixtral-8x7B 46.7 B,
DeepSeek-V2-Lite 15.7 B.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.planning.helpers import make_plan
from vllm_operator.api.errors import SpecError
from vllm_operator.planning import catalog, hf_config, kvcache
from vllm_operator.planning.catalog import GIB

CONFIGS = Path(__file__).parent / "hf_configs"


def config(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return loaded


def facts_plan(name: str, gpu: str, count: int = 1, **pools: Any) -> Any:
    facts = catalog.facts_from_hf_config(config(name)).to_wire()
    return make_plan(model={"name": f"x/{name}", "facts": facts}, accelerator={"type": gpu, "count": count},
                     **({"pools": pools} if pools else {}))


@pytest.mark.parametrize(("name", "billions"), [("qwen3-30b-a3b", 30.53), ("mixtral-8x7b-v0.1", 46.70),
                                                ("deepseek-v2-lite", 15.71)], ids=str)
def test_parameter_counts_include_every_expert(name: str, billions: float) -> None:
    assert hf_config.read(config(name)).params / 1e9 == pytest.approx(billions, abs=0.01)


def test_qwen3_30b_a3b_weights_match_what_vllm_loaded_on_the_h200() -> None:
    # vLLM 0.26 on the H200, bf16: "Model loading took 56.91 GiB"; before, the config read as dense gave 6.25 GiB.
    facts = catalog.facts_from_hf_config(config("qwen3-30b-a3b"))
    assert facts.weights_gib == pytest.approx(56.91, rel=0.01)
    assert facts.weights_gib >= 56.91  # never below what vLLM takes
    catalogued = catalog.catalog_model("Qwen/Qwen3-30B-A3B")
    assert catalogued is not None and catalogued.weights_gib == 56.91


def test_mixtral_on_two_h100s_gets_its_real_weights_per_gpu() -> None:
    # Issue 21: 6.78 GiB per GPU and about a million KV tokens were planned; the checkpoint is ~87 GiB.
    p = facts_plan("mixtral-8x7b-v0.1", "nvidia-h100-80gb", 2)
    long = p.pools["long"]
    assert long.kv.breakdown.weights_bytes / GIB == pytest.approx(87.04 / 2, abs=0.05)
    # 79.2 GiB x 0.9 - 43.7 GiB weights - overhead leaves ~25 GiB per GPU: 2 x 32 x 4 x 128 x 2 B = 64 KiB per token
    assert long.kv.bytes_per_token == 65536
    assert 300_000 < long.kv.planned_tokens < 450_000


def test_moe_activations_see_the_experts_a_token_is_routed_to() -> None:
    facts = catalog.facts_from_hf_config(config("mixtral-8x7b-v0.1"))
    assert facts.intermediate_size == 2 * 14336
    qwen = catalog.facts_from_hf_config(config("qwen3-30b-a3b"))
    assert (qwen.intermediate_size, qwen.hidden_size, qwen.vocab_size) == (8 * 768, 2048, 151936)


def test_mla_kv_is_one_latent_vector_per_layer_shared_by_tensor_parallel_ranks() -> None:
    facts = catalog.facts_from_hf_config(config("deepseek-v2-lite"))
    assert (facts.kv_lora_rank, facts.qk_rope_head_dim) == (512, 64)
    model = catalog.model_from_facts("deepseek-ai/DeepSeek-V2-Lite", facts)
    # 27 layers x (512 + 64) x 2 bytes; 16 KV heads x 192 dims read as K and V would be 331,776 B
    assert kvcache.bytes_per_token(model, "auto") == 27 * 576 * 2
    assert kvcache.bytes_per_token(model, "auto", tp=2) == 27 * 576 * 2
    assert facts.weights_gib == pytest.approx(15.71e9 * 2 / GIB, rel=0.01)


def test_mla_plans_on_an_h100() -> None:
    p = facts_plan("deepseek-v2-lite", "nvidia-h100-80gb")
    assert p.pools["long"].kv.bytes_per_token == 31104


def test_mla_facts_need_both_numbers() -> None:
    with pytest.raises(SpecError, match="kvLoraRank and qkRopeHeadDim together"):
        make_plan(model={"name": "x/y", "facts": {"numLayers": 2, "numKVHeads": 2, "headDim": 64,
                                                  "maxContextLength": 4096, "weightsGiB": 1, "kvLoraRank": 512}})


@pytest.mark.parametrize("arch", ["GptOssForCausalLM", "Gemma3ForConditionalGeneration", "MambaForCausalLM"])
def test_architectures_the_estimator_does_not_understand_are_refused_with_the_list(arch: str) -> None:
    cfg = {**config("qwen3-30b-a3b"), "architectures": [arch]}
    with pytest.raises(SpecError, match=rf"architecture {arch} is not one the KV estimator understands "
                                        r"\(supported: LlamaForCausalLM, .*Qwen3MoeForCausalLM.*DeepseekV3ForCausalLM"):
        catalog.facts_from_hf_config(cfg, origin="--model-config c.json")


def test_a_config_without_an_architecture_is_refused() -> None:
    cfg = {k: v for k, v in config("qwen3-30b-a3b").items() if k not in {"architectures", "model_type"}}
    with pytest.raises(SpecError, match="names no architecture"):
        catalog.facts_from_hf_config(cfg)


def test_model_type_stands_in_for_architectures() -> None:
    cfg = {k: v for k, v in config("qwen3-30b-a3b").items() if k != "architectures"}
    assert hf_config.read(cfg).architecture == "Qwen3MoeForCausalLM"


def test_moe_config_without_expert_numbers_is_refused() -> None:
    cfg = {k: v for k, v in config("mixtral-8x7b-v0.1").items() if k != "num_local_experts"}
    with pytest.raises(SpecError, match="needs the expert count"):
        catalog.facts_from_hf_config(cfg)


def test_a_window_on_every_layer_becomes_the_facts_sliding_window() -> None:
    notes: list[str] = []
    facts = catalog.facts_from_hf_config(config("mistral-7b-v0.1"), notes=notes)
    assert notes == ["every layer uses a 4096-token sliding window: vLLM keeps the window per sequence, and the plan "
                     "counts sequences and tokens as vLLM does"]
    assert (facts.num_layers, facts.num_kv_heads, facts.head_dim, facts.sliding_window) == (32, 8, 128, 4096)


def test_a_window_on_some_layers_is_sized_at_full_length_with_a_note() -> None:
    notes: list[str] = []
    cfg = {**config("qwen3-30b-a3b"), "sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 40}
    facts = catalog.facts_from_hf_config(cfg, notes=notes)
    assert notes == ["8 of 48 layers use a 4096-token sliding window; the KV estimate sizes them at full length "
                     "(an over-estimate: vLLM will report more KV tokens than planned)"]
    assert facts.sliding_window is None


def test_qwen_sliding_window_switched_off_is_no_sliding_window() -> None:
    notes: list[str] = []
    cfg = {**config("qwen3-30b-a3b"), "sliding_window": 4096, "use_sliding_window": False}
    catalog.facts_from_hf_config(cfg, notes=notes)
    assert notes == []


def test_tied_embeddings_are_counted_once() -> None:
    cfg = config("qwen3-30b-a3b")
    untied = hf_config.read(cfg).params
    tied = hf_config.read({**cfg, "tie_word_embeddings": True}).params
    assert untied - tied == 151936 * 2048


@pytest.mark.parametrize(("quant", "ratio"), [({"quant_method": "fp8"}, 0.5), ({"quant_method": "awq", "bits": 4},
                                                                                0.28)], ids=["fp8", "awq4"])
def test_quantized_checkpoints_are_sized_per_byte_width(quant: dict[str, Any], ratio: float) -> None:
    bf16 = catalog.facts_from_hf_config(config("qwen3-30b-a3b")).weights_gib
    quantized = catalog.facts_from_hf_config({**config("qwen3-30b-a3b"), "quantization_config": quant}).weights_gib
    assert bf16 is not None and quantized is not None
    assert quantized / bf16 == pytest.approx(ratio, abs=0.02)


def test_an_unknown_quantization_needs_the_weight_size() -> None:
    cfg = {**config("qwen3-30b-a3b"), "quantization_config": {"quant_method": "mxfp4"}}
    with pytest.raises(SpecError, match="give the size with --weights-gib"):
        catalog.facts_from_hf_config(cfg)
    assert catalog.facts_from_hf_config(cfg, weights_gib=17.0).weights_gib == 17.0


def test_qwen3_30b_a3b_catalog_plan_on_the_h200() -> None:
    p = make_plan(engine_version="0.26", model={"name": "Qwen/Qwen3-30B-A3B"},
                  accelerator={"type": "nvidia-h200-141gb"},
                  pools={"long": {"maxModelLen": 32768, "gpuMemoryUtilization": 0.9, "maxNumBatchedTokens": 8192,
                                  "maxNumSeqs": 1024}})
    long = p.pools["long"]
    assert long.kv.bytes_per_token == 2 * 48 * 4 * 128 * 2
    assert long.kv.breakdown.weights_bytes / GIB == pytest.approx(56.91, abs=0.01)
    assert long.kv.planned_tokens > 0
