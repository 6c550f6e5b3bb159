"""The contract module: every name and number that more than one part of the product depends on, in one place.

API group, label and annotation keys, component and condition names; the metric names the health loop, the alerts
and the dashboards select on; the engine wrapper's exit codes and termination reasons; the KV-cache dtype verdict
table the planner and the engine wrapper's preflight share; the remediation defaults the health loop and the alert
rules both resolve. The renderers, the handlers, the health loop, the router and the engine wrapper import these
rather than spelling strings, so a rename is one edit and a typo is an import error.

This module imports nothing of the product and nothing outside the standard library: the engine wrapper runs inside
vLLM's image with neither pydantic nor the planner, and reads its exit codes and the KV table from here.
"""

import enum
from dataclasses import dataclass
from typing import Final

GROUP: Final = "vllm-operator.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "VLLMDeployment"
PLURAL: Final = "vllmdeployments"
SINGULAR: Final = "vllmdeployment"
SHORT_NAME: Final = "vllmd"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"
CLASS_KIND: Final = "VLLMWorkloadClass"
CLASS_PLURAL: Final = "vllmworkloadclasses"
CLASS_SINGULAR: Final = "vllmworkloadclass"
CLASS_SHORT_NAME: Final = "vllmwc"
CLASS_CRD_NAME: Final = f"{CLASS_PLURAL}.{GROUP}"

# The label contract (docs/architecture.md, Labels).
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_DEPLOYMENT: Final = f"{GROUP}/deployment"
LABEL_POOL: Final = f"{GROUP}/pool"
APP_NAME: Final = "vllm-operator"
COMPONENT_ENGINE: Final = "engine"
COMPONENT_ROUTER: Final = "router"
COMPONENT_MONITORING: Final = "monitoring"  # PodMonitor and PrometheusRule of a VLLMDeployment
# Gateway API Inference Extension style range label ("<min>-<max>" prompt tokens the pool serves).
LABEL_CONTEXT_RANGE: Final = "llm-d.ai/context-length-range"

# Annotations.
ANNOTATION_SPEC_HASH: Final = f"{GROUP}/spec-hash"
ANNOTATION_CONFIG_HASH: Final = f"{GROUP}/config-hash"
ANNOTATION_PLAN_SUMMARY: Final = f"{GROUP}/plan"
# On a VLLMDeployment waiting for its turn in a class roll-out: the class it plans with until then, as it was before
# the edit (handlers/classes.py). Written when the roll-out starts, removed at the dependent's turn.
ANNOTATION_CLASS_PIN: Final = f"{GROUP}/workload-class-pin"
# The finalizer kopf put on every VLLMDeployment while the health loop was a kopf timer (releases up to 2d3eb9d);
# nothing needs it now, and kopf removes it from the objects it finds it on (handlers/lifecycle.py).
LEGACY_FINALIZER: Final = f"{GROUP}/finalizer"

POOL_SHORT: Final = "short"
POOL_LONG: Final = "long"
POOLS: Final = (POOL_SHORT, POOL_LONG)

# Router ConfigMap key (docs/architecture.md, RouterConfig).
ROUTER_CONFIG_KEY: Final = "router.json"

# Condition types (docs/architecture.md, Status).
COND_READY: Final = "Ready"
COND_PROGRESSING: Final = "Progressing"
COND_DEGRADED: Final = "Degraded"
COND_SPEC_VALID: Final = "SpecValid"
COND_METRICS_AVAILABLE: Final = "MetricsAvailable"
COND_RUNAWAY: Final = "RunawayGeneration"
COND_KV_PRESSURE: Final = "KVPressure"
COND_REMEDIATING: Final = "Remediating"
COND_AUTOSCALING: Final = "Autoscaling"
"""Only on VLLMDeployments with a pool that sets `autoscaling`: whether its KEDA ScaledObjects are in place."""
CONDITION_TYPES: Final = (
    COND_READY,
    COND_PROGRESSING,
    COND_DEGRADED,
    COND_SPEC_VALID,
    COND_METRICS_AVAILABLE,
    COND_RUNAWAY,
    COND_KV_PRESSURE,
    COND_REMEDIATING,
    COND_AUTOSCALING,
)

