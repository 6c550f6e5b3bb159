"""The VLLMDeployment spec: the one schema users write, and the source the CRD is generated from.

Every field carries a description (it becomes `kubectl explain` text) and its bounds live in the type, so the API
server, the offline planner and the operator refuse the same inputs. Cross-field rules that CEL can express are
declared next to the model as `x-kubernetes-validations` and mirrored by a pydantic validator, so `plan` offline
refuses exactly what the API server would. Defaults that depend on the workload class (pool lengths, scheduler
settings) are left unset here on purpose: the planner fills them from `planning/profiles.py`, and an unset field
reads as "the class decides".
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from vllm_operator.api.base import ApiModel

# Bounded strings and lists keep CEL cost estimates finite on a real API server.
Name = Annotated[str, StringConstraints(min_length=1, max_length=253)]
ShortText = Annotated[str, StringConstraints(min_length=1, max_length=256)]
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?([eE][0-9]+|[numkKMGTPE]i?)?$"
Quantity = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=QUANTITY_PATTERN)]
Arg = Annotated[str, StringConstraints(min_length=1, max_length=4096)]


def x_validations(*rules: tuple[str, str]) -> dict[str, Any]:
    """`json_schema_extra` for a model's CEL rules: (rule, message) pairs."""
    return {"x-kubernetes-validations": [{"rule": rule, "message": message} for rule, message in rules]}


class WorkloadClass(enum.StrEnum):
    """What traffic the deployment serves; picks both pools' lengths and scheduler settings."""

    CHAT = "chat"
    MULTI_TURN = "multi-turn"
    RAG = "rag"
    LONG_DOC = "long-doc"


class AcceleratorType(enum.StrEnum):
    """Accelerators the planner has facts for (planning/catalog.py); `auto` is resolved from node labels."""

    T4_16GB = "nvidia-t4-16gb"
    A10G_24GB = "nvidia-a10g-24gb"
    L4_24GB = "nvidia-l4-24gb"
    L40S_48GB = "nvidia-l40s-48gb"
    A100_40GB = "nvidia-a100-40gb"
    A100_80GB = "nvidia-a100-80gb"
    H100_80GB = "nvidia-h100-80gb"
    H200_141GB = "nvidia-h200-141gb"
    CPU = "cpu"
    AUTO = "auto"


class KVCacheDtype(enum.StrEnum):
    """vLLM `--kv-cache-dtype` values the operator plans for (`auto` = the model dtype)."""

    AUTO = "auto"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FP8 = "fp8"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"


class Quantization(enum.StrEnum):
    """Weight quantization of the checkpoint (changes weight size, not KV size)."""

    AWQ = "awq"
    GPTQ = "gptq"
    FP8 = "fp8"


class WeightsDtype(enum.StrEnum):
    """Bytes per parameter for models described by `paramsBillions`."""

    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FP8 = "fp8"
    INT4 = "int4"


class OverLimit(enum.StrEnum):
    """What the router does with a max_tokens above the cap: lower it to the cap, or answer 400."""

    CLAMP = "clamp"
    REJECT = "reject"


class RoutingStrategy(enum.StrEnum):
    """How the router picks a replica inside a pool."""

    LEAST_OUTSTANDING = "least-outstanding"
    PREFIX = "prefix"


class SecretKeyRef(ApiModel):
    """A key in a Secret in the VLLMDeployment's namespace."""

    name: Name = Field(description="Name of the Secret.")
    key: ShortText = Field(description="Key inside the Secret.")


class LocalObjectReference(ApiModel):
    """A reference to an object by name in the same namespace."""

    name: Name = Field(description="Name of the referenced object.")


