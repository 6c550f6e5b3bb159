"""The Plan: what the planner decided for one VLLMDeployment, as data (docs/architecture.md, Plan).

Planning is pure and produces this object; rendering turns it into manifests; the operator, the CLI, the e2e harness
and the GPU benchmark all read the same shape. `engineArgs` are exactly what follows `vllm serve MODEL` — each launcher
prepends its own command — so a plan can be run anywhere without translation.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from vllm_operator import constants
from vllm_operator.api.base import ApiModel
from vllm_operator.api.router_config import RouterConfig
from vllm_operator.api.spec import RemediationThresholds, SecretKeyRef, Toleration

Text = Annotated[str, StringConstraints(max_length=32768)]


class KVBreakdown(ApiModel):
    """Where the memory of one engine pod goes, in bytes (per GPU for tensor-parallel pools)."""

    device_bytes: int = Field(ge=0, description="Usable memory of the device (or the pod's memory for CPU).")
    utilization: float = Field(ge=0, le=1, description="--gpu-memory-utilization (1.0 for CPU).")
    weights_bytes: int = Field(ge=0, description="Model weights.")
    activation_bytes: int = Field(ge=0, description="Peak activations; grows with max_num_batched_tokens.")
    non_torch_bytes: int = Field(ge=0, description="CUDA context, NCCL, allocator slack outside torch.")
    cuda_graph_bytes: int = Field(ge=0, description="CUDA graph memory, where the engine version subtracts it.")
    margin_bytes: int = Field(ge=0, description="Explicit safety margin of the overhead model.")
    lora_bytes: int = Field(
        default=0, ge=0, description="LoRA adapter slots vLLM allocates at start-up (--max-loras x --max-lora-rank).")


class KVPlan(ApiModel):
    """The KV cache the pool is planned to get."""

    bytes_per_token: int = Field(ge=1, description="2 x layers x KV heads x head dim x dtype bytes (per GPU).")
    budget_bytes: int = Field(ge=0, description="Bytes left for KV cache per GPU.")
    planned_tokens: int = Field(ge=0, description="Tokens of KV cache the engine should report.")
    concurrency_at_full_length: float = Field(ge=0, description="Sequences of maxModelLen tokens that fit.")
    typical_sequence_tokens: int = Field(ge=1, description="A typical request's prompt + output for the class.")
    concurrency_at_typical_length: float = Field(ge=0, description="Typical sequences that fit.")
    breakdown: KVBreakdown = Field(description="The budget's inputs.")


class Resources(ApiModel):
    requests: dict[str, str] = Field(default_factory=dict, description="Container resource requests.")
    limits: dict[str, str] = Field(default_factory=dict, description="Container resource limits.")


class AutoscalingPlan(ApiModel):
    """A pool's resolved autoscaling (spec over workload class), rendered as its KEDA ScaledObject."""

    min_replicas: int = Field(ge=0, description="Fewest replicas (0: the pool sleeps when idle).")
    max_replicas: int = Field(ge=1, description="Most replicas.")
    metric: Text = Field(description="num-requests-waiting, kv-cache-usage or num-requests-running.")
    target: float = Field(gt=0, description="Target value of the metric per replica.")
    scale_down_stabilization_seconds: int = Field(ge=0, description="HPA scale-down stabilization window.")
    idle_seconds: int = Field(ge=1, description="Idle time before a minReplicas-0 pool sleeps (KEDA cooldown).")
    polling_interval_seconds: int = Field(
        default=constants.KEDA_POLLING_INTERVAL_S, ge=1,
        description="How often KEDA evaluates the triggers and activation (KEDA pollingInterval).")


PullPolicy = Literal["Always", "IfNotPresent", "Never"]


class WeightsCachePlan(ApiModel):
    """The weights cache an engine pod's fetch init container fills and its engine reads (docs/weights-cache.md)."""

    host_path: Text | None = Field(default=None, description="The node's cache directory (hostPath form).")
    claim_name: Text | None = Field(default=None, description="The deployment's cache claim (claim form).")
    repo: Text = Field(description="Hub repository fetched.")
    revision: Text | None = Field(default=None, description="Branch, tag or commit (resolved to a commit by the "
                                                            "fetch; the cache is keyed by the commit).")
    max_bytes: int = Field(ge=1, description="The cache's limit: least-recently-used entries no engine uses are "
                                             "evicted to fit a new model.")


