"""The step-down ladders: each rung changes the arguments, and the health policy can ask what comes next."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.planning.helpers import arg, make_plan
from vllm_operator.api.plan import Plan
from vllm_operator.api.status import PoolsStatus, PoolStatus, StepDownRecord, StepDownStatus, VLLMDeploymentStatus
from vllm_operator.health.rungs import ladder_views
from vllm_operator.planning import PoolRemediation, RemediationState, ladder


def at(step: int = 0, kv: int = 0, pool: str = "long", **patch: Any) -> Plan:
    return make_plan(RemediationState({pool: PoolRemediation(step, kv)}), **patch)


def next_level(p: Plan, **kw: Any) -> int | None:
    """The level of the long pool's next rung (`ladder.next_rung`), None when there is none."""
    rung = ladder.next_rung(p, "long", **kw)
    return None if rung is None else rung[0]


@pytest.mark.parametrize(("level", "expected"), [
    (0, {"--gpu-memory-utilization": "0.9", "--max-num-batched-tokens": "8192", "--max-num-seqs": "32",
         "--kv-cache-dtype": "auto"}),
    (1, {"--gpu-memory-utilization": "0.85", "--max-num-batched-tokens": "8192", "--max-num-seqs": "32",
         "--kv-cache-dtype": "auto"}),
    (2, {"--gpu-memory-utilization": "0.85", "--max-num-batched-tokens": "4096", "--max-num-seqs": "32",
         "--kv-cache-dtype": "auto"}),
    (3, {"--gpu-memory-utilization": "0.85", "--max-num-batched-tokens": "4096", "--max-num-seqs": "16",
         "--kv-cache-dtype": "auto"}),
    (4, {"--gpu-memory-utilization": "0.85", "--max-num-batched-tokens": "4096", "--max-num-seqs": "16",
         "--kv-cache-dtype": "fp8"}),
    (9, {"--gpu-memory-utilization": "0.85", "--max-num-batched-tokens": "4096", "--max-num-seqs": "16",
         "--kv-cache-dtype": "fp8"}),
], ids=["level0", "level1-utilization", "level2-batched", "level3-seqs", "level4-fp8", "beyond-the-end"])
def test_step_down_rungs_change_args(level: int, expected: dict[str, str]) -> None:
    p = at(level)
    assert {flag: arg(p, "long", flag) for flag in expected} == expected
    assert p.pools["long"].step_down_level == level
    assert arg(p, "short", "--gpu-memory-utilization") == "0.9"  # the other pool is untouched


def test_step_down_keeps_kv_prediction_honest() -> None:
    assert at(1).pools["long"].kv.planned_tokens < at(0).pools["long"].kv.planned_tokens
    assert at(4).pools["long"].kv.planned_tokens > at(3).pools["long"].kv.planned_tokens


def test_cpu_memory_rung_lowers_kv_bytes() -> None:
    cpu = {"model": {"name": "x/t", "facts": {"numLayers": 2, "numKVHeads": 2, "headDim": 64,
                                               "maxContextLength": 65536, "weightsGiB": 0.05}},
           "accelerator": {"type": "cpu", "memoryGiB": 4}}
    base = int(arg(at(0, **cpu), "long", "--kv-cache-memory-bytes") or 0)
    lower = int(arg(at(1, **cpu), "long", "--kv-cache-memory-bytes") or 0)
    assert 0.85 * base < lower < 0.95 * base
    assert arg(at(4, **cpu), "long", "--kv-cache-dtype") == "auto"  # no FP8 rung on CPU


def test_fp8_rung_is_skipped_where_already_fp8() -> None:
    p = at(0, workloadClass="long-doc")  # long-doc long pool is fp8 on an H100 already
    assert next_level(p) == 1
    assert next_level(at(2, workloadClass="long-doc")) == 3
    p3 = at(3, workloadClass="long-doc")
    assert next_level(p3) is None


def test_fp8_rung_refused_by_explicit_backend_is_skipped() -> None:
    flash = {"accelerator": {"type": "nvidia-a100-80gb"},
             "pools": {"long": {"extraArgs": ["--attention-backend=FLASH_ATTN"]}}}
    p = at(0, **flash)
    assert (p.pools["long"].attention_backend, p.pools["long"].fp8_kv_allowed) == ("FLASH_ATTN", False)
    assert next_level(at(3, **flash)) is None
    assert next_level(at(3, accelerator={"type": "nvidia-a100-80gb"})) == 4