class ModelFacts(ApiModel):
    """Architecture facts for a model outside the built-in catalog (read them off its Hugging Face config.json)."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("has(self.weightsGiB) || has(self.paramsBillions)", "give weightsGiB, or paramsBillions with weightsDtype"),
        ("has(self.kvLoraRank) == has(self.qkRopeHeadDim)", "give kvLoraRank and qkRopeHeadDim together (MLA)"),
        ("!has(self.slidingWindowLayers) || has(self.slidingWindow)",
         "slidingWindowLayers needs slidingWindow (the window those layers use)"),
        ("!has(self.slidingWindowLayers) || self.slidingWindowLayers <= self.numLayers",
         "slidingWindowLayers cannot be more than numLayers"),
    ))

    num_layers: int = Field(ge=1, le=1024, description="Transformer layers (num_hidden_layers).")
    num_kv_heads: int = Field(ge=1, le=1024, description="Key/value heads (num_key_value_heads).")
    head_dim: int = Field(ge=1, le=4096, description="Dimension of one attention head.")
    max_context_length: int = Field(ge=1, le=10_485_760, description="Native context (max_position_embeddings).")
    num_attention_heads: int | None = Field(
        default=None, ge=1, le=4096,
        description="Query heads; without it tensor-parallel divisibility is checked on KV heads only.")
    weights_gib: float | None = Field(default=None, gt=0, le=4096, description="Size of the weights in GiB.")
    params_billions: float | None = Field(
        default=None, gt=0, le=10_000, description="Parameter count in billions (used with weightsDtype).")
    weights_dtype: WeightsDtype | None = Field(
        default=None, description="Dtype of the weights when sized from paramsBillions (default bfloat16).")
    kv_lora_rank: int | None = Field(
        default=None, ge=1, le=65_536,
        description="Multi-head latent attention (DeepSeek kv_lora_rank): each layer caches kvLoraRank + "
                    "qkRopeHeadDim values per token, the same on every tensor-parallel rank; numKVHeads and headDim "
                    "then do not size the KV cache.")
    qk_rope_head_dim: int | None = Field(
        default=None, ge=1, le=4096, description="The rotary part of an MLA key (DeepSeek qk_rope_head_dim).")
    hidden_size: int | None = Field(
        default=None, ge=1, le=1_048_576, description="Model width (refines the activation estimate).")
    intermediate_size: int | None = Field(
        default=None, ge=1, le=4_194_304,
        description="MLP width one token passes through (MoE: experts per token x expert width, plus shared "
                    "experts); refines the activation estimate.")
    vocab_size: int | None = Field(
        default=None, ge=1, le=16_777_216, description="Vocabulary size (sizes the sampler's logits).")
    sliding_window: int | None = Field(
        default=None, ge=1, le=10_485_760,
        description="Sliding layers attend to this many tokens only (config.json sliding_window): vLLM keeps the "
                    "window per sequence, not the whole length, so more sequences fit. Every layer slides unless "
                    "slidingWindowLayers says how many do.")
    sliding_window_layers: int | None = Field(
        default=None, ge=1, le=1024,
        description="How many of numLayers use slidingWindow when the others attend to the whole length "
                    "(config.json layer_types; Gemma-2: every other layer): on a GPU vLLM groups the layers by kind "
                    "and keeps a window per sequence only in the sliding groups.")
    checkpoint_quantization: str | None = Field(
        default=None, max_length=64, pattern=r"^[a-z0-9][a-z0-9_.-]*$",
        description="The checkpoint's quantization_config.quant_method (none: unquantized), read off config.json; "
                    "model.quantization is checked against it (vLLM refuses to start when they disagree).")

    @model_validator(mode="after")
    def _weights_known(self) -> Self:
        if self.weights_gib is None and self.params_billions is None:
            raise ValueError("give weightsGiB, or paramsBillions with weightsDtype")
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ValueError("give kvLoraRank and qkRopeHeadDim together (multi-head latent attention)")
        if self.sliding_window_layers is not None and self.sliding_window is None:
            raise ValueError("slidingWindowLayers needs slidingWindow (the window those layers use)")
        if self.sliding_window_layers is not None and self.sliding_window_layers > self.num_layers:
            raise ValueError(f"slidingWindowLayers {self.sliding_window_layers} cannot be more than numLayers "
                             f"{self.num_layers}")
        return self


class HuggingFaceSource(ApiModel):
    """Load weights from the Hugging Face Hub at pod start."""

    repo: ShortText | None = Field(default=None, description="Repository id; defaults to model.name.")
    revision: ShortText | None = Field(default=None, description="Branch, tag or commit to pin (recommended).")
    token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding HF_TOKEN for gated models.")


class PVCSource(ApiModel):
    """Load weights from a PersistentVolumeClaim mounted read-only at /models."""

    claim_name: Name = Field(description="Name of the PersistentVolumeClaim.")
    path: Annotated[str, StringConstraints(max_length=1024)] = Field(
        default="", description="Path of the model directory inside the volume.")


class ModelSource(ApiModel):
    """Where engine pods get the weights; exactly one of huggingFace or pvc (huggingFace when empty)."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("!(has(self.huggingFace) && has(self.pvc))", "set only one of source.huggingFace and source.pvc"),
    ))

    hugging_face: HuggingFaceSource | None = Field(default=None, description="Hugging Face Hub source.")
    pvc: PVCSource | None = Field(default=None, description="PersistentVolumeClaim source.")

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if self.hugging_face is not None and self.pvc is not None:
            raise ValueError("set only one of huggingFace and pvc")
        return self


class CacheClaimSpec(ApiModel):
    """A PersistentVolumeClaim the operator creates for this VLLMDeployment's weights cache (`<name>-weights`), shared
    by the engine pods of both pools: the form that needs no hostPath (baseline/restricted Pod Security)."""

    storage_class_name: Annotated[str, StringConstraints(max_length=253)] | None = Field(
        default=None, description="StorageClass of the claim; \"\" binds a static PersistentVolume (no "
                                  "provisioner); unset: the cluster's default class.")
    size: Quantity = Field(description="Requested size; also the cache's limit (least-recently-used entries no pod "
                                       "uses are evicted to fit a new model).")
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"] = Field(
        default="ReadWriteMany", description="ReadWriteMany lets pods on every node share it; ReadWriteOnce keeps "
                                             "all engine pods on the node that mounted it first.")
    volume_name: Name | None = Field(default=None, description="Bind this PersistentVolume (static provisioning).")


