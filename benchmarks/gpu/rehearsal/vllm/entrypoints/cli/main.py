"""A stand-in for `python -m vllm.entrypoints.cli.main serve MODEL ARGS` on a machine without a GPU (matrix.py's
rehearsal): it reads the arguments as vLLM would, prints the log lines the rig parses, and serves the fake vLLM
(`fakevllm`, on the PYTHONPATH too). It dies as vLLM 0.26 did on the H200 where the arguments would: a float16
quantized model with an fp8 KV cache and no --dtype=bfloat16 (issue 38)."""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    argv = sys.argv[1:]
    assert argv[0] == "serve", argv
    model = argv[1]
    opts = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "") for a in argv[2:] if a.startswith("--"))
    with open(os.path.join(model, "config.json")) as fh:
        config = json.load(fh)
    print(f"INFO [api_server.py] vLLM API server version 0.26.0 (stand-in); args {argv[2:]}", flush=True)
    print("INFO [gpu_model_runner.py] Starting to load model", flush=True)
    time.sleep(0.5)
    print("INFO [gpu_model_runner.py] Model loading took 1.23 GiB memory and 0.5 seconds", flush=True)
    float16 = config.get("torch_dtype") == "float16" and opts.get("dtype") in (None, "auto", "float16", "half")
    if opts.get("kv-cache-dtype", "auto").startswith("fp8") and float16:
        print("INFO [backends.py] Using FLASH_ATTN attention backend", flush=True)
        print("(EngineCore_DP0 pid=1) ERROR [core.py] EngineCore failed to start.", flush=True)
        print("(EngineCore_DP0 pid=1) RuntimeError: For FP16/BF16 input, output must have the same dtype as inputs. "
              "For FP8 input, output must have dtype BF16", flush=True)
        print("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
              flush=True)
        sys.exit(1)
    print("INFO [kv_cache_utils.py] GPU KV cache size: 12,345 tokens", flush=True)
    print("INFO [kv_cache_utils.py] Maximum concurrency for 4,096 tokens per request: 3.01x", flush=True)
    print("INFO:     Application startup complete.", flush=True)  # uvicorn's line (fakevllm binds right after)
    from fakevllm.engine import main as fake
    sys.exit(fake(["--host", opts.get("host", "127.0.0.1"), "--port", opts.get("port", "8000"),
                "--model", opts.get("served-model-name", model), "--max-model-len", opts.get("max-model-len", "4096"),
                "--kv-cache-tokens", "12345"]))


if __name__ == "__main__":
    main()
