"""Read a Hugging Face `config.json` into the shape the KV estimator needs, for the architectures it understands.

Why an explicit list of architectures: a config.json names its numbers differently per family, and some families
change what the numbers mean. Mixture-of-experts models store every expert's MLP (Mixtral-8x7B: 46.7 B parameters,
≈87 GiB in bf16, where a dense reading of the same config gives ≈13.6 GiB); multi-head latent attention (DeepSeek
V2/V3) caches one compressed vector per layer and token (`kv_lora_rank + qk_rope_head_dim` values, the same on every
tensor-parallel rank) instead of K and V per head. Sizing a family the estimator does not know as if it were a dense
Llama yields a plan that cannot start, so anything outside `SUPPORTED_ARCHITECTURES` is refused with the list.

What is counted, per family (the parameter counts match the published totals: Llama-3.1-8B 8.03 B, Mixtral-8x7B
46.70 B, Qwen3-30B-A3B 30.53 B, DeepSeek-V2-Lite 15.71 B, DeepSeek-V3 671.0 B):

* attention: q/k/v/o projections (grouped-query), or MLA's low-rank q and kv projections;
* MLP: `3 × hidden × intermediate` for dense layers; for MoE layers every routed expert (`num_local_experts`,
  `num_experts` or `n_routed_experts` × `3 × hidden × moe_intermediate_size`), the shared experts
  (`n_shared_experts`, `shared_expert_intermediate_size`) and the router; which layers are MoE follows the family's
  own rule (Qwen: `decoder_sparse_step` and `mlp_only_layers`; DeepSeek: `first_k_dense_replace` and
  `moe_layer_freq`);
* embeddings once when `tie_word_embeddings`, else twice (the LM head);
* bytes per parameter of the linear layers: 2 for 16-bit checkpoints (vLLM also loads float32 checkpoints in 16 bit
  by default), 1 for `quant_method: fp8` and compressed-tensors 8-bit float schemes, `bits / 8` plus 16-bit group
  scales and zero points for AWQ, GPTQ and compressed-tensors int schemes (`grouped_int_bytes`); embeddings and the
  LM head stay 16 bit in every format; any other quantization needs an explicit weight size;
* on top, what vLLM counts as weights: the RoPE cache and a fixed 40 MiB (`load_extra_bytes`, fitted on the H200).

Sliding-window attention: when every layer slides (Mistral-7B-v0.1's `sliding_window`), the shape carries the
window and the planner counts sequences and tokens as vLLM does (a sequence holds its window, not the whole
length). When some layers slide and the others attend globally (`layer_types`; Gemma-2, whose config.json has no
`layer_types`, alternates sliding and global layers starting with a sliding one, as vLLM's Gemma2 config does), the
shape carries the window and the number of sliding layers: on a GPU vLLM's hybrid allocator groups the layers by
kind and gives the sliding groups a window per sequence (`kvcache.kv_layout`). Qwen's `max_window_layers` (vLLM
refuses a model where only some of those layers slide) stays sized at full length, with a note.

Gemma-2: embeddings are tied unless the config says otherwise (transformers' Gemma2Config default), every layer
has four RMS norms, and vLLM refuses float16 for it ("Numerical instability"), so its float32 checkpoint loads in
bfloat16 — 2 bytes per weight, as for every 16-bit checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_operator.api.errors import SpecError

GIB = 1 << 30
LOAD_FIXED_BYTES = 40 << 20
"""What vLLM's "Model loading took" holds beyond the weight tensors and the RoPE cache (`rope_cache_bytes`):
40 MiB, fitted on the H200 with vLLM 0.26 — Llama-3.1-8B 14.96 GiB of tensors + 0.03 RoPE → 15.04 measured,
Llama-3.3-70B FP8-dynamic 67.69 → 67.73, Qwen3-30B-A3B 56.88 → 56.91. Before issue 38 this was a 0.5 % factor on
the weights, which put the 70B FP8 shape 0.27 GiB above vLLM (a fixed cost, not a share of the weights)."""
ROPE_CACHE_DTYPE_BYTES = 2
"""vLLM's rotary embedding keeps one cos/sin cache of max_position × rotary_dim in the model dtype, shared by all
layers (model_executor/layers/rotary_embedding: `_ROPE_DICT`)."""
DEFAULT_GROUP_SIZE = 128
SCALE_BYTES = 2
"""Group scales of AWQ, GPTQ and compressed-tensors int checkpoints are 16-bit; zero points have the weights' bits."""


def rope_cache_bytes(max_position: int, rotary_dim: int) -> int:
    return max_position * rotary_dim * ROPE_CACHE_DTYPE_BYTES