class WeightsCacheSpec(ApiModel):
    """Where Hugging Face weights are cached between pod starts (docs/weights-cache.md). Unset: the operator's node
    cache (a hostPath on every node, chart value weightsCache.hostPath)."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("!(has(self.claim) && has(self.enabled) && !self.enabled)",
         "cache.claim is set but cache.enabled is false: drop one"),
    ))

    enabled: bool | None = Field(
        default=None, description="false: each engine pod downloads into its own emptyDir, as without a cache "
                                  "(every pod start downloads again).")
    claim: CacheClaimSpec | None = Field(
        default=None, description="Cache on a PersistentVolumeClaim of this deployment instead of the node's "
                                  "directory.")

    @model_validator(mode="after")
    def _claim_or_off(self) -> Self:
        if self.claim is not None and self.enabled is False:
            raise ValueError("cache.claim is set but cache.enabled is false: drop one")
        return self


class TokenizerSource(ApiModel):
    """Where the router loads the tokenizer it counts prompt tokens with."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("!(has(self.huggingFace) && has(self.configMap))", "set only one of tokenizer.huggingFace and configMap"),
    ))

    hugging_face: HuggingFaceSource | None = Field(
        default=None, description="Download tokenizer.json from the Hub at router start (defaults to the model's).")
    config_map: LocalObjectReference | None = Field(
        default=None, description="A ConfigMap holding tokenizer.json (and tokenizer_config.json), mounted read-only.")

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if self.hugging_face is not None and self.config_map is not None:
            raise ValueError("set only one of huggingFace and configMap")
        return self


class ModelSpec(ApiModel):
    """The model to serve."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("!(has(self.cache) && has(self.source) && has(self.source.pvc))",
         "model.cache is for Hugging Face sources; source.pvc is read from its own claim"),
    ))

    name: ShortText = Field(description="Hugging Face id (matched case-insensitively against the built-in catalog).")
    served_model_name: ShortText | None = Field(
        default=None, description="Name clients use in requests; defaults to name.")
    facts: ModelFacts | None = Field(default=None, description="Architecture facts for a model outside the catalog.")
    quantization: Quantization | None = Field(default=None, description="Weight quantization of the checkpoint.")
    source: ModelSource | None = Field(default=None, description="Where the weights come from (default: the Hub).")
    cache: WeightsCacheSpec | None = Field(
        default=None, description="Where Hub weights are cached, shared by both pools (default: the node cache). "
                                  "Not for source.pvc, which is already a volume the engines read.")
    tokenizer: TokenizerSource | None = Field(
        default=None, description="Tokenizer source for the router (default: the model's Hub repo).")

    @model_validator(mode="after")
    def _cache_for_hub(self) -> Self:
        if self.cache is not None and self.source is not None and self.source.pvc is not None:
            raise ValueError("model.cache is for Hugging Face sources; source.pvc is read from its own claim")
        return self


class AcceleratorSpec(ApiModel):
    """What each engine pod runs on."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("self.type != 'cpu' || has(self.memoryGiB)", "accelerator.type cpu needs memoryGiB"),
        ("self.type != 'cpu' || !has(self.count) || self.count == 1", "accelerator.count must be 1 for cpu"),
    ))

    type: AcceleratorType = Field(description="GPU type from the catalog, cpu, or auto (resolved from node labels).")
    count: int = Field(default=1, ge=1, le=16, description="GPUs per pod (tensor-parallel size).")
    memory_gib: float | None = Field(
        default=None, gt=0, le=4096, description="Memory per engine pod for cpu pools (weights + KV + runtime).")
    cpu_cores: int | None = Field(default=None, ge=1, le=512, description="CPU cores per engine pod (cpu only).")

    @model_validator(mode="after")
    def _cpu_rules(self) -> Self:
        if self.type is AcceleratorType.CPU and self.memory_gib is None:
            raise ValueError("memoryGiB is required when type is cpu")
        if self.type is AcceleratorType.CPU and self.count != 1:
            raise ValueError(f"count must be 1 for cpu (got {self.count})")
        return self