# GPU feature discovery node labels.
GFD_PRODUCT: Final = "nvidia.com/gpu.product"
GFD_MEMORY: Final = "nvidia.com/gpu.memory"
GFD_COMPUTE_MAJOR: Final = "nvidia.com/gpu.compute.major"
GFD_COMPUTE_MINOR: Final = "nvidia.com/gpu.compute.minor"
# GFD sets this above 1 on nodes whose GPUs are time-sliced (shared by that many pods) and appends "-SHARED" to
# the product label.
GFD_REPLICAS: Final = "nvidia.com/gpu.replicas"
GPU_RESOURCE: Final = "nvidia.com/gpu"

# Engine pods: where things are mounted.
MODELS_MOUNT: Final = "/models"
ENGINE_PORT: Final = 8000
WEIGHTS_CACHE_MOUNT: Final = "/weights-cache"
"""Where engine pods mount the weights cache (a node's hostPath or the deployment's claim): read-write in the fetch
init container, read-only in the engine; the same path in both, so the link the init container writes resolves."""
WEIGHTS_LINK_DIR: Final = "/run/vllm-operator/weights"
"""An emptyDir of the pod: the fetch init container writes the link to the cached model (`model`) and its progress
file there; the engine's model argument is the link."""
WEIGHTS_LINK: Final = f"{WEIGHTS_LINK_DIR}/model"
WEIGHTS_LEASES_DIR: Final = ".leases"
"""The cache's lease directory (engine/eviction.py), relative to its root."""
WEIGHTS_LEASES_MOUNT: Final = "/run/vllm-operator/weights-leases"
"""The cache's `.leases` directory, mounted read-write into the engine (the only part of the cache it may write):
the wrapper renews its pod's lease there, so a crash-looping engine keeps its entry in use (engine/eviction.py)."""
FETCH_CONTAINER: Final = "fetch-weights"
"""The init container that puts a Hub model into the weights cache (`vllm-operator fetch`)."""
CACHE_OWNER_CONTAINER: Final = "weights-cache-owner"
"""The init container that hands the cache's top directory to the engine's uid (a hostPath is created root-owned)."""
DEFAULT_WEIGHTS_CACHE_HOST_PATH: Final = "/var/lib/vllm-operator/models"
DEFAULT_WEIGHTS_CACHE_MAX_BYTES: Final = 500 * 2**30
"""The per-node cache limit when the chart sets none: a few 70B checkpoints."""
WEIGHTS_DOWNLOAD_BYTES_PER_S: Final = 10 * 2**20
"""A slow Hub link: the cold budgets (the startup backstop of an engine that downloads itself, the Deployment's
progress deadline, the wake budget of a Hub-sourced pool) count a download at this rate."""
WEIGHTS_LEASE_GRACE_S: Final = 900
"""A cache entry whose lease was touched this recently is in use even while no engine holds its lock: the fetch
touches it (the engine starts after the init container ends; image pull and start-up can take minutes), and the
engine wrapper renews it at each start and every minute, so an engine between two restarts of a crash loop (the
kubelet's back-off is at most 5 minutes) keeps its entry."""
ENGINE_STATUS_PORT: Final = 8001
ENV_RUNTIME_LORA_UPDATING: Final = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
"""vLLM's switch for its runtime LoRA endpoints (`True`/`1`); the engine wrapper loads adapters through them."""
ADAPTERS_MOUNT: Final = "/etc/vllm-operator/adapters"
"""Where engine pods mount the adapters ConfigMap (whole directory: the kubelet updates it in place)."""
ADAPTERS_PVC_ROOT: Final = "/adapters"
"""PVC-sourced adapters are mounted read-only at /adapters/<claimName>."""
ADAPTERS_HUB_CACHE: Final = "/adapters/.hub"
"""An emptyDir where the engine wrapper downloads Hub-sourced adapters (the model's /models may be a read-only PVC);
no claim can take the name, which is not a DNS name."""
LORA_ENDPOINTS: Final = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
"""vLLM's unauthenticated adapter endpoints: only the engine wrapper calls them; the router never forwards them."""
"""The engine wrapper's own endpoint (start-up phases: /startup, /status, /metrics), next to vLLM's port."""
ENGINE_STATUS_PORT_NAME: Final = "status"
ROUTER_PORT: Final = 8080

