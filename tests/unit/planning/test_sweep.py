"""Every catalog GPU x model x class x GPU count either plans or is refused with a SpecError — never anything else —
and a plan always holds at least one full-length sequence per enabled pool."""

from __future__ import annotations

import itertools

import pytest

from tests.unit.planning.helpers import make_plan
from vllm_operator.api.errors import SpecError
from vllm_operator.api.spec import WorkloadClass
from vllm_operator.planning import catalog

MODELS = [m.name for m in catalog.MODELS]


@pytest.mark.parametrize("gpu", sorted(catalog.GPUS_BY_NAME))
def test_every_combination_plans_or_refuses_cleanly(gpu: str) -> None:
    outcomes = {"planned": 0, "refused": 0}
    for model, cls, count in itertools.product(MODELS, WorkloadClass, (1, 2, 4, 8)):
        try:
            p = make_plan(model={"name": model}, workloadClass=cls.value, accelerator={"type": gpu, "count": count})
        except SpecError as err:
            assert err.field.startswith("spec.") and err.message
            outcomes["refused"] += 1
            continue
        outcomes["planned"] += 1
        for pool in p.pools.values():
            assert pool.kv.planned_tokens >= pool.max_model_len
            assert pool.max_tokens < pool.max_model_len
        assert p.router.tiers[0].max_tokens <= p.pools["long"].max_tokens
    assert outcomes["planned"] > 0 and outcomes["refused"] > 0