class EngineRuntime(ApiModel):
    """The engine image and the vLLM version it contains (selects version-gated flags)."""

    image: ShortText | None = Field(default=None, description="Engine image (default: the project's engine image).")
    version: Annotated[str, StringConstraints(pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$", max_length=32)] | None = Field(
        default=None, description="vLLM version inside the image, e.g. 0.33.0 (default 0.33 GPU, 0.32 CPU).")


class EngineSpec(ApiModel):
    """Engine images per accelerator kind."""

    gpu: EngineRuntime | None = Field(default=None, description="Image and vLLM version for GPU pools.")
    cpu: EngineRuntime | None = Field(default=None, description="Image and vLLM version for CPU pools.")
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        default=None, max_length=16, description="Secrets for pulling the engine and router images.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="Pull policy for engine and router containers.")


class ResourceRequirements(ApiModel):
    """Extra container resources (GPUs are set by the planner from accelerator.count)."""

    requests: dict[Annotated[str, StringConstraints(max_length=253)], Quantity] | None = Field(
        default=None, max_length=16, description="Resource requests, e.g. cpu: '4', memory: 32Gi.")
    limits: dict[Annotated[str, StringConstraints(max_length=253)], Quantity] | None = Field(
        default=None, max_length=16, description="Resource limits.")


class Toleration(ApiModel):
    """A pod toleration (as in core/v1)."""

    key: Annotated[str, StringConstraints(max_length=316)] | None = Field(default=None, description="Taint key.")
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal.")
    value: Annotated[str, StringConstraints(max_length=63)] | None = Field(default=None, description="Taint value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute", ""] | None = Field(
        default=None, description="Taint effect to tolerate; empty matches all.")
    toleration_seconds: int | None = Field(default=None, description="How long a NoExecute taint is tolerated.")


class EnvVar(ApiModel):
    """An environment variable for engine containers: a literal value or a Secret key."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("has(self.value) != has(self.secretKeyRef)", "set exactly one of value and secretKeyRef"),
    ))

    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)] = Field(
        description="Variable name.")
    value: Annotated[str, StringConstraints(max_length=4096)] | None = Field(default=None, description="Literal value.")
    secret_key_ref: SecretKeyRef | None = Field(default=None, description="Take the value from a Secret key.")

    @model_validator(mode="after")
    def _one_value(self) -> Self:
        if (self.value is None) == (self.secret_key_ref is None):
            raise ValueError(f"set exactly one of value and secretKeyRef (for {self.name})")
        return self


class AutoscalingMetric(enum.StrEnum):
    """The vLLM signal a pool scales on; each is summed over the pool's pods and compared with `target` per replica."""

    NUM_REQUESTS_WAITING = "num-requests-waiting"
    """vllm:num_requests_waiting: requests queued for lack of KV cache or batch slots (the queue users feel)."""
    KV_CACHE_USAGE = "kv-cache-usage"
    """vllm:kv_cache_usage_perc: the fraction of KV cache blocks in use (0-1); target is that fraction."""
    NUM_REQUESTS_RUNNING = "num-requests-running"
    """vllm:num_requests_running: requests in the running batch."""


class PoolAutoscaling(ApiModel):
    """Scale this pool on vLLM's own signals through a KEDA ScaledObject (KEDA's HPA owns the Deployment's replicas).

    The query sums the metric over the pool and KEDA divides by the replica count, so `target` is per replica:
    num-requests-waiting 4 means "add a replica when more than 4 requests per replica wait". Scaling N -> 1 follows
    the HPA with `scaleDownStabilizationSeconds`; 1 -> 0 (long pool only, minReplicas 0) follows KEDA once the pool has
    had no held, waiting or running request for `idleSeconds`. Unset fields come from the workload class."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
         "autoscaling.minReplicas must not exceed maxReplicas"),
        ("!has(self.metric) || !has(self.target) || self.metric != 'kv-cache-usage' || double(self.target) <= 1.0",
         "autoscaling.target for kv-cache-usage is a fraction of the KV cache (at most 1)"),
    ))

    min_replicas: int | None = Field(
        default=None, ge=0, le=1000,
        description="Fewest replicas (0 lets the long pool sleep; the short pool needs at least 1); default: from "
                    "the workload class.")
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas (what the pool may spend).")
    metric: AutoscalingMetric | None = Field(
        default=None, description="num-requests-waiting, kv-cache-usage or num-requests-running; default: from the "
                                  "workload class.")
    target: float | None = Field(
        default=None, gt=0, le=65_536,
        description="Target value of the metric per replica (kv-cache-usage: a fraction, e.g. 0.8); default: from "
                    "the workload class.")
    scale_down_stabilization_seconds: int | None = Field(
        default=None, ge=0, le=3600,
        description="How long the HPA waits on lower recommendations before scaling down (N -> 1); default: from "
                    "the workload class.")
    idle_seconds: int | None = Field(
        default=None, ge=1, le=86_400,
        description="With minReplicas 0: how long the pool must be idle (nothing held, waiting or running) before it "
                    "sleeps at 0 (KEDA's cooldownPeriod); default: from the workload class.")
    polling_interval_seconds: int | None = Field(
        default=None, ge=1, le=3600,
        description="How often KEDA queries Prometheus for this pool and decides whether it wakes from or sleeps at "
                    "0 (KEDA's pollingInterval; scaling between 1 and N follows the HPA's own sync). Shorter wakes a "
                    "sleeping pool sooner and costs a Prometheus query per trigger each time; default 15.")

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(f"autoscaling.minReplicas ({self.min_replicas}) must not exceed maxReplicas "
                             f"({self.max_replicas})")
        if self.metric is AutoscalingMetric.KV_CACHE_USAGE and self.target is not None and self.target > 1:
            raise ValueError(f"autoscaling.target ({self.target:g}) for kv-cache-usage is a fraction of the KV cache "
                             "(at most 1, e.g. 0.8)")
        return self


class PoolSpec(ApiModel):
    """Overrides for one pool; anything unset comes from the workload class profile."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("!has(self.maxTokens) || !has(self.maxModelLen) || self.maxTokens < self.maxModelLen",
         "maxTokens must be below maxModelLen (the prompt needs room)"),
        ("!has(self.autoscaling) || !has(self.replicas)",
         "set replicas or autoscaling, not both (with autoscaling the autoscaler decides the replica count)"),
        ("!has(self.autoscaling) || !has(self.externalAutoscaler) || !self.externalAutoscaler",
         "set autoscaling or externalAutoscaler, not both"),
    ))

    enabled: bool | None = Field(default=None, description="Run this pool (default true).")
    replicas: int | None = Field(
        default=None, ge=0, le=1000,
        description="Engine pods in this pool (default 1); refused together with autoscaling.")
    external_autoscaler: bool | None = Field(
        default=None,
        description="An HPA/KEDA owns spec.replicas: the operator sets it only at creation, never after.")
    autoscaling: PoolAutoscaling | None = Field(
        default=None,
        description="Scale this pool on vLLM's signals with a KEDA ScaledObject the operator renders; a new pool "
                    "starts with max(minReplicas, 1) replica and, with minReplicas 0, sleeps after idleSeconds.")
    max_model_len: int | None = Field(default=None, ge=1, le=10_485_760, description="vLLM --max-model-len.")
    max_tokens: int | None = Field(
        default=None, ge=1, le=10_485_760,
        description="Engine-side max_tokens fuse (--override-generation-config max_new_tokens) and planning budget.")
    max_num_seqs: int | None = Field(default=None, ge=1, le=65_536, description="vLLM --max-num-seqs.")
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, le=10_485_760, description="vLLM --max-num-batched-tokens (chunked-prefill chunk size).")
    kv_cache_dtype: KVCacheDtype | None = Field(default=None, description="vLLM --kv-cache-dtype.")
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0, le=1, description="vLLM --gpu-memory-utilization (GPU pools).")
    resources: ResourceRequirements | None = Field(default=None, description="Extra resources for engine containers.")
    node_selector: dict[Annotated[str, StringConstraints(max_length=317)],
                        Annotated[str, StringConstraints(max_length=63)]] | None = Field(
        default=None, max_length=32, description="Extra node selector for engine pods.")
    tolerations: list[Toleration] | None = Field(default=None, max_length=32, description="Engine pod tolerations.")
    env: list[EnvVar] | None = Field(default=None, max_length=64, description="Extra engine environment variables.")
    extra_args: list[Arg] | None = Field(
        default=None, max_length=64,
        description="Extra vLLM flags; flags the operator manages (e.g. --max-model-len, --config) are refused.")

    @model_validator(mode="after")
    def _tokens_below_len(self) -> Self:
        if self.max_tokens is not None and self.max_model_len is not None and self.max_tokens >= self.max_model_len:
            raise ValueError(
                f"maxTokens ({self.max_tokens}) must be below maxModelLen ({self.max_model_len}): "
                "the prompt needs room")
        if self.autoscaling is not None and self.replicas is not None:
            raise ValueError(f"set replicas ({self.replicas}) or autoscaling, not both: with autoscaling the "
                             f"autoscaler decides the replica count (between minReplicas and maxReplicas "
                             f"{self.autoscaling.max_replicas})")
        if self.autoscaling is not None and self.external_autoscaler:
            raise ValueError("set autoscaling or externalAutoscaler, not both (autoscaling renders the operator's "
                             "own ScaledObject; externalAutoscaler leaves replicas to one you run)")
        return self


