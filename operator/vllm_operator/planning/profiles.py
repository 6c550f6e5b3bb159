"""Workload class profiles: what each class means for both pools, the split between them, and the scheduler.

A class is a promise about traffic (how long prompts are, how much is generated, how many users at once), so the
profile carries both the engine settings and the numbers the planner checks the hardware against: a typical
sequence length (for the capacity figure) and the concurrency at full length below which the plan warns.

| class | pool | maxModelLen | maxTokens | threshold | seqs | batched | chunked | KV dtype | typical | need | routing |
|---|---|---|---|---|---|---|---|---|---|---|---|
| chat | short | 4096 | 512 | 3584 | 128 | 4096 | default | model | 1024 | 16 | least-outstanding |
| chat | long | 16384 | 1024 | | 32 | 8192 | explicit | model | 6144 | 2 | least-outstanding |
| multi-turn | short | 8192 | 1024 | 7168 | 64 | 8192 | default | model | 3072 | 8 | prefix |
| multi-turn | long | 32768 | 2048 | | 16 | 8192 | explicit | model | 12288 | 2 | prefix |
| rag | short | 16384 | 2048 | 14336 | 32 | 8192 | explicit | model | 6144 | 4 | prefix |
| rag | long | 32768 | 2048 | | 16 | 8192 | explicit | model | 20480 | 2 | prefix |
| long-doc | short | 8192 | 1024 | 7168 | 64 | 8192 | default | model | 3072 | 8 | prefix |
| long-doc | long | 32768 | 4096 | | 8 | 8192 | explicit | FP8 if native | 24576 | 2 | prefix |

(seqs = max_num_seqs; batched = max_num_batched_tokens; chunked: `explicit` passes `--enable-chunked-prefill`,
`default` leaves vLLM's default, which is on; typical = a typical prompt + output, for the capacity figure; need =
sequences at full maxModelLen the class expects to fit at once — below it the plan warns; routing =
`routing.pools.<pool>.strategy`, how the router picks a replica inside the pool.)

Rules behind the numbers:
* The threshold is the short pool's maxModelLen minus its maxTokens: a prompt below it always has room for a full
  answer in the short pool (the router still checks prompt + max_tokens per request).
* Starting points are the seeds' scenario table (chat 4096/512, multi-turn 8192/1024, RAG 16384/2048, long-doc
  32768/4096 for the long pool); the long pools of chat and multi-turn are overflow pools for the rare long prompt.
* `--enable-chunked-prefill` is passed explicitly where the class wants it and wherever maxModelLen exceeds
  max_num_batched_tokens (a prompt longer than one batch can only be prefilled in chunks). Long-doc bounds the chunk
  at 8192 tokens so decode steps of other sequences are not starved by a 32K prefill, and keeps max_num_seqs low.
* FP8 KV is chosen by the profile only where the GPU runs it natively (Ada SM89 / Hopper SM90: L4, L40S, H100, H200),
  see `catalog.kv_dtype_verdict`; elsewhere it is allowed when the spec asks.
* Routing: `prefix` where requests share long prefixes that are worth keeping on one replica's KV cache — the
  history of a conversation (multi-turn), retrieved documents and instructions (rag), the document a follow-up asks
  about (long-doc); `least-outstanding` for chat, whose short prompts cost little to prefill again, so even load
  matters more than cache reuse. Prefix routing is bounded by load (a replica never takes more than 1.25x the
  pool's mean requests in flight), so a hot prefix cannot swamp one replica.
* gpu_memory_utilization 0.90 for every GPU pool (vLLM's default is 0.92; the margin covers CUDA graphs, which vLLM
  captures outside the budget).
Every value can be overridden per pool in the spec; overrides go through the same checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_operator.api.spec import RoutingStrategy, WorkloadClass

DEFAULT_GPU_MEMORY_UTILIZATION = 0.90


@dataclass(frozen=True)
class PoolProfile:
    """Defaults for one pool of a class."""

    max_model_len: int
    max_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    prefer_fp8_kv: bool
    typical_sequence_tokens: int
    required_concurrency: float
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    routing: RoutingStrategy = RoutingStrategy.PREFIX


@dataclass(frozen=True)
class ClassProfile:
    """A workload class: both pools and the prompt-length threshold between them."""

    name: WorkloadClass
    short: PoolProfile
    long: PoolProfile
    prompt_length_threshold: int
    description: str

    def pool(self, name: str) -> PoolProfile:
        return self.short if name == "short" else self.long


PROFILES: dict[WorkloadClass, ClassProfile] = {
    WorkloadClass.CHAT: ClassProfile(
        WorkloadClass.CHAT,
        short=PoolProfile(4096, 512, 128, 4096, False, False, 1024, 16,
                          routing=RoutingStrategy.LEAST_OUTSTANDING),
        long=PoolProfile(16384, 1024, 32, 8192, True, False, 6144, 2, routing=RoutingStrategy.LEAST_OUTSTANDING),
        prompt_length_threshold=3584,
        description="interactive chat: short prompts, short answers, many users; long pool for overflow"),
    WorkloadClass.MULTI_TURN: ClassProfile(
        WorkloadClass.MULTI_TURN,
        short=PoolProfile(8192, 1024, 64, 8192, False, False, 3072, 8),
        long=PoolProfile(32768, 2048, 16, 8192, True, False, 12288, 2),
        prompt_length_threshold=7168,
        description="agent / multi-turn conversations: the history grows with every turn"),
    WorkloadClass.RAG: ClassProfile(
        WorkloadClass.RAG,
        short=PoolProfile(16384, 2048, 32, 8192, True, False, 6144, 4),
        long=PoolProfile(32768, 2048, 16, 8192, True, False, 20480, 2),
        prompt_length_threshold=14336,
        description="retrieval-augmented answers: retrieved context makes prompts long by nature"),
    WorkloadClass.LONG_DOC: ClassProfile(
        WorkloadClass.LONG_DOC,
        short=PoolProfile(8192, 1024, 64, 8192, False, False, 3072, 8),
        long=PoolProfile(32768, 4096, 8, 8192, True, True, 24576, 2),
        prompt_length_threshold=7168,
        description="long documents: 32K prompts with chunked prefill and FP8 KV; short pool for follow-ups"),
}


def profile(workload_class: WorkloadClass) -> ClassProfile:
    return PROFILES[workload_class]
