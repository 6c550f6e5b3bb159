"""Facts the planner sizes against: GPUs (memory, compute capability, node labels, KV dtypes) and models.

Everything here is data with its source noted, so a wrong number is a one-line fix with a reason, and the planner's
arithmetic never hides a constant. Three kinds of facts:

* **GPU types** (`GPUS`): the memory CUDA reports as the device's total (`torch.cuda.mem_get_info()[1]`, the figure
  vLLM multiplies by `--gpu-memory-utilization`) — not the marketing size and not nvidia-smi's MiB, which include
  memory the driver reserves. The GPU feature discovery (GFD) product strings identify the type on a node
  (`nvidia.com/gpu.product` is NVML's device name with spaces replaced by '-').
* **KV cache dtypes** (`KV_DTYPE_TABLE`): per vLLM attention backend and compute capability, which `--kv-cache-dtype`
  values work. The planner turns that into default / allowed on request / refused for a GPU (`kv_dtype_verdict`).
* **Models** (`MODELS`): the architecture numbers KV math needs, keyed case-insensitively by Hugging Face id, with
  base-model ids as aliases. A Hugging Face `config.json` (`facts_from_hf_config`, read by `hf_config` for the
  architectures it understands, experts and latent attention included) or the spec's `model.facts` stand in for a
  model outside the catalog.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_operator import constants
from vllm_operator.api.errors import SpecError
from vllm_operator.api.plan import AcceleratorFacts
from vllm_operator.api.spec import ModelFacts, WeightsDtype
from vllm_operator.constants import KVVerdict, kv_dtype_verdict
from vllm_operator.planning import hf_config

GIB = 1 << 30
MIB = 1 << 20


# ---------------------------------------------------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuType:
    """One catalog GPU type."""

    name: str
    usable_gib: float
    compute_capability: tuple[int, int]
    products: tuple[str, ...]
    source: str

    @property
    def usable_bytes(self) -> int:
        return int(self.usable_gib * GIB)


# Usable memory = total device memory as CUDA reports it (torch.cuda.mem_get_info()[1]; also the "X GiB total
# capacity" in PyTorch's OOM message), of the smallest variant the type's product strings name: engine pods select
# every one of them (SXM and PCIe alike), so the plan must fit the smallest (the variants listed have the same
# memory). Sources: H200 measured here (benchmarks/gpu, 139.8 GiB visible); the others from PyTorch OOM messages and
# `nvidia-smi --query-gpu=memory.total` (MiB, minus ~0.5 GiB the driver keeps) as quoted in public vLLM/PyTorch issue
# threads. Compute capability: NVIDIA's CUDA GPUs table.
GPUS: tuple[GpuType, ...] = (
    GpuType("nvidia-t4-16gb", 14.56, (7, 5), ("Tesla-T4", "NVIDIA-T4"),
            "PyTorch OOM messages on T4 (Colab/Kaggle): 'total capacity of 14.56 GiB' (older drivers 14.74)"),
    GpuType("nvidia-a10g-24gb", 22.0, (8, 6), ("NVIDIA-A10G",),
            "PyTorch OOM messages on AWS g5: 'total capacity of 22.06 GiB'; rounded down"),
    GpuType("nvidia-l4-24gb", 22.0, (8, 9), ("NVIDIA-L4",),
            "PyTorch OOM messages on GCP g2: 'total capacity of 22.03 GiB'; rounded down"),
    GpuType("nvidia-l40s-48gb", 44.4, (8, 9), ("NVIDIA-L40S",),
            "PyTorch OOM message 'total capacity of 44.53 GiB' (Wan-Video/Wan2.1#205); rounded down"),
    GpuType("nvidia-a100-40gb", 39.4, (8, 0),
            ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB", "A100-SXM4-40GB", "A100-PCIE-40GB"),
            "nvidia-smi 40960 MiB; PyTorch reports 39.4-39.6 GiB total capacity; the lower figure is kept"),
    GpuType("nvidia-a100-80gb", 79.2, (8, 0),
            ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe", "NVIDIA-A100-PCIE-80GB", "A100-SXM4-80GB"),
            "nvidia-smi 81920 MiB; PyTorch reports ~79.2 GiB total capacity"),
    GpuType("nvidia-h100-80gb", 79.2, (9, 0),
            ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-SXM5-80GB"),
            "nvidia-smi 81559 MiB; PyTorch reports 79.1-79.2 GiB total capacity"),
    GpuType("nvidia-h200-141gb", 139.8, (9, 0), ("NVIDIA-H200", "NVIDIA-H200-NVL"),
            "measured on the project's H200 with vLLM 0.26: 139.8 GiB visible (benchmarks/gpu)"),
)
GPUS_BY_NAME: dict[str, GpuType] = {g.name: g for g in GPUS}

# GFD appends this to the product name when a GPU is time-sliced: each pod gets a share of the card, not the card.
SHARED_SUFFIX = "-SHARED"


def gpu_type(name: str) -> GpuType:
    """The catalog entry for a GPU type name; SpecError for anything else."""
    try:
        return GPUS_BY_NAME[name]
    except KeyError:
        known = ", ".join(g.name for g in GPUS)
        raise SpecError("spec.accelerator.type", f"unknown GPU type {name!r} (known: {known}, cpu, auto)") from None


def gpu_type_for_product(product: str) -> GpuType | None:
    """Match a GFD `nvidia.com/gpu.product` value (case-insensitively) to a catalog type; MIG slices match nothing."""
    wanted = product.strip().upper().removesuffix(SHARED_SUFFIX)
    if "-MIG-" in wanted:
        return None  # a MIG slice has a fraction of the card's memory: not a catalog type
    for gpu in GPUS:
        if any(p.upper() == wanted for p in gpu.products):
            return gpu
    return None


def shared_gpu(labels: Mapping[str, str]) -> str | None:
    """How a node's GPUs are time-sliced (GFD's `-SHARED` product suffix or `nvidia.com/gpu.replicas` above 1), or
    None. vLLM sizes its KV cache from `utilization × total` of the card; several pods on one card each take that
    share, and the second one runs out of memory. The planner does not plan for shares, so such nodes are neither a
    target for `auto` nor selected by the engine pods' node affinity."""
    product = labels.get(constants.GFD_PRODUCT, "")
    replicas = labels.get(constants.GFD_REPLICAS, "")
    shared_product = product.upper().endswith(SHARED_SUFFIX)
    many = replicas.isdigit() and int(replicas) > 1
    if not shared_product and not many:
        return None
    parts = [f"{constants.GFD_PRODUCT}={product}"] if shared_product else []
    if replicas:
        parts.append(f"{constants.GFD_REPLICAS}={replicas}")
    return ", ".join(parts)


