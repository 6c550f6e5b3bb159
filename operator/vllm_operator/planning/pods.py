"""What the pods of a plan take from the spec besides the numbers: environment, volume sources, images and their pull
settings, tolerations, the router Deployment's settings, adapter sources and the monitoring switches.

Decided here once, so the renderer reads the Plan alone (`render(plan)`) and `vllm-operator plan` shows every value a
manifest carries. Environment, lowest precedence first: the operator's literals (usage stats off; `HF_HOME` under
/models when /models is the emptyDir the model is downloaded into — a PVC is mounted read-only, so there the image's
own default under HOME stays; `HF_HUB_OFFLINE` for a PVC), the model's Hub token as `HF_TOKEN`, then the spec's
entries in their order; a name ends up either a literal or a Secret key, never both.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence

from vllm_operator import constants
from vllm_operator.api.errors import SpecError
from vllm_operator.api.plan import AcceleratorFacts, AdapterPlan, MonitoringPlan, Resources, RouterPod
from vllm_operator.api.spec import PoolSpec, SecretKeyRef, Toleration, VLLMDeploymentSpec
from vllm_operator.images import PROJECT_IMAGE_USER, ImageDefaults

HF_HOME = f"{constants.MODELS_MOUNT}/.hf-cache"
ROUTER_HF_HOME = "/tmp/hf-home"
"""The router's root filesystem is read-only; the renderer mounts an emptyDir at /tmp for a Hub tokenizer."""
ROUTER_REPLICAS = 2
"""One node drain or one crash never takes the endpoint away."""
ROUTER_RESOURCES = Resources(requests={"cpu": "250m", "memory": "512Mi"}, limits={"memory": "1Gi"})
"""A tokenizer such as Llama-3's takes a few hundred MiB."""
GPU_TOLERATION = Toleration(key=constants.GPU_RESOURCE, operator="Exists", effect="NoSchedule")
"""The usual taint of GPU node pools."""


def model_claim(spec: VLLMDeploymentSpec) -> str | None:
    src = spec.model.source
    return src.pvc.claim_name if src is not None and src.pvc is not None else None


def engine_env(spec: VLLMDeploymentSpec, ps: PoolSpec, acc: AcceleratorFacts, pool: str, *,
               lora_on: bool = False, cached: bool = False) -> tuple[dict[str, str], dict[str, SecretKeyRef]]:
    """(literal environment, environment from Secret keys) of a pool's engine container (module docstring).
    `cached`: the weights cache holds the model (the fetch init container put it there), so vLLM reads a local
    directory and never asks the Hub (HF_HUB_OFFLINE); the token stays for the init container and Hub adapters."""
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    secrets: dict[str, SecretKeyRef] = {}
    if lora_on:  # vLLM registers /v1/load_lora_adapter and /v1/unload_lora_adapter only with this set
        env[constants.ENV_RUNTIME_LORA_UPDATING] = "True"
    if model_claim(spec) is not None:
        env["HF_HUB_OFFLINE"] = "1"
    else:
        if cached:
            env["HF_HUB_OFFLINE"] = "1"
        else:
            env["HF_HOME"] = HF_HOME
        hub = spec.model.source.hugging_face if spec.model.source is not None else None
        if hub is not None and hub.token_secret_ref is not None:
            secrets["HF_TOKEN"] = hub.token_secret_ref
    for i, var in enumerate(ps.env or []):
        if var.secret_key_ref is not None:
            env.pop(var.name, None)
            secrets[var.name] = var.secret_key_ref
            continue
        if not acc.is_gpu and var.name == "VLLM_CPU_KVCACHE_SPACE":
            raise SpecError(f"spec.pools.{pool}.env[{i}]", "VLLM_CPU_KVCACHE_SPACE would override the planned "
                            "--kv-cache-memory-bytes; size the pool with accelerator.memoryGiB instead")
        secrets.pop(var.name, None)
        env[var.name] = var.value or ""
    return dict(sorted(env.items())), dict(sorted(secrets.items()))