# ---------------------------------------------------------------------------------------------------------------------
# Metric names (docs/architecture.md, Labels)
# ---------------------------------------------------------------------------------------------------------------------

# vLLM's own metrics, without the `vllm:` prefix (stored as `vllm:name`, or `vllm_name` when the scrape negotiated
# OpenMetrics): select them with `metric_name`.
METRIC_RUNNING: Final = "num_requests_running"
METRIC_GENERATION_TOKENS: Final = "generation_tokens_total"
METRIC_KV_USAGE: Final = "kv_cache_usage_perc"
METRIC_PREEMPTIONS: Final = "num_preemptions_total"
METRIC_REQUEST_SUCCESS: Final = "request_success_total"
METRIC_CACHE_CONFIG_INFO: Final = "cache_config_info"
# The operator's and the router's own metrics (prometheus_client appends `_total` to counters).
METRIC_ENGINE_RESTARTS: Final = "vllm_operator_engine_restarts"
METRIC_ROUTER_PREFIX: Final = "vllm_operator_router"
METRIC_ROUTER_HELD: Final = f"{METRIC_ROUTER_PREFIX}_held_requests"
KEDA_POLLING_INTERVAL_S: Final = 15
"""How often KEDA evaluates a ScaledObject's activation (0 <-> 1) (docs/architecture.md, Autoscaling)."""
"""Requests the router holds for a pool that has no ready endpoint (a pool at zero waking up), by `pool`: the signal
that exists while the pool has no pods, so KEDA's activation trigger wakes it (docs/architecture.md, Autoscaling)."""


def metric_name(metric: str) -> str:
    """A PromQL `__name__` matcher for a vLLM metric in either spelling (`vllm:foo` or `vllm_foo`)."""
    return f'__name__=~"vllm[:_]{metric}"'


# ---------------------------------------------------------------------------------------------------------------------
# Engine wrapper exit codes and termination reasons (docs/architecture.md, Exit codes)
# ---------------------------------------------------------------------------------------------------------------------
# vLLM has no OOM metric and its API server exits with code 0 when its engine core dies, so from Kubernetes alone a
# run-time CUDA OOM looks like a clean exit. The wrapper (`vllm_operator.engine.main`) reads vLLM's log, turns the
# failures that matter into these exit codes, and writes one JSON line to the container's termination message file
# (`{"reason": "EngineOOM", "exitCode": 87, ...}`); `health.diagnose` reads both back from `lastState.terminated`.
# Codes sit in 78-89, clear of vLLM's own 1/2, the shell's 126/127 and 128+signal. The weights-cache init container
# (`vllm_operator.engine.fetch`, `vllm-operator fetch`) writes the same kind of message with 78-81 (and StartupStalled
# for a fetch that stops moving).

EXIT_ENGINE_OOM: Final = 87
"""The engine ran out of accelerator memory ("CUDA out of memory" / torch OutOfMemoryError), at start or at run time."""

EXIT_ENGINE_DEAD: Final = 88
"""The engine core died ("EngineCore encountered a fatal error", engine core process died) — vLLM itself exits 0."""

EXIT_KV_CACHE_TOO_SMALL: Final = 89
"""Start-up refused: one sequence of max_model_len needs more KV cache than the memory left ("KV cache is needed,
which is larger than the available KV cache memory")."""

EXIT_PREFLIGHT_FAILED: Final = 85
"""The wrapper's preflight failed before vLLM started: too little free GPU memory for the plan's budget, or FP8 KV
requested on a GPU whose compute capability cannot do it."""

EXIT_UNEXPECTED: Final = 86
"""vLLM exited with code 0 although nobody asked it to stop and no failure text was seen: a server never ends on its
own, so this is reported as a failure too."""

