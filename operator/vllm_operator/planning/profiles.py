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
* Autoscaling defaults (used when a pool sets `autoscaling`, for every field it leaves out; maxReplicas has no
  default, it is what the pool may spend):

  | class | pool | minReplicas | metric | target per replica | scale-down window | idle before 0 |
  |---|---|---|---|---|---|---|
  | chat | short | 1 | num-requests-waiting | 4 | 300 s | |
  | chat | long | 0 | num-requests-waiting | 2 | 300 s | 600 s |
  | multi-turn | short | 1 | num-requests-waiting | 4 | 300 s | |
  | multi-turn | long | 0 | num-requests-waiting | 2 | 300 s | 900 s |
  | rag | short | 1 | num-requests-waiting | 4 | 300 s | |
  | rag | long | 1 | num-requests-waiting | 2 | 300 s | |
  | long-doc | short | 1 | num-requests-waiting | 4 | 300 s | |
  | long-doc | long | 1 | kv-cache-usage | 0.8 | 300 s | |

  Waiting requests are the queue users feel, and vLLM queues only when the running batch is out of KV blocks or
  sequence slots, so it says "one more replica helps" directly; long-doc's long pool fills its KV cache with a few
  32K sequences before it queues, so it scales on KV usage. The long pools of chat and multi-turn are overflow pools
  and sleep at 0 when idle (a wake costs one engine start, 90-150 s on an H200: idle times are several times that);
  rag and long-doc send much of their traffic long and keep one replica. 300 s is the HPA's own scale-down default.
Every value can be overridden per pool in the spec; overrides go through the same checks.

This table is the one source of the four built-in VLLMWorkloadClass objects the chart installs (`builtin_classes`,
written by `make crds`); a class read from the cluster becomes a ClassProfile through `from_class`, so the planner
sees one shape whichever way a class arrives.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_operator import constants
from vllm_operator.api.remediation import default_thresholds
from vllm_operator.api.spec import AutoscalingMetric, RemediationThresholds, RoutingStrategy, Tier, WorkloadClass
from vllm_operator.api.workload_class import (
    ClassAutoscaling,
    ClassPool,
    ClassPools,
    KVCachePolicy,
    VLLMWorkloadClassSpec,
)

DEFAULT_GPU_MEMORY_UTILIZATION = 0.90


@dataclass(frozen=True)
class AutoscalingProfile:
    """A pool's autoscaling defaults (see the table above)."""

    min_replicas: int
    metric: AutoscalingMetric
    target: float
    scale_down_stabilization_seconds: int = 300
    idle_seconds: int = 600


WAITING = AutoscalingMetric.NUM_REQUESTS_WAITING
SHORT_AUTOSCALING = AutoscalingProfile(1, WAITING, 4)
LONG_AUTOSCALING = AutoscalingProfile(1, WAITING, 2)
"""The defaults for a class from the cluster that names none (like the built-in rag's: no pool sleeps unasked)."""


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
    autoscaling: AutoscalingProfile | None = None
    """None: SHORT_AUTOSCALING / LONG_AUTOSCALING for the pool it is (see ClassProfile.autoscaling)."""


@dataclass(frozen=True)
class ClassProfile:
    """A workload class: both pools and the prompt-length threshold between them."""

    name: str
    short: PoolProfile
    long: PoolProfile
    prompt_length_threshold: int
    description: str
    tiers: tuple[Tier, ...] = ()
    generation: int | None = None
    """metadata.generation of the VLLMWorkloadClass this came from; None for a built-in from this table."""
    default: bool = False
    """Marked default: applies to VLLMDeployments that name no class."""
    thresholds: RemediationThresholds | None = None
    """The class's remediation thresholds (None: the operator's defaults); a deployment's own win field by field."""

    def pool(self, name: str) -> PoolProfile:
        return self.short if name == "short" else self.long

    def autoscaling(self, name: str) -> AutoscalingProfile:
        """The pool's autoscaling defaults (the generic ones where the class names none)."""
        own = self.pool(name).autoscaling
        return own if own is not None else (SHORT_AUTOSCALING if name == "short" else LONG_AUTOSCALING)


BUILTIN_THRESHOLDS = default_thresholds()
"""The built-ins state the operator's default thresholds, so `kubectl get vllmwc -o yaml` shows every number."""

