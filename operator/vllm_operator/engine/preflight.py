"""Preflight for engine pods: check the GPU against the plan before vLLM spends minutes loading a model.

vLLM finds out late (after downloading and loading weights) that another process holds GPU memory, and an FP8 KV
cache on a GPU that cannot do it fails deep inside an attention backend. The wrapper asks the driver first and
fails fast with the numbers. It reads the GPU through NVML (`pynvml`, shipped with vLLM as nvidia-ml-py) or, where
that is missing, an `nvidia-smi` child process — never through torch, so the wrapper itself holds no CUDA context
and all of the GPU stays for vLLM. No GPU (CPU pods, tests) means no preflight.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from vllm_operator.constants import AttentionBackend, KVVerdict, kv_dtype_verdict

log = logging.getLogger(__name__)

GIB = 1024**3
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
"""vLLM 0.33's default for --gpu-memory-utilization (its CacheConfig)."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    total_bytes: int
    free_bytes: int
    compute_capability: tuple[int, int] | None


@dataclass(frozen=True)
class EngineRequest:
    """What the vLLM command line asks of the GPUs."""

    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    kv_cache_memory_bytes: int | None = None
    attention_backend: str | None = None


def _flag_values(args: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            if "=" in arg:
                key, value = arg[2:].split("=", 1)
                out[key] = value
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                out[arg[2:]] = args[i + 1]
                i += 1
            else:
                out[arg[2:]] = ""
        i += 1
    return out


_SIZE_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size(text: str) -> int:
    """vLLM's human sizes: `1G` = 2^30 (also `1GiB`, `1073741824`)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1] if t and t[-1] in _SIZE_SUFFIX else ""
    number = t[:-1] if unit else t
    return int(float(number) * _SIZE_SUFFIX[unit])


def parse_request(args: Sequence[str]) -> EngineRequest:
    """Read the flags preflight cares about from vLLM's arguments; ValueError names a malformed one."""
    flags = {k.replace("_", "-"): v for k, v in _flag_values(args).items()}
    try:
        util = float(flags.get("gpu-memory-utilization", DEFAULT_GPU_MEMORY_UTILIZATION))
    except ValueError as err:
        raise ValueError(f"--gpu-memory-utilization must be a number, got {flags['gpu-memory-utilization']!r}") \
            from err
    tp_raw = flags.get("tensor-parallel-size", flags.get("tp", "1"))
    if not tp_raw.isdigit() or int(tp_raw) < 1:
        raise ValueError(f"--tensor-parallel-size must be a positive integer, got {tp_raw!r}")
    kv_bytes = None
    if flags.get("kv-cache-memory-bytes"):
        try:
            kv_bytes = parse_size(flags["kv-cache-memory-bytes"])
        except ValueError as err:
            raise ValueError(f"--kv-cache-memory-bytes is not a size: {flags['kv-cache-memory-bytes']!r}") from err
    return EngineRequest(gpu_memory_utilization=util, kv_cache_dtype=flags.get("kv-cache-dtype", "auto") or "auto",
                         tensor_parallel_size=int(tp_raw), kv_cache_memory_bytes=kv_bytes,
                         attention_backend=flags.get("attention-backend") or None)


def check(gpus: Sequence[GpuInfo], request: EngineRequest, *, required_bytes: int | None = None) -> list[str]:
    """Problems that would make vLLM fail on these GPUs, each naming the numbers (empty = go)."""
    problems: list[str] = []
    if len(gpus) < request.tensor_parallel_size:
        problems.append(f"tensor-parallel-size {request.tensor_parallel_size} needs {request.tensor_parallel_size} "
                        f"GPUs; {len(gpus)} visible")
    for gpu in gpus[:request.tensor_parallel_size]:
        need = required_bytes if required_bytes is not None else int(gpu.total_bytes * request.gpu_memory_utilization)
        basis = ("the plan's budget" if required_bytes is not None else
                 f"gpu-memory-utilization {request.gpu_memory_utilization} x {gpu.total_bytes / GIB:.1f} GiB")
        if gpu.free_bytes < need:
            held = gpu.total_bytes - gpu.free_bytes
            problems.append(f"GPU {gpu.index} ({gpu.name}): {gpu.free_bytes / GIB:.1f} GiB free of "
                            f"{gpu.total_bytes / GIB:.1f} GiB, needs {need / GIB:.1f} GiB ({basis}); "
                            f"{held / GIB:.1f} GiB is held by another process")
        if request.kv_cache_dtype.startswith("fp8") and gpu.compute_capability is not None:
            backend = None
            if request.attention_backend:
                try:
                    backend = AttentionBackend(request.attention_backend.upper())
                except ValueError:
                    backend = None
            if kv_dtype_verdict(gpu.compute_capability, request.kv_cache_dtype, backend) is KVVerdict.REFUSED:
                cc = ".".join(map(str, gpu.compute_capability)) if gpu.compute_capability else "unknown"
                problems.append(f"GPU {gpu.index} ({gpu.name}): kv-cache-dtype {request.kv_cache_dtype} is not "
                                f"supported at compute capability {cc}"
                                + (f" with attention backend {request.attention_backend}"
                                   if request.attention_backend else ""))
    return problems


def _visible(gpus: list[GpuInfo]) -> list[GpuInfo]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return gpus
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    if not all(v.isdigit() for v in wanted):
        return gpus  # UUIDs: the device plugin already hid the others
    by_index = {g.index: g for g in gpus}
    return [by_index[int(v)] for v in wanted if int(v) in by_index]


def _read_nvml() -> list[GpuInfo] | None:
    try:
        import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as err:  # NVMLError: no driver
        log.info("NVML found no driver (%s)", err)
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                cc: tuple[int, int] | None = (int(major), int(minor))
            except Exception:
                cc = None
            out.append(GpuInfo(i, name.decode() if isinstance(name, bytes) else str(name), int(mem.total),
                               int(mem.free), cc))
        return out
    finally:
        pynvml.nvmlShutdown()


def parse_nvidia_smi(text: str) -> list[GpuInfo]:
    """`index, name, memory.total, memory.free, compute_cap` CSV rows (MiB) -> GpuInfo."""
    out = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        cc = None
        if "." in parts[4]:
            major, minor = parts[4].split(".", 1)
            if major.isdigit() and minor.isdigit():
                cc = (int(major), int(minor))
        out.append(GpuInfo(int(parts[0]), parts[1], int(float(parts[2])) * 1024**2, int(float(parts[3])) * 1024**2,
                           cc))
    return out


def _read_nvidia_smi() -> list[GpuInfo] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "--query-gpu=index,name,memory.total,memory.free,compute_cap",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        log.info("nvidia-smi failed: %s", err)
        return []
    if done.returncode != 0:
        log.info("nvidia-smi exited %s: %s", done.returncode, done.stderr.strip()[:300])
        return []
    return parse_nvidia_smi(done.stdout)


def read_gpus() -> tuple[list[GpuInfo], str] | None:
    """The visible GPUs and how they were read ("nvml" / "nvidia-smi"); None when no way to ask exists."""
    for how, reader in (("nvml", _read_nvml), ("nvidia-smi", _read_nvidia_smi)):
        gpus = reader()
        if gpus is not None:
            return _visible(gpus), how
    return None
