"""Every refusal rule of the planner, with the field it names and the numbers in its message."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.unit.planning.helpers import make_plan, make_spec
from vllm_operator.api.errors import SpecError
from vllm_operator.planning import RemediationState, plan

TINY_FACTS = {"numLayers": 2, "numKVHeads": 6, "numAttentionHeads": 32, "headDim": 64, "maxContextLength": 8192,
              "weightsGiB": 1.0}

CASES: list[Any] = [
    pytest.param({"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "pools": {"long": {"maxModelLen": 65536}}},
                 "spec.pools.long.maxModelLen",
                 r"^65536 exceeds the native context of Qwen/Qwen2\.5-7B-Instruct \(32768 tokens\)$",
                 id="max-model-len-above-native-context"),
    pytest.param({"accelerator": {"type": "nvidia-a10g-24gb"}, "pools": {"long": {"maxModelLen": 131072}}},
                 "spec.pools.long.maxModelLen",
                 r"^needs 16\.0 GiB of KV cache for one 131072-token sequence; about 3\.4 GiB is left on "
                 r"nvidia-a10g-24gb after 16\.4 GiB of weights and overhead at gpu-memory-utilization 0\.9; what "
                 r"fits: maxModelLen 27696 \(55408 with kvCacheDtype fp8\), or accelerator\.count 2$",
                 id="a10g-llama-8b-131072-does-not-fit"),
    pytest.param({"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}},
                 "spec.accelerator",
                 r"^nothing is left for the KV cache on nvidia-h100-80gb: 131\.5 GiB of weights and 1\.6 GiB of "
                 r"overhead exceed the 71\.3 GiB that gpu-memory-utilization 0\.9 of 79\.2 GiB allows",
                 id="weights-do-not-fit"),
    pytest.param({"pools": {"short": {"maxTokens": 4096}}}, "spec.pools.short.maxTokens",
                 r"^4096 must be below maxModelLen \(4096\): the prompt needs room$", id="max-tokens-not-below-len"),
    pytest.param({"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "accelerator": {"type": "nvidia-h100-80gb",
                                                                                  "count": 8}},
                 "spec.accelerator.count",
                 r"^tensor-parallel size 8 does not divide the 28 attention heads of Qwen/Qwen2\.5-7B-Instruct$",
                 id="tp-does-not-divide-attention-heads"),
    pytest.param({"model": {"name": "x/tiny", "facts": TINY_FACTS}, "accelerator": {"count": 4},
                  "pools": {"long": {"maxModelLen": 8192}}},
                 "spec.accelerator.count", r"^tensor-parallel size 4 does not divide the 6 KV heads of x/tiny",
                 id="tp-does-not-divide-kv-heads"),
    pytest.param({"accelerator": {"type": "nvidia-t4-16gb"}, "model": {"name": "x/tiny", "facts": TINY_FACTS},
                  "pools": {"short": {"kvCacheDtype": "bfloat16"}, "long": {"maxModelLen": 8192}}},
                 "spec.pools.short.kvCacheDtype",
                 r"^bfloat16 KV cache is not supported on nvidia-t4-16gb \(compute capability 7\.5\)$",
                 id="kv-dtype-refused-for-gpu"),
    pytest.param({"pools": {"long": {"kvCacheDtype": "fp8_e5m2", "extraArgs": ["--attention-backend=FLASH_ATTN"]}}},
                 "spec.pools.long.kvCacheDtype",
                 r"^fp8_e5m2 KV cache is not supported on nvidia-h100-80gb \(compute capability 9\.0\) with "
                 r"--attention-backend=FLASH_ATTN$", id="kv-dtype-refused-for-backend"),
    pytest.param({"pools": {"short": {"maxModelLen": 32768}}}, "spec.pools.short.maxModelLen",
                 r"^32768 exceeds pools\.long\.maxModelLen \(16384\)", id="short-longer-than-long"),
    pytest.param({"routing": {"tiers": [{"name": "free", "maxTokens": 512}, {"name": "pro", "maxTokens": 2048}]}},
                 "spec.routing.tiers[1].maxTokens",
                 r"^tier pro caps max_tokens at 2048, above pools\.long\.maxTokens \(1024\)", id="tier-cap-above-long"),
    pytest.param({"model": {"name": "acme/unknown-13b"}}, "spec.model.name",
                 r"^'acme/unknown-13b' is not in the model catalog .*give spec\.model\.facts", id="unknown-model"),
    pytest.param({"pools": {"short": {"enabled": False}, "long": {"enabled": False}}}, "spec.pools",
                 r"^both pools are disabled", id="both-pools-disabled"),
    pytest.param({"routing": {"promptLengthThreshold": 20000}}, "spec.routing.promptLengthThreshold",
                 r"^20000 is above pools\.long\.maxModelLen \(16384\)", id="threshold-above-long"),
    pytest.param({"accelerator": {"type": "cpu", "memoryGiB": 8}, "model": {"name": "x/tiny", "facts": TINY_FACTS},
                  "pools": {"long": {"maxModelLen": 8192, "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "4"}]}}},
                 "spec.pools.long.env[0]", r"^VLLM_CPU_KVCACHE_SPACE would override", id="cpu-kvcache-space-env"),
    pytest.param({"accelerator": {"type": "cpu", "memoryGiB": 2}, "model": {"name": "x/tiny", "facts": TINY_FACTS},
                  "pools": {"long": {"maxModelLen": 8192}}},
                 "spec.accelerator", r"^nothing is left for the KV cache on cpu \(2\.0 GiB pod memory\)",
                 id="cpu-pod-too-small"),
    pytest.param({"pools": {"short": {"maxNumSeqs": 1024, "maxNumBatchedTokens": 512}}},
                 "spec.pools.short.maxNumBatchedTokens", r"^512 is below maxNumSeqs \(1024\)",
                 id="batched-tokens-below-seqs"),
    pytest.param({"engine": {"gpu": {"version": "0.20.1"}}}, "spec.engine.gpu.version",
                 r"^vLLM 0\.20\.1 is older than every version the planner knows \(0\.26, 0\.32, 0\.33\)$",
                 id="engine-version-too-old"),
    pytest.param({"accelerator": {"type": "auto"}}, "spec.accelerator.type",
                 r"^accelerator\.type auto must be resolved from node labels \(offline: --gpu TYPE\)$",
                 id="auto-without-node-facts"),
]


@pytest.mark.parametrize(("patch", "field", "message"), CASES)
def test_refused(patch: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        make_plan(**patch)
    assert info.value.field == field
    assert re.search(message, info.value.message), info.value.message


@pytest.mark.parametrize("token", [
    "--max-model-len=8192", "--max_model_len=8192", "--max-model-len", "--MAX-MODEL-LEN=1", "--config=x.yaml",
    "--config", "-tp=2", "--tensor_parallel_size=2", "--gpu-memory-utilization=0.99", "--kv-cache-dtype=fp8",
    "--no-enable-chunked-prefill", "--max-num-seqs=1", "--override-generation-config={}", "--served-model-name=x",
    "--port=1", "--host=0.0.0.0", "--kv-cache-memory-bytes=1", "--quantization=awq", "-q",
], ids=lambda t: t)
def test_extra_args_managed_flags_refused_in_any_spelling(token: str) -> None:
    with pytest.raises(SpecError) as info:
        make_plan(pools={"short": {"extraArgs": ["--enable-prefix-caching", token, "8192"]}})
    assert info.value.field == "spec.pools.short.extraArgs[1]"
    assert "which the operator manages" in info.value.message


def test_cpu_without_memory_is_refused_by_the_api() -> None:
    with pytest.raises(SpecError, match="memoryGiB"):
        make_spec(accelerator={"type": "cpu"})


def test_unknown_model_with_facts_plans() -> None:
    p = make_plan(model={"name": "acme/unknown-13b", "facts": {**TINY_FACTS, "numKVHeads": 8}},
                  pools={"long": {"maxModelLen": 8192}})
    assert p.pools["long"].kv.bytes_per_token == 2 * 2 * 8 * 64 * 2


def test_remediation_state_defaults_to_level_zero() -> None:
    spec = make_spec()
    p = plan(spec, None, RemediationState.from_status(None), name="a", namespace="b")
    assert {pool.step_down_level for pool in p.pools.values()} == {0}


# --- what would fit (issue 21 item 8) ---------------------------------------------------------------------------

def refusal(**patch: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        make_plan(**patch)
    return info.value


def test_a_length_that_does_not_fit_names_the_longest_that_does_and_fp8() -> None:
    err = refusal(accelerator={"type": "nvidia-l4-24gb"}, pools={"long": {"maxModelLen": 131072}})
    assert err.message.endswith("; what fits: maxModelLen 27696 (55408 with kvCacheDtype fp8), or accelerator.count 2")
    # each suggestion plans, and one block more does not
    make_plan(accelerator={"type": "nvidia-l4-24gb"}, pools={"long": {"maxModelLen": 27696}})
    make_plan(accelerator={"type": "nvidia-l4-24gb"}, pools={"long": {"maxModelLen": 55408, "kvCacheDtype": "fp8"}})
    make_plan(accelerator={"type": "nvidia-l4-24gb", "count": 2}, pools={"long": {"maxModelLen": 131072}})
    with pytest.raises(SpecError):
        make_plan(accelerator={"type": "nvidia-l4-24gb"}, pools={"long": {"maxModelLen": 27696 + 16}})


def test_fp8_that_fits_the_whole_length_says_so() -> None:
    err = refusal(accelerator={"type": "nvidia-l4-24gb"}, pools={"long": {"maxModelLen": 40960}})
    assert "(kvCacheDtype fp8 fits all 40960)" in err.message


def test_a_gpu_without_fp8_kv_says_so() -> None:
    facts = {**TINY_FACTS, "numLayers": 64, "numKVHeads": 8, "numAttentionHeads": 8, "headDim": 128,
             "maxContextLength": 131072, "weightsGiB": 1.0}
    long = {"maxModelLen": 131072, "extraArgs": ["--attention-backend=FLASH_ATTN"]}
    err = refusal(accelerator={"type": "nvidia-t4-16gb"}, model={"name": "x/tiny", "facts": facts},
                  pools={"long": long})
    assert "(FP8 KV is not available on nvidia-t4-16gb)" in err.message


def test_weights_that_do_not_fit_name_the_fewest_gpus_that_plan_the_whole_spec() -> None:
    err = refusal(accelerator={"type": "nvidia-l4-24gb"}, model={"name": "meta-llama/Llama-3.1-70B-Instruct"})
    assert err.field == "spec.accelerator"
    assert err.message.endswith("allows; what fits: accelerator.count 8")
    make_plan(accelerator={"type": "nvidia-l4-24gb", "count": 8}, model={"name": "meta-llama/Llama-3.1-70B-Instruct"})
    with pytest.raises(SpecError):  # 4 GPUs hold the weights but not both pools' sequences
        make_plan(accelerator={"type": "nvidia-l4-24gb", "count": 4},
                  model={"name": "meta-llama/Llama-3.1-70B-Instruct"})


def test_no_gpu_count_fits_says_what_else_would() -> None:
    err = refusal(accelerator={"type": "nvidia-t4-16gb"}, model={"name": "x/huge", "facts": {
        **TINY_FACTS, "numKVHeads": 8, "numAttentionHeads": 64, "weightsGiB": 900.0}})
    assert err.message.endswith("what fits: no accelerator.count up to 16 on nvidia-t4-16gb (a larger GPU or a "
                                "quantized checkpoint)")


def test_cpu_refusal_names_the_pod_memory_that_fits() -> None:
    facts = {**TINY_FACTS, "numLayers": 32, "numKVHeads": 32, "headDim": 128, "maxContextLength": 65536}
    patch = {"model": {"name": "x/tiny", "facts": facts}, "pools": {"long": {"maxModelLen": 32768}}}
    err = refusal(accelerator={"type": "cpu", "memoryGiB": 4}, **patch)
    memory = int(re.search(r"what fits: accelerator\.memoryGiB (\d+)$", err.message).group(1))  # type: ignore[union-attr]
    make_plan(accelerator={"type": "cpu", "memoryGiB": memory}, **patch)
    with pytest.raises(SpecError):
        make_plan(accelerator={"type": "cpu", "memoryGiB": memory - 1}, **patch)
