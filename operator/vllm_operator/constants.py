"""Every name other tools depend on, in one place: API group, label and annotation keys, component names.

Renderers, handlers, the router and the simulated cluster import these rather than spelling strings, so a
rename is one edit and a typo is an import error.
"""

from typing import Final

GROUP: Final = "vllm-operator.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "VLLMDeployment"
PLURAL: Final = "vllmdeployments"
SINGULAR: Final = "vllmdeployment"
SHORT_NAME: Final = "vllmd"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

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
# The set of fields the operator wrote on a child (rendering/applied.py): how a later patch removes dropped keys.
ANNOTATION_APPLIED_FIELDS: Final = f"{GROUP}/applied-fields"

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
CONDITION_TYPES: Final = (
    COND_READY,
    COND_PROGRESSING,
    COND_DEGRADED,
    COND_SPEC_VALID,
    COND_METRICS_AVAILABLE,
    COND_RUNAWAY,
    COND_KV_PRESSURE,
    COND_REMEDIATING,
)

# GPU feature discovery node labels.
GFD_PRODUCT: Final = "nvidia.com/gpu.product"
GFD_MEMORY: Final = "nvidia.com/gpu.memory"
GFD_COUNT: Final = "nvidia.com/gpu.count"
GFD_COMPUTE_MAJOR: Final = "nvidia.com/gpu.compute.major"
GFD_COMPUTE_MINOR: Final = "nvidia.com/gpu.compute.minor"
# GFD sets this above 1 on nodes whose GPUs are time-sliced (shared by that many pods) and appends "-SHARED" to
# the product label.
GFD_REPLICAS: Final = "nvidia.com/gpu.replicas"
GPU_RESOURCE: Final = "nvidia.com/gpu"

# Engine pods: where things are mounted.
MODELS_MOUNT: Final = "/models"
ENGINE_PORT: Final = 8000
ROUTER_PORT: Final = 8080