def test_describe_rung() -> None:
    p = at(0)
    assert ladder.next_rung(p, "long") == (1, "gpu-memory-utilization 0.9->0.85")
    settings = ladder.settings_of(p, "long")
    assert ladder.describe_change(settings, ladder.apply_levels(ladder.STEP_DOWN_LADDER, settings, 2)) == (
        "gpu-memory-utilization 0.9->0.85, max-num-batched-tokens 8192->4096")
    assert ladder.next_rung(at(1), "long") == (2, "max-num-batched-tokens 8192->4096")
    assert ladder.next_rung(at(2), "long") == (3, "max-num-seqs 32->16")
    assert ladder.next_rung(at(3), "long") == (4, "kv-cache-dtype auto->fp8")
    assert ladder.next_rung(at(4), "long") is None
    assert ladder.describe_change(settings, settings) == "no change"


def test_floors_end_the_ladder() -> None:
    p = at(0, pools={"long": {"gpuMemoryUtilization": 0.5, "maxNumBatchedTokens": 512, "maxNumSeqs": 1,
                              "kvCacheDtype": "fp8"}})
    assert next_level(p) is None


@pytest.mark.parametrize(("kv", "allow", "length", "dtype"), [
    (0, False, 16384, "auto"), (1, False, 16384, "fp8"), (2, False, 16384, "fp8"), (2, True, 8192, "fp8"),
], ids=["kv0", "kv1-fp8", "kv2-no-opt-in", "kv2-opt-in-halves-length"])
def test_kv_ladder(kv: int, allow: bool, length: int, dtype: str) -> None:
    p = at(0, kv, remediation={"allowLowerMaxModelLen": allow})
    assert p.pools["long"].max_model_len == length
    assert arg(p, "long", "--max-model-len") == str(length)
    assert arg(p, "long", "--kv-cache-dtype") == dtype
    assert p.router.pools.long.max_model_len == length


def test_kv_ladder_queries() -> None:
    p = at(0)
    assert ladder.next_rung(p, "long", kv=True) == (1, "kv-cache-dtype auto->fp8")
    assert next_level(at(0, 1), kv=True) is None
    assert ladder.next_rung(at(0, 1), "long", kv=True, allow_lower_max_model_len=True) == (
        2, "max-model-len 16384->8192")
    settings = ladder.settings_of(p, "long")
    assert ladder.describe_change(settings, ladder.apply_levels(ladder.kv_ladder_for(True), settings, 2)) == (
        "kv-cache-dtype auto->fp8, max-model-len 16384->8192")
    # the long pool never drops below the short pool's length
    assert next_level(at(0, 1, pools={"long": {"maxModelLen": 4096}}), kv=True, allow_lower_max_model_len=True) is None


def test_remediation_state_from_status() -> None:
    status = VLLMDeploymentStatus(pools=PoolsStatus(long=PoolStatus(step_down=StepDownStatus(level=2, kv_level=1))))
    state = RemediationState.from_status(status)
    assert state.pool("long") == PoolRemediation(2, 1)
    assert state.pool("short") == PoolRemediation()
    p = make_plan(state)
    assert (p.pools["long"].step_down_level, p.pools["long"].kv_level) == (2, 1)
    assert any("remediation applied" in w for w in p.pools["long"].warnings)


def test_a_pool_moved_before_is_marked_in_its_plan_also_back_on_rung_0() -> None:
    """A reset leaves rung 0 and the move in the history: the plan says the pool has moved (rendering rolls it
    replace-first); a pool never moved is not marked."""
    reset = StepDownRecord(level=0, rung="", reason="resetToken t", time="2026-12-06T09:30:00Z")
    status = VLLMDeploymentStatus(pools=PoolsStatus(long=PoolStatus(step_down=StepDownStatus(history=[reset]))))
    state = RemediationState.from_status(status)
    assert state.pool("long") == PoolRemediation(0, 0, moved=True)
    p = make_plan(state)
    assert (p.pools["long"].step_down_level, p.pools["long"].ladder_moved) == (0, True)
    assert not p.pools["short"].ladder_moved


def test_next_rung_pairs_for_the_health_policy() -> None:
    assert ladder_views(at(0), False)["long"].next_memory == (1, "gpu-memory-utilization 0.9->0.85")
    assert ladder_views(at(0, workloadClass="long-doc"), False)["long"].next_memory == (
        1, "gpu-memory-utilization 0.9->0.85")
    assert ladder_views(at(3, workloadClass="long-doc"), False)["long"].next_memory is None
    assert ladder_views(at(0), False)["long"].next_kv == (1, "kv-cache-dtype auto->fp8")
    assert ladder_views(at(0, 1), False)["long"].next_kv is None
    assert ladder_views(at(0, 1), True)["long"].next_kv == (2, "max-model-len 16384->8192")


def test_batched_tokens_never_halved_below_max_num_seqs() -> None:
    p = at(2, pools={"long": {"maxNumSeqs": 1024, "maxNumBatchedTokens": 1536}})
    assert arg(p, "long", "--max-num-batched-tokens") == "1024"
