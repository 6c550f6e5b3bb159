"""The GPU benchmark's VLLMDeployments: valid specs, planned by the real planner into commands the GPU machine can run,
and each variant differs from the baseline in one knob (and its command in one flag) only.

The layouts are compared at equal hardware, so a variant that drifted in a second field would measure two things.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.support.loadgen import GPU_BENCH, load_script
from vllm_operator.api.resource import parse_resource
from vllm_operator.planning import cli as plan_cli

DEPLOYMENTS = GPU_BENCH / "deployments"
ec: Any = load_script("engine_cmd")


def spec(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((DEPLOYMENTS / f"{name}.yaml").read_text())
    parse_resource(obj)  # raises SpecError when invalid
    return obj


def flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}.{k}" if prefix else k))
    return out


def test_baseline_is_an_h200_with_engine_0_26() -> None:
    parsed = parse_resource(spec("default"))
    assert parsed.spec.accelerator.type.value == "nvidia-h200-141gb"
    assert parsed.spec.engine is not None and parsed.spec.engine.gpu is not None
    assert parsed.spec.engine.gpu.version == "0.26.0"


@pytest.mark.parametrize(
    ("variant", "field", "value"),
    [
        pytest.param("tuned", "spec.pools.long.maxNumBatchedTokens", 2048, id="tuned-chunked-prefill"),
        pytest.param("bf16", "spec.pools.long.kvCacheDtype", "auto", id="bf16-kv"),
        pytest.param("seqs64", "spec.pools.long.maxNumSeqs", 64, id="more-sequences"),
    ],
)
def test_variant_changes_one_knob(variant: str, field: str, value: Any) -> None:
    base, other = flat(spec("default")), flat(spec(variant))
    changed = {k for k in base.keys() | other.keys() if base.get(k) != other.get(k)}
    assert changed == {field}
    assert other[field] == value


def planned(name: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The plan exactly as the README makes it: `vllm-operator plan FILE -o json --engine-version 0.26.0`."""
    capsys.readouterr()
    assert plan_cli.main([str(DEPLOYMENTS / f"{name}.yaml"), "-o", "json", "--engine-version", "0.26.0"]) == 0
    plan: dict[str, Any] = json.loads(capsys.readouterr().out)
    return plan


@pytest.mark.parametrize("name", ["default", "tuned", "bf16", "seqs64"])
def test_planner_output_becomes_a_gpu_command(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    plan = planned(name, capsys)
    for pool in ("short", "long"):
        cmd, env = ec.build_argv(plan, pool, "/tmp/model", "127.0.0.1", 8000, {"/models": "/tmp/models"})
        assert cmd[:5] == ["python3", "-m", "vllm.entrypoints.cli.main", "serve", "/tmp/model"]
        args = cmd[5:]
        assert all(a.startswith("--") for a in args), args
        assert "--host=127.0.0.1" in args and "--port=8000" in args and "--served-model-name=llama-3.1-8b" in args
        assert not any("$(" in a or "/models" in a.replace("/tmp/models", "") for a in args)
        assert not any(v.startswith("/models") for v in env.values())
    assert ec.facts(plan)["long"]["plannedTokens"] > 0


@pytest.mark.parametrize(
    ("variant", "flags"),
    [
        pytest.param("tuned", {"--max-num-batched-tokens"}, id="tuned"),
        # fp8 KV on the H200's FlashAttention 3 comes with --dtype=bfloat16 (issue 38); bf16 KV needs none
        pytest.param("bf16", {"--kv-cache-dtype", "--dtype"}, id="bf16"),
        pytest.param("seqs64", {"--max-num-seqs"}, id="seqs64"),
    ],
)
def test_variant_commands_differ_in_one_knob(variant: str, flags: set[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    base = set(ec.build_argv(planned("default", capsys), "long", "/m", "127.0.0.1", 8000)[0])
    other = set(ec.build_argv(planned(variant, capsys), "long", "/m", "127.0.0.1", 8000)[0])
    assert {a.split("=")[0] for a in base ^ other} == flags


def test_lora_deployment_plans_two_rank_16_slots_out_of_the_kv_budget(capsys: pytest.CaptureFixture[str]) -> None:
    """The LoRA call's plan: the long pool alone gets --enable-lora with 2 slots of rank 16 and runtime updating on,
    and its KV tokens are the default long pool's minus the slots' memory (what the GPU run compares with vLLM)."""
    lora, base = planned("lora", capsys), planned("default", capsys)
    cmd, env = ec.build_argv(lora, "long", "/tmp/model", "127.0.0.1", 8000, {"/models": "/tmp/models"})
    assert {"--enable-lora", "--max-loras=2", "--max-lora-rank=16"} <= set(cmd)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert lora["pools"]["long"]["adapters"] == ["a1"]
    assert lora["pools"]["long"]["kv"]["breakdown"]["loraBytes"] == 184_713_216  # 2 slots x rank 16, Llama-3.1-8B
    slot_tokens = ec.facts(base)["long"]["plannedTokens"] - ec.facts(lora)["long"]["plannedTokens"]
    assert 0 < slot_tokens < ec.facts(base)["long"]["plannedTokens"] * 0.01, slot_tokens
