"""The VLLMDeployment status: everything the operator writes, declared so a real API server keeps it.

A real API server prunes status fields the CRD does not declare, silently. Anything the controller or the health
loop persists (step-down rungs, restart budgets, observed KV tokens) therefore has a field here, with bounded lists
so the object never grows without limit. Remediation state lives in status, not in memory, so a restarted operator
continues exactly where the previous one stopped.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, StringConstraints

from vllm_operator.api.base import ApiModel

Text = Annotated[str, StringConstraints(max_length=32768)]
Timestamp = Annotated[str, StringConstraints(max_length=64)]

STEP_DOWN_HISTORY_MAX = 20
RESTART_HISTORY_MAX = 50


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """A Kubernetes-style condition (metav1.Condition)."""

    type: Annotated[str, StringConstraints(max_length=316)] = Field(description="Condition type, e.g. Ready.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: Annotated[str, StringConstraints(max_length=1024)] = Field(
        default="", description="CamelCase machine-readable reason.")
    message: Text = Field(default="", description="Human-readable explanation naming the numbers.")
    last_transition_time: Timestamp | None = Field(
        default=None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from.")


class StepDownRecord(ApiModel):
    """One move on the step-down ladder."""

    level: int = Field(ge=0, description="Rung after the move.")
    rung: Annotated[str, StringConstraints(max_length=128)] = Field(
        description="What the rung changed, e.g. gpu-memory-utilization 0.90->0.85.")
    reason: Annotated[str, StringConstraints(max_length=1024)] = Field(
        description="Why the move happened, e.g. EngineOOM x2 in 900s.")
    time: Timestamp = Field(description="When (RFC 3339).")


class StepDownStatus(ApiModel):
    """The pool's rung on the step-down ladder and how it got there."""

    level: int = Field(default=0, ge=0, description="0 = the plan as specified; each rung buys memory headroom.")
    kv_level: int = Field(
        default=0, ge=0,
        description="Rung on the separate KVCacheTooSmall path (FP8 KV, then opt-in lower maxModelLen).")
    history: list[StepDownRecord] = Field(
        default_factory=list, max_length=STEP_DOWN_HISTORY_MAX, description="Recent moves, oldest first (bounded).")


class RestartBudgetStatus(ApiModel):
    """Pod deletions the operator made in the current budget window."""

    window_start: Timestamp | None = Field(default=None, description="Start of the current window (RFC 3339).")
    used: int = Field(default=0, ge=0, description="Deletions made in this window.")
    restarts: list[Timestamp] = Field(
        default_factory=list, max_length=RESTART_HISTORY_MAX, description="Times of recent deletions (bounded).")
    oom_events: list[Timestamp] = Field(
        default_factory=list, max_length=RESTART_HISTORY_MAX,
        description="Times of recent engine OOMs seen for this pool (bounded), for the step-down trigger.")
    seen_terminations: list[Annotated[str, StringConstraints(max_length=512)]] = Field(
        default_factory=list, max_length=RESTART_HISTORY_MAX,
        description="pod/container/restartCount keys of terminations already counted (bounded).")


class AdapterStatus(ApiModel):
    """One LoRA adapter of a pool, as the pool's engine wrappers report it."""

    name: Annotated[str, StringConstraints(max_length=128)] = Field(description="Adapter name.")
    loaded_replicas: int = Field(ge=0, description="Engine pods (of those with fresh metrics) that loaded it.")


class StartupDownloadStatus(ApiModel):
    """The download of a pool's least advanced start, in numbers (phase Downloading only)."""

    bytes_done: int = Field(ge=0, description="Bytes on disk so far.")
    bytes_total: int | None = Field(default=None, ge=0, description="Bytes the model has, where known.")
    files_done: int | None = Field(
        default=None, ge=0, description="Files finished and verified; only the weights cache's fetch counts them.")
    files_total: int | None = Field(default=None, ge=0, description="Files the model has (the fetch's count).")
    eta_seconds: int | None = Field(
        default=None, ge=0, description="Seconds still needed at the fetch's average rate so far, as of the last "
                                        "health check; unset until bytes have moved, and for a download vLLM makes "
                                        "itself.")


