"""benchmarks/gpu/matrix.py's pure parts: the cells' deployments, the launcher substitutions, vLLM's log read back."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.loadgen import load_script

matrix = load_script("matrix")

# Lines of vLLM 0.26.0's log on the H200 (benchmarks/gpu/results/matrix/call2.tar.xz, cell awq72-fp8).
LOG = """\
(EngineCore pid=744) INFO 12-04 03:02:29 [cuda.py:482] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'TRITON_ATTN'].
(EngineCore pid=744) INFO 12-04 03:02:34 [model_runner.py:305] Model loading took 39.6 GiB and 4.123 seconds
(EngineCore pid=744) INFO 12-04 03:03:05 [gpu_worker.py:436] Available KV cache memory: 83.43 GiB
(EngineCore pid=744) INFO 12-04 03:03:05 [kv_cache_utils.py:2177] GPU KV cache size: 546,752 tokens
(EngineCore pid=744) INFO 12-04 03:03:05 [kv_cache_utils.py:2181] Maximum concurrency for 32,768 tokens per request: 16.69x
(EngineCore pid=7071) RuntimeError: For FP16/BF16 input, output must have the same dtype as inputs. For FP8 input, output must have dtype BF16
(APIServer pid=580) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""  # noqa: E501


def test_log_facts_read_vllms_own_figures_and_the_root_cause() -> None:
    facts = matrix.log_facts(LOG)
    assert facts["weights_gib"] == 39.6 and facts["kv_tokens"] == 546_752 and facts["kv_memory_gib"] == 83.43
    assert facts["concurrency"] == 16.69 and facts["attention_backend"] == "FLASH_ATTN"
    assert facts["error_line"].startswith("(EngineCore pid=7071) RuntimeError: For FP16/BF16 input")


def rec(**over: Any) -> dict[str, Any]:
    base = {"cell": "c", "command": ["vllm-operator", "engine", "--", "vllm", "serve", "Qwen/X"],
            "args": ["--host=$(POD_IP)", "--port=8000", "--kv-cache-dtype=fp8"],
            "env": [{"name": "POD_IP", "value": None, "fieldRef": {"fieldPath": "status.podIP"}},
                    {"name": "HF_HOME", "value": "/models/.hf-cache", "fieldRef": None}]}
    return {**base, **over}


def test_only_the_launchers_substitutions_are_made() -> None:
    argv, env = matrix.substitute(rec(), "/tmp/m/x", "/tmp/t.log", "/tmp/vol")
    assert argv == ["vllm-operator", "engine", "--termination-message-path=/tmp/t.log", "--", "vllm", "serve",
                    "/tmp/m/x", "--host=127.0.0.1", "--port=8000", "--kv-cache-dtype=fp8", "--load-format=dummy"]
    assert env == {"POD_IP": "127.0.0.1", "HF_HOME": "/tmp/vol/.hf-cache"}
    moved, _ = matrix.substitute(rec(), "/m", "/t", "/v", ports=(9000, 9001))
    assert "--port=9000" in moved and "--status-port=9001" in moved


def test_a_plan_that_sets_the_load_format_is_not_overridden() -> None:
    with pytest.raises(SystemExit, match="already sets --load-format"):
        matrix.substitute(rec(args=["--load-format=auto"]), "/m", "/t", "/v")


def test_each_cell_starts_one_pool_and_keeps_the_other_at_zero() -> None:
    for cell in matrix.CELLS:
        doc = matrix.deployment(cell, "0.26.0")
        pools = doc["spec"]["pools"]
        assert pools[cell.pool]["replicas"] == 1
        assert pools["long" if cell.pool == "short" else "short"]["replicas"] == 0
        assert doc["spec"]["accelerator"] == {"type": "nvidia-h200-141gb", "count": 1}
        assert (matrix.SHAPES / cell.shape / "config.json").exists()


def test_the_table_says_what_failed_and_what_was_not_run() -> None:
    rows = matrix.table([
        {"cell": "a", "pool": "long", "outcome": "started", "serving_s": 90.0,
         "planned": {"weights_bytes": 2 << 30, "kv_tokens": 990, "kv_cache_dtype": "fp8"},
         "vllm": {"weights_gib": 2.0}, "cache_config_info": {"kv_cache_size_tokens": "1000"},
         "chat": {"via": "router", "status": 200}},
        {"cell": "b", "pool": "long", "outcome": "failed", "planned": None,
         "vllm": {"error_line": "RuntimeError: x"}},
        {"cell": "c", "outcome": "not-run", "reason": "call budget: 90 s left"},
    ]).splitlines()
    assert rows[2] == "| a | long | fp8 | started | 2.00 / 2.00 | 990 / 1,000 | -1.00 % | 90.0 s | router 200 |"
    assert "failed: RuntimeError: x" in rows[3] and "not-run: call budget" in rows[4]