class PoolsSpec(ApiModel):
    """The two pools: short prompts and long prompts."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("!has(self.short) || !has(self.long) || !has(self.short.maxModelLen) || !has(self.long.maxModelLen)"
         " || self.short.maxModelLen <= self.long.maxModelLen",
         "pools.short.maxModelLen must not exceed pools.long.maxModelLen"),
        ("!has(self.short) || !has(self.short.autoscaling) || !has(self.short.autoscaling.minReplicas)"
         " || self.short.autoscaling.minReplicas >= 1",
         "pools.short.autoscaling.minReplicas must be at least 1 (only the long pool may sleep at 0)"),
        ("!has(self.long) || !has(self.long.autoscaling) || !has(self.long.autoscaling.minReplicas)"
         " || self.long.autoscaling.minReplicas > 0 || !has(self.short)"
         " || ((!has(self.short.enabled) || self.short.enabled)"
         " && (!has(self.short.replicas) || self.short.replicas >= 1))",
         "pools.long.autoscaling.minReplicas 0 needs a running short pool (enabled, replicas or minReplicas at least "
         "1), so a sleeping long pool never makes short requests fail"),
    ))

    short: PoolSpec | None = Field(default=None, description="The short-text pool (interactive traffic).")
    long: PoolSpec | None = Field(default=None, description="The long-text pool (long prompts and outputs).")

    @model_validator(mode="after")
    def _short_not_longer(self) -> Self:
        s = self.short.max_model_len if self.short else None
        lg = self.long.max_model_len if self.long else None
        if s is not None and lg is not None and s > lg:
            raise ValueError(f"short.maxModelLen ({s}) must not exceed long.maxModelLen ({lg})")
        short_min = self.short.autoscaling.min_replicas if self.short and self.short.autoscaling else None
        if short_min == 0:
            raise ValueError("pools.short.autoscaling.minReplicas must be at least 1 (got 0): only the long pool may "
                             "sleep at 0")
        long_min = self.long.autoscaling.min_replicas if self.long and self.long.autoscaling else None
        if long_min == 0 and self.short is not None and (self.short.enabled is False or self.short.replicas == 0):
            raise ValueError("pools.long.autoscaling.minReplicas 0 needs a running short pool (short is "
                             f"{'disabled' if self.short.enabled is False else 'at replicas 0'}), so a sleeping long "
                             "pool never makes short requests fail")
        return self


class Tier(ApiModel):
    """A client tier: the max_tokens cap for requests with this tier's API keys."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("!has(self.defaultMaxTokens) || self.defaultMaxTokens <= self.maxTokens",
         "defaultMaxTokens must not exceed maxTokens"),
    ))

    name: Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)] = Field(
        description="Tier name; also the key of this tier's API keys in the API-key Secret.")
    default_max_tokens: int | None = Field(
        default=None, ge=1, le=10_485_760, description="max_tokens for requests that omit it (default: maxTokens).")
    max_tokens: int = Field(ge=1, le=10_485_760, description="Highest max_tokens this tier may ask for.")

    @model_validator(mode="after")
    def _default_within_cap(self) -> Self:
        if self.default_max_tokens is not None and self.default_max_tokens > self.max_tokens:
            raise ValueError(
                f"defaultMaxTokens ({self.default_max_tokens}) exceeds maxTokens ({self.max_tokens}) of tier "
                f"{self.name}")
        return self


