"""Exit codes and termination reasons of the engine entrypoint wrapper, shared with the health loop.

vLLM has no OOM metric and its API server exits with code 0 when its engine core dies, so from Kubernetes alone a
run-time CUDA OOM looks like a clean exit. The wrapper (`vllm_operator.engine.main`) reads vLLM's log, turns the
failures that matter into these distinct exit codes, and writes one JSON line to the container's termination
message file (``{"reason": "EngineOOM", "exitCode": 87, ...}``). `health.diagnose` reads both back from the pod's
``lastState.terminated``.

This module must stay import-free: the pure health core imports it, and so does the wrapper inside engine images.
Codes sit in 80-89, clear of vLLM's own 1/2, the shell's 126/127 and 128+signal.
"""

ENGINE_OOM = 87
"""The engine ran out of accelerator memory ("CUDA out of memory" / torch OutOfMemoryError), at start or at run time."""

ENGINE_DEAD = 88
"""The engine core died ("EngineCore encountered a fatal error", engine core process died) — vLLM itself exits 0."""

KV_CACHE_TOO_SMALL = 89
"""Start-up refused: one sequence of max_model_len needs more KV cache than the memory left ("KV cache is needed,
which is larger than the available KV cache memory")."""

PREFLIGHT_FAILED = 85
"""The wrapper's preflight failed before vLLM started: too little free GPU memory for the plan's budget, or FP8 KV
requested on a GPU whose compute capability cannot do it."""

UNEXPECTED_EXIT = 86
"""vLLM exited with code 0 although nobody asked it to stop and no failure text was seen: a server never ends on its
own, so this is reported as a failure too."""

LAUNCH_FAILED = 84
"""The launch command could not be started (not found, not executable)."""

REASON_ENGINE_OOM = "EngineOOM"
REASON_ENGINE_DEAD = "EngineDead"
REASON_KV_CACHE_TOO_SMALL = "KVCacheTooSmall"
REASON_PREFLIGHT_FAILED = "PreflightFailed"
REASON_UNEXPECTED_EXIT = "UnexpectedExit"
REASON_LAUNCH_FAILED = "LaunchFailed"

REASONS = {
    ENGINE_OOM: REASON_ENGINE_OOM,
    ENGINE_DEAD: REASON_ENGINE_DEAD,
    KV_CACHE_TOO_SMALL: REASON_KV_CACHE_TOO_SMALL,
    PREFLIGHT_FAILED: REASON_PREFLIGHT_FAILED,
    UNEXPECTED_EXIT: REASON_UNEXPECTED_EXIT,
    LAUNCH_FAILED: REASON_LAUNCH_FAILED,
}
"""Exit code -> reason (the ``reason`` field of the termination message)."""

CODES = {reason: code for code, reason in REASONS.items()}
"""Reason -> exit code."""

TERMINATION_MESSAGE_MAX_BYTES = 4096
"""Kubernetes keeps at most 4096 bytes of a termination message."""