EXIT_LAUNCH_FAILED: Final = 84
"""The launch command could not be started (not found, not executable), or the status port could not be opened."""

EXIT_STARTUP_STALLED: Final = 83
"""The start stopped advancing: one start-up phase (`StartupPhase`) went its limit without a new phase, a progress
line or a downloaded byte, so the wrapper stopped vLLM. The termination message names the phase and the limit."""

EXIT_STARTUP_FAILED: Final = 82
"""vLLM exited with an error before it served, and the error is none of the above (not out of memory, not a KV cache
too small): a combination of model, arguments and GPU that this vLLM cannot run — e.g. FlashAttention 3's
"For FP8 input, output must have dtype BF16" in CUDA graph capture (issue 38). Restarting with smaller memory
settings cannot help, so the health loop reports it (with vLLM's error line) and steps nothing down."""

EXIT_HUB_UNREACHABLE: Final = 78
"""The weights fetch got no answer from the Hugging Face Hub (connection refused, DNS, timeout, HTTP 5xx)."""

EXIT_MODEL_ACCESS_DENIED: Final = 79
"""The Hub refused the pod's token for the model (gated, private, not found, revision unknown, HTTP 401/403): also
what a pod gets whose token may not read a model another namespace's pod put into the cache."""

EXIT_CACHE_DISK_FULL: Final = 80
"""The weights cache's file system ran out of space during the fetch; the partial fetch was removed."""

EXIT_FETCH_FAILED: Final = 81
"""The weights fetch failed otherwise (a file that stays corrupt after a second fetch, an unexpected error)."""

EXIT_WEIGHTS_GONE: Final = 90
"""The engine found its weights cache entry gone (evicted, or deleted by hand, while no engine ran it for longer than
the lease grace). Restarts cannot bring it back — the fetch is an init container, run only when a pod is created — so
the health loop replaces the pod instead of letting the kubelet restart it forever."""

REASON_HUB_UNREACHABLE: Final = "HubUnreachable"
REASON_MODEL_ACCESS_DENIED: Final = "ModelAccessDenied"
REASON_CACHE_DISK_FULL: Final = "CacheDiskFull"
REASON_FETCH_FAILED: Final = "FetchFailed"
REASON_WEIGHTS_GONE: Final = "WeightsGone"
REASON_ENGINE_OOM: Final = "EngineOOM"
REASON_ENGINE_DEAD: Final = "EngineDead"
REASON_KV_CACHE_TOO_SMALL: Final = "KVCacheTooSmall"
REASON_PREFLIGHT_FAILED: Final = "PreflightFailed"
REASON_UNEXPECTED_EXIT: Final = "UnexpectedExit"
REASON_LAUNCH_FAILED: Final = "LaunchFailed"
REASON_STARTUP_STALLED: Final = "StartupStalled"
REASON_STARTUP_FAILED: Final = "StartupFailed"

EXIT_REASONS: Final = {
    EXIT_ENGINE_OOM: REASON_ENGINE_OOM,
    EXIT_ENGINE_DEAD: REASON_ENGINE_DEAD,
    EXIT_KV_CACHE_TOO_SMALL: REASON_KV_CACHE_TOO_SMALL,
    EXIT_PREFLIGHT_FAILED: REASON_PREFLIGHT_FAILED,
    EXIT_UNEXPECTED: REASON_UNEXPECTED_EXIT,
    EXIT_LAUNCH_FAILED: REASON_LAUNCH_FAILED,
    EXIT_STARTUP_STALLED: REASON_STARTUP_STALLED,
    EXIT_STARTUP_FAILED: REASON_STARTUP_FAILED,
    EXIT_HUB_UNREACHABLE: REASON_HUB_UNREACHABLE,
    EXIT_MODEL_ACCESS_DENIED: REASON_MODEL_ACCESS_DENIED,
    EXIT_CACHE_DISK_FULL: REASON_CACHE_DISK_FULL,
    EXIT_FETCH_FAILED: REASON_FETCH_FAILED,
    EXIT_WEIGHTS_GONE: REASON_WEIGHTS_GONE,
}
"""Exit code -> reason (the `reason` field of the termination message)."""

