"""One plain vLLM CPU engine (no wrapper, no cluster) on the tiny model, shared by the e2e modules that read vLLM
itself: test_vllm_cpu_substrate (the vLLM behaviour everything else builds on) and health/test_vllm_signals (the
health loop's signals from that engine through a real Prometheus). Each start of vLLM is ~40 s of the tier on 2
cores, so they share one, started on first use (`SharedEngine.get`).

The engine's flags are the substrate's facts: the substrate module asserts what they do (the fuse caps an omitted
max_tokens at `FUSE`, `KV_BYTES` gives whole CPU blocks, prompts over `MAX_MODEL_LEN` get vLLM's 400).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from tests.support import vllm_cpu

MODEL = "tiny-llama"
"""The served model name."""
MAX_MODEL_LEN = 1024
FUSE = 24
"""The engine-side max_tokens fuse (`--override-generation-config={"max_new_tokens":24}`)."""
KV_BYTES = 64 * 2**20

ENGINE_ARGS = [
    f"--kv-cache-memory-bytes={KV_BYTES}",
    "--kv-cache-dtype=auto",
    f"--max-model-len={MAX_MODEL_LEN}",
    "--max-num-seqs=8",
    "--max-num-batched-tokens=2048",
    "--enable-chunked-prefill",
    f"--served-model-name={MODEL}",
    "--generation-config=vllm",
    "--override-generation-config=" + json.dumps({"max_new_tokens": FUSE}, separators=(",", ":")),
]


class SharedEngine:
    """The session's plain engine: `get()` returns the running one, or starts one when there is none yet or a test
    ended the last (the substrate's engine-death test kills its engine core, and vLLM then exits), so the modules
    work in any order and alone."""

    def __init__(self, model_dir: Path, log_dir: Path) -> None:
        self.model_dir = model_dir
        self.log_dir = log_dir
        self.server: vllm_cpu.VllmServer | None = None
        self.starts = 0

    def get(self) -> vllm_cpu.VllmServer:
        if self.server is not None and self.server.returncode() is None:
            return self.server
        if self.server is not None:
            self.server.stop()  # reaps it and whatever it left
        self.starts += 1
        self.server = vllm_cpu.start_vllm(self.model_dir, ENGINE_ARGS,
                                          log_path=self.log_dir / f"plain-engine-{self.starts}.log")
        first_request_of_one_token(self.server)
        return self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def first_request_of_one_token(server: vllm_cpu.VllmServer) -> None:
    """The engine's first request is one token long and must be answered: on an AMX host that is the request which
    killed plain vLLM with SIGILL before `start_vllm` gave it the tile permission (vllm_operator/engine/amx.py), and
    a test then saw only a dead engine and a scrape target down. Whatever the modules send next, they send it to an
    engine that passed this."""
    body = json.dumps({"model": MODEL, "prompt": "a", "max_tokens": 1}).encode()
    req = urllib.request.Request(f"{server.url}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status = resp.status
    except OSError as err:
        status = getattr(err, "code", None)
    if status != 200:
        raise AssertionError(f"the plain engine's one-token first request got {status}, engine exit code "
                             f"{server.returncode()}: {server.log_tail()}")
