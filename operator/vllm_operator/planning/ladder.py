"""The step-down ladder: what the planner changes, rung by rung, after a pool keeps running out of memory.

Two paths, because the two failures need different medicine (docs/architecture.md, Who restarts what):

* **EngineOOM** (CUDA OOM at run time: memory outside the KV cache ran out) climbs `STEP_DOWN_LADDER`, cheapest
  headroom first:
  1. lower gpu_memory_utilization by 0.05 (CPU pools: 10 % less KV bytes) — gives memory back to activations and
     CUDA graphs at the price of KV tokens only;
  2. halve max_num_batched_tokens — activations shrink linearly with it; prefill gets slower;
  3. halve max_num_seqs — fewer sequences in flight, smaller sampler buffers;
  4. FP8 KV cache where the GPU allows it — doubles tokens per byte, so the lower utilisation costs no capacity.
* **KVCacheTooSmall** (vLLM refused to start: one maxModelLen sequence does not fit the KV cache it found) climbs
  `KV_LADDER`: 1. FP8 KV where allowed; 2. halve maxModelLen — only with `remediation.allowLowerMaxModelLen`,
  because it changes what clients may send.

Levels are positions in these tuples: level N applies rungs 1..N. A rung that cannot change anything for a pool
(FP8 on a GPU that refuses it, a value at its floor) is a no-op, and `next_rung` skips it. The functions
that take a `Plan` serve the health policy: it holds the plan in effect and asks whether another rung exists and
what moving there changes (for events and `status.pools.<p>.stepDown.history`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from vllm_operator.api.plan import Plan

UTILIZATION_STEP = 0.05
UTILIZATION_FLOOR = 0.50
CPU_KV_STEP = 0.10
CPU_KV_FLOOR = 0.50
BATCHED_TOKENS_FLOOR = 512
SEQS_FLOOR = 1
FP8 = "fp8"


@dataclass(frozen=True)
class Settings:
    """The values the ladders change."""

    gpu_memory_utilization: float | None  # None for CPU pools
    cpu_kv_fraction: float                # CPU pools: share of the planned KV bytes passed to vLLM
    max_num_batched_tokens: int
    max_num_seqs: int
    kv_cache_dtype: str
    max_model_len: int
    max_tokens: int
    fp8_allowed: bool
    min_max_model_len: int = 1            # the long pool may not go below the short pool's maxModelLen


@dataclass(frozen=True)
class Rung:
    """One rung: its name (the flag it moves) and how it changes the settings."""

    name: str
    apply: Callable[[Settings], Settings]


def _lower_memory(s: Settings) -> Settings:
    if s.gpu_memory_utilization is None:
        return replace(s, cpu_kv_fraction=round(max(CPU_KV_FLOOR, s.cpu_kv_fraction - CPU_KV_STEP), 4))
    return replace(s, gpu_memory_utilization=round(max(UTILIZATION_FLOOR, s.gpu_memory_utilization
                                                       - UTILIZATION_STEP), 4))


def _halve_batched(s: Settings) -> Settings:
    # vLLM refuses max_num_batched_tokens below max_num_seqs: that is a floor too.
    floor = max(BATCHED_TOKENS_FLOOR, s.max_num_seqs)
    return replace(s, max_num_batched_tokens=max(floor, min(s.max_num_batched_tokens, s.max_num_batched_tokens // 2)))


def _halve_seqs(s: Settings) -> Settings:
    return replace(s, max_num_seqs=max(SEQS_FLOOR, min(s.max_num_seqs, s.max_num_seqs // 2)))


def _fp8(s: Settings) -> Settings:
    if not s.fp8_allowed or s.kv_cache_dtype.startswith("fp8"):
        return s
    return replace(s, kv_cache_dtype=FP8)


def _halve_len(s: Settings) -> Settings:
    new = max(s.max_model_len // 2, s.min_max_model_len)
    if new >= s.max_model_len or new <= s.max_tokens:
        return s  # nothing to give: the prompt needs room above maxTokens
    return replace(s, max_model_len=new)


STEP_DOWN_LADDER: tuple[Rung, ...] = (
    Rung("gpu-memory-utilization", _lower_memory),
    Rung("max-num-batched-tokens", _halve_batched),
    Rung("max-num-seqs", _halve_seqs),
    Rung("kv-cache-dtype", _fp8),
)
KV_LADDER: tuple[Rung, ...] = (
    Rung("kv-cache-dtype", _fp8),
    Rung("max-model-len", _halve_len),
)


def apply_levels(ladder: tuple[Rung, ...], settings: Settings, level: int, first: int = 0) -> Settings:
    """Apply rungs first+1..level (levels past the ladder's end apply nothing more)."""
    for rung in ladder[first:min(level, len(ladder))]:
        settings = rung.apply(settings)
    return settings


def kv_ladder_for(allow_lower_max_model_len: bool) -> tuple[Rung, ...]:
    return KV_LADDER if allow_lower_max_model_len else KV_LADDER[:1]


def describe_change(before: Settings, after: Settings) -> str:
    """`gpu-memory-utilization 0.9->0.85, max-num-seqs 64->32`; "no change" when nothing moved."""
    parts = []
    for label, a, b in (("gpu-memory-utilization", before.gpu_memory_utilization, after.gpu_memory_utilization),
                        ("kv-cache-memory share", before.cpu_kv_fraction, after.cpu_kv_fraction),
                        ("max-num-batched-tokens", before.max_num_batched_tokens, after.max_num_batched_tokens),
                        ("max-num-seqs", before.max_num_seqs, after.max_num_seqs),
                        ("kv-cache-dtype", before.kv_cache_dtype, after.kv_cache_dtype),
                        ("max-model-len", before.max_model_len, after.max_model_len)):
        if a != b:
            parts.append(f"{label} {a}->{b}")
    return ", ".join(parts) or "no change"


# --- the health policy's view: a Plan in effect -------------------------------------------------------------------

def settings_of(plan: Plan, pool_name: str, cpu_kv_fraction: float = 1.0) -> Settings:
    """The ladder's settings of a pool plan as planned."""
    pool = plan.pools[pool_name]
    other = plan.pools.get("short")
    floor = other.max_model_len if pool_name == "long" and other is not None and other.enabled else 1
    return Settings(gpu_memory_utilization=pool.gpu_memory_utilization, cpu_kv_fraction=cpu_kv_fraction,
                    max_num_batched_tokens=pool.max_num_batched_tokens, max_num_seqs=pool.max_num_seqs,
                    kv_cache_dtype=pool.kv_cache_dtype, max_model_len=pool.max_model_len,
                    max_tokens=pool.max_tokens, fp8_allowed=pool.fp8_kv_allowed, min_max_model_len=floor)


def next_rung(plan: Plan, pool: str, *, kv: bool = False, allow_lower_max_model_len: bool = False
              ) -> tuple[int, str] | None:
    """The next rung above the pool's current level that changes something, and what moving there changes (e.g.
    `gpu-memory-utilization 0.9->0.85`): on the EngineOOM ladder, or with `kv` on the KVCacheTooSmall one; None
    when the ladder has nothing left."""
    the_pool = plan.pools[pool]
    rungs, current = ((kv_ladder_for(allow_lower_max_model_len), the_pool.kv_level) if kv
                      else (STEP_DOWN_LADDER, the_pool.step_down_level))
    settings = settings_of(plan, pool)
    for level in range(current + 1, len(rungs) + 1):
        if rungs[level - 1].apply(settings) != settings:
            return level, describe_change(settings, apply_levels(rungs, settings, level, current))
    return None