EXIT_CODES: Final = {reason: code for code, reason in EXIT_REASONS.items()}
"""Reason -> exit code."""

TERMINATION_MESSAGE_MAX_BYTES: Final = 4096
"""Kubernetes keeps at most 4096 bytes of a termination message."""

# ---------------------------------------------------------------------------------------------------------------------
# Engine start-up phases (the wrapper's engine/phases.py reads them off vLLM's log; the health loop reports them and the
# startup probe's backstop adds their limits up)
# ---------------------------------------------------------------------------------------------------------------------


class StartupPhase(enum.StrEnum):
    """Where an engine start is, in the order vLLM 0.32 usually goes (Compiling may also follow KVCacheAllocated:
    CUDA-graph capture comes after the KV cache is sized)."""

    LAUNCHING = "Launching"
    DOWNLOADING = "Downloading"
    LOADING_WEIGHTS = "LoadingWeights"
    COMPILING = "Compiling"
    PROFILING_MEMORY = "ProfilingMemory"
    KV_CACHE_ALLOCATED = "KVCacheAllocated"
    SERVING = "Serving"


STARTUP_PHASES: Final = tuple(StartupPhase)

STARTUP_PHASE_LIMITS_S: Final = {
    StartupPhase.LAUNCHING: 900.0,
    StartupPhase.DOWNLOADING: 600.0,
    StartupPhase.LOADING_WEIGHTS: 1200.0,
    StartupPhase.COMPILING: 1800.0,
    StartupPhase.PROFILING_MEMORY: 900.0,
    StartupPhase.KV_CACHE_ALLOCATED: 1200.0,
}
"""Seconds a phase may go without advancing before the start counts as stalled (Serving has no limit).

* Launching 15 min: importing torch and CUDA libraries from a cold network disk, NCCL set-up for tensor parallelism;
  vLLM prints nothing for long stretches (on 2 CPU cores each of its three processes took ~25 s to import torch).
* Downloading 10 min without one new byte (not 10 minutes in all: a download that moves is never stalled).
* LoadingWeights 20 min between shard-progress lines: one 5 GB shard from a slow PersistentVolume at 10 MB/s.
* Compiling 30 min between compile lines: one torch.compile graph of a large model takes minutes without a cache.
* ProfilingMemory 15 min: one forward pass of max-num-batched-tokens, compile excluded (it is its own phase).
* KVCacheAllocated 20 min: KV tensors, warm-up and the API server's start after the KV cache is sized.
"""

# The engine wrapper's own series on its status port (plain names, no `vllm:`).
METRIC_STARTUP_PHASE: Final = "vllm_operator_engine_startup_phase"
METRIC_ADAPTER_LOADED: Final = "vllm_operator_engine_adapter_loaded"
METRIC_STARTUP_PHASE_SINCE: Final = "vllm_operator_engine_startup_phase_since_timestamp_seconds"
METRIC_STARTUP_LAST_PROGRESS: Final = "vllm_operator_engine_startup_last_progress_timestamp_seconds"
METRIC_STARTUP_STALLED: Final = "vllm_operator_engine_startup_stalled"
METRIC_STARTUP_LIMIT: Final = "vllm_operator_engine_startup_phase_limit_seconds"
METRIC_STARTUP_DOWNLOAD: Final = "vllm_operator_engine_startup_download_bytes"
METRIC_STARTUP_DOWNLOAD_TOTAL: Final = "vllm_operator_engine_startup_download_total_bytes"
METRIC_STARTUP_DOWNLOAD_FILES: Final = "vllm_operator_engine_startup_download_files"
"""Files of the download finished and verified (the weights cache's fetch counts them; a download vLLM makes itself
does not export it)."""
METRIC_STARTUP_DOWNLOAD_TOTAL_FILES: Final = "vllm_operator_engine_startup_download_total_files"
METRIC_STARTUP_DOWNLOAD_ETA: Final = "vllm_operator_engine_startup_download_eta_seconds"
"""Seconds the download still needs at its average rate so far (only once bytes have moved)."""
METRIC_STARTUP_KV_TOKENS: Final = "vllm_operator_engine_startup_kv_cache_tokens"
METRIC_STARTUP_DURATION: Final = "vllm_operator_engine_startup_phase_duration_seconds"
METRIC_PROCESS_START: Final = "vllm_operator_engine_process_start_timestamp_seconds"
METRIC_ENGINE_UNRESPONSIVE: Final = "vllm_operator_engine_unresponsive"
"""1 once the wrapper's one-token probes of an idle engine failed `failures` times in a row (engine/idleprobe.py)."""
METRIC_IDLE_PROBE_FAILURES: Final = "vllm_operator_engine_idle_probe_failures"
METRIC_IDLE_PROBE_LAST_SUCCESS: Final = "vllm_operator_engine_idle_probe_last_success_timestamp_seconds"
REASON_ENGINE_UNRESPONSIVE: Final = "EngineUnresponsive"
"""The health loop's state (and event reasons) for an engine whose /health answers while it generates nothing."""

