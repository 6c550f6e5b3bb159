"""The VLLMWorkloadClass spec: a cluster-scoped, editable workload class (like a StorageClass for vLLM pools).

A class is the table row a VLLMDeployment's `spec.workloadClass` names: both pools' lengths and scheduler settings,
the prompt-length threshold between them, the KV dtype policy, the routing strategy and the default client tiers.
The four built-ins (chat, multi-turn, rag, long-doc) are generated from `planning/profiles.py` and installed by the
chart, so a platform team reads the numbers with `kubectl get vllmwc` and edits them, or adds its own classes.

Every field is required here (unlike VLLMDeploymentSpec's "unset = the class decides"): a class *is* the decision,
so an object that leaves a number out would make the planner invent one. The CEL rules are mirrored by pydantic
validators so `plan -f --class` refuses offline exactly what the API server refuses.
"""

from __future__ import annotations

import enum
from typing import Annotated, Self

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from vllm_operator.api.base import ApiModel
from vllm_operator.api.spec import AutoscalingMetric, RemediationThresholds, RoutingStrategy, Tier, x_validations


class KVCachePolicy(enum.StrEnum):
    """Which KV cache dtype the class picks when the VLLMDeployment names none."""

    MODEL = "model"
    FP8_IF_NATIVE = "fp8-if-native"


class ClassAutoscaling(ApiModel):
    """A pool's autoscaling defaults, for VLLMDeployments that set `autoscaling` and leave these fields out."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("self.metric != 'kv-cache-usage' || double(self.target) <= 1.0",
         "target for kv-cache-usage is a fraction of the KV cache (at most 1)"),
    ))

    min_replicas: int = Field(ge=0, le=1000, description="Fewest replicas (0: the pool sleeps when idle; long only).")
    metric: AutoscalingMetric = Field(description="The vLLM signal the pool scales on.")
    target: float = Field(gt=0, le=65_536, description="Target value of the metric per replica.")
    scale_down_stabilization_seconds: int = Field(ge=0, le=3600, description="HPA scale-down stabilization window.")
    idle_seconds: int = Field(ge=1, le=86_400, description="Idle time before a minReplicas-0 pool sleeps.")

    @model_validator(mode="after")
    def _fraction(self) -> Self:
        if self.metric is AutoscalingMetric.KV_CACHE_USAGE and self.target > 1:
            raise ValueError(f"autoscaling.target ({self.target:g}) for kv-cache-usage is a fraction (at most 1)")
        return self


class ClassPool(ApiModel):
    """One pool's defaults in a workload class."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("self.maxTokens < self.maxModelLen", "maxTokens must be below maxModelLen (the prompt needs room)"),
        ("self.typicalSequenceTokens <= self.maxModelLen", "typicalSequenceTokens must not exceed maxModelLen"),
    ))

    max_model_len: int = Field(ge=2, le=10_485_760, description="vLLM --max-model-len.")
    max_tokens: int = Field(ge=1, le=10_485_760, description="Engine-side max_tokens fuse and planning budget.")
    max_num_seqs: int = Field(ge=1, le=65_536, description="vLLM --max-num-seqs.")
    max_num_batched_tokens: int = Field(ge=1, le=10_485_760, description="vLLM --max-num-batched-tokens.")
    chunked_prefill: bool = Field(
        description="Pass --enable-chunked-prefill explicitly (it is passed anyway when maxModelLen exceeds "
                    "maxNumBatchedTokens).")
    kv_cache_policy: KVCachePolicy = Field(
        description="model (the model dtype) or fp8-if-native (FP8 KV where the GPU runs it natively).")
    typical_sequence_tokens: int = Field(
        ge=1, le=10_485_760, description="A typical prompt + output, for the plan's capacity figure.")
    required_concurrency: float = Field(
        gt=0, le=65_536, description="Sequences at full maxModelLen the class expects to fit; below it the plan warns.")
    gpu_memory_utilization: float = Field(gt=0, le=1, description="vLLM --gpu-memory-utilization (GPU pools).")
    routing: RoutingStrategy = Field(description="How the router picks a replica inside the pool.")
    autoscaling: ClassAutoscaling | None = Field(
        default=None, description="Autoscaling defaults (unset: the operator's built-in defaults for this pool).")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.max_tokens >= self.max_model_len:
            raise ValueError(f"maxTokens ({self.max_tokens}) must be below maxModelLen ({self.max_model_len}): "
                             "the prompt needs room")
        if self.typical_sequence_tokens > self.max_model_len:
            raise ValueError(f"typicalSequenceTokens ({self.typical_sequence_tokens}) exceeds maxModelLen "
                             f"({self.max_model_len})")
        return self


class ClassPools(ApiModel):
    """Both pools of a class."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("self.short.maxModelLen <= self.long.maxModelLen",
         "pools.short.maxModelLen must not exceed pools.long.maxModelLen"),
        ("!has(self.short.autoscaling) || self.short.autoscaling.minReplicas >= 1",
         "pools.short.autoscaling.minReplicas must be at least 1 (only the long pool may sleep at 0)"),
    ))

    short: ClassPool = Field(description="The short-text pool.")
    long: ClassPool = Field(description="The long-text pool.")

    @model_validator(mode="after")
    def _short_not_longer(self) -> Self:
        if self.short.max_model_len > self.long.max_model_len:
            raise ValueError(f"short.maxModelLen ({self.short.max_model_len}) must not exceed long.maxModelLen "
                             f"({self.long.max_model_len})")
        if self.short.autoscaling is not None and self.short.autoscaling.min_replicas < 1:
            raise ValueError("pools.short.autoscaling.minReplicas must be at least 1 (got 0): only the long pool may "
                             "sleep at 0")
        return self


class VLLMWorkloadClassSpec(ApiModel):
    """A workload class: what a VLLMDeployment naming it gets for every field it leaves unset."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("self.promptLengthThreshold <= self.pools.short.maxModelLen",
         "promptLengthThreshold must not exceed pools.short.maxModelLen"),
        ("!has(self.tiers) || self.tiers.all(t, self.tiers.exists_one(u, u.name == t.name))",
         "tier names must be unique"),
    ))

    default: bool | None = Field(
        default=None, description="Applies to VLLMDeployments that name no workloadClass (at most one class).")
    description: Annotated[str, StringConstraints(max_length=1024)] | None = Field(
        default=None, description="What traffic the class is for.")
    prompt_length_threshold: int = Field(
        ge=1, le=10_485_760, description="Prompts with fewer tokens go to the short pool.")
    pools: ClassPools = Field(description="Both pools' defaults.")
    tiers: list[Tier] | None = Field(
        default=None, min_length=1, max_length=16,
        description="Client tiers for VLLMDeployments that list none (default: one tier capped at the long pool's "
                    "maxTokens).")
    remediation_thresholds: RemediationThresholds | None = Field(
        default=None,
        description="The health loop's detection thresholds (and the alert rules') for VLLMDeployments of this class; "
                    "a VLLMDeployment's own spec.remediation.thresholds win field by field, unset fields take the "
                    "operator's defaults.")

    @model_validator(mode="after")
    def _threshold_fits(self) -> Self:
        if self.prompt_length_threshold > self.pools.short.max_model_len:
            raise ValueError(f"promptLengthThreshold ({self.prompt_length_threshold}) exceeds pools.short.maxModelLen "
                             f"({self.pools.short.max_model_len})")
        names = [t.name for t in self.tiers or []]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"tier names must be unique (repeated: {', '.join(dup)})")
        return self
