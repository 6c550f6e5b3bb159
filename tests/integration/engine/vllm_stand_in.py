"""A stand-in for vLLM that prints one failure text and exits the way vLLM does, for the engine wrapper's tests.

Usage: python vllm_stand_in.py MODE. Modes print the real vLLM lines: vLLM exits 0 after its engine
core dies and 1 when the KV cache is too small at start-up.
"""

from __future__ import annotations

import os
import signal
import sys
import time

KV = ("ValueError: To serve at least one request with the model's max seq len (65536), (4.00 GiB KV cache is "
      "needed, which is larger than the available KV cache memory (0.06 GiB). Based on the available memory, the "
      "estimated maximum model length is 1008. Try increasing `gpu_memory_utilization` or decreasing "
      "`max_model_len` when initializing the engine.")


def main(mode: str) -> int:
    print("INFO Starting vLLM API server", flush=True)
    if mode == "oom":
        print("ERROR [core.py:933] EngineCore encountered a fatal error.", file=sys.stderr, flush=True)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity "
              "of 79.19 GiB of which 1.20 GiB is free.", file=sys.stderr, flush=True)
        return 0
    if mode == "fatal":
        print("ERROR [core.py:933] EngineCore encountered a fatal error.", file=sys.stderr, flush=True)
        print("INFO Shutting down FastAPI HTTP server.", flush=True)
        return 0
    if mode == "kv":
        print(KV, file=sys.stderr, flush=True)
        return 1
    if mode == "clean-exit":
        return 0
    if mode == "error":
        print("RuntimeError: something else", file=sys.stderr, flush=True)
        return 3
    if mode == "error-after-serving":
        print("INFO:     Application startup complete.", flush=True)
        time.sleep(0.5)
        print("RuntimeError: something else", file=sys.stderr, flush=True)
        return 3
    if mode == "startup-fa3":  # vLLM 0.26.0 on the H200, float16 AWQ model with fp8 KV (benchmarks/gpu, issue 38)
        print("(EngineCore pid=7071) RuntimeError: For FP16/BF16 input, output must have the same dtype as inputs. "
              "For FP8 input, output must have dtype BF16", file=sys.stderr, flush=True)
        print("(APIServer pid=580) RuntimeError: Engine core initialization failed. See root cause above. Failed core "
              "proc(s): {}", file=sys.stderr, flush=True)
        return 1
    if mode == "sigterm":
        def drain(signum: int, _frame: object) -> None:
            print(f"INFO drained after signal {signum}", flush=True)
            sys.exit(0)

        signal.signal(signal.SIGTERM, drain)
        print("READY", flush=True)
        while True:
            time.sleep(0.1)
    if mode == "dead-core-lingers":  # vLLM's API server after its engine core was killed: it says so, then
        # carries on until its own watchdog's next round (every 5 s; here never), unless stopped
        def stopped(signum: int, _frame: object) -> None:
            print(f"INFO stopped after signal {signum}", flush=True)
            sys.exit(0)

        signal.signal(signal.SIGTERM, stopped)
        print("INFO:     Application startup complete.", flush=True)
        print("WARNING [core_client.py:818] [shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
              flush=True)
        time.sleep(600)
        return 0
    if mode == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
