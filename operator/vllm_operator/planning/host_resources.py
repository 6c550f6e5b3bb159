"""CPU and host-memory requests of a GPU engine pod, from its GPU count and the model's checkpoint size.

Without requests a GPU pod is BestEffort: the scheduler may pack it onto a node whose memory is already promised to
others, and under node pressure the kubelet evicts it first — an engine that took minutes to load, for no fault of its
own. The requests below make it Burstable and reserve what vLLM (V1 engine) uses on the host:

CPU, in whole cores: the API server process (HTTP, tokenizing prompts, detokenizing streamed output: one busy Python
thread under load) and the engine-core process (the scheduler's busy loop; with one GPU it also drives the GPU) — 2
cores; with tensor parallelism the model runs in one worker process per GPU beside the engine core, each launching
kernels from its own Python thread — 2 + N cores. 1 GPU: 2; 2: 4; 4: 6; 8: 10. No CPU limit: CFS throttling of the
engine loop shows up directly as inter-token latency, and idle cores on a GPU node are better used than reserved.

Memory: 2 GiB for the API server (Python, torch, the tokenizer, FastAPI; vLLM on CPU here measured 1.7-2.2 GiB summed
RSS for API server and engine together, with a tiny model and 64-256 MiB of KV: benchmarks/vllm-cpu/README.md) plus 3
GiB per GPU process (CUDA context and driver allocations, torch's CUDA libraries, NCCL and CUDA-graph host buffers,
and the share of the memory-backed /dev/shm that NCCL uses with tensor parallelism) plus the loading headroom: the
default safetensors loader memory-maps the checkpoint and copies it to the GPU tensor by tensor, so the page cache
charged to the pod holds about one shard at a time — Hugging Face's default shard size, 5 GB (4.66 GiB), or the whole
checkpoint when it is smaller. Rounded up to whole GiB: an 8B model (15 GiB) on 1 GPU requests 10 GiB, which fits the
smallest common 1-GPU nodes (16 GiB hosts such as AWS g6/g5.xlarge or GCP g2-standard-4); 70B on 8 GPUs requests 31
GiB. No memory limit: peak host use while loading depends on the checkpoint format (a `.bin` checkpoint is read whole
into memory by torch.load), and a limit would OOM-kill the pod mid-load, which reads as an engine crash.

A VLLMDeployment that sets its own request or limit for cpu or memory (spec.pools.<pool>.resources) keeps it:
Kubernetes then uses a lone limit as the request, so no default is added for that resource.
"""

from __future__ import annotations

import math

GIB = 2**30
API_SERVER_GIB = 2.0
PER_GPU_PROCESS_GIB = 3.0
SHARD_BYTES = 5 * 10**9  # Hugging Face's default max_shard_size ("5GB")
ENGINE_CORE_CPUS = 2  # API server + engine core


def gpu_pod_cpus(gpus: int) -> int:
    """Whole cores: API server and engine core, plus one worker per GPU under tensor parallelism."""
    return ENGINE_CORE_CPUS + (gpus if gpus > 1 else 0)


def gpu_pod_memory_gib(gpus: int, weights_bytes: int) -> int:
    """Whole GiB of host memory: API server, one process per GPU, one checkpoint shard in flight while loading."""
    loading = min(weights_bytes, SHARD_BYTES) / GIB
    return math.ceil(API_SERVER_GIB + PER_GPU_PROCESS_GIB * gpus + loading)


def gpu_pod_requests(gpus: int, weights_bytes: int, requests: dict[str, str], limits: dict[str, str]
                     ) -> dict[str, str]:
    """`requests` with cpu and memory filled in where the spec set neither a request nor a limit for them."""
    out = dict(requests)
    defaults = {"cpu": str(gpu_pod_cpus(gpus)), "memory": f"{gpu_pod_memory_gib(gpus, weights_bytes)}Gi"}
    for name, value in defaults.items():
        if name not in requests and name not in limits:
            out[name] = value
    return out