# ---------------------------------------------------------------------------------------------------------------------
# Remediation defaults: what `spec.remediation` means when a field is unset (the health loop and the alert rules)
# ---------------------------------------------------------------------------------------------------------------------

DEFAULT_INTERVAL_S: Final = 30
DEFAULT_WINDOW_S: Final = 600
DEFAULT_STALL_S: Final = 120
DEFAULT_LENGTH_SHARE_WATCH: Final = 0.05
DEFAULT_LENGTH_SHARE_ALERT: Final = 0.20
DEFAULT_KV_PRESSURE: Final = 0.95
DEFAULT_OOM_COUNT: Final = 2
DEFAULT_OOM_WINDOW_S: Final = 900
DEFAULT_RESTART_BUDGET: Final = 3
DEFAULT_BUDGET_WINDOW_S: Final = 3600
STALLED_POD_GRACE_S: Final = 5
"""The grace period the health loop deletes a stalled engine's pod with, instead of the pod's own 30 s: an engine
that makes no progress cannot drain, so a graceful stop only keeps its GPU (or cores) from the replacement, which on
a full node waits Pending until the kubelet has killed it. Not 0: a forced deletion removes the pod object before
its processes are gone, and the scheduler would hand the GPU they still hold to the replacement."""
MIN_FINISHED_FOR_SHARE: Final = 10
"""Fewer finished requests than this in the window: the length share is not judged (one truncated request of two
is not a runaway)."""

# ---------------------------------------------------------------------------------------------------------------------
# KV cache dtypes per attention backend and compute capability (the planner and the engine wrapper's preflight)
# ---------------------------------------------------------------------------------------------------------------------

class AttentionBackend(enum.StrEnum):
    """vLLM attention backends that decide which KV dtypes a GPU can store (`--attention-backend`)."""

    FLASH_ATTN = "FLASH_ATTN"
    FLASHINFER = "FLASHINFER"
    TRITON_ATTN = "TRITON_ATTN"
    CPU_ATTN = "CPU_ATTN"


class KVVerdict(enum.StrEnum):
    """What the planner (and the engine wrapper's preflight) does with a KV dtype on a GPU."""

    DEFAULT = "default"        # the GPU's default backend stores it natively; profiles may pick it on their own
    ON_REQUEST = "on-request"  # works (vLLM picks another backend or emulates), only when the spec asks for it
    REFUSED = "refused"        # no backend can run it on this GPU


_BF16_FP16 = frozenset({"auto", "bfloat16", "float16"})
_FP8_E4M3 = frozenset({"fp8", "fp8_e4m3"})
_FP8_ALL = _FP8_E4M3 | {"fp8_e5m2"}


@dataclass(frozen=True)
class BackendKVRule:
    """Dtypes one backend stores in a range of compute capabilities [min_cc, max_cc]."""

    backend: AttentionBackend
    min_cc: tuple[int, int]
    max_cc: tuple[int, int]
    dtypes: frozenset[str]
    source: str