def gpu_products(gpu_type_name: str, seen: str | None = None) -> list[str]:
    """The GFD product strings engine pods may schedule on for a type: every variant the catalog lists, plus the
    exact spelling a node was seen with (`auto`), never a time-sliced `-SHARED` one."""
    products = list(GPUS_BY_NAME[gpu_type_name].products)
    if seen and seen not in products and not seen.upper().endswith(SHARED_SUFFIX):
        products.append(seen)
    return sorted(products)


def gpu_facts(gpu: GpuType, count: int, product: str | None = None) -> AcceleratorFacts:
    return AcceleratorFacts(type=gpu.name, count=count, memory_bytes=gpu.usable_bytes,
                            compute_capability=gpu.compute_capability, product=product or gpu.products[0],
                            is_gpu=True)


def cpu_facts(memory_gib: float) -> AcceleratorFacts:
    return AcceleratorFacts(type="cpu", count=1, memory_bytes=int(memory_gib * GIB), compute_capability=None,
                            product=None, is_gpu=False)


def accelerator_from_node_labels(labels: Mapping[str, str], count: int) -> AcceleratorFacts | None:
    """Resolve `accelerator.type: auto` from a node's GPU feature discovery labels; None if not a catalog GPU or
    time-sliced (`shared_gpu`).

    The catalog's usable memory is used, not `nvidia.com/gpu.memory` (nvidia-smi's MiB include what the driver
    keeps). When the labels carry a compute capability that contradicts the catalog, the node is not trusted (None).
    """
    product = labels.get(constants.GFD_PRODUCT)
    if not product or shared_gpu(labels) is not None:
        return None
    gpu = gpu_type_for_product(product)
    if gpu is None:
        return None
    major, minor = labels.get(constants.GFD_COMPUTE_MAJOR), labels.get(constants.GFD_COMPUTE_MINOR)
    if major is not None and minor is not None:
        try:
            if (int(major), int(minor)) != gpu.compute_capability:
                return None
        except ValueError:
            return None
    return gpu_facts(gpu, count, product=product)