def load_extra_bytes(max_position: int, rotary_dim: int) -> int:
    """Bytes vLLM counts as weights on top of the tensors."""
    return rope_cache_bytes(max_position, rotary_dim) + LOAD_FIXED_BYTES


def grouped_int_bytes(bits: int, group_size: int, zero_points: bool) -> float:
    """Bytes per weight of a group-quantized int checkpoint as vLLM keeps it: the packed weight, a 16-bit scale per
    group and output, and a zero point per group when the format has them (AWQ; symmetric GPTQ's are dropped on
    load). Zero points count 16 bits: on Hopper vLLM 0.26 runs AWQ through Machete, which keeps them as 16-bit
    scaled zeros (the H200 matrix: Qwen2.5-72B-AWQ loaded 39.60 GiB, 4-bit zeros would give 39.1); Marlin packs
    them to `bits`, so elsewhere this over-estimates by (16 - bits) / 8 / group_size bytes per weight (the safe
    side). group_size -1 = one group per output channel (~no overhead)."""
    per_group = SCALE_BYTES + (SCALE_BYTES if zero_points else 0.0)
    return bits / 8 + (per_group / group_size if group_size > 0 else 0.0)


DENSE = "dense"
MOE = "moe"
MLA_MOE = "mla-moe"

# architecture (config.json `architectures[0]`) -> family; `model_type` spellings are accepted when `architectures`
# is absent.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": DENSE, "MistralForCausalLM": DENSE, "Qwen2ForCausalLM": DENSE, "Qwen3ForCausalLM": DENSE,
    "ChatGLMModel": DENSE, "ChatGLMForConditionalGeneration": DENSE, "GlmForCausalLM": DENSE,
    "MixtralForCausalLM": MOE, "Qwen2MoeForCausalLM": MOE, "Qwen3MoeForCausalLM": MOE,
    "DeepseekV2ForCausalLM": MLA_MOE, "DeepseekV3ForCausalLM": MLA_MOE, "Gemma2ForCausalLM": DENSE,
}
MODEL_TYPES: dict[str, str] = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "chatglm": "ChatGLMModel", "glm": "GlmForCausalLM",
    "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
}
TIED_BY_DEFAULT = frozenset({"Gemma2ForCausalLM"})
"""Architectures whose transformers config ties the embeddings when config.json does not say
(`tie_word_embeddings` defaults to True in Gemma2Config)."""
NORMS_PER_LAYER: dict[str, int] = {"Gemma2ForCausalLM": 4}
"""RMS norms per decoder layer where it is not 2 (Gemma-2: input, post-attention, pre- and post-feed-forward)."""
ALTERNATING_LAYER_TYPES = frozenset({"Gemma2ForCausalLM"})
"""Architectures whose layers alternate sliding and global attention, sliding first, when config.json has no
`layer_types` (vLLM's Gemma2 model reads `config.layer_types`, which transformers derives this way)."""


@dataclass(frozen=True)
class ConfigShape:
    """The numbers of one config.json the planner uses (`params` counts every stored weight, experts included)."""

    architecture: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    max_context_length: int
    hidden_size: int
    activation_intermediate: int  # MLP width one token passes through (MoE: experts per token × expert width)
    vocab_size: int
    params: int
    embedding_params: int
    bytes_per_param: float | None  # None: a quantization the estimator does not size
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    experts: int = 0
    notes: list[str] = field(default_factory=list)

    rotary_dim: int = 0
    sliding_window: int | None = None  # the window of the sliding layers (None: no layer slides)
    sliding_window_layers: int | None = None  # how many layers slide, when not all of them do
    checkpoint_quantization: str = "none"  # quantization_config.quant_method, lower-case ("none": unquantized)

    def weights_gib(self) -> float | None:
        """Estimated weights as vLLM loads them (None when the quantization is unknown): the quantized linear layers,
        embeddings and LM head in 16 bit (no format here quantizes them), the RoPE cache and vLLM's fixed extra."""
        if self.bytes_per_param is None:
            return None
        dense = (self.params - self.embedding_params) * self.bytes_per_param + self.embedding_params * 2
        total = dense + load_extra_bytes(self.max_context_length, self.rotary_dim or self.head_dim)
        return max(round(total / GIB, 2), 0.01)