class AutoscalerStatus(ApiModel):
    """What the pool's autoscaler (KEDA's HPA, and KEDA itself at zero) last decided."""

    desired_replicas: int | None = Field(default=None, ge=0, description="The HPA's desired replicas.")
    current_replicas: int | None = Field(default=None, ge=0, description="The HPA's current replicas.")
    active: bool | None = Field(
        default=None, description="The ScaledObject's Active condition: False = nothing to do (a pool at minReplicas "
                                  "0 sleeps), True = its triggers see work.")
    last_scale_time: Timestamp | None = Field(default=None, description="When the HPA last changed the count.")
    decision: Annotated[str, StringConstraints(max_length=512)] | None = Field(
        default=None, description="The last decision in words: the HPA's AbleToScale/ScalingLimited message, or at "
                                  "zero (where the HPA only says ScalingActive=False) the ScaledObject's Active one.")


class PoolStatus(ApiModel):
    """Observed state of one pool."""

    replicas: int = Field(default=0, ge=0, description="Engine pods that exist.")
    desired_replicas: int | None = Field(
        default=None, ge=0, description="The pool Deployment's replicas: the operator's count, or the autoscaler's.")
    autoscaler: AutoscalerStatus | None = Field(
        default=None, description="Only for pools with autoscaling: the autoscaler's last decision.")
    woke_at: Timestamp | None = Field(
        default=None, description="While a pool waking from zero has no Ready replica: when it was asked to wake.")
    ready_replicas: int = Field(default=0, ge=0, description="Engine pods passing readiness.")
    planned_kv_tokens: int | None = Field(default=None, ge=0, description="KV cache tokens the planner predicted.")
    observed_kv_tokens: int | None = Field(
        default=None, ge=0, description="KV cache tokens vLLM reported (vllm:cache_config_info kv_cache_size_tokens).")
    max_model_len: int | None = Field(default=None, ge=1, description="Planned maxModelLen now in effect.")
    max_tokens: int | None = Field(default=None, ge=1, description="Planned engine-side max_tokens fuse in effect.")
    step_down: StepDownStatus = Field(default_factory=StepDownStatus, description="Step-down ladder state.")
    restart_budget: RestartBudgetStatus = Field(
        default_factory=RestartBudgetStatus, description="Restart budget state.")
    stable_since: Timestamp | None = Field(
        default=None, description="Since when the pool has been healthy (for step-up).")
    diagnosis: Annotated[str, StringConstraints(max_length=64)] | None = Field(
        default=None, description="Last diagnosis of the health loop, e.g. Healthy, Starting, StartupStalled, "
                                  "Stalled, EngineOOM.")
    startup_phase: Annotated[str, StringConstraints(max_length=32)] | None = Field(
        default=None, description="Start-up phase of the pool's least advanced engine pod, from its wrapper: "
                                  "Launching, Downloading, LoadingWeights, Compiling, ProfilingMemory, "
                                  "KVCacheAllocated, Serving (Serving once every pod serves).")
    startup_phase_since: Timestamp | None = Field(
        default=None, description="Since when that pod has been in that phase (RFC 3339).")
    startup_progress: Annotated[str, StringConstraints(max_length=256)] | None = Field(
        default=None, description="What the start last reported, e.g. 3.1 GiB of 15.0 GiB downloaded, 2 of 4 files, "
                                  "ETA 5m10s, KV cache 65,536 tokens, last progress 12s ago (limit 1200s).")
    startup_download: StartupDownloadStatus | None = Field(
        default=None, description="While that pod downloads its weights: bytes and files done of total and the ETA "
                                  "(the same numbers as startupProgress, for tools).")
    startup_pod: Annotated[str, StringConstraints(max_length=253)] | None = Field(
        default=None, description="The pod the startup fields describe.")
    adapters: list[AdapterStatus] | None = Field(
        default=None, max_length=64,
        description="LoRA adapters the pool's adapters file lists, with how many engine pods loaded each (from the "
                    "engine wrappers' metrics); unset without LoRA.")


class PoolsStatus(ApiModel):
    """Observed state per pool."""

    short: PoolStatus | None = Field(default=None, description="The short-text pool.")
    long: PoolStatus | None = Field(default=None, description="The long-text pool.")