def native_fp8(cc: tuple[int, int] | None) -> bool:
    """Whether a profile may choose FP8 KV on its own for this device."""
    return kv_dtype_verdict(cc, "fp8") is KVVerdict.DEFAULT


def kv_dtype_bytes(dtype: str) -> int:
    return 1 if dtype.startswith("fp8") else 2


# ---------------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelInfo:
    """What the planner knows about a model's shape."""

    name: str
    num_layers: int
    num_attention_heads: int | None
    num_kv_heads: int
    head_dim: int
    max_context_length: int
    weights_gib: float
    hidden_size: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    aliases: tuple[str, ...] = ()
    source: str = ""
    trust_remote_code: bool = False  # the checkpoint's tokenizer/config classes live in the repo's own code
    kv_lora_rank: int | None = None  # multi-head latent attention: one latent vector per layer and token
    qk_rope_head_dim: int | None = None
    tied_embeddings: bool = False  # one vocab x hidden matrix for the embeddings and the LM head
    sliding_window: int | None = None  # sliding layers keep only this many tokens per sequence (vLLM's window)
    sliding_window_layers: int | None = None  # how many layers slide (None: all of them, when sliding_window is set)

    @property
    def latent_kv_dim(self) -> int | None:
        """Values an MLA layer caches per token (kv_lora_rank + qk_rope_head_dim); None for per-head K and V."""
        if self.kv_lora_rank is None or self.qk_rope_head_dim is None:
            return None
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def weights_bytes(self) -> int:
        return int(self.weights_gib * GIB)

    @property
    def est_hidden_size(self) -> int:
        if self.hidden_size:
            return self.hidden_size
        heads = self.num_attention_heads or self.num_kv_heads * 4
        return heads * self.head_dim

    @property
    def est_intermediate_size(self) -> int:
        return self.intermediate_size or int(3.5 * self.est_hidden_size)

    @property
    def est_vocab_size(self) -> int:
        return self.vocab_size or 128_256


def _bf16(params: int, context: int, rotary_dim: int = 128) -> float:
    """bf16 weights in GiB as vLLM counts them: the tensors, the RoPE cache and a fixed extra
    (`hf_config.load_extra_bytes`; Llama-3.1-8B: 14.96 GiB of tensors, reported by vLLM 0.26 as 15.04 GiB)."""
    return round((params * 2 + hf_config.load_extra_bytes(context, rotary_dim)) / GIB, 2)