def _int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def architecture(config: Mapping[str, Any], origin: str) -> str:
    """The config's architecture if the estimator understands it; SpecError listing the supported ones otherwise."""
    archs = config.get("architectures")
    name = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if name is None:
        model_type = config.get("model_type")
        name = MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
        if name is None:
            raise SpecError(origin, "names no architecture (architectures or model_type); the KV estimator "
                            f"understands {', '.join(SUPPORTED_ARCHITECTURES)}")
    if name not in SUPPORTED_ARCHITECTURES:
        raise SpecError(origin, f"architecture {name} is not one the KV estimator understands (supported: "
                        f"{', '.join(SUPPORTED_ARCHITECTURES)}); describe the model with spec.model.facts instead")
    return name


def _compressed_tensors_bytes(quant: Mapping[str, Any]) -> float | None:
    """compressed-tensors (llm-compressor) checkpoints: the first config group's weight scheme — 8-bit float
    (FP8-dynamic/static: a per-channel or per-tensor scale, ~1 byte per weight) or 4/8-bit int in groups."""
    groups = quant.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        return None
    first = next(iter(groups.values()))
    weights = first.get("weights") if isinstance(first, Mapping) else None
    if not isinstance(weights, Mapping):
        return None
    bits, kind = weights.get("num_bits"), str(weights.get("type", "int"))
    if kind == "float" and bits == 8:
        return 1.0
    if kind == "int" and bits in (4, 8):
        group = weights.get("group_size") if weights.get("strategy") == "group" else -1
        return grouped_int_bytes(bits, group if isinstance(group, int) else DEFAULT_GROUP_SIZE,
                                 zero_points=weights.get("symmetric") is False)
    return None


def _bytes_per_param(cfg: Mapping[str, Any]) -> float | None:
    """Bytes per weight of the (quantized) linear layers; None for a quantization the estimate does not know."""
    quant = cfg.get("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method", "")).lower()
        if method == "fp8":
            return 1.0
        if method == "compressed-tensors":
            return _compressed_tensors_bytes(quant)
        bits = quant.get("bits") or quant.get("w_bit")
        group = quant.get("group_size", quant.get("q_group_size", DEFAULT_GROUP_SIZE))
        if method in {"awq", "gptq"} and isinstance(bits, int) and bits in (4, 8) and isinstance(group, int):
            zeros = bool(quant.get("zero_point", True)) if method == "awq" else quant.get("sym") is False
            return grouped_int_bytes(bits, group, zero_points=zeros)
        return None
    return 2.0


def _moe_layers(arch: str, cfg: Mapping[str, Any], layers: int) -> list[bool]:
    """Which decoder layers hold experts, by each family's own rule."""
    if arch == "MixtralForCausalLM":
        return [True] * layers
    if arch in {"Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"}:
        step = _int(cfg, "decoder_sparse_step") or 1
        dense_only = set(cfg.get("mlp_only_layers") or [])
        return [i not in dense_only and (i + 1) % step == 0 for i in range(layers)]
    first_dense = cfg.get("first_k_dense_replace")
    first = first_dense if isinstance(first_dense, int) else 0
    freq = _int(cfg, "moe_layer_freq") or 1
    return [i >= first and i % freq == 0 for i in range(layers)]


def _sliding_layers(arch: str, cfg: Mapping[str, Any], layers: int, context: int) -> tuple[int, int] | None:
    """(window, layers using it) when some layers attend to a window shorter than the context."""
    types = cfg.get("layer_types")
    window = _int(cfg, "sliding_window")
    if types is None and arch in ALTERNATING_LAYER_TYPES:
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if isinstance(types, list) and window:
        count = sum(1 for t in types if t == "sliding_attention")
        return (window, count) if count and window < context else None
    if window is None or window >= context or cfg.get("use_sliding_window") is False:
        return None
    max_window = _int(cfg, "max_window_layers")
    count = layers if max_window is None or "use_sliding_window" not in cfg else max(layers - max_window, 0)
    return (window, count) if count else None