class RoutingTimeouts(ApiModel):
    """Router timeouts towards the engines, in seconds."""

    connect_seconds: float | None = Field(default=None, gt=0, le=600, description="TCP connect (default 2).")
    first_byte_seconds: float | None = Field(
        default=None, gt=0, le=3600, description="Until the first response byte, i.e. queueing + prefill (default 60).")
    idle_seconds: float | None = Field(
        default=None, gt=0, le=3600, description="Longest gap between streamed chunks (default 30).")
    total_seconds: float | None = Field(
        default=None, gt=0, le=86_400, description="Whole request (default 600).")


class PoolRoutingSpec(ApiModel):
    """How the router spreads one pool's requests over its replicas."""

    strategy: RoutingStrategy | None = Field(
        default=None,
        description="least-outstanding (fewest requests in flight) or prefix (the replica most likely to hold the "
        "prompt's prefix in its KV cache, bounded by load); default: from the workload class.")


class RoutingPoolsSpec(ApiModel):
    """Per-pool routing settings."""

    short: PoolRoutingSpec | None = Field(default=None, description="The short pool.")
    long: PoolRoutingSpec | None = Field(default=None, description="The long pool.")


class RoutingSpec(ApiModel):
    """How the router picks a pool and enforces max_tokens."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("!has(self.tiers) || self.tiers.all(t, self.tiers.exists_one(u, u.name == t.name))",
         "tier names must be unique"),
    ))

    prompt_length_threshold: int | None = Field(
        default=None, ge=1, le=10_485_760,
        description="Prompts with fewer tokens go to the short pool (default: from the class profile).")
    tiers: list[Tier] | None = Field(
        default=None, min_length=1, max_length=16,
        description="Client tiers; requests without a known API key (or with auth off) get the first one.")
    over_limit: OverLimit | None = Field(default=None, description="clamp (default) or reject over-cap max_tokens.")
    timeouts: RoutingTimeouts | None = Field(default=None, description="Timeouts towards the engines.")
    pools: RoutingPoolsSpec | None = Field(
        default=None, description="Replica choice inside each pool (strategy; default from the workload class).")
    api_key_secret_ref: LocalObjectReference | None = Field(
        default=None,
        description="Secret whose keys are tier names and values newline-separated API keys; unset = auth off.")
    max_body_bytes: int | None = Field(
        default=None, ge=1024, le=1_073_741_824, description="Largest request body accepted (default 8 MiB).")

    @model_validator(mode="after")
    def _unique_tiers(self) -> Self:
        names = [t.name for t in self.tiers or []]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"tier names must be unique (repeated: {', '.join(dup)})")
        return self


class RouterSpec(ApiModel):
    """The router Deployment."""

    replicas: int | None = Field(default=None, ge=0, le=100, description="Router pods (default 2).")
    image: ShortText | None = Field(default=None, description="Router image (default: the project's router image).")
    resources: ResourceRequirements | None = Field(default=None, description="Router container resources.")
    access_log: bool | None = Field(
        default=None, description="One INFO log line per model request (default true); false turns it off.")


class RemediationThresholds(ApiModel):
    """Detection thresholds for the health loop."""

    length_share_warn: float | None = Field(
        default=None, ge=0, le=1, description="finish_reason=length share that raises a watch (default 0.05).")
    length_share_alert: float | None = Field(
        default=None, ge=0, le=1, description="Share that sets RunawayGeneration (default 0.20).")
    kv_usage_pressure: float | None = Field(
        default=None, ge=0, le=1, description="KV usage that sets KVPressure (default 0.95).")
    stall_seconds: int | None = Field(
        default=None, ge=1, le=86_400,
        description="Seconds of requests running with no token progress before a pod is Stalled (default 120).")
    window_seconds: int | None = Field(
        default=None, ge=1, le=86_400, description="Metric window for shares and rates (default 600).")
    oom_count: int | None = Field(
        default=None, ge=1, le=100, description="Engine OOMs within oomWindowSeconds before a step-down (default 2).")
    oom_window_seconds: int | None = Field(
        default=None, ge=1, le=86_400, description="Window for counting OOMs (default 900).")


class RemediationSpec(ApiModel):
    """What the health loop may do on its own."""

    enabled: bool | None = Field(default=None, description="Run the health loop's actions (default true).")
    interval_seconds: int | None = Field(
        default=None, ge=1, le=3600, description="How often the health loop looks (default 30).")
    restart_budget: int | None = Field(
        default=None, ge=0, le=1000, description="Pod deletions allowed per pool per budget window (default 3).")
    budget_window_seconds: int | None = Field(
        default=None, ge=1, le=604_800, description="Length of the restart-budget window (default 3600).")
    step_down: bool | None = Field(default=None, description="Step parameters down after repeated OOM (default true).")
    step_up_after_seconds: int | None = Field(
        default=None, ge=60, le=2_592_000, description="Step one rung back up after this long stable (unset: never).")
    allow_lower_max_model_len: bool | None = Field(
        default=None, description="Opt in to lowering maxModelLen as the last rung (default false).")
    reset_token: Annotated[str, StringConstraints(max_length=128)] | None = Field(
        default=None, description="Change this value to clear step-down rungs and restart budgets.")
    thresholds: RemediationThresholds | None = Field(default=None, description="Detection thresholds.")


class MonitoringSpec(ApiModel):
    """Prometheus Operator objects rendered per VLLMDeployment (created only when their CRDs exist)."""

    pod_monitor: bool | None = Field(default=None, description="Create a PodMonitor for the engines (default true).")
    prometheus_rule: bool | None = Field(default=None, description="Create the alert PrometheusRule (default true).")
    labels: dict[Annotated[str, StringConstraints(max_length=317)],
                 Annotated[str, StringConstraints(max_length=63)]] | None = Field(
        default=None, max_length=16, description="Extra labels so a Prometheus selector picks the objects up.")


LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The `--max-lora-rank` values vLLM accepts (vllm/config/lora.py `MaxLoRARanks`, 0.32 and 0.33)."""
AdapterName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.:/]*$")]