# Sources: each model's config.json on the Hugging Face Hub (num_hidden_layers, num_attention_heads,
# num_key_value_heads, hidden_size / num_attention_heads, max_position_embeddings, intermediate_size, vocab_size) and
# the parameter count of its safetensors index. glm-4-9b uses ChatGLM names (num_layers, multi_query_group_num,
# kv_channels, seq_length, ffn_hidden_size, padded_vocab_size).
MODELS: tuple[ModelInfo, ...] = (
    ModelInfo("meta-llama/Llama-3.1-8B-Instruct", 32, 32, 8, 128, 131_072, 15.04, 4096, 14336, 128_256,
              ("meta-llama/Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B"),
              "HF config.json; weights as vLLM 0.26 reported them on the H200"),
    ModelInfo("meta-llama/Llama-3.1-70B-Instruct", 80, 64, 8, 128, 131_072, _bf16(70_553_706_496, 131_072), 8192, 28672,
              128_256, ("meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B-Instruct",
                        "meta-llama/Meta-Llama-3.1-70B"), "HF config.json; 70.55 B params"),
    ModelInfo("Qwen/Qwen2.5-7B-Instruct", 28, 28, 4, 128, 32_768, _bf16(7_615_616_512, 32_768), 3584, 18944, 152_064,
              ("Qwen/Qwen2.5-7B",), "HF config.json (32768 native; 131072 only with YaRN rope scaling); 7.62 B"),
    ModelInfo("Qwen/Qwen2.5-72B-Instruct", 80, 64, 8, 128, 32_768, _bf16(72_706_203_648, 32_768), 8192, 29568, 152_064,
              ("Qwen/Qwen2.5-72B",), "HF config.json (32768 native; 131072 only with YaRN); 72.71 B params"),
    ModelInfo("mistralai/Mistral-7B-Instruct-v0.3", 32, 32, 8, 128, 32_768, _bf16(7_248_023_552, 32_768), 4096, 14336,
              32_768, ("mistralai/Mistral-7B-v0.3",), "HF config.json; 7.25 B params"),
    ModelInfo("THUDM/glm-4-9b-chat", 40, 32, 2, 128, 131_072, _bf16(9_399_951_360, 131_072), 4096, 13696, 151_552,
              ("zai-org/glm-4-9b-chat",),
              "HF config.json (ChatGLM names; seq_length 131072, multi_query_group_num 2); 9.40 B params",
              trust_remote_code=True),
    ModelInfo("THUDM/glm-4-9b-chat-hf", 40, 32, 2, 128, 131_072, _bf16(9_399_951_360, 131_072), 4096, 13696, 151_552,
              ("zai-org/glm-4-9b-chat-hf",), "the transformers-native (Glm) port of glm-4-9b-chat: same shape"),
    ModelInfo("THUDM/glm-4-9b", 40, 32, 2, 128, 8_192, _bf16(9_399_951_360, 8_192), 4096, 13696, 151_552,
              ("zai-org/glm-4-9b",), "the base model of glm-4-9b-chat: same shape, but seq_length 8192",
              trust_remote_code=True),
    # Mixture of experts: the weights hold every expert; activations see the experts a token is routed to
    # (intermediate = num_experts_per_tok x moe_intermediate_size).
    ModelInfo("Qwen/Qwen3-30B-A3B", 48, 32, 4, 128, 40_960, 56.91, 2048, 8 * 768, 151_936, (),
              "HF config.json (Qwen3MoeForCausalLM: 128 experts of width 768, 8 per token, untied embeddings; "
              "30.53 B params = 56.87 GiB of bf16 tensors); weights as vLLM 0.26 loaded them on the H200 "
              "('Model loading took 56.91 GiB')"),
    ModelInfo("mistralai/Mixtral-8x7B-Instruct-v0.1", 32, 32, 8, 128, 32_768, _bf16(46_702_792_704, 32_768), 4096,
              2 * 14336, 32_000, ("mistralai/Mixtral-8x7B-v0.1",),
              "HF config.json (MixtralForCausalLM: 8 experts of width 14336, 2 per token, sliding_window null); "
              "46.70 B params"),
)
_MODEL_INDEX: dict[str, ModelInfo] = {}
for _m in MODELS:
    for _key in (_m.name, *_m.aliases):
        _MODEL_INDEX[_key.lower()] = _m


def catalog_model(name: str) -> ModelInfo | None:
    """Look a Hugging Face id up case-insensitively (aliases included)."""
    return _MODEL_INDEX.get(name.strip().lower())


QUANTIZED_GROUP_SIZE = 128
"""The group size of the published AWQ/GPTQ checkpoints of catalog models (AutoAWQ's and the Qwen/TheBloke GPTQ
defaults); symmetric GPTQ, AWQ with zero points."""