def read(config: Mapping[str, Any], origin: str = "config.json") -> ConfigShape:
    """The shape of a supported config.json; SpecError naming the missing key or the unsupported architecture."""
    arch = architecture(config, origin)
    family = SUPPORTED_ARCHITECTURES[arch]
    cfg = config
    layers = _int(cfg, "num_hidden_layers", "num_layers")
    heads = _int(cfg, "num_attention_heads")
    if layers is None or heads is None:
        raise SpecError(origin, "needs num_hidden_layers (or num_layers) and num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads", "multi_query_group_num") or heads
    hidden = _int(cfg, "hidden_size")
    if hidden is None:
        raise SpecError(origin, "needs hidden_size")
    context = _int(cfg, "max_position_embeddings", "seq_length")
    if context is None:
        raise SpecError(origin, "needs max_position_embeddings (or seq_length) for the native context")
    vocab = _int(cfg, "vocab_size", "padded_vocab_size")
    if vocab is None:
        raise SpecError(origin, "needs vocab_size")
    inter = _int(cfg, "intermediate_size", "ffn_hidden_size") or 0
    notes: list[str] = []
    kv_lora = rope = None
    if family == MLA_MOE:
        kv_lora, rope = _int(cfg, "kv_lora_rank"), _int(cfg, "qk_rope_head_dim")
        nope, v_dim = _int(cfg, "qk_nope_head_dim"), _int(cfg, "v_head_dim")
        if kv_lora is None or rope is None or nope is None or v_dim is None:
            raise SpecError(origin, f"{arch} needs kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim and v_head_dim "
                            "(multi-head latent attention)")
        head_dim = nope + rope
        q_lora = _int(cfg, "q_lora_rank")
        q = (hidden * q_lora + q_lora * heads * head_dim) if q_lora else hidden * heads * head_dim
        attn = q + hidden * (kv_lora + rope) + kv_lora * heads * (nope + v_dim) + heads * v_dim * hidden
    else:
        head_dim = _int(cfg, "head_dim", "kv_channels") or hidden // heads
        attn = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    if family == DENSE:
        inter = inter or int(3.5 * hidden)
        mlp = [3 * hidden * inter] * layers
        per_token_mlp, experts, top_k = inter, 0, 0
    else:
        experts = _int(cfg, "num_local_experts", "num_experts", "n_routed_experts") or 0
        top_k = _int(cfg, "num_experts_per_tok") or 0
        expert_inter = _int(cfg, "moe_intermediate_size") or inter
        if not experts or not top_k or not expert_inter:
            raise SpecError(origin, f"{arch} needs the expert count (num_local_experts, num_experts or "
                            "n_routed_experts), num_experts_per_tok and the expert width (moe_intermediate_size)")
        shared = (_int(cfg, "n_shared_experts") or 0) * expert_inter + (_int(cfg, "shared_expert_intermediate_size")
                                                                         or 0)
        moe_mlp = experts * 3 * hidden * expert_inter + hidden * experts + 3 * hidden * shared
        if cfg.get("shared_expert_intermediate_size"):
            moe_mlp += hidden  # Qwen2-MoE's shared-expert gate
        mlp = [moe_mlp if is_moe else 3 * hidden * inter for is_moe in _moe_layers(arch, cfg, layers)]
        per_token_mlp = top_k * expert_inter + shared
    tied = cfg.get("tie_word_embeddings", arch in TIED_BY_DEFAULT)
    embeddings = vocab * hidden * (1 if tied else 2)
    norms = NORMS_PER_LAYER.get(arch, 2)
    params = sum(attn + m + norms * hidden for m in mlp) + embeddings
    sliding = _sliding_layers(arch, cfg, layers, context)
    window_out = window_layers = None
    if sliding is not None:
        window, count = sliding
        if count == layers:
            window_out = window
            notes.append(f"every layer uses a {window}-token sliding window: vLLM keeps the window per sequence, "
                         "and the plan counts sequences and tokens as vLLM does")
        elif isinstance(cfg.get("layer_types"), list) or arch in ALTERNATING_LAYER_TYPES:
            window_out, window_layers = window, count
            notes.append(f"{count} of {layers} layers use a {window}-token sliding window, the others the whole "
                         "length: on a GPU vLLM groups them by kind and keeps the window per sequence in the "
                         "sliding groups, and the plan counts tokens as vLLM does (on a CPU every layer keeps the "
                         "whole length)")
        else:
            notes.append(f"{count} of {layers} layers use a {window}-token sliding window; the KV estimate sizes "
                         "them at full length (an over-estimate: vLLM will report more KV tokens than planned)")
    return ConfigShape(
        architecture=arch, num_layers=layers, num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        max_context_length=context, hidden_size=hidden, activation_intermediate=per_token_mlp, vocab_size=vocab,
        params=params, embedding_params=embeddings, bytes_per_param=_bytes_per_param(cfg), kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope, experts=experts, notes=notes,
        rotary_dim=rope or int(head_dim * float(cfg.get("partial_rotary_factor") or 1.0)), sliding_window=window_out,
        sliding_window_layers=window_layers, checkpoint_quantization=checkpoint_quantization(cfg))


def checkpoint_quantization(cfg: Mapping[str, Any]) -> str:
    """The checkpoint's `quantization_config.quant_method`, lower-case; "none" for an unquantized checkpoint."""
    quant = cfg.get("quantization_config")
    if not isinstance(quant, Mapping):
        return "none"
    return str(quant.get("quant_method") or "unknown").lower()