class AdapterHuggingFace(ApiModel):
    """An adapter repository on the Hugging Face Hub, downloaded by the engine pod when the adapter is loaded."""

    repo: ShortText = Field(description="Repository id of the adapter (holds adapter_config.json).")
    revision: ShortText | None = Field(default=None, description="Branch, tag or commit to pin (recommended).")


class AdapterSource(ApiModel):
    """Where an adapter's files come from; exactly one of huggingFace or pvc."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("has(self.huggingFace) != has(self.pvc)", "set exactly one of source.huggingFace and source.pvc"),
    ))

    hugging_face: AdapterHuggingFace | None = Field(default=None, description="Hugging Face Hub source.")
    pvc: PVCSource | None = Field(
        default=None, description="A directory on a PersistentVolumeClaim, mounted read-only in the engine pods "
                                  "while any adapter on it is listed (the first adapter on a claim, and removing "
                                  "the last one, change the pod's volumes and so roll the engines).")

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.hugging_face is None) == (self.pvc is None):
            raise ValueError("set exactly one of huggingFace and pvc")
        return self


class AdapterSpec(ApiModel):
    """A LoRA adapter of the model, served by name beside the base model and loaded without restarting engines."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        (f"!has(self.maxRank) || self.maxRank in {list(LORA_RANKS)}",
         f"maxRank must be one of vLLM's LoRA ranks {', '.join(map(str, LORA_RANKS))}"),
        ("!has(self.pools) || self.pools.all(p, self.pools.exists_one(q, q == p))", "pools must not repeat"),
    ))

    name: AdapterName = Field(description="Model name clients send for this adapter (`model` in a request).")
    source: AdapterSource = Field(description="Where the adapter's files come from.")
    max_rank: int | None = Field(
        default=None, ge=1, le=512,
        description="The adapter's LoRA rank rounded up to one vLLM supports (1, 8, 16, 32, 64, 128, 256, 320, "
                    "512; default 16): sizes the engines' --max-lora-rank and the memory of their LoRA slots.")
    pools: list[Literal["short", "long"]] | None = Field(
        default=None, max_length=2, description="Pools that serve the adapter (default: every enabled pool).")

    @model_validator(mode="after")
    def _rank_supported(self) -> Self:
        if self.max_rank is not None and self.max_rank not in LORA_RANKS:
            up = next(r for r in LORA_RANKS if r >= self.max_rank)
            raise ValueError(f"maxRank {self.max_rank} of adapter {self.name} is not a LoRA rank vLLM supports "
                             f"({', '.join(map(str, LORA_RANKS))}); use {up}")
        if self.pools is not None and len(set(self.pools)) != len(self.pools):
            raise ValueError(f"pools of adapter {self.name} repeat a pool ({', '.join(self.pools)})")
        return self