def tolerations(ps: PoolSpec, acc: AcceleratorFacts) -> list[Toleration]:
    """The spec's plus the GPU taint's; order does not matter to the scheduler, so sorted, and each once."""
    items = [*(ps.tolerations or []), *([GPU_TOLERATION] if acc.is_gpu else [])]
    unique = {json.dumps(t.to_wire(), sort_keys=True, separators=(",", ":")): t for t in items}
    return [unique[k] for k in sorted(unique)]


def pull_secrets(spec: VLLMDeploymentSpec, images: ImageDefaults) -> list[str]:
    own = [s.name for s in (spec.engine.image_pull_secrets or [])] if spec.engine is not None else []
    return [ref["name"] for ref in images.pull_secret_refs(own)]


def run_as_user(spec: VLLMDeploymentSpec, acc: AcceleratorFacts) -> int | None:
    """The project's images run as their own non-root user; an image the spec names keeps whatever user it has
    (the official vllm/vllm-openai runs as root with HOME=/root)."""
    runtime = (spec.engine.gpu if acc.is_gpu else spec.engine.cpu) if spec.engine else None
    return PROJECT_IMAGE_USER if runtime is None or not runtime.image else None


def router_pod(spec: VLLMDeploymentSpec, images: ImageDefaults) -> RouterPod:
    r = spec.router
    requests, limits = dict(ROUTER_RESOURCES.requests), dict(ROUTER_RESOURCES.limits)
    if r is not None and r.resources is not None:
        requests = dict(r.resources.requests) if r.resources.requests is not None else requests
        limits = dict(r.resources.limits) if r.resources.limits is not None else limits
    routing, tokenizer = spec.routing, spec.model.tokenizer
    return RouterPod(
        replicas=r.replicas if r is not None and r.replicas is not None else ROUTER_REPLICAS,
        image=r.image if r is not None and r.image else images.router(),
        image_pull_policy=spec.engine.image_pull_policy if spec.engine is not None else None,
        image_pull_secrets=pull_secrets(spec, images), resources=Resources(requests=requests, limits=limits),
        env={"HF_HOME": ROUTER_HF_HOME},
        api_key_secret=routing.api_key_secret_ref.name if routing and routing.api_key_secret_ref else None,
        tokenizer_config_map=tokenizer.config_map.name if tokenizer and tokenizer.config_map else None,
        hf_token_secret=hf_token(spec))


def hf_token(spec: VLLMDeploymentSpec) -> SecretKeyRef | None:
    """The Secret key holding the Hub token for the tokenizer: the tokenizer's own source's, else the model's."""
    sources = [spec.model.tokenizer.hugging_face if spec.model.tokenizer is not None else None,
               spec.model.source.hugging_face if spec.model.source is not None else None]
    return next((hub.token_secret_ref for hub in sources if hub is not None and hub.token_secret_ref is not None),
                None)


def adapters(spec: VLLMDeploymentSpec, served: Sequence[str]) -> list[AdapterPlan]:
    """The sources of the adapters some pool serves, by name; a PVC adapter's path is where the engine sees it."""
    out = []
    for a in sorted(spec.adapters or [], key=lambda a: a.name):
        if a.name not in served:
            continue
        hub, pvc = a.source.hugging_face, a.source.pvc
        if hub is not None:
            out.append(AdapterPlan(name=a.name, hf_repo=hub.repo, hf_revision=hub.revision or None))
        elif pvc is not None:
            path = posixpath.join(constants.ADAPTERS_PVC_ROOT, pvc.claim_name, pvc.path.lstrip("/"))
            out.append(AdapterPlan(name=a.name, claim_name=pvc.claim_name, path=posixpath.normpath(path)))
    return out


def monitoring(spec: VLLMDeploymentSpec) -> MonitoringPlan:
    m = spec.monitoring
    if m is None:
        return MonitoringPlan()
    return MonitoringPlan(pod_monitor=m.pod_monitor is not False, prometheus_rule=m.prometheus_rule is not False,
                          labels=dict(sorted((m.labels or {}).items())))