# Read off vLLM 0.33.0's attention backends (their supported KV-cache dtypes and compute capabilities): FlashAttention
# stores fp8/fp8_e4m3 only with FA3 on SM90/SM100 and never e5m2; FlashInfer (SM 8.0-12.1) adds e5m2; Triton attention
# stores every fp8 flavour on any GPU. bfloat16 needs SM80 or newer in hardware (vLLM casts bf16 models to fp16 on a
# T4).
KV_DTYPE_TABLE: tuple[BackendKVRule, ...] = (
    BackendKVRule(AttentionBackend.FLASH_ATTN, (8, 0), (8, 9), _BF16_FP16, "FA2: no fp8 KV"),
    BackendKVRule(AttentionBackend.FLASH_ATTN, (9, 0), (10, 3), _BF16_FP16 | _FP8_E4M3, "FA3: fp8/e4m3, never e5m2"),
    BackendKVRule(AttentionBackend.FLASH_ATTN, (11, 0), (12, 1), _BF16_FP16, "FA2 on newer consumer parts"),
    BackendKVRule(AttentionBackend.FLASHINFER, (8, 0), (12, 1), _BF16_FP16 | _FP8_ALL, "FlashInfer: all fp8"),
    BackendKVRule(AttentionBackend.TRITON_ATTN, (7, 0), (7, 9), frozenset({"auto", "float16"}) | _FP8_ALL,
                  "Triton before SM80: no bf16 hardware"),
    BackendKVRule(AttentionBackend.TRITON_ATTN, (8, 0), (12, 1), _BF16_FP16 | _FP8_ALL, "Triton: fp8 on any GPU"),
    BackendKVRule(AttentionBackend.CPU_ATTN, (0, 0), (0, 0), _BF16_FP16 | {"fp8"},
                  "CPU: fp8 only with AVX512/AMX"),
)

# Hardware FP8 (Ada SM89, Hopper SM90 and newer): where a class profile may choose FP8 KV on its own.
NATIVE_FP8_MIN_CC = (8, 9)


def default_backend(cc: tuple[int, int] | None) -> AttentionBackend:
    """The backend vLLM picks for a model-dtype KV cache: FlashAttention from SM80, Triton below, CPU without GPU."""
    if cc is None:
        return AttentionBackend.CPU_ATTN
    return AttentionBackend.FLASH_ATTN if cc >= (8, 0) else AttentionBackend.TRITON_ATTN


def backend_supports(backend: AttentionBackend, cc: tuple[int, int] | None, dtype: str) -> bool:
    key = cc if cc is not None else (0, 0)
    if cc is not None and backend is AttentionBackend.CPU_ATTN:
        return False
    if cc is None and backend is not AttentionBackend.CPU_ATTN:
        return False
    return any(rule.backend is backend and rule.min_cc <= key <= rule.max_cc and dtype in rule.dtypes
               for rule in KV_DTYPE_TABLE)


def kv_dtype_verdict(cc: tuple[int, int] | None, dtype: str,
                     backend: AttentionBackend | None = None) -> KVVerdict:
    """Classify a KV dtype for a device (cc None = CPU), optionally for an explicitly chosen backend."""
    value = str(dtype)
    if cc is None and backend is None and value in _FP8_ALL:
        # CPU attention stores fp8 only on AVX512/AMX hosts, which the planner cannot see: opt-in only.
        return KVVerdict.ON_REQUEST if backend_supports(AttentionBackend.CPU_ATTN, None, value) else KVVerdict.REFUSED
    if backend is not None:
        return KVVerdict.DEFAULT if backend_supports(backend, cc, value) else KVVerdict.REFUSED
    if backend_supports(default_backend(cc), cc, value):
        if value in _FP8_ALL and cc is not None and cc < NATIVE_FP8_MIN_CC:
            return KVVerdict.ON_REQUEST
        return KVVerdict.DEFAULT
    if any(backend_supports(b, cc, value) for b in AttentionBackend):
        native = cc is not None and cc >= NATIVE_FP8_MIN_CC and any(
            backend_supports(b, cc, value) for b in AttentionBackend if b is not AttentionBackend.TRITON_ATTN)
        return KVVerdict.DEFAULT if native else KVVerdict.ON_REQUEST
    return KVVerdict.REFUSED


