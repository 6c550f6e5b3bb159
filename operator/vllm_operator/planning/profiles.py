"""The built-in workload classes: what each class means for both pools, the split between them, and the scheduler.

A class is a promise about traffic (how long prompts are, how much is generated, how many users at once), so it
carries both the engine settings and the numbers the planner checks the hardware against: a typical
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
* FP8 KV is chosen by the class only where the GPU runs it natively (Ada SM89 / Hopper SM90: L4, L40S, H100, H200),
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
written by `make crds`). The built-ins are VLLMWorkloadClass specs, the very type a class read from the cluster or
from a file is, so the planner sees one shape (`NamedClass`) whichever way a class arrives, and nothing converts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_operator import constants
from vllm_operator.api.remediation import default_thresholds
from vllm_operator.api.spec import AutoscalingMetric, RoutingStrategy, WorkloadClass
from vllm_operator.api.workload_class import (
    ClassAutoscaling,
    ClassPool,
    ClassPools,
    KVCachePolicy,
    VLLMWorkloadClassSpec,
)

DEFAULT_GPU_MEMORY_UTILIZATION = 0.90
WAITING = AutoscalingMetric.NUM_REQUESTS_WAITING
KV_USAGE = AutoscalingMetric.KV_CACHE_USAGE


def _scaling(min_replicas: int, metric: AutoscalingMetric, target: float, idle_seconds: int = 600) -> ClassAutoscaling:
    return ClassAutoscaling(min_replicas=min_replicas, metric=metric, target=target,
                            scale_down_stabilization_seconds=300, idle_seconds=idle_seconds)


SHORT_AUTOSCALING = _scaling(1, WAITING, 4)
LONG_AUTOSCALING = _scaling(1, WAITING, 2)
"""The defaults for a class from the cluster that names none (like the built-in rag's: no pool sleeps unasked)."""


def _pool(max_model_len: int, max_tokens: int, max_num_seqs: int, max_num_batched_tokens: int, chunked: bool,
          fp8: bool, typical: int, need: float, autoscaling: ClassAutoscaling,
          routing: RoutingStrategy = RoutingStrategy.PREFIX) -> ClassPool:
    """One row of the table above, in its column order."""
    return ClassPool(max_model_len=max_model_len, max_tokens=max_tokens, max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=max_num_batched_tokens, chunked_prefill=chunked,
                     kv_cache_policy=KVCachePolicy.FP8_IF_NATIVE if fp8 else KVCachePolicy.MODEL,
                     typical_sequence_tokens=typical, required_concurrency=need,
                     gpu_memory_utilization=DEFAULT_GPU_MEMORY_UTILIZATION, routing=routing, autoscaling=autoscaling)


def _class(description: str, threshold: int, short: ClassPool, long: ClassPool) -> VLLMWorkloadClassSpec:
    # The built-ins state the operator's default thresholds, so `kubectl get vllmwc -o yaml` shows every number.
    return VLLMWorkloadClassSpec(description=description, prompt_length_threshold=threshold,
                                 pools=ClassPools(short=short, long=long), remediation_thresholds=default_thresholds())


LEAST = RoutingStrategy.LEAST_OUTSTANDING
BUILTINS: dict[WorkloadClass, VLLMWorkloadClassSpec] = {
    WorkloadClass.CHAT: _class(
        "interactive chat: short prompts, short answers, many users; long pool for overflow", 3584,
        _pool(4096, 512, 128, 4096, False, False, 1024, 16, SHORT_AUTOSCALING, LEAST),
        _pool(16384, 1024, 32, 8192, True, False, 6144, 2, _scaling(0, WAITING, 2, idle_seconds=600), LEAST)),
    WorkloadClass.MULTI_TURN: _class(
        "agent / multi-turn conversations: the history grows with every turn", 7168,
        _pool(8192, 1024, 64, 8192, False, False, 3072, 8, SHORT_AUTOSCALING),
        _pool(32768, 2048, 16, 8192, True, False, 12288, 2, _scaling(0, WAITING, 2, idle_seconds=900))),
    WorkloadClass.RAG: _class(
        "retrieval-augmented answers: retrieved context makes prompts long by nature", 14336,
        _pool(16384, 2048, 32, 8192, True, False, 6144, 4, SHORT_AUTOSCALING),
        _pool(32768, 2048, 16, 8192, True, False, 20480, 2, LONG_AUTOSCALING)),
    WorkloadClass.LONG_DOC: _class(
        "long documents: 32K prompts with chunked prefill and FP8 KV; short pool for follow-ups", 7168,
        _pool(8192, 1024, 64, 8192, False, False, 3072, 8, SHORT_AUTOSCALING),
        _pool(32768, 4096, 8, 8192, True, True, 24576, 2, _scaling(1, KV_USAGE, 0.8))),
}


@dataclass(frozen=True)
class NamedClass:
    """A workload class as the planner reads it: the VLLMWorkloadClass's name, spec and metadata.generation."""

    name: str
    spec: VLLMWorkloadClassSpec
    generation: int | None = None
    """None for a built-in from the table above."""

    def pool(self, name: str) -> ClassPool:
        return self.spec.pools.short if name == constants.POOL_SHORT else self.spec.pools.long

    def autoscaling(self, name: str) -> ClassAutoscaling:
        """The pool's autoscaling defaults (the generic ones where the class names none)."""
        own = self.pool(name).autoscaling
        return own if own is not None else (SHORT_AUTOSCALING if name == constants.POOL_SHORT else LONG_AUTOSCALING)

    @property
    def default(self) -> bool:
        """Marked default: applies to VLLMDeployments that name no class."""
        return bool(self.spec.default)


def builtin(workload_class: str) -> NamedClass:
    """The built-in class of that name (KeyError for any other name)."""
    return NamedClass(workload_class, BUILTINS[WorkloadClass(workload_class)])


def is_builtin(name: str) -> bool:
    return name in {c.value for c in WorkloadClass}


def builtin_classes() -> list[dict[str, Any]]:
    """The four built-in VLLMWorkloadClass objects, in table order."""
    return [{"apiVersion": constants.API_VERSION, "kind": constants.CLASS_KIND,
             "metadata": {"name": name.value, "labels": {constants.LABEL_NAME: constants.APP_NAME}},
             "spec": spec.to_wire()} for name, spec in BUILTINS.items()]


def parse_class(obj: Mapping[str, Any]) -> NamedClass:
    """A VLLMWorkloadClass object as the planner reads it; pydantic's ValidationError for a malformed spec."""
    meta = obj.get("metadata") or {}
    return NamedClass(str(meta.get("name", "")), VLLMWorkloadClassSpec.model_validate(obj.get("spec") or {}),
                      meta.get("generation"))
