"""Issue 38: what the H200 compatibility matrix (benchmarks/gpu/README.md, vLLM 0.26.0) found, held on the rendered
arguments and the planned KV figures.

* A float16 checkpoint (AWQ, GPTQ) with an fp8 KV cache died in CUDA graph capture on FlashAttention 3 unless the
  engine ran in bfloat16: every plan with fp8 KV on an FA3 GPU carries `--dtype=bfloat16` (per engine version;
  0.26 measured, 0.32/0.33 carried over unverified on a GPU).
* Planned KV tokens within ±2 % of vLLM's `kv_cache_size_tokens` in every cell that started, and never above it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tests.unit.planning.helpers import arg, make_plan
from vllm_operator.api.errors import SpecError
from vllm_operator.api.plan import Plan
from vllm_operator.api.spec import ModelFacts
from vllm_operator.planning import catalog, engine_args, hf_config, kvcache

REPO = Path(__file__).resolve().parents[3]
SHAPES = REPO / "benchmarks" / "gpu" / "matrix" / "shapes"
H200 = {"type": "nvidia-h200-141gb", "count": 1}


def shape_model(shape: str, name: str, **more: Any) -> dict[str, Any]:
    """spec.model for a matrix shape, with the facts `plan --model-config` reads off its config.json."""
    config = json.loads((SHAPES / shape / "config.json").read_text())
    return {"name": name, "facts": catalog.facts_from_hf_config(config).to_wire(), **more}


def awq_plan(klass: str = "long-doc", version: str = "0.26", **patch: Any) -> Plan:
    model = shape_model("qwen2.5-72b-instruct-awq", "Qwen/Qwen2.5-72B-Instruct-AWQ", quantization="awq")
    return make_plan(engine_version=version, model=model, workloadClass=klass, accelerator=H200, **patch)


# --- the dtype FlashAttention 3 needs with an fp8 KV cache ----------------------------------------------------------

@pytest.mark.parametrize("version", ["0.26", "0.32", "0.33"])
def test_fp8_kv_on_hopper_runs_the_model_in_bfloat16(version: str) -> None:
    # Without it vLLM 0.26.0 died on the H200: "RuntimeError: For FP16/BF16 input, output must have the same dtype
    # as inputs. For FP8 input, output must have dtype BF16" (cell awq72-fp8-nodtype); with it, it served.
    p = awq_plan(version=version)
    assert arg(p, "long", "--kv-cache-dtype") == "fp8"
    assert arg(p, "long", "--dtype") == "bfloat16"
    assert arg(p, "short", "--kv-cache-dtype") == "auto"
    assert arg(p, "short", "--dtype") is None  # model-dtype KV: the checkpoint's float16 is fine


def test_only_versions_whose_table_has_the_rule_get_the_flag() -> None:
    table = engine_args.ENGINE_VERSIONS["0.26"]
    assert engine_args.FA3_FP8_KV_NEEDS_BF16 in table.dtype_rules
    assert "measured" in table.dtype_rules_source
    assert "unverified on a GPU" in engine_args.ENGINE_VERSIONS["0.33"].dtype_rules_source
    bare = engine_args.EngineVersion("0.26", table.flags, table.overhead)
    assert engine_args.model_dtype_rule(bare, (9, 0), None, "fp8") is None
    assert engine_args.model_dtype_rule(table, (9, 0), None, "fp8") is engine_args.FA3_FP8_KV_NEEDS_BF16


@pytest.mark.parametrize(("cc", "backend", "kv", "wanted"), [
    pytest.param((9, 0), None, "fp8", True, id="hopper-default-backend-fp8"),
    pytest.param((9, 0), None, "fp8_e4m3", True, id="hopper-e4m3"),
    pytest.param((9, 0), None, "auto", False, id="hopper-model-dtype-kv"),
    pytest.param((9, 0), "FLASHINFER", "fp8", False, id="hopper-flashinfer"),
    pytest.param((8, 9), None, "fp8", False, id="ada-fa2-has-no-fp8"),
    pytest.param((8, 0), None, "fp8", False, id="ampere"),
    pytest.param(None, None, "fp8", False, id="cpu"),
])
def test_the_rule_applies_to_fa3_with_fp8_only(cc: tuple[int, int] | None, backend: str | None, kv: str,
                                               wanted: bool) -> None:
    from vllm_operator.constants import AttentionBackend

    chosen = AttentionBackend(backend) if backend else None
    rule = engine_args.model_dtype_rule(engine_args.ENGINE_VERSIONS["0.26"], cc, chosen, kv)
    assert (rule is not None) is wanted


def test_a_gpu_without_fa3_gets_no_dtype_flag() -> None:
    p = make_plan(engine_version="0.26", workloadClass="long-doc", accelerator={"type": "nvidia-a100-80gb"},
                  pools={"long": {"maxModelLen": 32768}})
    assert arg(p, "long", "--dtype") is None


def test_an_extra_args_dtype_the_rule_allows_is_not_doubled() -> None:
    p = awq_plan(pools={"long": {"extraArgs": ["--dtype=bfloat16"]}})
    assert [a for a in p.pools["long"].engine_args if a.startswith("--dtype")] == ["--dtype=bfloat16"]


@pytest.mark.parametrize("value", ["float16", "half", "auto"])
def test_an_extra_args_dtype_that_cannot_run_is_refused_with_the_fix(value: str) -> None:
    with pytest.raises(SpecError) as info:
        awq_plan(pools={"long": {"extraArgs": [f"--dtype={value}"]}})
    assert info.value.field == "spec.pools.long.extraArgs"
    assert info.value.message.startswith(f"--dtype={value} cannot run with a fp8 KV cache on nvidia-h200-141gb "
                                          "(vLLM 0.26): FlashAttention 3 with an fp8 KV cache only writes bf16 output")
    assert info.value.message.endswith("remove --dtype (the planner then sets --dtype=bfloat16) or set "
                                       "kvCacheDtype: auto")
    # what the message offers plans
    awq_plan(pools={"long": {"extraArgs": [f"--dtype={value}"], "kvCacheDtype": "auto"}})


# --- planned KV against vLLM's, every cell that started -------------------------------------------------------------

# (shape or None for the catalog entry, model name, class, pool, pool fields, quantization, vLLM kv_cache_size_tokens)
H200_MATRIX = [
    pytest.param("qwen2.5-72b-instruct-awq", "Qwen/Qwen2.5-72B-Instruct-AWQ", "long-doc", "long", {}, "awq",
                 546_752, id="awq72-fp8"),
    pytest.param("qwen2.5-72b-instruct-awq", "Qwen/Qwen2.5-72B-Instruct-AWQ", "long-doc", "short", {}, "awq",
                 273_472, id="awq72-short"),
    pytest.param("llama-3.3-70b-instruct-fp8-dynamic", "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", "long-doc",
                 "long", {"kvCacheDtype": "auto"}, None, 182_096, id="fp8w70-auto"),
    # vLLM's log (cell fp8w70-fp8, call 3): it profiled this KV cache and logged "Starting vLLM server" 161 s after
    # launch, after the rig had stopped waiting for the call's budget (no chat request was sent).
    pytest.param("llama-3.3-70b-instruct-fp8-dynamic", "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", "long-doc",
                 "long", {}, None, 364_192, id="fp8w70-fp8"),
    pytest.param("mistral-7b-instruct-v0.1", "mistralai/Mistral-7B-Instruct-v0.1", "long-doc", "long", {}, None,
                 2_911_031, id="mistral-sw-fp8"),
    pytest.param("deepseek-v2-lite-chat", "deepseek-ai/DeepSeek-V2-Lite-Chat", "chat", "long", {}, None,
                 3_285_008, id="dsv2lite-mla-chat"),
    pytest.param("deepseek-v2-lite-chat", "deepseek-ai/DeepSeek-V2-Lite-Chat", "long-doc", "long", {}, None,
                 6_569_984, id="dsv2lite-mla-fp8"),
    pytest.param("llama-3.2-3b-instruct", "meta-llama/Llama-3.2-3B-Instruct", "chat", "short", {}, None,
                 1_112_032, id="llama3b-tied-chat"),
    pytest.param(None, "Qwen/Qwen3-30B-A3B", "long-doc", "long", {}, None, 1_480_272, id="qwen3moe-fp8"),
    pytest.param(None, "meta-llama/Llama-3.1-8B-Instruct", "chat", "short", {}, None, 897_424, id="dense8-chat"),
    pytest.param(None, "meta-llama/Llama-3.1-8B-Instruct", "long-doc", "long", {}, None, 1_793_328,
                 id="dense8-long-fp8"),
]


@pytest.mark.parametrize(("shape", "name", "klass", "pool", "fields", "quant", "measured"), H200_MATRIX)
def test_planned_kv_is_within_2_percent_of_vllm_on_the_h200(shape: str | None, name: str, klass: str, pool: str,
                                                           fields: dict[str, Any], quant: str | None,
                                                           measured: int) -> None:
    model = shape_model(shape, name) if shape else {"name": name}
    if quant:
        model["quantization"] = quant
    p = make_plan(engine_version="0.26", model=model, workloadClass=klass, accelerator=H200,
                  pools={pool: {"replicas": 1, **fields}})
    planned = p.pools[pool].kv.planned_tokens
    assert planned == pytest.approx(measured, rel=0.02)
    assert planned <= measured  # an under-estimate: the plan never promises KV vLLM does not allocate


def test_the_fp8_weights_70b_shape_is_no_longer_minus_2_8_percent() -> None:
    # The issue's figures: vLLM 67.73 GiB of weights and 182,176 tokens; the plan said 68.00 GiB and 177,040. The
    # matrix run measured 67.75 GiB and 182,096; the plan now says 67.74 GiB (the tensors, 16-bit embeddings and LM
    # head, the RoPE cache and a fixed 40 MiB, no longer +0.5 % of the weights) and a margin of 1 % of the KV memory.
    model = shape_model("llama-3.3-70b-instruct-fp8-dynamic", "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic")
    p = make_plan(engine_version="0.26", model=model, workloadClass="long-doc", accelerator=H200,
                  pools={"long": {"kvCacheDtype": "auto"}})
    kv = p.pools["long"].kv
    assert kv.breakdown.weights_bytes / catalog.GIB == pytest.approx(67.75, abs=0.03)
    assert (kv.planned_tokens - 182_096) / 182_096 > -0.011


def test_the_lora_deployment_of_issue_28_is_within_2_percent() -> None:
    # benchmarks/gpu/deployments/lora.yaml on the H200 (2026-12-01): vLLM 1,790,432 KV tokens with two rank-16 slots.
    doc = yaml.safe_load((REPO / "benchmarks" / "gpu" / "deployments" / "lora.yaml").read_text())
    p = make_plan(engine_version="0.26", **{k: v for k, v in doc["spec"].items() if k != "engine"})
    planned = p.pools["long"].kv.planned_tokens
    assert planned == pytest.approx(1_790_432, rel=0.02) and planned <= 1_790_432


# --- Gemma-2: interleaved sliding-window and global layers (vLLM's hybrid KV allocator) ------------------------------

GEMMA2 = "gemma-2-9b-it"


def gemma2_config() -> dict[str, Any]:
    config: dict[str, Any] = json.loads((SHAPES / GEMMA2 / "config.json").read_text())
    return config


def test_gemma2_is_read_with_tied_embeddings_four_norms_and_alternating_sliding_layers() -> None:
    # Refused before ("architecture Gemma2ForCausalLM is not one the KV estimator understands").
    shape = hf_config.read(gemma2_config())
    assert shape.architecture == "Gemma2ForCausalLM" and shape.head_dim == 256
    # published: 9,241,705,984 parameters (the final norm, 3,584, is not counted); tied embeddings, 4 norms a layer
    assert shape.params == 9_241_702_400
    assert (shape.sliding_window, shape.sliding_window_layers) == (4096, 21)
    facts = catalog.facts_from_hf_config(gemma2_config())
    assert facts.sliding_window == 4096 and facts.sliding_window_layers == 21
    assert facts.checkpoint_quantization == "none"
    assert facts.weights_gib == pytest.approx(17.26, abs=0.01)  # float32 checkpoint, loaded in bfloat16


def test_explicit_layer_types_win_over_the_alternating_default() -> None:
    config = {**gemma2_config(), "layer_types": ["full_attention"] * 40 + ["sliding_attention"] * 2}
    shape = hf_config.read(config)
    assert (shape.sliding_window, shape.sliding_window_layers) == (4096, 2)


def gemma2_info() -> catalog.ModelInfo:
    return catalog.model_from_facts("google/gemma-2-9b-it", catalog.facts_from_hf_config(gemma2_config()))


def test_the_hybrid_allocator_groups_layers_by_kind_and_gives_sliding_groups_a_window() -> None:
    # vLLM 0.26 (kv_cache_utils): 21 sliding + 21 global layers -> two groups of 21, one block id spans a group; a
    # request at 8192 holds ceil(8192 / 16) = 512 blocks in the global group and min(4095 + 2 x 8192, 8192) / 16 + 1
    # = 513 in the sliding one.
    model = gemma2_info()
    assert kvcache.kv_layout(model, 8192, 16, 2 * 8192) == kvcache.KVLayout(21, 512 + 513)
    assert kvcache.kv_layout(model, 8192, 16, 2 * 1024) == kvcache.KVLayout(21, 512 + 385)
    # a window not shorter than L still costs one block more than full attention in vLLM 0.26
    assert kvcache.kv_layout(model, 4096, 16, 2 * 4096) == kvcache.KVLayout(21, 256 + 257)
    # no hybrid allocator (vLLM turns it off on CPUs): every layer keeps the whole length
    assert kvcache.kv_layout(model, 8192, 128, 2 * 8192, hybrid=False) == kvcache.KVLayout(42, 64)


@pytest.mark.parametrize(("sliding", "full", "groups"), [
    (21, 21, (21, 1, 1)), (20, 5, (5, 1, 4)), (12, 13, (13, 1, 1)), (30, 10, (10, 1, 3))])
def test_hybrid_groups_follow_vllm(sliding: int, full: int, groups: tuple[int, int, int]) -> None:
    # Gemma-2 1:1, Gemma-3 5:1, gpt-oss 12 sliding + 13 full padded to 13 each, a 3:1 pattern
    assert kvcache.hybrid_groups(sliding, full) == groups


def test_a_gemma2_plan_counts_tokens_as_the_hybrid_allocator_does() -> None:
    model = shape_model(GEMMA2, "google/gemma-2-9b-it")
    p = make_plan(engine_version="0.26", model=model, workloadClass="chat", accelerator=H200,
                  pools={"long": {"replicas": 1, "kvCacheDtype": "fp8"}})
    kv, pool = p.pools["long"].kv, p.pools["long"]
    assert pool.max_model_len == 8192 and arg(p, "long", "--dtype") == "bfloat16"
    block_bytes = 16 * 2 * 21 * 8 * 256  # a block of one group: 16 tokens x K and V x 21 layers x 8 heads x 256, fp8
    blocks = kv.budget_bytes // block_bytes
    assert kv.planned_tokens == int(blocks / (512 + 513) * 8192)
    assert kv.bytes_per_token == 2 * 42 * 8 * 256  # every layer, as documented


# --- model.quantization against the checkpoint's own quantization ---------------------------------------------------

def test_fp8_on_a_compressed_tensors_checkpoint_is_refused_with_vllms_reason() -> None:
    # vLLM 0.26 (config/model.py _verify_quantization): "Quantization method specified in the model config
    # (compressed-tensors) does not match the quantization method specified in the `quantization` argument (fp8)".
    model = shape_model("llama-3.3-70b-instruct-fp8-dynamic", "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic",
                        quantization="fp8")
    with pytest.raises(SpecError) as info:
        make_plan(engine_version="0.26", model=model, workloadClass="long-doc", accelerator=H200)
    assert info.value.field == "spec.model.quantization"
    assert info.value.message == (
        "fp8 does not match the checkpoint's quantization_config quant_method (compressed-tensors; "
        "spec.model.facts.checkpointQuantization): vLLM refuses to start a compressed-tensors checkpoint with "
        "--quantization=fp8; leave spec.model.quantization unset: vLLM reads the method from the checkpoint")
    # what the message offers plans
    del model["quantization"]
    p = make_plan(engine_version="0.26", model=model, workloadClass="long-doc", accelerator=H200)
    assert arg(p, "long", "--quantization") is None


def test_gptq_on_an_unquantized_checkpoint_is_refused_and_fp8_online_quantization_is_not() -> None:
    bf16 = shape_model("llama-3.2-3b-instruct", "meta-llama/Llama-3.2-3B-Instruct")
    with pytest.raises(SpecError, match="vLLM refuses to start an unquantized checkpoint with --quantization=gptq"):
        make_plan(engine_version="0.26", model={**bf16, "quantization": "gptq"}, accelerator=H200)
    p = make_plan(engine_version="0.26", model={**bf16, "quantization": "fp8"}, accelerator=H200)
    assert arg(p, "long", "--quantization") == "fp8"


def test_facts_without_the_checkpoints_quantization_are_not_checked() -> None:
    model = shape_model("llama-3.3-70b-instruct-fp8-dynamic", "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic",
                        quantization="fp8")
    del model["facts"]["checkpointQuantization"]  # written by hand: the planner cannot know
    make_plan(engine_version="0.26", model=model, workloadClass="long-doc", accelerator=H200)


@pytest.mark.parametrize(("patch", "message"), [
    ({"slidingWindowLayers": 21}, "slidingWindowLayers needs slidingWindow"),
    ({"slidingWindow": 4096, "slidingWindowLayers": 43}, "slidingWindowLayers 43 cannot be more than numLayers 42"),
])
def test_sliding_window_layers_are_validated(patch: dict[str, Any], message: str) -> None:
    facts = {k: v for k, v in catalog.facts_from_hf_config(gemma2_config()).to_wire().items()
             if not k.startswith("slidingWindow")}
    with pytest.raises(ValidationError, match=message):
        ModelFacts.model_validate({**facts, **patch})