class LoraSpec(ApiModel):
    """The engines' LoRA capacity. Changing it restarts the engines; adapters within it are loaded at run time."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        (f"!has(self.maxRank) || self.maxRank in {list(LORA_RANKS)}",
         f"maxRank must be one of vLLM's LoRA ranks {', '.join(map(str, LORA_RANKS))}"),
    ))

    max_loras: int | None = Field(
        default=None, ge=1, le=256,
        description="Adapters one batch may mix (vLLM --max-loras; default 4). Each is a slot of LoRA weights "
                    "allocated at start-up and taken from the KV cache budget; more adapters than slots are served "
                    "in turn.")
    max_rank: int | None = Field(
        default=None, ge=1, le=512,
        description="vLLM --max-lora-rank (default: the highest adapter maxRank); an adapter above it is refused.")
    enabled: bool | None = Field(
        default=None, description="Keep LoRA enabled on every pool even with no adapters listed (default: on where "
                                  "an adapter is served), so that emptying the list does not restart engines.")

    @model_validator(mode="after")
    def _rank_supported(self) -> Self:
        if self.max_rank is not None and self.max_rank not in LORA_RANKS:
            up = next(r for r in LORA_RANKS if r >= self.max_rank)
            raise ValueError(f"maxRank {self.max_rank} is not a LoRA rank vLLM supports "
                             f"({', '.join(map(str, LORA_RANKS))}); use {up}")
        return self


class VLLMDeploymentSpec(ApiModel):
    """A model served by a short-text and a long-text vLLM pool behind a length-aware router."""

    model_config = ConfigDict(json_schema_extra=x_validations(
        ("!has(self.adapters) || self.adapters.all(a, self.adapters.exists_one(b, b.name == a.name))",
         "adapter names must be unique"),
    ))

    model: ModelSpec = Field(description="The model to serve.")
    workload_class: Annotated[str, StringConstraints(
        min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")] | None = Field(
        default=None,
        description="Name of the VLLMWorkloadClass that sets pool defaults (built-ins: chat, multi-turn, rag, "
                    "long-doc); unset: the class marked default.")
    accelerator: AcceleratorSpec = Field(description="What each engine pod runs on.")
    engine: EngineSpec | None = Field(default=None, description="Engine images and vLLM versions.")
    pools: PoolsSpec | None = Field(default=None, description="Per-pool overrides of the class profile.")
    routing: RoutingSpec | None = Field(default=None, description="Routing, tiers and max_tokens caps.")
    router: RouterSpec | None = Field(default=None, description="The router Deployment.")
    remediation: RemediationSpec | None = Field(default=None, description="The health loop's permissions.")
    monitoring: MonitoringSpec | None = Field(default=None, description="PodMonitor and PrometheusRule.")
    adapters: list[AdapterSpec] | None = Field(
        default=None, max_length=64,
        description="LoRA adapters served by name beside the model; adding or removing one loads or unloads it in "
                    "the running engines (no restart).")
    lora: LoraSpec | None = Field(default=None, description="The engines' LoRA capacity (slots and rank).")

    @model_validator(mode="after")
    def _unique_adapters(self) -> Self:
        names = [a.name for a in self.adapters or []]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"adapter names must be unique (repeated: {', '.join(dup)})")
        return self
