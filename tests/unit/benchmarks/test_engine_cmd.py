"""engine_cmd.py: the GPU benchmark's bridge from a planner's Plan to a vLLM command line and back to vLLM's facts.

Plans here are built with the project's own `PoolPlan` model and dumped to the wire shape, so a change to the Plan
contract that the script does not follow fails here, not on the GPU machine.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.support.loadgen import ENGINE_CMD_PATH, load_script
from vllm_operator.api.plan import KVBreakdown, KVPlan, PoolPlan, Resources

ec: Any = load_script("engine_cmd")


def pool_plan(name: str, args: list[str], **kw: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "name": name,
        "enabled": True,
        "replicas": 1,
        "external_autoscaler": False,
        "max_model_len": 32768,
        "max_tokens": 4096,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 8192,
        "kv_cache_dtype": "auto",
        "gpu_memory_utilization": 0.9,
        "prompt_range": (8192, 32768),
        "model": "/models/llama-3.1-8b",
        "served_model_name": "llama",
        "engine_args": args,
        "env": {"VLLM_NO_USAGE_STATS": "1"},
        "resources": Resources(limits={"nvidia.com/gpu": "1"}),
        "image": "vllm/vllm-openai:v0.26.0",
        "kv": KVPlan(
            bytes_per_token=131072,
            budget_bytes=117_000_000_000,
            planned_tokens=896_912,
            concurrency_at_full_length=27.37,
            typical_sequence_tokens=24512,
            concurrency_at_typical_length=36.6,
            breakdown=KVBreakdown(
                device_bytes=150_000_000_000,
                utilization=0.9,
                weights_bytes=16_000_000_000,
                activation_bytes=1_000_000_000,
                non_torch_bytes=200_000_000,
                cuda_graph_bytes=0,
                margin_bytes=500_000_000,
            ),
        ),
        "step_down_level": 0,
    }
    fields.update(kw)
    return PoolPlan(**fields).to_wire()


ARGS = [
    "--host=$(POD_IP)",
    "--port=8000",
    "--served-model-name=llama",
    "--max-model-len=32768",
    "--max-num-batched-tokens=8192",
    '--override-generation-config={"max_new_tokens":4096}',
    "--enable-chunked-prefill",
]


@pytest.fixture
def plan() -> dict[str, Any]:
    return {"pools": {"long": pool_plan("long", ARGS), "short": pool_plan("short", ARGS[:3], enabled=False)}}


def test_argv_prepends_launcher_and_expands_pod_ip(plan: dict[str, Any]) -> None:
    cmd, env = ec.build_argv(plan, "long", "/tmp/model", "127.0.0.1", 8001)
    assert cmd[:5] == ["python3", "-m", "vllm.entrypoints.cli.main", "serve", "/tmp/model"]
    assert "--host=127.0.0.1" in cmd
    assert [a for a in cmd if a.startswith("--port")] == ["--port=8001"]
    assert cmd[-1] == "--load-format=dummy"
    assert '--override-generation-config={"max_new_tokens":4096}' in cmd  # JSON untouched
    assert "/models/llama-3.1-8b" not in cmd
    assert env == {"VLLM_NO_USAGE_STATS": "1"}


def test_argv_keeps_plan_port_when_none_given(plan: dict[str, Any]) -> None:
    cmd, _ = ec.build_argv(plan, "long", "/m", "10.0.0.1", None)
    assert "--port=8000" in cmd and "--host=10.0.0.1" in cmd


@pytest.mark.parametrize(
    ("mutate", "pool", "message"),
    [
        pytest.param(
            lambda p: None, "medium", "plan has no pool 'medium' \\(pools: \\['long', 'short'\\]\\)", id="unknown-pool"
        ),
        pytest.param(lambda p: None, "short", "pool 'short' is disabled", id="disabled-pool"),
        pytest.param(
            lambda p: p["pools"]["long"]["engineArgs"].append("--x=$(NODE_NAME)"),
            "long",
            "refers to \\$\\(NODE_NAME\\), which has no value here",
            id="unknown-variable",
        ),
        pytest.param(
            lambda p: p["pools"]["long"]["engineArgs"].append("--load-format=auto"),
            "long",
            "already sets \\['--load-format'\\]",
            id="benchmark-flag-clash",
        ),
    ],
)
def test_argv_refusals_name_the_problem(plan: dict[str, Any], mutate: Any, pool: str, message: str) -> None:
    mutate(plan)
    with pytest.raises(ec.PlanError, match=message):
        ec.build_argv(plan, pool, "/m", "127.0.0.1", None)


def test_facts_lists_enabled_pools(plan: dict[str, Any]) -> None:
    assert ec.facts(plan) == {
        "long": {
            "servedModelName": "llama",
            "maxModelLen": 32768,
            "kvCacheDtype": "auto",
            "gpuMemoryUtilization": 0.9,
            "maxNumBatchedTokens": 8192,
            "maxNumSeqs": 64,
            "plannedTokens": 896912,
            "concurrencyAtFullLength": 27.37,
        }
    }


INFO = (
    'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",'
    'kv_cache_size_tokens="{tokens}",num_gpu_blocks="{blocks}"}} 1.0\n'
)


@pytest.mark.parametrize(
    ("line", "observed", "error_pct"),
    [
        pytest.param(
            INFO.replace("{tokens}", "854202").replace("{blocks}", "53387").replace("}}", "}"),
            854202,
            5.0,
            id="five-percent-over",
        ),
        pytest.param(
            INFO.replace("{tokens}", "None").replace("{blocks}", "56057").replace("}}", "}"),
            896912,
            0.0,
            id="from-blocks-when-no-token-label",
        ),
        pytest.param(
            INFO.replace("vllm:", "vllm_").replace("{tokens}", "896912").replace("{blocks}", "1").replace("}}", "}"),
            896912,
            0.0,
            id="escaped-name",
        ),
    ],
)
def test_compare_planned_with_observed(plan: dict[str, Any], line: str, observed: int, error_pct: float) -> None:
    text = "# HELP vllm:cache_config_info x\n# TYPE vllm:cache_config_info gauge\n" + line
    out = ec.compare(plan, "long", text)
    assert out["kvTokens"]["observed"] == observed
    assert out["kvTokens"]["error_pct"] == pytest.approx(error_pct, abs=0.01)
    assert out["concurrencyAtFullLength"] == {"planned": 27.37, "observed": round(observed / 32768, 2)}
    assert out["kvCacheDtype"] == {"planned": "auto", "observed": "auto"}


def test_compare_without_cache_config_info(plan: dict[str, Any]) -> None:
    with pytest.raises(ec.PlanError, match="no vllm:cache_config_info"):
        ec.compare(plan, "long", "vllm:num_requests_running 0\n")


def test_cli_prints_a_runnable_shell_line(
    plan: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    assert ec.main(["argv", str(path), "--pool", "long", "--model-dir", "/tmp/model", "--port", "8000"]) == 0
    words = shlex.split(capsys.readouterr().out)
    assert words[0] == "VLLM_NO_USAGE_STATS=1" and words[1:6] == [
        "python3",
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        "/tmp/model",
    ]
    assert '--override-generation-config={"max_new_tokens":4096}' in words
    assert ec.main(["argv", str(path), "--pool", "nope", "--model-dir", "/m"]) == 2
    assert "plan has no pool 'nope'" in capsys.readouterr().err


def test_stdlib_only() -> None:
    import ast
    import sys

    tree = ast.parse(ENGINE_CMD_PATH.read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {r for r in roots if r not in sys.stdlib_module_names and r != "__future__"} == set()


@pytest.mark.parametrize(
    ("value", "want"),
    [
        pytest.param("/models/.hf-cache", "/tmp/models/.hf-cache", id="path"),
        pytest.param("/models", "/tmp/models", id="mount-root"),
        pytest.param("--download-dir=/models/cache", "--download-dir=/tmp/models/cache", id="flag-value"),
        pytest.param("/modelsX/a", "/modelsX/a", id="other-dir-same-prefix"),
        pytest.param(
            '--override-generation-config={"a":"/models"}',
            '--override-generation-config={"a":"/models"}',
            id="json-untouched",
        ),
        pytest.param("--enforce-eager", "--enforce-eager", id="bare-flag"),
    ],
)
def test_remount(value: str, want: str) -> None:
    assert ec.remount(value, {"/models": "/tmp/models/"}) == want


def test_mount_applies_to_args_and_env(plan: dict[str, Any]) -> None:
    plan["pools"]["long"]["env"]["HF_HOME"] = "/models/.hf-cache"
    plan["pools"]["long"]["engineArgs"].append("--download-dir=/models/dl")
    cmd, env = ec.build_argv(plan, "long", "/m", "127.0.0.1", None, {"/models": "/tmp/models"})
    assert env["HF_HOME"] == "/tmp/models/.hf-cache" and "--download-dir=/tmp/models/dl" in cmd


def test_cli_refuses_a_malformed_mount(
    plan: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    assert ec.main(["argv", str(path), "--pool", "long", "--model-dir", "/m", "--mount", "/models"]) == 2
    assert "--mount takes POD_PATH=LOCAL_PATH" in capsys.readouterr().err