def quantized_weights_bytes(model: ModelInfo, quantization: str) -> int:
    """Weights of a quantized checkpoint of a catalog model, as vLLM loads them: embeddings and LM head stay 16-bit,
    the linear layers take the format's bytes per weight with group scales and zeros
    (`hf_config.grouped_int_bytes`), the RoPE cache and fixed extra stay. The bf16 tensors are read back from the
    catalog's size."""
    extra = hf_config.load_extra_bytes(model.max_context_length, model.head_dim)
    params = max(model.weights_bytes - extra, 0) / 2
    embeddings = min(model.est_vocab_size * model.est_hidden_size * (1 if model.tied_embeddings else 2), params)
    per_weight = {"fp8": 1.0, "awq": hf_config.grouped_int_bytes(4, QUANTIZED_GROUP_SIZE, zero_points=True),
                  "gptq": hf_config.grouped_int_bytes(4, QUANTIZED_GROUP_SIZE, zero_points=False)}[quantization]
    return int((params - embeddings) * per_weight + embeddings * 2 + extra)


_WEIGHT_BYTES = {WeightsDtype.BFLOAT16: 2.0, WeightsDtype.FLOAT16: 2.0, WeightsDtype.FP8: 1.0, WeightsDtype.INT4: 0.5}


def model_from_facts(name: str, facts: ModelFacts) -> ModelInfo:
    """A ModelInfo from the spec's `model.facts`."""
    if facts.weights_gib is not None:
        weights = facts.weights_gib
    else:
        assert facts.params_billions is not None  # the API model guarantees one of the two
        per_param = _WEIGHT_BYTES[facts.weights_dtype or WeightsDtype.BFLOAT16]
        extra = hf_config.load_extra_bytes(facts.max_context_length, facts.qk_rope_head_dim or facts.head_dim)
        weights = round((facts.params_billions * 1e9 * per_param + extra) / GIB, 2)
    return ModelInfo(name, facts.num_layers, facts.num_attention_heads, facts.num_kv_heads, facts.head_dim,
                     facts.max_context_length, weights, hidden_size=facts.hidden_size,
                     intermediate_size=facts.intermediate_size, vocab_size=facts.vocab_size,
                     source="spec.model.facts", kv_lora_rank=facts.kv_lora_rank,
                     qk_rope_head_dim=facts.qk_rope_head_dim, sliding_window=facts.sliding_window,
                     sliding_window_layers=facts.sliding_window_layers)


def facts_from_hf_config(config: Mapping[str, Any], *, weights_gib: float | None = None,
                         origin: str = "config.json", notes: list[str] | None = None) -> ModelFacts:
    """`spec.model.facts` for a Hugging Face config.json of an architecture the estimator understands
    (`hf_config.SUPPORTED_ARCHITECTURES`): dense, mixture-of-experts and multi-head-latent-attention models.

    Weights are not in config.json: pass `weights_gib`, else they are estimated from the shape (every expert
    counted). What the estimate simplifies or how it counts sliding layers is appended to `notes`.
    SpecError names the missing key or lists the supported architectures.
    """
    shape = hf_config.read(config, origin)
    if notes is not None:
        notes.extend(shape.notes)
    if weights_gib is None:
        weights_gib = shape.weights_gib()
        if weights_gib is None:
            raise SpecError(origin, f"quantization_config {config.get('quantization_config')!r} is not one the "
                            "weight estimate knows (fp8, 4/8-bit awq or gptq); give the size with --weights-gib")
    return ModelFacts(num_layers=shape.num_layers, num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                      max_context_length=shape.max_context_length, num_attention_heads=shape.num_attention_heads,
                      weights_gib=weights_gib, kv_lora_rank=shape.kv_lora_rank,
                      qk_rope_head_dim=shape.qk_rope_head_dim, hidden_size=shape.hidden_size,
                      intermediate_size=shape.activation_intermediate, vocab_size=shape.vocab_size,
                      sliding_window=shape.sliding_window, sliding_window_layers=shape.sliding_window_layers,
                      checkpoint_quantization=shape.checkpoint_quantization)
