"""`plan()`: a VLLMDeployment spec + accelerator facts + remediation state -> the Plan (docs/architecture.md, Plan).

One pure function so that the operator, the offline CLI, the e2e harness and the GPU benchmark all agree on what a
spec means. The order is fixed and each step can refuse with a SpecError naming the field and the numbers:

1. resolve the model (spec facts > catalog by id > refuse) and the accelerator (given facts > catalog type);
2. per pool: fill unset fields from the class profile (clamped to the model's native context), check lengths and
   max_tokens, pick the KV dtype (profile FP8 only where native; a requested dtype against the GPU's table), apply
   the remediation rungs (ladder.py), size the KV cache (kvcache.py) and refuse when one full-length sequence does
   not fit, warn when the class's concurrency at full length does not;
3. the router's configuration from the same numbers (docs/architecture.md, max_tokens: tier defaults filled, a tier
   cap above the long pool's maxTokens refused);
4. a stable hash over the whole plan.

Defaults chosen here (documented in the README's class table): replicas 1; a missing tier list becomes one tier
`default` whose cap is the long pool's maxTokens and whose default is the short pool's maxTokens (so a request that
omits max_tokens still fits the short pool); router timeouts connect 2 s / first byte 60 s / idle 30 s / total
600 s; request bodies up to 8 MiB; over-limit `clamp`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from vllm_operator import constants, names
from vllm_operator.api.errors import SpecError
from vllm_operator.api.plan import (
    AcceleratorFacts,
    AutoscalingPlan,
    KVBreakdown,
    KVPlan,
    Plan,
    PoolPlan,
    Resources,
    WeightsCachePlan,
)
from vllm_operator.api.remediation import merge_thresholds
from vllm_operator.api.resource import VLLMDeployment
from vllm_operator.api.router_config import (
    HealthCheckConfig,
    PoolRoute,
    PoolRoutes,
    PrefixRouting,
    RouterConfig,
    ServiceRef,
    TierConfig,
    Timeouts,
    TokenizerConfig,
)
from vllm_operator.api.spec import (
    LORA_RANKS,
    AcceleratorType,
    AutoscalingMetric,
    KVCacheDtype,
    OverLimit,
    PoolSpec,
    RoutingStrategy,
    VLLMDeploymentSpec,
)
from vllm_operator.api.status import VLLMDeploymentStatus
from vllm_operator.api.workload_class import ClassAutoscaling, ClassPool, KVCachePolicy
from vllm_operator.images import DEFAULT_IMAGES, ImageDefaults
from vllm_operator.planning import (
    catalog,
    engine_args,
    host_resources,
    kvcache,
    ladder,
    lora,
    pods,
    profiles,
    weights_cache,
)
from vllm_operator.planning.catalog import GIB, MIB, ModelInfo

API_KEYS_DIR = "/etc/vllm-operator/api-keys"
TOKENIZER_DIR = "/etc/vllm-operator/tokenizer"
HF_TOKEN_FILE = "/etc/vllm-operator/hf-token/token"
DEFAULT_TIMEOUTS = Timeouts(connect_seconds=2, first_byte_seconds=60, idle_seconds=30, total_seconds=600)
DEFAULT_MAX_BODY_BYTES = 8 * MIB
DEFAULT_TIER = "default"
DEFAULT_CPU_CORES = 2
# CUDA graphs are captured outside `utilization × total`: keep this much free beyond the graphs' estimate.
GRAPH_HEADROOM_BYTES = GIB // 4


@dataclass(frozen=True)
class PoolRemediation:
    """A pool's rungs on the two ladders (from status.pools.<p>.stepDown), and whether the health loop has ever
    moved it on one (its history is not empty: a step-down, a KV rung, a step back up, a reset)."""

    step_down_level: int = 0
    kv_level: int = 0
    moved: bool = False


@dataclass(frozen=True)
class RemediationState:
    """What the health loop has done so far, per pool; empty = plan as specified."""

    pools: Mapping[str, PoolRemediation] = field(default_factory=dict)

    def pool(self, name: str) -> PoolRemediation:
        return self.pools.get(name, PoolRemediation())

    @classmethod
    def from_status(cls, status: VLLMDeploymentStatus | None) -> RemediationState:
        if status is None or status.pools is None:
            return cls()
        pools = {}
        for name in constants.POOLS:
            entry = getattr(status.pools, name)
            if entry is not None:
                step = entry.step_down
                pools[name] = PoolRemediation(step.level, step.kv_level, moved=bool(step.history))
        return cls(pools)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f}"


# --- model and accelerator ------------------------------------------------------------------------------------------

QUANTIZATION_CHECKPOINTS: dict[str, frozenset[str]] = {
    "awq": frozenset({"awq"}), "gptq": frozenset({"gptq"}), "fp8": frozenset({"fp8", "none"}),
}
"""model.quantization -> the checkpoint quant_methods vLLM starts with it. vLLM (config/model.py
`_verify_quantization`, 0.26 to 0.33) takes the method from the checkpoint's quantization_config and refuses a
different `--quantization`: "Quantization method specified in the model config (compressed-tensors) does not match
the quantization method specified in the `quantization` argument (fp8)"; `--quantization=fp8` on an unquantized
checkpoint is online FP8 quantization, while awq and gptq need the checkpoint's own quantization config."""


def check_quantization(spec: VLLMDeploymentSpec) -> None:
    """SpecError when model.quantization disagrees with the checkpoint's quant_method (facts.checkpointQuantization,
    known when the facts were read off config.json): such a pool would never start."""
    quant, facts = spec.model.quantization, spec.model.facts
    if quant is None or facts is None or facts.checkpoint_quantization is None:
        return
    method = facts.checkpoint_quantization
    if method in QUANTIZATION_CHECKPOINTS[quant.value]:
        return
    what = "an unquantized checkpoint" if method == "none" else f"a {method} checkpoint"
    fix = ("leave spec.model.quantization unset: vLLM reads the method from the checkpoint" if method != "none"
           else "use a checkpoint quantized with it, or leave spec.model.quantization unset")
    raise SpecError("spec.model.quantization", f"{quant.value} does not match the checkpoint's quantization_config "
                    f"quant_method ({method}; spec.model.facts.checkpointQuantization): vLLM refuses to start "
                    f"{what} with --quantization={quant.value}; {fix}")


def resolve_model(spec: VLLMDeploymentSpec) -> ModelInfo:
    """spec.model.facts, else the catalog by name (or by the Hub repo), else SpecError."""
    if spec.model.facts is not None:
        check_quantization(spec)
        return catalog.model_from_facts(spec.model.name, spec.model.facts)
    found = catalog.catalog_model(spec.model.name)
    hf = spec.model.source.hugging_face if spec.model.source else None
    if found is None and hf is not None and hf.repo:
        found = catalog.catalog_model(hf.repo)
    if found is None:
        known = ", ".join(m.name for m in catalog.MODELS)
        raise SpecError("spec.model.name", f"{spec.model.name!r} is not in the model catalog (known: {known}); "
                        "give spec.model.facts (numLayers, numKVHeads, headDim, maxContextLength, weightsGiB) "
                        "or plan --model-config config.json")
    return found