PROFILES: dict[WorkloadClass, ClassProfile] = {
    WorkloadClass.CHAT: ClassProfile(
        WorkloadClass.CHAT.value,
        short=PoolProfile(4096, 512, 128, 4096, False, False, 1024, 16,
                          routing=RoutingStrategy.LEAST_OUTSTANDING, autoscaling=SHORT_AUTOSCALING),
        long=PoolProfile(16384, 1024, 32, 8192, True, False, 6144, 2, routing=RoutingStrategy.LEAST_OUTSTANDING,
                         autoscaling=AutoscalingProfile(0, WAITING, 2, idle_seconds=600)),
        prompt_length_threshold=3584,
        description="interactive chat: short prompts, short answers, many users; long pool for overflow",
        thresholds=BUILTIN_THRESHOLDS),
    WorkloadClass.MULTI_TURN: ClassProfile(
        WorkloadClass.MULTI_TURN.value,
        short=PoolProfile(8192, 1024, 64, 8192, False, False, 3072, 8, autoscaling=SHORT_AUTOSCALING),
        long=PoolProfile(32768, 2048, 16, 8192, True, False, 12288, 2,
                         autoscaling=AutoscalingProfile(0, WAITING, 2, idle_seconds=900)),
        prompt_length_threshold=7168,
        description="agent / multi-turn conversations: the history grows with every turn",
        thresholds=BUILTIN_THRESHOLDS),
    WorkloadClass.RAG: ClassProfile(
        WorkloadClass.RAG.value,
        short=PoolProfile(16384, 2048, 32, 8192, True, False, 6144, 4, autoscaling=SHORT_AUTOSCALING),
        long=PoolProfile(32768, 2048, 16, 8192, True, False, 20480, 2, autoscaling=LONG_AUTOSCALING),
        prompt_length_threshold=14336,
        description="retrieval-augmented answers: retrieved context makes prompts long by nature",
        thresholds=BUILTIN_THRESHOLDS),
    WorkloadClass.LONG_DOC: ClassProfile(
        WorkloadClass.LONG_DOC.value,
        short=PoolProfile(8192, 1024, 64, 8192, False, False, 3072, 8, autoscaling=SHORT_AUTOSCALING),
        long=PoolProfile(32768, 4096, 8, 8192, True, True, 24576, 2,
                         autoscaling=AutoscalingProfile(1, AutoscalingMetric.KV_CACHE_USAGE, 0.8)),
        prompt_length_threshold=7168,
        description="long documents: 32K prompts with chunked prefill and FP8 KV; short pool for follow-ups",
        thresholds=BUILTIN_THRESHOLDS),
}


def profile(workload_class: str) -> ClassProfile:
    """The built-in profile of that name (KeyError for any other name)."""
    return PROFILES[WorkloadClass(workload_class)]


def is_builtin(name: str) -> bool:
    return name in {c.value for c in WorkloadClass}


def _pool_to_class(p: PoolProfile) -> ClassPool:
    a = p.autoscaling
    return ClassPool(max_model_len=p.max_model_len, max_tokens=p.max_tokens, max_num_seqs=p.max_num_seqs,
                     max_num_batched_tokens=p.max_num_batched_tokens, chunked_prefill=p.chunked_prefill,
                     kv_cache_policy=KVCachePolicy.FP8_IF_NATIVE if p.prefer_fp8_kv else KVCachePolicy.MODEL,
                     typical_sequence_tokens=p.typical_sequence_tokens, required_concurrency=p.required_concurrency,
                     gpu_memory_utilization=p.gpu_memory_utilization, routing=p.routing,
                     autoscaling=ClassAutoscaling(
                         min_replicas=a.min_replicas, metric=a.metric, target=a.target,
                         scale_down_stabilization_seconds=a.scale_down_stabilization_seconds,
                         idle_seconds=a.idle_seconds) if a is not None else None)


def _pool_from_class(p: ClassPool) -> PoolProfile:
    a = p.autoscaling
    return PoolProfile(p.max_model_len, p.max_tokens, p.max_num_seqs, p.max_num_batched_tokens, p.chunked_prefill,
                       p.kv_cache_policy is KVCachePolicy.FP8_IF_NATIVE, p.typical_sequence_tokens,
                       p.required_concurrency, p.gpu_memory_utilization, p.routing,
                       AutoscalingProfile(a.min_replicas, a.metric, a.target, a.scale_down_stabilization_seconds,
                                          a.idle_seconds) if a is not None else None)


def to_class_spec(prof: ClassProfile) -> VLLMWorkloadClassSpec:
    """A profile as a VLLMWorkloadClass spec (the built-ins the chart installs)."""
    return VLLMWorkloadClassSpec(
        description=prof.description, prompt_length_threshold=prof.prompt_length_threshold,
        pools=ClassPools(short=_pool_to_class(prof.short), long=_pool_to_class(prof.long)),
        tiers=list(prof.tiers) or None, remediation_thresholds=prof.thresholds)


def from_class(name: str, spec: VLLMWorkloadClassSpec, generation: int | None = None) -> ClassProfile:
    """A VLLMWorkloadClass (read from the cluster or from a file) as the profile the planner uses."""
    return ClassProfile(name, short=_pool_from_class(spec.pools.short), long=_pool_from_class(spec.pools.long),
                        prompt_length_threshold=spec.prompt_length_threshold, description=spec.description or "",
                        tiers=tuple(spec.tiers or ()), generation=generation, default=bool(spec.default),
                        thresholds=spec.remediation_thresholds)


def class_object(prof: ClassProfile) -> dict[str, Any]:
    """A VLLMWorkloadClass object for a profile (apiVersion, kind, metadata, spec)."""
    return {"apiVersion": constants.API_VERSION, "kind": constants.CLASS_KIND,
            "metadata": {"name": prof.name, "labels": {constants.LABEL_NAME: constants.APP_NAME}},
            "spec": to_class_spec(prof).to_wire()}


def builtin_classes() -> list[dict[str, Any]]:
    """The four built-in VLLMWorkloadClass objects, in table order."""
    return [class_object(prof) for prof in PROFILES.values()]


def parse_class(obj: Mapping[str, Any]) -> ClassProfile:
    """A VLLMWorkloadClass object as a profile; pydantic's ValidationError for a malformed spec."""
    meta = obj.get("metadata") or {}
    spec = VLLMWorkloadClassSpec.model_validate(obj.get("spec") or {})
    return from_class(str(meta.get("name", "")), spec, meta.get("generation"))
