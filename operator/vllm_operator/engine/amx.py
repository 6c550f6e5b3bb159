"""AMX tile permission for vLLM's CPU processes: the first short request on an AMX host must not kill the engine.

Linux lets a process execute AMX tile instructions only after it asked for the tile state with
`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`; before that, the first tile instruction raises SIGILL. The
permission is per process: a fork inherits it, an exec drops it. vLLM's CPU build (0.32, measured) picks its "amx"
attention kernel whenever the CPU has `amx_tile` and the model is bf16, but never asks for the permission itself: it
works only once some oneDNN kernel, which does ask, has run in the same process. On CPU, vLLM starts its engine core
and its worker with `spawn` (fork + exec), so each starts without it; with `--enforce-eager` and an explicit
`--kv-cache-memory-bytes` (how the operator renders a CPU pool) vLLM skips its warm-up forward pass, and a first
request of a few tokens runs the AMX attention before any AMX matmul: the worker dies of SIGILL ("Worker proc
VllmWorker-0 died unexpectedly"), the engine core reports EngineDead and every request gets 500. A longer first
prompt goes through oneDNN's AMX matmul first and hides it.

No option of vLLM's or torch's steers that choice, and nothing the wrapper does in its own process survives vLLM's
exec, so the wrapper gives every Python process of vLLM's the permission at interpreter start, through the
`sitecustomize` that `childsite.py` puts first on vLLM's PYTHONPATH. Only on hosts whose CPU has `amx_tile`; the
request is harmless where the kernel refuses it.
"""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def has_amx_tile(cpuinfo: str) -> bool:
    """Whether /proc/cpuinfo's first `flags` line lists `amx_tile`."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return "amx_tile" in value.split()
    return False


def host_has_amx_tile(cpuinfo: Path = CPUINFO) -> bool:
    try:
        return has_amx_tile(cpuinfo.read_text(errors="replace"))
    except OSError:
        return False