def resolve_accelerator(spec: VLLMDeploymentSpec, given: AcceleratorFacts | None) -> AcceleratorFacts:
    acc = spec.accelerator
    if given is not None:
        return given if given.count == acc.count or not given.is_gpu else given.model_copy(update={"count": acc.count})
    if acc.type is AcceleratorType.AUTO:
        raise SpecError("spec.accelerator.type",
                        "accelerator.type auto must be resolved from node labels (offline: --gpu TYPE)")
    if acc.type is AcceleratorType.CPU:
        if acc.memory_gib is None:
            raise SpecError("spec.accelerator.memoryGiB", "required when accelerator.type is cpu")
        return catalog.cpu_facts(acc.memory_gib)
    return catalog.gpu_facts(catalog.gpu_type(acc.type.value), acc.count)


def _weights_bytes(spec: VLLMDeploymentSpec, model: ModelInfo) -> int:
    quant = spec.model.quantization
    if quant is None or spec.model.facts is not None:  # facts give the checkpoint's own size
        return model.weights_bytes
    return catalog.quantized_weights_bytes(model, quant.value)


def _check_tensor_parallel(model: ModelInfo, tp: int) -> None:
    if tp <= 1:
        return
    heads = model.num_attention_heads
    if heads is not None and heads % tp:
        raise SpecError("spec.accelerator.count", f"tensor-parallel size {tp} does not divide the {heads} attention "
                        f"heads of {model.name}")
    kv = model.num_kv_heads
    if model.latent_kv_dim is None and kv % tp and tp % kv:
        raise SpecError("spec.accelerator.count", f"tensor-parallel size {tp} does not divide the {kv} KV heads of "
                        f"{model.name} (nor is it a multiple of them, which vLLM would replicate)")


# --- pools ----------------------------------------------------------------------------------------------------------

@dataclass
class _PoolDraft:
    """Lengths of one pool after profile defaults, before sizing."""

    name: str
    spec: PoolSpec
    profile: ClassPool
    enabled: bool
    max_model_len: int
    max_tokens: int
    warnings: list[str]
    class_name: str
    class_autoscaling: ClassAutoscaling


def _pool_spec(spec: VLLMDeploymentSpec, name: str) -> PoolSpec:
    pools = spec.pools
    got = getattr(pools, name) if pools is not None else None
    return got if got is not None else PoolSpec()


