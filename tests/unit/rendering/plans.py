"""Hand-built Plans for renderer tests that must not depend on the planner's numbers.

The golden tests render real plans from `examples/`; these fixtures pin the renderer's own behaviour (GPU vs CPU,
disabled pools, long names, model sources) with plans whose every number is visible here. `with_spec` fills in what
planning takes from a spec besides the numbers (environment, volume sources, images, tolerations, the router pod,
adapters, monitoring) with the planner's own code (`planning/pods.py`), so a case pairs hand-built numbers with a real
spec.
"""

from __future__ import annotations

from typing import Any

import yaml

from tests.support.paths import EXAMPLES
from vllm_operator import constants, names
from vllm_operator.api.plan import AcceleratorFacts, KVBreakdown, KVPlan, Plan, PoolPlan, Resources, RouterPod
from vllm_operator.api.resource import parse_resource
from vllm_operator.api.router_config import (
    PoolRoute,
    PoolRoutes,
    RouterConfig,
    ServiceRef,
    TierConfig,
    Timeouts,
    TokenizerConfig,
)
from vllm_operator.api.spec import OverLimit, PoolSpec, VLLMDeploymentSpec
from vllm_operator.images import DEFAULT_IMAGES, ImageDefaults
from vllm_operator.planning import pods
from vllm_operator.planning.planner import RemediationState, plan
from vllm_operator.rendering import adapters

GIB = 2**30


def example_spec(file: str) -> VLLMDeploymentSpec:
    return parse_resource(yaml.safe_load((EXAMPLES / file).read_text())).spec


def spec_from(data: dict[str, Any]) -> VLLMDeploymentSpec:
    return parse_resource({"apiVersion": constants.API_VERSION, "kind": constants.KIND,
                           "metadata": {"name": "x", "namespace": "ns"}, "spec": data}).spec