class PoolPlanSummary(ApiModel):
    """The few numbers of a pool's plan worth showing in status."""

    max_model_len: int = Field(ge=1, description="--max-model-len.")
    max_tokens: int = Field(ge=1, description="Engine-side max_tokens fuse.")
    max_num_seqs: int = Field(ge=1, description="--max-num-seqs.")
    max_num_batched_tokens: int = Field(ge=1, description="--max-num-batched-tokens.")
    kv_cache_dtype: Annotated[str, StringConstraints(max_length=32)] = Field(description="--kv-cache-dtype.")
    kv_tokens: int = Field(ge=0, description="Planned KV cache tokens per pod.")
    concurrency_at_full_length: float = Field(ge=0, description="Sequences of maxModelLen tokens that fit at once.")


class PlanSummary(ApiModel):
    """What the planner decided, per pool, and its warnings."""

    hash: Annotated[str, StringConstraints(max_length=64)] = Field(description="Hash of the full plan.")
    engine_version: Annotated[str, StringConstraints(max_length=32)] = Field(description="vLLM version planned for.")
    prompt_length_threshold: int = Field(ge=1, description="Prompt tokens below which requests go short.")
    short: PoolPlanSummary | None = Field(default=None, description="Short pool plan (absent when disabled).")
    long: PoolPlanSummary | None = Field(default=None, description="Long pool plan (absent when disabled).")
    warnings: list[Text] = Field(default_factory=list, max_length=32, description="Planner warnings.")


class ResolvedAccelerator(ApiModel):
    """The accelerator the plan used (resolved from node labels for type auto)."""

    type: Annotated[str, StringConstraints(max_length=64)] = Field(description="Catalog type.")
    count: int = Field(ge=1, description="GPUs per pod.")
    product: Annotated[str, StringConstraints(max_length=256)] | None = Field(
        default=None, description="GPU feature discovery product string it was resolved from.")


class WorkloadClassRef(ApiModel):
    """The workload class the plan in effect was made from."""

    name: Annotated[str, StringConstraints(max_length=63)] = Field(description="VLLMWorkloadClass name.")
    generation: int | None = Field(
        default=None, ge=0, description="Its metadata.generation (absent: the operator's built-in table).")


class VLLMDeploymentStatus(ApiModel):
    """Observed state of a VLLMDeployment."""

    observed_generation: int | None = Field(default=None, ge=0, description="Last metadata.generation reconciled.")
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16,
        description="Ready, Progressing, Degraded, SpecValid, MetricsAvailable, RunawayGeneration, KVPressure, "
                    "Remediating.")
    pools: PoolsStatus | None = Field(default=None, description="Per-pool state.")
    plan: PlanSummary | None = Field(default=None, description="Summary of the plan in effect.")
    accelerator: ResolvedAccelerator | None = Field(default=None, description="The accelerator planned for.")
    workload_class: WorkloadClassRef | None = Field(
        default=None, description="The workload class (and its generation) the plan in effect used.")
    last_reset_token: Annotated[str, StringConstraints(max_length=128)] | None = Field(
        default=None, description="The remediation.resetToken last acted on.")
    step_down_level: int = Field(default=0, ge=0, description="Highest step-down rung across pools (printer column).")
    ready: Annotated[str, StringConstraints(max_length=32)] | None = Field(
        default=None, description="Ready engine pods over desired, e.g. 3/3 (printer column).")
    short_replicas: Annotated[str, StringConstraints(max_length=32)] | None = Field(
        default=None, description="Short pool ready/desired (printer column).")
    long_replicas: Annotated[str, StringConstraints(max_length=32)] | None = Field(
        default=None, description="Long pool ready/desired (printer column).")

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> VLLMDeploymentStatus | None:
        """The status of a VLLMDeployment object as read (None when it has none yet). Keys of kopf's (`status.kopf`,
        written by its default progress storage before the operator chose annotations) are not the operator's."""
        raw = obj.get("status")
        if not isinstance(raw, Mapping) or not raw:
            return None
        return cls.model_validate({k: v for k, v in raw.items() if not str(k).startswith("kopf")})