def _draft(spec: VLLMDeploymentSpec, name: str, model: ModelInfo, klass: profiles.NamedClass) -> _PoolDraft:
    prof = klass.pool(name)
    ps = _pool_spec(spec, name)
    path = f"spec.pools.{name}"
    warnings: list[str] = []
    native = model.max_context_length
    if ps.max_model_len is not None:
        mml = ps.max_model_len
        if mml > native:
            raise SpecError(f"{path}.maxModelLen", f"{mml} exceeds the native context of {model.name} "
                                                   f"({native} tokens)")
    else:
        mml = prof.max_model_len
        if mml > native:
            warnings.append(f"pools.{name}: the {klass.name} class's maxModelLen {mml} is above "
                            f"{model.name}'s native context; planned with {native}")
            mml = native
    if ps.max_tokens is not None:
        mt = ps.max_tokens
        if mt >= mml:
            raise SpecError(f"{path}.maxTokens", f"{mt} must be below maxModelLen ({mml}): the prompt needs room")
    else:
        mt = min(prof.max_tokens, mml // 2)
    enabled = ps.enabled if ps.enabled is not None else True
    return _PoolDraft(name, ps, prof, enabled, mml, mt, warnings, klass.name, klass.autoscaling(name))


def _kv_dtype(spec: VLLMDeploymentSpec, draft: _PoolDraft, acc: AcceleratorFacts,
              backend: constants.AttentionBackend | None) -> tuple[str, list[str]]:
    cc = acc.compute_capability if acc.is_gpu else None
    requested = draft.spec.kv_cache_dtype
    where = acc.type if acc.is_gpu else "cpu"
    if requested is None:
        if draft.profile.kv_cache_policy is KVCachePolicy.FP8_IF_NATIVE and acc.is_gpu and catalog.native_fp8(cc) and (
                constants.kv_dtype_verdict(cc, KVCacheDtype.FP8, backend) is constants.KVVerdict.DEFAULT):
            return KVCacheDtype.FP8.value, []
        return KVCacheDtype.AUTO.value, []
    verdict = constants.kv_dtype_verdict(cc, requested, backend)
    field_path = f"spec.pools.{draft.name}.kvCacheDtype"
    cc_text = f"compute capability {cc[0]}.{cc[1]}" if cc else "the CPU backend"
    if verdict is constants.KVVerdict.REFUSED:
        via = f" with --attention-backend={backend.value}" if backend else ""
        raise SpecError(field_path, f"{requested.value} KV cache is not supported on {where} ({cc_text}){via}")
    if verdict is constants.KVVerdict.ON_REQUEST and requested.value.startswith("fp8"):
        note = ("needs AVX512/AMX on the host" if cc is None else
                "is not native there: vLLM stores it through the FlashInfer or Triton backend, slower than FP8 on "
                "Ada/Hopper")
        return requested.value, [f"pools.{draft.name}: {requested.value} KV cache on {where} {note}"]
    return requested.value, []


MAX_GPU_COUNT = 16  # the API's bound on accelerator.count


@dataclass(frozen=True)
class _FitInputs:
    """What sizing one pool needs, so a refusal can try other lengths, KV dtypes and GPU counts."""

    model: ModelInfo
    acc: AcceleratorFacts
    settings: ladder.Settings
    weights: int
    overhead: kvcache.OverheadModel
    block: int
    fp8_allowed: bool
    lora_bytes: int = 0
    lora: lora.PoolLora | None = None

    def budget(self, count: int) -> int:
        s = self.settings
        assert s.gpu_memory_utilization is not None
        b = kvcache.gpu_breakdown(device_bytes=self.acc.memory_bytes, utilization=s.gpu_memory_utilization,
                                  model=self.model, tp=count, max_num_batched_tokens=s.max_num_batched_tokens,
                                  max_num_seqs=s.max_num_seqs, overhead=self.overhead, weights_bytes=self.weights,
                                  lora_bytes=self.lora_bytes)
        return kvcache.budget_bytes(b)

    def longest(self, budget: int, dtype: str, count: int) -> int:
        """The longest sequence whose whole blocks fit the budget (vLLM needs ceil(L / block) blocks for one)."""
        per_token = kvcache.bytes_per_token(self.model, dtype, count)
        return kvcache.num_blocks(budget, per_token, self.block) * self.block

    def cpu_memory_gib(self) -> int:
        """Whole GiB of pod memory that hold weights, runtime, activations and one full-length sequence."""
        s = self.settings
        b = kvcache.cpu_breakdown(memory_bytes=0, model=self.model, max_num_batched_tokens=s.max_num_batched_tokens,
                                  max_num_seqs=s.max_num_seqs, overhead=self.overhead, weights_bytes=self.weights)
        per_token = kvcache.bytes_per_token(self.model, s.kv_cache_dtype)
        kv = -(-s.max_model_len // self.block) * self.block * per_token
        # budgets round down to MiB
        fixed = b.weights_bytes + b.activation_bytes + b.non_torch_bytes + self.lora_bytes + kv + MIB
        return -(-int(fixed / (1 - self.overhead.cpu_margin_fraction)) // GIB)


def _what_fits(f: _FitInputs, budget: int) -> str:
    """'; what fits: …' for a refusal: the longest maxModelLen, whether FP8 KV changes that, the fewest GPUs."""
    s, acc = f.settings, f.acc
    count = acc.count if acc.is_gpu else 1
    options: list[str] = []
    if budget > 0:
        longest = f.longest(budget, s.kv_cache_dtype, count)
        fp8 = ""
        if acc.is_gpu and f.fp8_allowed and not s.kv_cache_dtype.startswith("fp8"):
            with_fp8 = f.longest(budget, "fp8", count)
            fp8 = (f" (kvCacheDtype fp8 fits all {s.max_model_len})" if with_fp8 >= s.max_model_len else
                   f" ({with_fp8} with kvCacheDtype fp8)")
        elif acc.is_gpu and not s.kv_cache_dtype.startswith("fp8"):
            fp8 = f" (FP8 KV is not available on {acc.type})"
        if longest > s.max_tokens or fp8:
            options.append(f"maxModelLen {longest}{fp8}" if longest > s.max_tokens else f"no maxModelLen{fp8}")
    return ", or ".join(options)


class _NoFit(SpecError):
    """A pool's KV cache does not fit; `plan()` adds what accelerator would make the whole spec fit, and, where the
    LoRA slots are what crowds the KV cache out (`lora`), the adapter rank and the slots that would."""

    def __init__(self, field: str, message: str, lengths: str, cpu_memory_gib: int | None,
                 pool_lora: lora.PoolLora | None = None) -> None:
        super().__init__(field, message)
        self.lengths = lengths
        self.cpu_memory_gib = cpu_memory_gib
        self.lora = pool_lora


def _fit_error(pool: str, max_model_len: int, acc: AcceleratorFacts, b: KVBreakdown, need: int,
               budget: int, fits: _FitInputs) -> _NoFit:
    lengths = _what_fits(fits, budget)
    memory = None if acc.is_gpu else fits.cpu_memory_gib()
    used = b.weights_bytes + kvcache.overhead_bytes(b)
    where = acc.type if acc.is_gpu else f"cpu ({_gib(acc.memory_bytes)} GiB pod memory)"
    tp = f" per GPU at tensor-parallel {acc.count}" if acc.is_gpu and acc.count > 1 else ""
    slots = fits.lora
    if slots is not None and budget + b.lora_bytes >= need:  # without its LoRA slots the pool would fit
        allowed = int(b.device_bytes * b.utilization)
        left = f"nothing is left for the KV cache on {where}" if budget <= 0 else \
            f"only {_gib(budget)} GiB is left for the KV cache on {where}, and one {max_model_len}-token sequence " \
            f"needs {_gib(need)} GiB"
        limit = f"that gpu-memory-utilization {b.utilization} allows" if acc.is_gpu else "of the pod"
        return _NoFit(slots.rank_field, f"the {pool} pool's {slots.describe()} take {_gib(b.lora_bytes)} GiB{tp}: "
                      f"{left} "
                      f"({_gib(b.weights_bytes)} GiB of weights, {_gib(used - b.weights_bytes - b.lora_bytes)} GiB "
                      f"of runtime overhead and {_gib(b.lora_bytes)} GiB of LoRA slots against the {_gib(allowed)} "
                      f"GiB {limit})", lengths, memory, slots)
    if budget <= 0:
        allowed = int(b.device_bytes * b.utilization)
        knob = f"gpu-memory-utilization {b.utilization} of {_gib(b.device_bytes)} GiB" if acc.is_gpu else \
            "the pod's memory"
        overhead = f"{_gib(used - b.weights_bytes)} GiB of overhead" if not b.lora_bytes else \
            f"{_gib(used - b.weights_bytes)} GiB of overhead ({_gib(b.lora_bytes)} GiB of it LoRA slots)"
        return _NoFit("spec.accelerator", f"nothing is left for the KV cache on {where}: {_gib(b.weights_bytes)} "
                      f"GiB of weights{tp} and {overhead} exceed the {_gib(allowed)} GiB that {knob} allows",
                      lengths, memory, slots)
    return _NoFit(f"spec.pools.{pool}.maxModelLen",
                  f"needs {_gib(need)} GiB of KV cache for one {max_model_len}-token sequence; about "
                  f"{_gib(budget)} GiB is left on {where} after {_gib(used)} GiB of weights and overhead{tp}"
                  + (f" at gpu-memory-utilization {b.utilization}" if acc.is_gpu else "")
                  + (f" ({_gib(b.lora_bytes)} GiB of it LoRA slots)" if b.lora_bytes else ""), lengths, memory, slots)


def _model_path(spec: VLLMDeploymentSpec) -> str:
    src = spec.model.source
    if src is not None and src.pvc is not None:
        path = src.pvc.path.strip("/")
        return f"{constants.MODELS_MOUNT}/{path}" if path else constants.MODELS_MOUNT
    if src is not None and src.hugging_face is not None and src.hugging_face.repo:
        return src.hugging_face.repo
    return spec.model.name


def _resources(ps: PoolSpec, acc: AcceleratorFacts, spec: VLLMDeploymentSpec, weights_bytes: int) -> Resources:
    """Container resources: CPU pools get exactly the planned memory (the KV math sized it) and their cores; GPU
    pools the GPUs plus CPU and host-memory requests (host_resources.py says why and how much)."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if ps.resources is not None:
        requests.update(ps.resources.requests or {})
        limits.update(ps.resources.limits or {})
    if acc.is_gpu:
        limits[constants.GPU_RESOURCE] = str(acc.count)
        requests.pop(constants.GPU_RESOURCE, None)
        requests = host_resources.gpu_pod_requests(acc.count, weights_bytes, requests, limits)
    else:
        cores = str(spec.accelerator.cpu_cores or DEFAULT_CPU_CORES)
        memory = f"{acc.memory_bytes // MIB}Mi"
        requests.setdefault("cpu", cores)
        limits.setdefault("cpu", cores)
        requests["memory"] = memory
        limits["memory"] = memory
    return Resources(requests=dict(sorted(requests.items())), limits=dict(sorted(limits.items())))


def _attention_backend(extra: list[str], field_path: str) -> constants.AttentionBackend | None:
    value = engine_args.extra_flag_value(extra, "attention-backend")
    if value is None:
        return None
    try:
        return constants.AttentionBackend(value.upper())
    except ValueError:
        return None  # a backend the KV table does not know: vLLM judges it


def _model_dtype(version: engine_args.EngineVersion, acc: AcceleratorFacts, backend: constants.AttentionBackend | None,
                 kv_cache_dtype: str, extra: list[str], pool: str) -> str | None:
    """`--dtype` the pool needs for its KV dtype on this GPU (engine_args.ENGINE_VERSIONS' dtype rules), or None.
    An extraArgs `--dtype` the rule allows is left to stand (no second flag); one it refuses is a SpecError."""
    rule = engine_args.model_dtype_rule(version, acc.compute_capability if acc.is_gpu else None, backend,
                                        kv_cache_dtype)
    if rule is None:
        return None
    given = engine_args.extra_flag_value(extra, "dtype")
    if given is None:
        return rule.model_dtype
    if given.lower() in rule.refused:
        raise SpecError(f"spec.pools.{pool}.extraArgs", f"--dtype={given} cannot run with a {kv_cache_dtype} KV "
                        f"cache on {acc.type} (vLLM {version.version}): {rule.source}; remove --dtype (the planner "
                        f"then sets --dtype={rule.model_dtype}) or set kvCacheDtype: auto")
    return None


def _plan_pool(spec: VLLMDeploymentSpec, draft: _PoolDraft, model: ModelInfo, acc: AcceleratorFacts,
               version: engine_args.EngineVersion, version_text: str, remedy: PoolRemediation,
               short_len: int | None, images: ImageDefaults, pool_lora: lora.PoolLora | None = None,
               cache: WeightsCachePlan | None = None) -> PoolPlan:
    ps, prof, name = draft.spec, draft.profile, draft.name
    path = f"spec.pools.{name}"
    warnings = list(draft.warnings)
    extra = list(ps.extra_args or [])
    engine_args.check_extra_args(extra, f"{path}.extraArgs")
    backend = _attention_backend(extra, f"{path}.extraArgs")
    if model.trust_remote_code and not any(engine_args.normalize_flag(a) == "trust-remote-code" for a in extra):
        warnings.append(f"pools.{name}: {model.name} ships its tokenizer as repository code; vLLM needs "
                        "--trust-remote-code in extraArgs to load it (or use the -hf port of the model)")
    kv_dtype, notes = _kv_dtype(spec, draft, acc, backend)
    warnings += notes
    if not acc.is_gpu and ps.gpu_memory_utilization is not None:
        warnings.append(f"pools.{name}: gpuMemoryUtilization is ignored on cpu (sized by accelerator.memoryGiB)")
    util = (ps.gpu_memory_utilization or prof.gpu_memory_utilization) if acc.is_gpu else None
    fp8_ok = acc.is_gpu and constants.kv_dtype_verdict(acc.compute_capability, "fp8", backend) \
        is not constants.KVVerdict.REFUSED
    base = ladder.Settings(
        gpu_memory_utilization=util, cpu_kv_fraction=1.0,
        max_num_batched_tokens=ps.max_num_batched_tokens or prof.max_num_batched_tokens,
        max_num_seqs=ps.max_num_seqs or prof.max_num_seqs, kv_cache_dtype=kv_dtype,
        max_model_len=draft.max_model_len, max_tokens=draft.max_tokens, fp8_allowed=fp8_ok,
        min_max_model_len=short_len or 1)
    if base.max_num_batched_tokens < base.max_num_seqs:
        raise SpecError(f"{path}.maxNumBatchedTokens", f"{base.max_num_batched_tokens} is below maxNumSeqs "
                        f"({base.max_num_seqs}); vLLM refuses to start with fewer batched tokens than sequences")
    allow_lower = bool(spec.remediation and spec.remediation.allow_lower_max_model_len)
    s = ladder.apply_levels(ladder.STEP_DOWN_LADDER, base, remedy.step_down_level)
    s = ladder.apply_levels(ladder.kv_ladder_for(allow_lower), s, remedy.kv_level)
    if s != base:
        warnings.append(f"pools.{name}: remediation applied (step-down {remedy.step_down_level}, KV "
                        f"{remedy.kv_level}): {ladder.describe_change(base, s)}")
    tp = acc.count if acc.is_gpu else 1
    weights = _weights_bytes(spec, model)
    lora_bytes = pool_lora.slot_bytes if pool_lora is not None else 0
    if acc.is_gpu:
        assert s.gpu_memory_utilization is not None
        b = kvcache.gpu_breakdown(device_bytes=acc.memory_bytes, utilization=s.gpu_memory_utilization, model=model,
                                  tp=tp, max_num_batched_tokens=s.max_num_batched_tokens,
                                  max_num_seqs=s.max_num_seqs, overhead=version.overhead, weights_bytes=weights,
                                  lora_bytes=lora_bytes)
        budget = kvcache.budget_bytes(b)
        kv_memory_bytes = None
    else:
        b = kvcache.cpu_breakdown(memory_bytes=acc.memory_bytes, model=model,
                                  max_num_batched_tokens=s.max_num_batched_tokens, max_num_seqs=s.max_num_seqs,
                                  overhead=version.overhead, weights_bytes=weights)
        b = b.model_copy(update={"lora_bytes": lora_bytes})
        budget = int(kvcache.budget_bytes(b) * s.cpu_kv_fraction) // MIB * MIB
        kv_memory_bytes = max(budget, 0)
    per_token = kvcache.bytes_per_token(model, s.kv_cache_dtype, tp)
    block = kvcache.BLOCK_SIZE if acc.is_gpu else kvcache.CPU_BLOCK_SIZE
    layout = kvcache.kv_layout(model, s.max_model_len, block,
                               version.overhead.in_flight_batches * s.max_num_batched_tokens, hybrid=acc.is_gpu)
    per_request = layout.blocks_per_request
    block_token_bytes = per_token // model.num_layers * layout.block_layers  # one token of one block id
    if layout.block_layers == model.num_layers:
        need = per_token * min(s.max_model_len, per_request * block)
    else:  # vLLM's check: a request's blocks in every group
        need = block_token_bytes * block * per_request
    capacity = kvcache.reported_capacity(max(budget, 0), block_token_bytes, s.max_model_len, block, per_request)
    if draft.enabled and (budget < need or capacity.max_concurrency < 1):  # vLLM: ceil(L / block) whole blocks
        fits = _FitInputs(model, acc, s, weights, version.overhead, block, fp8_ok, lora_bytes, pool_lora)
        raise _fit_error(name, s.max_model_len, acc, b, need, budget, fits)
    tokens = capacity.tokens
    full = round(capacity.max_concurrency, 2)
    typical = min(prof.typical_sequence_tokens, s.max_model_len)
    if draft.enabled and full < prof.required_concurrency:
        warnings.append(f"pools.{name}: {full:.2f} sequences of {s.max_model_len} tokens fit in the KV cache "
                        f"({tokens} tokens) on {acc.type}; the {draft.class_name} class expects at least "
                        f"{prof.required_concurrency:g} (more GPUs, FP8 KV, or a shorter maxModelLen)")
    if acc.is_gpu:
        assert s.gpu_memory_utilization is not None
        outside = acc.memory_bytes - int(acc.memory_bytes * s.gpu_memory_utilization)
        beyond = max(int(version.overhead.cuda_graph_gib * GIB) - b.cuda_graph_bytes, 0)
        if outside < beyond + GRAPH_HEADROOM_BYTES:
            warnings.append(f"pools.{name}: gpu-memory-utilization {s.gpu_memory_utilization} leaves "
                            f"{_gib(outside)} GiB outside the budget; CUDA graphs may need ~{_gib(beyond)} GiB more "
                            "than vLLM's estimate there and run out of memory")
    chunked = prof.chunked_prefill or s.max_model_len > s.max_num_batched_tokens
    model_dtype = _model_dtype(version, acc, backend, s.kv_cache_dtype, extra, name)
    hf = spec.model.source.hugging_face if spec.model.source else None
    served = spec.model.served_model_name or spec.model.name
    values = engine_args.PoolArgs(
        served_model_name=served, max_model_len=s.max_model_len, max_tokens=s.max_tokens,
        max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens, chunked_prefill=chunked,
        kv_cache_dtype=s.kv_cache_dtype, gpu_memory_utilization=s.gpu_memory_utilization,
        kv_cache_memory_bytes=kv_memory_bytes, tensor_parallel_size=tp,
        quantization=spec.model.quantization.value if spec.model.quantization else None,
        revision=hf.revision if hf is not None and cache is None else None, port=constants.ENGINE_PORT,
        max_loras=pool_lora.max_loras if pool_lora else None, max_lora_rank=pool_lora.max_rank if pool_lora else None,
        dtype=model_dtype)
    args = engine_args.build_args(values, version, extra)
    node_selector = dict(ps.node_selector or {})
    products = catalog.gpu_products(acc.type, acc.product) if acc.is_gpu and acc.type in catalog.GPUS_BY_NAME \
        else []
    runtime = (spec.engine.gpu if acc.is_gpu else spec.engine.cpu) if spec.engine else None
    image = runtime.image if runtime and runtime.image else images.engine(gpu=acc.is_gpu, version=version_text)
    scaling = _autoscaling(ps, draft.class_autoscaling, draft.class_name, name)
    start = max(scaling.min_replicas, 1) if scaling is not None else (ps.replicas if ps.replicas is not None else 1)
    env, secret_env = pods.engine_env(spec, ps, acc, name, lora_on=pool_lora is not None, cached=cache is not None)
    return PoolPlan(
        name=name, enabled=draft.enabled, replicas=start, autoscaling=scaling,
        external_autoscaler=bool(ps.external_autoscaler), max_model_len=s.max_model_len, max_tokens=s.max_tokens,
        max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
        kv_cache_dtype=s.kv_cache_dtype, gpu_memory_utilization=s.gpu_memory_utilization,
        prompt_range=(0, s.max_model_len), model=constants.WEIGHTS_LINK if cache is not None else _model_path(spec),
        served_model_name=served, engine_args=args,
        env=env, secret_env=secret_env, resources=_resources(ps, acc, spec, weights),
        node_selector=dict(sorted(node_selector.items())), gpu_products=products,
        tolerations=pods.tolerations(ps, acc), image=image,
        image_pull_policy=spec.engine.image_pull_policy if spec.engine is not None else None,
        image_pull_secrets=pods.pull_secrets(spec, images), run_as_user=pods.run_as_user(spec, acc),
        model_claim=pods.model_claim(spec), weights_cache=cache,
        kv=KVPlan(bytes_per_token=per_token, budget_bytes=max(budget, 0), planned_tokens=tokens,
                  concurrency_at_full_length=full, typical_sequence_tokens=typical,
                  concurrency_at_typical_length=kvcache.concurrency(tokens, typical), breakdown=b),
        attention_backend=backend.value if backend is not None else None, fp8_kv_allowed=fp8_ok,
        step_down_level=remedy.step_down_level, kv_level=remedy.kv_level, ladder_moved=remedy.moved,
        warnings=warnings,
        lora_slots=pool_lora.max_loras if pool_lora else 0, adapters=list(pool_lora.adapters) if pool_lora else [])


def _paused(pool: PoolPlan) -> bool:
    """An enabled pool that stays at zero engines: replicas 0, and nothing (KEDA, an external autoscaler) that
    would ever scale it up."""
    return pool.enabled and pool.autoscaling is None and pool.replicas == 0 and not pool.external_autoscaler


def _paused_warnings(short: PoolPlan, long: PoolPlan) -> list[str]:
    """Legal (a paused deployment) but worth a word: what the router answers while a pool is paused. The short
    pool's requests fall back to a running long pool (proxy.py `_choose_pool`), so only a paused long pool beside
    a running short one, and every enabled pool paused, leave requests without an engine."""
    enabled = [p for p in (short, long) if p.enabled]
    if all(_paused(p) for p in enabled):
        which = "both pools are" if len(enabled) == 2 else f"the only enabled pool ({enabled[0].name}) is"
        return [f"pools: {which} at replicas 0 with no autoscaling (a paused deployment): the router has no engine "
                "to send a request to, so its readiness (/health) fails and its Service has no ready endpoint "
                "(clients of the Service are refused; a request that reaches a router pod gets 503 "
                "no_healthy_endpoint); set replicas or autoscaling on a pool to serve again"]
    if short.enabled and _paused(long):
        return [f"pools.long: replicas 0 with no autoscaling while the short pool runs: requests the router sends to "
                f"the long pool (prompts of the routing threshold or more, and max_tokens above the short pool's "
                f"{short.max_tokens}) get 503 no_healthy_endpoint until it has replicas"]
    return []


def _autoscaling(ps: PoolSpec, d: ClassAutoscaling, class_name: str,
                 name: str) -> AutoscalingPlan | None:
    """The pool's autoscaling, every unset field from the workload class's `d`; None when the pool sets none."""
    a = ps.autoscaling
    if a is None:
        return None
    low = a.min_replicas if a.min_replicas is not None else min(d.min_replicas, a.max_replicas)
    if name == constants.POOL_SHORT and low < 1:
        raise SpecError(f"spec.pools.{name}.autoscaling.minReplicas",
                        f"the {class_name} class gives the short pool minReplicas {low}; only the long pool may "
                        "sleep at 0, set minReplicas 1 or more")
    metric = a.metric if a.metric is not None else d.metric
    target = a.target if a.target is not None else (
        d.target if metric is d.metric else _default_target(metric, name))
    if metric is AutoscalingMetric.KV_CACHE_USAGE and target > 1:
        raise SpecError(f"spec.pools.{name}.autoscaling.target",
                        f"{target:g} for kv-cache-usage is a fraction of the KV cache (at most 1, e.g. 0.8)")
    return AutoscalingPlan(
        min_replicas=low, max_replicas=a.max_replicas, metric=metric.value, target=target,
        scale_down_stabilization_seconds=(a.scale_down_stabilization_seconds
                                          if a.scale_down_stabilization_seconds is not None
                                          else d.scale_down_stabilization_seconds),
        idle_seconds=a.idle_seconds if a.idle_seconds is not None else d.idle_seconds,
        polling_interval_seconds=(a.polling_interval_seconds if a.polling_interval_seconds is not None
                                  else constants.KEDA_POLLING_INTERVAL_S))


def _default_target(metric: AutoscalingMetric, pool: str) -> float:
    """A target for a metric other than the class's (the class's target is in the class's metric's unit)."""
    if metric is AutoscalingMetric.KV_CACHE_USAGE:
        return 0.8
    if metric is AutoscalingMetric.NUM_REQUESTS_WAITING:
        return 4 if pool == constants.POOL_SHORT else 2
    return 16 if pool == constants.POOL_SHORT else 4


# --- router ---------------------------------------------------------------------------------------------------------

def _tiers(spec: VLLMDeploymentSpec, short: PoolPlan, long: PoolPlan,
           warnings: list[str], klass: profiles.NamedClass) -> list[TierConfig]:
    """The spec's tiers, else the class's default tiers, else one tier capped at the long pool's maxTokens."""
    routing = spec.routing
    given = list(routing.tiers) if routing is not None and routing.tiers else list(klass.spec.tiers or ())
    where = "spec.routing.tiers" if routing is not None and routing.tiers else f"workload class {klass.name}: tiers"
    if not given:
        default = short.max_tokens if short.enabled else long.max_tokens
        return [TierConfig(name=DEFAULT_TIER, default_max_tokens=min(default, long.max_tokens),
                           max_tokens=long.max_tokens)]
    tiers = []
    for i, tier in enumerate(given):
        if tier.max_tokens > long.max_tokens:
            raise SpecError(f"{where}[{i}].maxTokens",
                            f"tier {tier.name} caps max_tokens at {tier.max_tokens}, above pools.long.maxTokens "
                            f"({long.max_tokens}): the long pool's engine would cut answers the tier allows")
        default = tier.default_max_tokens or tier.max_tokens
        warnings += _tier_default_warning(i, tier.name, default, tier.default_max_tokens is None, short, long)
        tiers.append(TierConfig(name=tier.name, default_max_tokens=default, max_tokens=tier.max_tokens))
    return tiers


def _tier_default_warning(i: int, tier: str, default: int, from_cap: bool, short: PoolPlan,
                          long: PoolPlan) -> list[str]:
    """The router sends a request short only when its max_tokens fits the short pool (docs/architecture.md,
    max_tokens); a tier whose default does not fit sends every request that omits max_tokens — a one-word "hello"
    too — to the long pool, which is sized for few long sequences. Legitimate on purpose, a trap by accident: warn,
    naming the fix."""
    if not (short.enabled and long.enabled):
        return []
    room = min(short.max_tokens, short.max_model_len - 1)
    if default <= room:
        return []
    origin = "its maxTokens cap, the default when defaultMaxTokens is unset" if from_cap else "defaultMaxTokens"
    return [f"routing.tiers[{i}] ({tier}): requests that omit max_tokens ask for {default} ({origin}), above "
            f"pools.short.maxTokens ({short.max_tokens}): every one of them goes to the long pool "
            f"({long.replicas} replica{'s' if long.replicas != 1 else ''}), however short the prompt; set "
            f"defaultMaxTokens to {room} or less to keep them short"]


def _tokenizer(spec: VLLMDeploymentSpec) -> TokenizerConfig:
    """Contract: a mounted ConfigMap when model.tokenizer.configMap is set, else a Hub repo (the tokenizer's own
    source, else the model's repo, else the model name) with the token file when a token Secret is set."""
    tok = spec.model.tokenizer
    if tok is not None and tok.config_map is not None:
        return TokenizerConfig(path=TOKENIZER_DIR)
    model_hf = spec.model.source.hugging_face if spec.model.source else None
    hf = tok.hugging_face if tok is not None and tok.hugging_face is not None else model_hf
    repo = (hf.repo if hf is not None and hf.repo else None) or (
        model_hf.repo if model_hf is not None and model_hf.repo else spec.model.name)
    revision = hf.revision if hf is not None else None
    return TokenizerConfig(hf_repo=repo, hf_revision=revision,
                           hf_token_file=HF_TOKEN_FILE if pods.hf_token(spec) is not None else None)


def _timeouts(spec: VLLMDeploymentSpec) -> Timeouts:
    t = spec.routing.timeouts if spec.routing else None
    d = DEFAULT_TIMEOUTS
    if t is None:
        return d
    return Timeouts(connect_seconds=t.connect_seconds or d.connect_seconds,
                    first_byte_seconds=t.first_byte_seconds or d.first_byte_seconds,
                    idle_seconds=t.idle_seconds or d.idle_seconds, total_seconds=t.total_seconds or d.total_seconds)


PREFIX_INDEX_MIN_BLOCKS = 1024
PREFIX_INDEX_MAX_BLOCKS = 262_144
PREFIX_INDEX_REPLICAS = 8
"""Bounds of the router's prefix index per pool (blocks it remembers). The planned value is what
PREFIX_INDEX_REPLICAS of the pool's engines can hold (KV blocks per replica x 8), not x the pool's current replicas:
router.json must not change with a replicas edit (or an autoscaler), or every scale step would roll the router pods
and reset their in-memory index. The ceiling keeps the router pod's memory bounded (~60 MB at the ceiling,
benchmarks/router-prefix/README.md); GPU pools reach it at one or two replicas anyway."""


def _strategy(spec: VLLMDeploymentSpec, pool: str, klass: profiles.NamedClass) -> RoutingStrategy:
    """routing.pools.<pool>.strategy, else the workload class's default (profiles.py)."""
    pools = spec.routing.pools if spec.routing else None
    if pools is not None:
        chosen = pools.short if pool == constants.POOL_SHORT else pools.long
        if chosen is not None and chosen.strategy is not None:
            return chosen.strategy
    return klass.pool(pool).routing


def _route(spec: VLLMDeploymentSpec, pool: PoolPlan, acc: AcceleratorFacts, name: str, namespace: str,
           klass: profiles.NamedClass) -> PoolRoute:
    """The router's view of a pool. Prefix blocks are the engine's KV blocks (16 tokens on GPU, 128 on vLLM's CPU
    build), and the prefix index is sized to what several of the pool's engines can cache at once (independent of
its replicas, so a scale step never rewrites router.json)."""
    block = kvcache.BLOCK_SIZE if acc.is_gpu else kvcache.CPU_BLOCK_SIZE
    engine_blocks = pool.kv.planned_tokens // block * PREFIX_INDEX_REPLICAS
    index = min(max(engine_blocks, PREFIX_INDEX_MIN_BLOCKS), PREFIX_INDEX_MAX_BLOCKS)
    sleeps = pool.enabled and pool.autoscaling is not None and pool.autoscaling.min_replicas == 0
    return PoolRoute(enabled=pool.enabled, max_model_len=pool.max_model_len, max_tokens=pool.max_tokens,
                     service=ServiceRef(namespace=namespace, name=names.pool(name, pool.name),
                                        port=constants.ENGINE_PORT),
                     strategy=_strategy(spec, pool.name, klass),
                     prefix=PrefixRouting(block_tokens=block, index_blocks=index),
                     wake_seconds=wake_budget(acc.is_gpu, _timeouts(spec).total_seconds,
                                              pool.autoscaling.polling_interval_seconds, cold_download_s(pool, acc))
                     if sleeps and pool.autoscaling is not None else None)


# The wake chain of a pool at zero, each link at its default or a measured bound: Prometheus scrapes the router's
# held-requests gauge (its default 30 s interval; the PodMonitor sets none), KEDA evaluates activation every
# pollingIntervalSeconds (KEDA_POLLING_INTERVAL_S unless the pool sets it), the HPA controller syncs every 15 s
# (kube-controller-manager's default), the scheduler binds
# and the kubelet starts the container (image present), and the engine starts: on an H200 under the engine wrapper,
# Llama-3.1-8B with the long-doc plan, 172 s cold and 122 s warm from launch to Serving with dummy weights (Launching
# 82 s, LoadingWeights 12 s, Compiling 61 s, KV cache 15 s; benchmarks/gpu/README.md, "LoRA and start-up phases"), so
# 240 s leaves ~16 s for reading 16 GB of real weights at 1 GB/s and a 25 % margin; ~40 s on CPU here (90 s).
WAKE_SCRAPE_S = 30
WAKE_HPA_SYNC_S = 15
WAKE_POD_START_S = 30
WAKE_ENGINE_START_S = {True: 240, False: 90}


def cold_download_s(pool: PoolPlan, acc: AcceleratorFacts) -> float:
    """The download a start of this pool may have to make first, at a slow link's rate: none when the weights are
    on a claim the user filled (source.pvc); the whole checkpoint for a Hub source, cached or not. The plan cannot
    know the node a woken pod lands on, and a node cache holds a model only on the nodes that fetched it (and
    evicts it when none uses it), so the budget stays cold (docs/weights-cache.md, "What the planner knows")."""
    if pool.model_claim is not None:
        return 0.0
    return pool.kv.breakdown.weights_bytes * (acc.count if acc.is_gpu else 1) / constants.WEIGHTS_DOWNLOAD_BYTES_PER_S


def wake_budget(gpu: bool, total_seconds: float, polling_s: float, download_s: float = 0.0) -> float:
    """How long the router holds a request for a sleeping pool: the whole wake chain, with the weights' download
    when they may not be on the node (`cold_download_s`), within the request's own total timeout (less 10 % for the
    answer itself)."""
    chain = WAKE_SCRAPE_S + polling_s + WAKE_HPA_SYNC_S + WAKE_POD_START_S \
        + WAKE_ENGINE_START_S[gpu] + download_s
    return float(min(chain, total_seconds * 0.9))


# --- the whole plan -------------------------------------------------------------------------------------------------

def plan_hash(p: Plan) -> str:
    body = p.model_dump(mode="json", by_alias=True, exclude={"hash", "workload_class_generation"})
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def check_name(name: str) -> None:
    """The VLLMDeployment's name prefixes its Services' names, which must be DNS-1035 labels. Kubernetes accepts a
    custom resource named like a DNS subdomain ('chat.prod', '1chat'), and the first Service create would then be
    refused on every reconcile; refuse it up front instead, with a name that would work. (Length is not a
    problem: child names are shortened with a hash suffix.)"""
    if _DNS_1035_LABEL.fullmatch(name):
        return
    suggestion = re.sub(r"[^-a-z0-9]+", "-", name.lower()).strip("-")
    if not suggestion[:1].isalpha():
        suggestion = f"vllm-{suggestion}".rstrip("-")
    raise SpecError("metadata.name", f"{name!r} cannot prefix Service names: they must be DNS-1035 labels "
                    f"(lowercase letters, digits and '-', starting with a letter and ending with a letter or "
                    f"digit); e.g. {suggestion!r}")


def resolve_class(spec: VLLMDeploymentSpec, classes: Mapping[str, profiles.NamedClass] | None = None,
                  ) -> profiles.NamedClass:
    """The workload class a spec names, or the one marked default, among `classes` (the VLLMWorkloadClass objects
    read from the cluster or given beside the spec, by name; their `default` flags in `defaults`). A built-in name
    that is not among them resolves to the table in profiles.py, so a spec naming chat plans the same with or
    without the chart's class objects. Raises SpecError naming spec.workloadClass."""
    given = dict(classes or {})
    name = spec.workload_class
    if name is None:
        marked = sorted(n for n, c in given.items() if c.default)
        if len(marked) > 1:
            raise SpecError("spec.workloadClass", f"unset, and {len(marked)} VLLMWorkloadClasses are marked default "
                            f"({', '.join(marked)}); mark one, or name the class")
        if not marked:
            raise SpecError("spec.workloadClass", "unset, and no VLLMWorkloadClass is marked default; name one "
                            f"(built-ins: {', '.join(c.value for c in profiles.BUILTINS)})")
        return given[marked[0]]
    if name in given:
        return given[name]
    if profiles.is_builtin(name):
        return profiles.builtin(name)
    known = sorted({*given, *(c.value for c in profiles.BUILTINS)})
    raise SpecError("spec.workloadClass", f"VLLMWorkloadClass {name!r} does not exist (known: {', '.join(known)})")


@dataclass(frozen=True)
class PlanContext:
    """What planning a VLLMDeployment takes beside the object itself. The operator gathers it from the cluster
    (handlers.reconcile.plan_context: `auto` resolved from nodes, the class from its VLLMWorkloadClass index, its
    --image-repository); the CLI from its flags and files. Every reader plans through `plan_for` with one."""

    accelerator: AcceleratorFacts | None = None
    """Resolved facts (None: the spec's catalog type)."""
    accelerator_note: str | None = None
    """Why those facts ("auto matched …; planned for …, the smallest"), a warning of the plan."""
    workload_class: profiles.NamedClass | None = None
    """The class resolved for the object (None: resolved among the built-ins)."""
    images: ImageDefaults = DEFAULT_IMAGES
    engine_version: str | None = None
    """The CLI's --engine-version (None: the spec's, else the default)."""
    node_cache: weights_cache.NodeCache = weights_cache.DEFAULT_NODE_CACHE
    """The operator's node weights cache (--weights-cache-host-path, --weights-cache-max-size)."""


def plan_for(resource: VLLMDeployment, context: PlanContext, status: VLLMDeploymentStatus | None = None) -> Plan:
    """The plan of a VLLMDeployment: its spec, the remediation rungs of `status` (default: its own), and `context`.
    Reconcile, the status refresh, the health loop, admission and the CLI all plan through here."""
    meta = resource.metadata
    state = RemediationState.from_status(status if status is not None else resource.status)
    the_plan = plan(resource.spec, context.accelerator, state, name=meta.name, namespace=meta.namespace,
                    engine_version=context.engine_version, images=context.images,
                    workload_class=context.workload_class, node_cache=context.node_cache)
    if context.accelerator_note:
        the_plan = the_plan.model_copy(update={"warnings": [*the_plan.warnings, context.accelerator_note]})
    return the_plan


def plan(spec: VLLMDeploymentSpec, accelerator: AcceleratorFacts | None, remediation: RemediationState, *,
         name: str, namespace: str, engine_version: str | None = None,
         images: ImageDefaults = DEFAULT_IMAGES, workload_class: profiles.NamedClass | None = None,
         node_cache: weights_cache.NodeCache = weights_cache.DEFAULT_NODE_CACHE) -> Plan:
    """Plan a VLLMDeployment (see the module docstring); raises SpecError. `images`: where default engine images
    come from (the operator's --image-repository); `workload_class`: the class resolved by `resolve_class` (default:
    resolved among the built-ins). A spec whose KV cache does not fit is
    refused with what would: the longest maxModelLen (and with FP8 KV) for the pool, and the fewest GPUs per pod
    (or the pod memory, on CPU) that make the whole spec plan — found by planning it again with them."""
    klass = workload_class if workload_class is not None else resolve_class(spec)
    try:
        return _plan(spec, accelerator, remediation, name=name, namespace=namespace, engine_version=engine_version,
                     images=images, klass=klass, node_cache=node_cache)
    except _NoFit as err:
        options = _fitting_lora(spec, accelerator, remediation, name, namespace, engine_version, err, klass)
        options += [err.lengths] if err.lengths else []
        resource = _fitting_accelerator(spec, accelerator, remediation, name, namespace, engine_version, err, klass)
        if resource:
            options.append(resource)
        what = f"; what fits: {', or '.join(options)}" if options else ""
        raise SpecError(err.field, err.message + what) from None


def _fitting_lora(spec: VLLMDeploymentSpec, accelerator: AcceleratorFacts | None, remediation: RemediationState,
                  name: str, namespace: str, engine_version: str | None, err: _NoFit,
                  klass: profiles.NamedClass) -> list[str]:
    """Where the LoRA slots crowd the KV cache out: the highest adapter rank (one vLLM supports) and the most slots
    with which the whole spec plans, each found by planning it again, as text."""
    slots = err.lora
    if slots is None or not err.field.endswith("maxRank"):
        return []
    options: list[str] = []
    rank = next((r for r in sorted(LORA_RANKS, reverse=True) if r < slots.max_rank and _plans(
        lora.with_rank(spec, r), accelerator, remediation, name, namespace, engine_version, klass)), None)
    field = slots.rank_field.removeprefix("spec.")
    if rank is not None:
        options.append(f"{field} {rank}" if field == "lora.maxRank" else
                       f"an adapter of rank {rank} or lower ({field} {rank})")
    # Fewer slots only free memory, so the fitting counts are 1..k: bisect for k (maxLoras may be 256).
    low, high = 0, slots.max_loras - 1
    while low < high:
        mid = (low + high + 1) // 2
        if _plans(lora.with_max_loras(spec, mid), accelerator, remediation, name, namespace, engine_version, klass):
            low = mid
        else:
            high = mid - 1
    count = low or None
    if count is not None:
        options.append(f"lora.maxLoras {count} (at rank {slots.max_rank}; more adapters than slots are served "
                       "in turn)")
    return options


def _fitting_accelerator(spec: VLLMDeploymentSpec, accelerator: AcceleratorFacts | None,
                         remediation: RemediationState, name: str, namespace: str, engine_version: str | None,
                         err: _NoFit, klass: profiles.NamedClass) -> str | None:
    """The smallest accelerator.count (GPU) or memoryGiB (CPU) with which the whole spec plans, as text."""
    acc = spec.accelerator
    if acc.type is AcceleratorType.CPU:
        start = err.cpu_memory_gib or int(acc.memory_gib or 1)
        for memory in range(start, start + 16):
            trial = spec.model_copy(update={"accelerator": acc.model_copy(update={"memory_gib": float(memory)})})
            if _plans(trial, None, remediation, name, namespace, engine_version, klass):
                return f"accelerator.memoryGiB {memory}"
        return None
    for count in range(acc.count + 1, MAX_GPU_COUNT + 1):
        trial = spec.model_copy(update={"accelerator": acc.model_copy(update={"count": count})})
        given = accelerator.model_copy(update={"count": count}) if accelerator is not None else None
        if _plans(trial, given, remediation, name, namespace, engine_version, klass):
            return f"accelerator.count {count}"
    where = accelerator.type if accelerator is not None else acc.type.value
    return f"no accelerator.count up to {MAX_GPU_COUNT} on {where} (a larger GPU or a quantized checkpoint)"


def _plans(spec: VLLMDeploymentSpec, accelerator: AcceleratorFacts | None, remediation: RemediationState,
           name: str, namespace: str, engine_version: str | None, klass: profiles.NamedClass) -> bool:
    try:
        _plan(spec, accelerator, remediation, name=name, namespace=namespace, engine_version=engine_version,
              klass=klass)
    except SpecError:
        return False
    return True


def _plan(spec: VLLMDeploymentSpec, accelerator: AcceleratorFacts | None, remediation: RemediationState, *,
          name: str, namespace: str, engine_version: str | None, klass: profiles.NamedClass,
          images: ImageDefaults = DEFAULT_IMAGES,
          node_cache: weights_cache.NodeCache = weights_cache.DEFAULT_NODE_CACHE) -> Plan:
    check_name(name)
    model = resolve_model(spec)
    acc = resolve_accelerator(spec, accelerator)
    if acc.is_gpu:
        _check_tensor_parallel(model, acc.count)
    runtime = (spec.engine.gpu if acc.is_gpu else spec.engine.cpu) if spec.engine else None
    version_path = "spec.engine.gpu.version" if acc.is_gpu else "spec.engine.cpu.version"
    version_text = engine_version or (runtime.version if runtime and runtime.version else None) or (
        engine_args.DEFAULT_GPU_VERSION if acc.is_gpu else engine_args.DEFAULT_CPU_VERSION)
    version, warnings = engine_args.engine_version(version_text, "--engine-version" if engine_version
                                                   else version_path)
    short_d = _draft(spec, constants.POOL_SHORT, model, klass)
    long_d = _draft(spec, constants.POOL_LONG, model, klass)
    if not short_d.enabled and not long_d.enabled:
        raise SpecError("spec.pools", "both pools are disabled; enable at least one")
    if short_d.max_model_len > long_d.max_model_len:
        raise SpecError("spec.pools.short.maxModelLen", f"{short_d.max_model_len} exceeds pools.long.maxModelLen "
                        f"({long_d.max_model_len}); the short pool must not be the longer one")
    enabled = tuple(d.name for d in (short_d, long_d) if d.enabled)
    lora.check_adapters(spec, spec.model.served_model_name or spec.model.name, enabled)
    tp = acc.count if acc.is_gpu else 1
    cache, claim = weights_cache.plan(spec, name, node_cache)
    short = _plan_pool(spec, short_d, model, acc, version, version_text, remediation.pool(constants.POOL_SHORT),
                       None, images, lora.pool_lora(spec, constants.POOL_SHORT, enabled, model, tp), cache)
    long = _plan_pool(spec, long_d, model, acc, version, version_text, remediation.pool(constants.POOL_LONG),
                      short.max_model_len if short.enabled else None, images,
                      lora.pool_lora(spec, constants.POOL_LONG, enabled, model, tp), cache)
    if long.enabled and long.autoscaling is not None and long.autoscaling.min_replicas == 0 and (
            not short.enabled or (short.autoscaling is None and short.replicas < 1)):
        raise SpecError("spec.pools.long.autoscaling.minReplicas",
                        "0 needs a running short pool (short is "
                        f"{'disabled' if not short.enabled else 'at replicas 0'}), so a sleeping long pool never "
                        "makes short requests fail; set minReplicas 1 or run the short pool")
    warnings += _paused_warnings(short, long)
    routing = spec.routing
    # The class's threshold holds for the class's short pool; a spec that changes that pool's lengths gets the
    # derived one (maxModelLen - maxTokens), as it always did.
    class_short = klass.spec.pools.short
    threshold = routing.prompt_length_threshold if routing and routing.prompt_length_threshold else (
        klass.spec.prompt_length_threshold if (short.max_model_len, short.max_tokens) == (
            class_short.max_model_len, class_short.max_tokens) else short.max_model_len - short.max_tokens)
    if threshold > long.max_model_len:
        raise SpecError("spec.routing.promptLengthThreshold", f"{threshold} is above pools.long.maxModelLen "
                        f"({long.max_model_len}): no prompt at the threshold fits the long pool")
    if short.enabled and long.enabled and threshold > short.max_model_len:
        # Refused, not warned: the router sends a prompt short only when prompt + max_tokens fits the short pool,
        # so prompts between the two numbers go long anyway; the threshold would only make the plan's prompt
        # ranges (and the README's reading of the spec) claim a split the router never makes.
        raise SpecError("spec.routing.promptLengthThreshold", f"{threshold} is above pools.short.maxModelLen "
                        f"({short.max_model_len}): prompts that long never fit the short pool; use at most "
                        f"{short.max_model_len - short.max_tokens} (maxModelLen - maxTokens, the default) so a "
                        "prompt below the threshold still has room for its answer")
    if short.enabled and long.enabled:
        short = short.model_copy(update={"prompt_range": (0, threshold)})
        long = long.model_copy(update={"prompt_range": (threshold, long.max_model_len)})
    tiers = _tiers(spec, short, long, warnings, klass)
    router = RouterConfig(
        model=short.served_model_name, deployment=name, namespace=namespace, prompt_length_threshold=threshold,
        over_limit=(routing.over_limit if routing and routing.over_limit else OverLimit.CLAMP), tiers=tiers,
        pools=PoolRoutes(short=_route(spec, short, acc, name, namespace, klass),
                         long=_route(spec, long, acc, name, namespace, klass)),
        tokenizer=_tokenizer(spec), timeouts=_timeouts(spec),
        api_keys_dir=API_KEYS_DIR if routing and routing.api_key_secret_ref else None,
        max_body_bytes=(routing.max_body_bytes if routing and routing.max_body_bytes else DEFAULT_MAX_BODY_BYTES),
        health=HealthCheckConfig(), port=constants.ROUTER_PORT,
        access_log=spec.router.access_log is not False if spec.router else True,
        adapters={a: [p.name for p in (short, long) if a in p.adapters]
                  for a in sorted({n for p in (short, long) for n in p.adapters})} or None)
    result = Plan(name=name, namespace=namespace, workload_class=klass.name,
                  workload_class_generation=klass.generation,
                  engine_version=version_text, accelerator=acc, pools={"short": short, "long": long},
                  router=router, router_pod=pods.router_pod(spec, images),
                  adapters=pods.adapters(spec, [a for p in (short, long) if p.enabled for a in p.adapters]),
                  monitoring=pods.monitoring(spec), warnings=warnings, hash="", weights_claim=claim,
                  thresholds=merge_thresholds(spec.remediation.thresholds if spec.remediation else None,
                                              klass.spec.remediation_thresholds))
    return result.model_copy(update={"hash": plan_hash(result)})
