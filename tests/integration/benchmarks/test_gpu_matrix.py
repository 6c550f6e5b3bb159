"""Rehearsal of the issue-38 matrix calls: matrix.py stages cells with the real planner and renderer, then runs each
under the real engine wrapper and router, with only vLLM replaced by a stand-in (benchmarks/gpu/rehearsal: it reads
the rendered arguments, prints vLLM's log lines, serves the fake vLLM, and dies as vLLM 0.26.0 did on the H200 where
a float16 model meets an fp8 KV cache without --dtype=bfloat16)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.support.loadgen import GPU_BENCH
from tests.support.net import free_port
from tests.support.paths import ROOT


def test_staged_cells_start_under_the_wrapper_and_a_failed_start_is_named(tmp_path: Path) -> None:
    stage, out = tmp_path / "stage", tmp_path / "out"
    cells = "awq72-fp8,lora8-fp8,gemma2-fp8,awq72-fp8-nodtype"
    subprocess.run([sys.executable, str(GPU_BENCH / "matrix.py"), "stage", str(stage), "--cells", cells],
                   check=True, capture_output=True, text=True)
    staged = json.loads((stage / "cells" / "awq72-fp8.json").read_text())
    assert "--dtype=bfloat16" in staged["args"] and staged["command"][:2] == ["vllm-operator", "engine"]
    nodtype = json.loads((stage / "cells" / "awq72-fp8-nodtype.json").read_text())
    assert "--dtype=bfloat16" not in nodtype["args"] and nodtype["dropped"] == ["--dtype=bfloat16"]
    site = f"{GPU_BENCH / 'rehearsal'}:{ROOT}"
    done = subprocess.run([sys.executable, str(stage / "matrix.py"), "run", "--stage", str(stage), "--out", str(out),
                           "--archive", str(tmp_path / "a.tar.xz"), "--site", site, "--work", str(tmp_path / "w"),
                           "--engine-port", str(free_port()), "--status-port", str(free_port()),
                           "--router-port", str(free_port())],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = {r["cell"]: r for r in json.loads((out / "results.json").read_text())}
    for name in ("awq72-fp8", "lora8-fp8", "gemma2-fp8"):
        r = results[name]
        assert r["outcome"] == "started", r
        assert r["chat"]["via"] == "router" and r["chat"]["ok"], r["chat"]
        assert r["vllm"]["weights_gib"] == 1.23 and r["cache_config_info"]["kv_cache_size_tokens"]
        assert r["status"]["phase"] == "Serving"
        assert "--load-format=dummy" in r["argv"] and "--host=127.0.0.1" in r["argv"]
    assert "--enable-lora" in results["lora8-fp8"]["argv"]
    # the adapters file names the adapter in the local /adapters volume, where the rig makes one (torch permitting)
    adapters = json.loads((out / "lora8-fp8" / "adapters" / "long.json").read_text())["adapters"]
    assert adapters[0]["name"] == "a1" and adapters[0]["path"] == str(tmp_path / "w" / "models-volume" / "adapters"
                                                                       / "adapters" / "a1")
    assert results["lora8-fp8"]["adapter_status"]["wanted"] == ["a1"] and results["lora8-fp8"]["chat_adapter"]
    # Gemma-2 (refused by the config reader before): the hybrid layout's plan, bf16 activations for fp8 KV on FA3
    gemma = json.loads((stage / "cells" / "gemma2-fp8.json").read_text())
    assert gemma["facts"]["slidingWindowLayers"] == 21 and "--dtype=bfloat16" in gemma["args"]
    failed = results["awq72-fp8-nodtype"]
    assert failed["outcome"] == "failed" and failed["wrapper_exit_code"] == 82
    term = json.loads(failed["termination"])
    assert term["reason"] == "StartupFailed" and "For FP8 input, output must have dtype BF16" in term["detail"]
    assert failed["vllm"]["error_line"].endswith("For FP8 input, output must have dtype BF16")
    with tarfile.open(tmp_path / "a.tar.xz") as tar:
        assert "out/awq72-fp8/engine.log" in tar.getnames()
