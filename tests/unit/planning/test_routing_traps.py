"""Spec mistakes that used to pass silently (issue 21, items 3 and 5): a tier whose default sends every request to
the long pool, a threshold above the short pool's length, a flag and its value in one extraArgs item."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.paths import EXAMPLE_FILES
from tests.unit.planning.helpers import make_plan
from vllm_operator.api.errors import SpecError
from vllm_operator.planning import cli_inputs

TIER_TRAP = "requests that omit max_tokens ask for"


def tiers(*items: dict[str, object]) -> dict[str, object]:
    return {"routing": {"tiers": list(items)}}


def test_a_tier_default_above_the_short_pool_is_warned_with_the_fix() -> None:
    # chat: short pool maxTokens 512; pro's default is its cap, 1024
    p = make_plan(**tiers({"name": "free", "defaultMaxTokens": 256, "maxTokens": 512}, {"name": "pro", "maxTokens":
                                                                                         1024}))
    assert p.warnings == [
        "routing.tiers[1] (pro): requests that omit max_tokens ask for 1024 (its maxTokens cap, the default when "
        "defaultMaxTokens is unset), above pools.short.maxTokens (512): every one of them goes to the long pool "
        "(1 replica), however short the prompt; set defaultMaxTokens to 512 or less to keep them short"]


def test_an_explicit_default_above_the_short_pool_is_warned_too() -> None:
    p = make_plan(**tiers({"name": "big", "defaultMaxTokens": 600, "maxTokens": 1024}))
    assert len(p.warnings) == 1 and "ask for 600 (defaultMaxTokens)" in p.warnings[0]


@pytest.mark.parametrize("patch", [
    tiers({"name": "pro", "defaultMaxTokens": 512, "maxTokens": 1024}),
    {"pools": {"short": {"enabled": False}}, **tiers({"name": "pro", "maxTokens": 1024})},
    {},
], ids=["default-fits", "short-pool-off", "no-tiers"])
def test_no_warning_when_the_default_can_go_short(patch: dict[str, object]) -> None:
    assert not any(TIER_TRAP in w for w in make_plan(**patch).warnings)


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_examples_keep_tier_defaults_in_the_short_pool(example: Path) -> None:
    for planned in cli_inputs.plan_documents(cli_inputs.load_documents(str(example))):
        assert not any(TIER_TRAP in w for w in planned.plan.warnings), planned.plan.warnings


def test_threshold_above_the_short_pool_length_is_refused() -> None:
    with pytest.raises(SpecError) as err:
        make_plan(routing={"promptLengthThreshold": 5000})
    assert err.value.field == "spec.routing.promptLengthThreshold"
    assert err.value.message == ("5000 is above pools.short.maxModelLen (4096): prompts that long never fit the "
                                 "short pool; use at most 3584 (maxModelLen - maxTokens, the default) so a prompt "
                                 "below the threshold still has room for its answer")


def test_threshold_within_the_short_pool_is_accepted() -> None:
    assert make_plan(routing={"promptLengthThreshold": 4000}).router.prompt_length_threshold == 4000
    one_pool = make_plan(routing={"promptLengthThreshold": 5000}, pools={"short": {"enabled": False}})
    assert one_pool.router.prompt_length_threshold == 5000


@pytest.mark.parametrize(("item", "managed"), [("--max-model-len 9999", True), ("--max_model_len  9999", True),
                                               ("-tp 2", True), ("--enforce-eager true", False)], ids=str)
def test_flag_and_value_in_one_item_is_refused(item: str, managed: bool) -> None:
    with pytest.raises(SpecError) as err:
        make_plan(pools={"short": {"extraArgs": ["--enable-prefix-caching", item]}})
    assert err.value.field == "spec.pools.short.extraArgs[1]"
    assert "holds a flag and its value in one item" in err.value.message
    assert ("managed by the operator" in err.value.message) is managed


def test_values_with_spaces_after_the_equals_sign_are_fine() -> None:
    p = make_plan(pools={"short": {"extraArgs": ["--chat-template-content-format=string", '--hf-overrides={"a": 1}']}})
    assert '--hf-overrides={"a": 1}' in p.pools["short"].engine_args