class WeightsClaimPlan(ApiModel):
    """The PersistentVolumeClaim the operator creates for the claim form of the weights cache."""

    name: Text = Field(description="Claim name (<deployment>-weights).")
    storage_class_name: Text | None = Field(default=None, description="StorageClass (\"\": static binding).")
    size: Text = Field(description="Requested size.")
    access_mode: Text = Field(description="Access mode.")
    volume_name: Text | None = Field(default=None, description="PersistentVolume to bind.")


class PoolPlan(ApiModel):
    """One pool's plan."""

    name: Text = Field(description="short or long.")
    enabled: bool = Field(description="Whether the pool is deployed.")
    replicas: int = Field(ge=0, description="Engine pods.")
    external_autoscaler: bool = Field(description="Replicas are owned by an external autoscaler.")
    autoscaling: AutoscalingPlan | None = Field(
        default=None, description="The operator's own autoscaling (a KEDA ScaledObject); replicas is then the "
                                  "starting count, max(minReplicas, 1), and KEDA's HPA owns it after.")
    max_model_len: int = Field(ge=1, description="--max-model-len.")
    max_tokens: int = Field(ge=1, description="Engine-side max_tokens fuse.")
    max_num_seqs: int = Field(ge=1, description="--max-num-seqs.")
    max_num_batched_tokens: int = Field(ge=1, description="--max-num-batched-tokens.")
    kv_cache_dtype: Text = Field(description="--kv-cache-dtype.")
    gpu_memory_utilization: float | None = Field(default=None, description="--gpu-memory-utilization (GPU pools).")
    prompt_range: tuple[int, int] = Field(description="[min, max) prompt tokens the router sends to this pool.")
    model: Text = Field(description="What vLLM is told to load (repo id or /models path).")
    served_model_name: Text = Field(description="--served-model-name.")
    engine_args: list[Text] = Field(description="Arguments after `vllm serve MODEL`, each --flag=value or --flag.")
    env: dict[str, str] = Field(default_factory=dict, description="Literal environment for the engine container.")
    secret_env: dict[str, SecretKeyRef] = Field(
        default_factory=dict, description="Environment taken from Secret keys: the model's Hub token as HF_TOKEN and "
                                          "the spec's secretKeyRef entries (a name is in env or here, never both).")
    resources: Resources = Field(description="Engine container resources.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node selector (the spec's).")
    gpu_products: list[Text] = Field(
        default_factory=list,
        description="GPU feature discovery product strings the engine pods may run on (every variant of the type), "
                    "as required node affinity that also excludes time-sliced nodes; empty for CPU pools.")
    tolerations: list[Toleration] = Field(
        default_factory=list, description="The spec's tolerations plus, for GPU pools, the nvidia.com/gpu NoSchedule "
                                          "taint's; sorted, each once.")
    image: Text = Field(description="Engine image.")
    image_pull_policy: PullPolicy | None = Field(default=None, description="spec.engine.imagePullPolicy.")
    image_pull_secrets: list[Text] = Field(
        default_factory=list, description="imagePullSecrets: the spec's, then the operator's, each once.")
    run_as_user: int | None = Field(
        default=None, description="uid/gid the engine runs as, non-root: the project's images' user; none for an "
                                  "image the spec names, which keeps its own user.")
    model_claim: Text | None = Field(
        default=None, description="PersistentVolumeClaim holding the model, mounted read-only at /models; none: "
                                  "/models is an emptyDir the engine downloads the model into (or the weights "
                                  "cache holds it).")
    weights_cache: WeightsCachePlan | None = Field(
        default=None, description="The weights cache the fetch init container fills (Hub sources with the cache "
                                  "on); the engine's model is then the link it writes.")
    kv: KVPlan = Field(description="KV cache plan.")
    attention_backend: Text | None = Field(
        default=None, description="--attention-backend the pool's extraArgs name (None: vLLM picks).")
    fp8_kv_allowed: bool = Field(
        default=False, description="Whether FP8 KV is a rung the health loop may take (never on CPU, nor where the "
                                   "GPU's KV table refuses it with this attention backend).")
    step_down_level: int = Field(ge=0, description="Step-down rung applied.")
    kv_level: int = Field(default=0, ge=0, description="KVCacheTooSmall-path rung applied.")
    ladder_moved: bool = Field(
        default=False, description="Whether the health loop has moved the pool on a ladder before (a step-down, a KV "
                                   "rung, a step back up or a reset): such a CPU pool rolls replace-first.")
    warnings: list[Text] = Field(default_factory=list, description="Warnings for this pool.")
    lora_slots: int = Field(
        default=0, ge=0, description="LoRA adapter slots the pool's engines allocate (--max-loras); 0: LoRA off.")
    adapters: list[Text] = Field(
        default_factory=list, description="LoRA adapters this pool serves (loaded at run time by the engine wrapper).")