def kv(weights_gib: float, device_gib: float, utilization: float) -> KVPlan:
    budget = int(device_gib * GIB * utilization - weights_gib * GIB - GIB)
    return KVPlan(bytes_per_token=131072, budget_bytes=budget, planned_tokens=budget // 131072,
                  concurrency_at_full_length=4.0, typical_sequence_tokens=1024, concurrency_at_typical_length=40.0,
                  breakdown=KVBreakdown(device_bytes=int(device_gib * GIB), utilization=utilization,
                                        weights_bytes=int(weights_gib * GIB), activation_bytes=GIB // 2,
                                        non_torch_bytes=GIB // 4, cuda_graph_bytes=0, margin_bytes=GIB // 4))


def pool(name: str, *, gpu: bool, enabled: bool = True, max_model_len: int, max_tokens: int, low: int, high: int,
         replicas: int = 1, model: str = "meta-llama/Llama-3.1-8B-Instruct") -> PoolPlan:
    if gpu:
        memory = ["--gpu-memory-utilization=0.9"]
        resources = Resources(limits={constants.GPU_RESOURCE: "1"})
        products = ["NVIDIA-L4"]
        image = "vllm/vllm-openai:v0.33.0"
    else:
        memory = ["--kv-cache-memory-bytes=1073741824"]
        resources = Resources(requests={"cpu": "1", "memory": "4Gi"}, limits={"memory": "4Gi"})
        products = []
        image = "ghcr.io/vllm-operator/engine-cpu:0.32.0"
    args = [f"--max-model-len={max_model_len}", "--max-num-seqs=64", "--max-num-batched-tokens=2048",
            "--host=$(POD_IP)", "--port=8000", *memory, "--served-model-name=llama",
            f'--override-generation-config={{"max_new_tokens":{max_tokens}}}', "--enable-chunked-prefill"]
    return PoolPlan(name=name, enabled=enabled, replicas=replicas, external_autoscaler=False,
                    max_model_len=max_model_len, max_tokens=max_tokens, max_num_seqs=64, max_num_batched_tokens=2048,
                    kv_cache_dtype="auto", gpu_memory_utilization=0.9 if gpu else None, prompt_range=(low, high),
                    model=model, served_model_name="llama", engine_args=args, env={"VLLM_LOGGING_LEVEL": "INFO"},
                    resources=resources, gpu_products=products, image=image,
                    kv=kv(15.0 if gpu else 0.05, 22.0 if gpu else 4.0, 0.9 if gpu else 1.0), step_down_level=0)


def router_config(name: str, namespace: str, short: PoolPlan, long: PoolPlan, *, api_keys: bool = False,
                  tokenizer: TokenizerConfig | None = None) -> RouterConfig:
    def route(p: PoolPlan) -> PoolRoute:
        return PoolRoute(enabled=p.enabled, max_model_len=p.max_model_len, max_tokens=p.max_tokens,
                         service=ServiceRef(namespace=namespace, name=names.pool(name, p.name),
                                            port=constants.ENGINE_PORT))
    return RouterConfig(
        model="llama", deployment=name, namespace=namespace, prompt_length_threshold=short.prompt_range[1],
        over_limit=OverLimit.CLAMP, tiers=[TierConfig(name="free", default_max_tokens=256, max_tokens=512)],
        pools=PoolRoutes(short=route(short), long=route(long)),
        tokenizer=tokenizer or TokenizerConfig(hf_repo="meta-llama/Llama-3.1-8B-Instruct"),
        timeouts=Timeouts(connect_seconds=2, first_byte_seconds=60, idle_seconds=30, total_seconds=600),
        api_keys_dir="/etc/vllm-operator/api-keys" if api_keys else None, max_body_bytes=8 * 2**20)


def make_plan(*, gpu: bool = True, name: str = "chat", namespace: str = "ml", long_enabled: bool = True,
              api_keys: bool = False, tokenizer: TokenizerConfig | None = None, threshold: int = 3072,
              short_replicas: int = 2) -> Plan:
    short = pool("short", gpu=gpu, max_model_len=4096, max_tokens=512, low=0, high=threshold,
                 replicas=short_replicas)
    long = pool("long", gpu=gpu, enabled=long_enabled, max_model_len=16384, max_tokens=1024, low=threshold,
                high=16384 - 1)
    if gpu:
        accel = AcceleratorFacts(type="nvidia-l4-24gb", count=1, memory_bytes=22 * GIB, compute_capability=(8, 9),
                                 product="NVIDIA-L4", is_gpu=True)
    else:
        accel = AcceleratorFacts(type="cpu", count=1, memory_bytes=4 * GIB, is_gpu=False)
    router = router_config(name, namespace, short, long, api_keys=api_keys, tokenizer=tokenizer)
    router_pod = RouterPod(replicas=2, image=DEFAULT_IMAGES.router(), resources=pods.ROUTER_RESOURCES,
                           env={"HF_HOME": pods.ROUTER_HF_HOME})
    return Plan(name=name, namespace=namespace, workload_class="chat", engine_version="0.33.0" if gpu else "0.32.0",
                accelerator=accel, pools={"short": short, "long": long}, router=router, router_pod=router_pod,
                hash="0" * 64)


def with_spec(p: Plan, spec: VLLMDeploymentSpec, images: ImageDefaults = DEFAULT_IMAGES) -> Plan:
    """`p` with what the planner takes from `spec` besides the numbers (module docstring); the pools keep their
    hand-built literal environment under the spec's."""
    pools = {}
    for name, pool in p.pools.items():
        ps = getattr(spec.pools, name, None) if spec.pools is not None else None
        ps = ps if isinstance(ps, PoolSpec) else PoolSpec()
        env, secret_env = pods.engine_env(spec, ps, p.accelerator, name, lora_on=adapters.lora_enabled(pool))
        pools[name] = pool.model_copy(update={
            "env": {**pool.env, **env}, "secret_env": secret_env, "tolerations": pods.tolerations(ps, p.accelerator),
            "node_selector": dict(ps.node_selector or {}), "model_claim": pods.model_claim(spec),
            "image_pull_policy": spec.engine.image_pull_policy if spec.engine is not None else None,
            "image_pull_secrets": pods.pull_secrets(spec, images),
            "run_as_user": pods.run_as_user(spec, p.accelerator)})
    served = [a for pool in pools.values() if pool.enabled for a in pool.adapters]
    return p.model_copy(update={
        "pools": pools, "router_pod": pods.router_pod(spec, images), "adapters": pods.adapters(spec, served),
        "monitoring": pods.monitoring(spec), "thresholds": spec.remediation.thresholds if spec.remediation else None})


def planned(spec: VLLMDeploymentSpec, name: str = "chat", namespace: str = "ml") -> Plan:
    """The planner's own plan of `spec` (for cases where the spec, not the numbers, is under test)."""
    return plan(spec, None, RemediationState(), name=name, namespace=namespace)


GPU_SPEC_FILE = "chat.yaml"
CPU_SPEC_FILE = "cpu-dev.yaml"


def gpu_case() -> tuple[Plan, VLLMDeploymentSpec]:
    """Llama-3.1-8B chat on L4 from the Hub with an HF token and API keys (examples/chat.yaml's spec)."""
    spec = example_spec(GPU_SPEC_FILE)
    return with_spec(make_plan(gpu=True, api_keys=True, tokenizer=TokenizerConfig(
        hf_repo="meta-llama/Llama-3.1-8B-Instruct", hf_token_file="/etc/vllm-operator/hf-token/token")), spec), spec


def cpu_case() -> tuple[Plan, VLLMDeploymentSpec]:
    """A tiny model on CPU pools from a PVC (examples/cpu-dev.yaml's spec), one router replica."""
    spec = example_spec(CPU_SPEC_FILE)
    return with_spec(make_plan(gpu=False, name="cpu-dev", namespace="dev", threshold=512), spec), spec


__all__ = ["cpu_case", "gpu_case", "make_plan", "planned", "spec_from", "with_spec"]