class AdapterPlan(ApiModel):
    """Where one LoRA adapter's files come from, as the engine wrapper reads it from the adapters ConfigMap."""

    name: Text = Field(description="Model name clients send for the adapter.")
    hf_repo: Text | None = Field(default=None, description="Hub repository the wrapper downloads.")
    hf_revision: Text | None = Field(default=None, description="Hub revision.")
    claim_name: Text | None = Field(default=None, description="PersistentVolumeClaim the adapter lives on.")
    path: Text | None = Field(default=None, description="Container path of a PVC adapter's directory.")


class RouterPod(ApiModel):
    """The router Deployment's settings (its configuration is `Plan.router`)."""

    replicas: int = Field(ge=0, description="Router pods (spec.router.replicas, default 2).")
    image: Text = Field(description="Router image.")
    image_pull_policy: PullPolicy | None = Field(default=None, description="spec.engine.imagePullPolicy.")
    image_pull_secrets: list[Text] = Field(default_factory=list, description="As the engines'.")
    resources: Resources = Field(description="Router container resources (the spec's over the defaults).")
    env: dict[str, str] = Field(default_factory=dict, description="Literal environment of the router container.")
    api_key_secret: Text | None = Field(
        default=None, description="Secret mounted at router.apiKeysDir (spec.routing.apiKeySecretRef).")
    tokenizer_config_map: Text | None = Field(
        default=None, description="ConfigMap mounted at router.tokenizer.path (spec.model.tokenizer.configMap).")
    hf_token_secret: SecretKeyRef | None = Field(
        default=None, description="Secret key mounted as router.tokenizer.hfTokenFile: the tokenizer's Hub token, "
                                  "else the model's.")


class MonitoringPlan(ApiModel):
    """Which Prometheus Operator objects are rendered, and the labels they carry (spec.monitoring)."""

    pod_monitor: bool = Field(default=True, description="Render the PodMonitor.")
    prometheus_rule: bool = Field(default=True, description="Render the PrometheusRule.")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels of both.")


class AcceleratorFacts(ApiModel):
    """Facts about the accelerator a plan is made for (from the catalog, or resolved from node labels)."""

    type: Text = Field(description="Catalog type, e.g. nvidia-l4-24gb, or cpu.")
    count: int = Field(ge=1, description="GPUs per pod.")
    memory_bytes: int = Field(ge=1, description="Usable memory per device (per pod for CPU).")
    compute_capability: tuple[int, int] | None = Field(default=None, description="CUDA compute capability.")
    product: Text | None = Field(default=None, description="GPU feature discovery product string.")
    is_gpu: bool = Field(description="False for cpu.")


class Plan(ApiModel):
    """The full plan for one VLLMDeployment."""

    name: Text = Field(description="VLLMDeployment name.")
    namespace: Text = Field(description="VLLMDeployment namespace.")
    workload_class: Text = Field(description="The workload class.")
    workload_class_generation: int | None = Field(
        default=None, description="metadata.generation of the VLLMWorkloadClass used (none for the built-in table); "
                                  "left out of the hash, so a class edit that changes no number rolls nothing.")
    engine_version: Text = Field(description="vLLM version the arguments are valid for.")
    accelerator: AcceleratorFacts = Field(description="The accelerator planned for.")
    pools: dict[str, PoolPlan] = Field(description="short and long.")
    router: RouterConfig = Field(description="The router's configuration (router.json).")
    router_pod: RouterPod = Field(description="The router Deployment.")
    adapters: list[AdapterPlan] = Field(default_factory=list, description="LoRA adapter sources, by name.")
    weights_claim: WeightsClaimPlan | None = Field(
        default=None, description="The weights cache's claim the operator creates (model.cache.claim).")
    monitoring: MonitoringPlan = Field(default_factory=MonitoringPlan, description="Monitoring objects.")
    warnings: list[Text] = Field(default_factory=list, description="Deployment-wide warnings.")
    thresholds: RemediationThresholds | None = Field(
        default=None, description="Detection thresholds in effect: spec.remediation.thresholds over the workload "
                                  "class's, field by field (unset: the operator's defaults). The health loop and "
                                  "the alert rules both read these.")
    hash: Text = Field(description="Stable hash of everything above.")

    def all_warnings(self) -> list[str]:
        """The deployment's warnings, then each enabled pool's (each already names its pool): what status and the
        admission webhook show, so kubectl prints at apply time what status says after."""
        return list(self.warnings) + [w for p in self.pools.values() if p.enabled for w in p.warnings]
