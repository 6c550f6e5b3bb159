"""The max_tokens contract (docs/architecture.md) as tables: every line of the pseudo-code has rows that take it and
rows that just miss it."""

from __future__ import annotations

import pytest

from vllm_operator.api.router_config import TierConfig
from vllm_operator.api.spec import OverLimit
from vllm_operator.router import decide as d

FREE = TierConfig(name="free", default_max_tokens=256, max_tokens=512)
PRO = TierConfig(name="pro", default_max_tokens=1024, max_tokens=1024)
# A tier above the long pool's cap (the planner refuses it; the router must still be safe).
BIG = TierConfig(name="big", default_max_tokens=2048, max_tokens=4096)
TIERS = {"free": FREE, "pro": PRO, "big": BIG}


def limits(over: OverLimit = OverLimit.CLAMP, *, short: bool = True, long: bool = True,
           threshold: int = 3000) -> d.Limits:
    return d.Limits(
        threshold=threshold,
        over_limit=over,
        short=d.PoolLimits("short", short, max_model_len=4096, max_tokens=512),
        long=d.PoolLimits("long", long, max_model_len=16384, max_tokens=1024),
    )


C, R = OverLimit.CLAMP, OverLimit.REJECT

# (prompt, requested, tier, policy) -> (pool, max_tokens, clamps)
ROUTES = [
    pytest.param(10, None, "free", C, ("short", 256, ()), id="omitted-gets-tier-default"),
    pytest.param(10, 100, "free", C, ("short", 100, ()), id="requested-under-cap-kept"),
    pytest.param(10, 512, "free", C, ("short", 512, ()), id="requested-at-tier-cap-kept"),
    pytest.param(10, 513, "free", C, ("short", 512, ("tier",)), id="over-tier-cap-clamped"),
    pytest.param(10, 100000, "free", C, ("short", 512, ("tier",)), id="huge-request-clamped-to-tier"),
    pytest.param(2999, 10, "free", C, ("short", 10, ()), id="prompt-just-under-threshold-short"),
    pytest.param(3000, 10, "free", C, ("long", 10, ()), id="prompt-at-threshold-long"),
    pytest.param(2999, 512, "free", C, ("short", 512, ()), id="fits-short-exactly-under-threshold"),
    pytest.param(3584, 512, "free", C, ("long", 512, ()), id="over-threshold-though-fits-short-len"),
    pytest.param(100, 1024, "pro", C, ("long", 1024, ()), id="want-over-short-pool-cap-goes-long"),
    pytest.param(2000, 2097, "big", C, ("long", 1024, ("pool",)), id="want-over-short-cap-goes-long-then-pool-clamp"),
    pytest.param(10, None, "big", C, ("long", 1024, ("pool",)), id="big-default-clamped-to-long-pool-cap"),
    pytest.param(10, 5000, "big", C, ("long", 1024, ("tier", "pool")), id="tier-then-pool-clamp"),
    pytest.param(15360, 1024, "pro", C, ("long", 1024, ()), id="prompt-plus-want-fills-long-exactly"),
    pytest.param(15361, 1024, "pro", C, ("long", 1023, ("context",)), id="context-clamp-by-one"),
    pytest.param(16383, 1024, "pro", C, ("long", 1, ("context",)), id="context-clamp-to-one-token"),
    pytest.param(16000, 5000, "big", C, ("long", 384, ("tier", "pool", "context")), id="all-three-clamps"),
    pytest.param(10, 512, "free", R, ("short", 512, ()), id="reject-policy-at-cap-kept"),
    pytest.param(15360, 1024, "pro", R, ("long", 1024, ()), id="reject-policy-fills-long-exactly"),
    pytest.param(100, 1024, "pro", R, ("long", 1024, ()), id="reject-policy-long-within-caps"),
]


@pytest.mark.parametrize(("prompt", "requested", "tier", "policy", "expected"), ROUTES)
def test_routes(prompt: int, requested: int | None, tier: str, policy: OverLimit,
                expected: tuple[str, int, tuple[str, ...]]) -> None:
    result = d.decide(prompt, requested, TIERS[tier], limits(policy))
    assert result == d.Route(*expected)


# (prompt, requested, tier, policy) -> (status, reason, param, numbers that the message must name)
REFUSALS = [
    pytest.param(10, 513, "free", R, (400, d.REASON_TIER_CAP, "max_tokens", ["513", "512", "free"]),
                 id="reject-over-tier-cap"),
    pytest.param(10, 2000, "big", R, (400, d.REASON_POOL_CAP, "max_tokens", ["2000", "1024", "long"]),
                 id="reject-over-long-pool-cap"),
    pytest.param(10, None, "big", R, (400, d.REASON_POOL_CAP, "max_tokens", ["2048", "1024"]),
                 id="reject-default-over-long-pool-cap"),
    pytest.param(16384, 10, "free", C, (400, d.REASON_PROMPT_TOO_LONG, "messages", ["16384", "10"]),
                 id="prompt-at-long-limit-refused"),
    pytest.param(20000, None, "free", C, (400, d.REASON_PROMPT_TOO_LONG, "messages", ["20000", "16384", "256"]),
                 id="prompt-over-long-limit-refused-clamp-policy"),
    pytest.param(20000, 10, "free", R, (400, d.REASON_PROMPT_TOO_LONG, "messages", ["20000", "16384"]),
                 id="prompt-over-long-limit-refused-reject-policy"),
    pytest.param(15361, 1024, "pro", R, (400, d.REASON_CONTEXT, "max_tokens", ["16384", "16385", "15361", "1023"]),
                 id="reject-context-overflow-by-one"),
]


@pytest.mark.parametrize(("prompt", "requested", "tier", "policy", "expected"), REFUSALS)
def test_refusals(prompt: int, requested: int | None, tier: str, policy: OverLimit,
                  expected: tuple[int, str, str, list[str]]) -> None:
    status, reason, param, numbers = expected
    result = d.decide(prompt, requested, TIERS[tier], limits(policy))
    assert isinstance(result, d.Refusal), result
    assert (result.status, result.reason, result.param) == (status, reason, param)
    for number in numbers:
        assert number in result.message, (number, result.message)
    body = result.body()
    assert set(body["error"]) == {"message", "type", "param", "code"}


SHORT_LEN = [
    pytest.param(3584, 512, ("short", 512, ()), id="prompt-plus-want-fills-short-exactly"),
    pytest.param(3585, 512, ("long", 512, ()), id="prompt-plus-want-one-over-short-goes-long"),
]


@pytest.mark.parametrize(("prompt", "requested", "expected"), SHORT_LEN)
def test_short_context_decides_with_high_threshold(prompt: int, requested: int,
                                                    expected: tuple[str, int, tuple[str, ...]]) -> None:
    assert d.decide(prompt, requested, FREE, limits(threshold=4000)) == d.Route(*expected)


def test_prompt_param_is_named() -> None:
    result = d.decide(20000, None, FREE, limits(), prompt_param="prompt")
    assert isinstance(result, d.Refusal)
    assert result.param == "prompt"
    assert result.code == d.CODE_CONTEXT


DISABLED = [
    pytest.param(10, 100, False, True, ("long", 100, ()), id="short-disabled-small-prompt-goes-long"),
    pytest.param(10, None, True, False, ("short", 256, ()), id="long-disabled-short-serves"),
    pytest.param(3500, 100, True, False, ("short", 100, ()), id="long-disabled-over-threshold-still-short"),
    pytest.param(3900, 512, True, False, ("short", 196, ("context",)), id="long-disabled-short-context-clamp"),
]


@pytest.mark.parametrize(("prompt", "requested", "short", "long", "expected"), DISABLED)
def test_disabled_pools(prompt: int, requested: int | None, short: bool, long: bool,
                        expected: tuple[str, int, tuple[str, ...]]) -> None:
    assert d.decide(prompt, requested, FREE, limits(short=short, long=long)) == d.Route(*expected)


def test_long_disabled_prompt_over_short_limit_refused() -> None:
    result = d.decide(4096, 10, FREE, limits(short=True, long=False))
    assert isinstance(result, d.Refusal)
    assert result.reason == d.REASON_PROMPT_TOO_LONG
    assert "4096" in result.message


def test_no_pool_enabled_is_503() -> None:
    result = d.decide(10, 10, FREE, limits(short=False, long=False))
    assert isinstance(result, d.Refusal)
    assert result.status == 503


REQUESTED = [
    pytest.param({}, (None, None), id="omitted"),
    pytest.param({"max_tokens": None}, (None, None), id="null-is-omitted"),
    pytest.param({"max_tokens": 7}, (7, None), id="max-tokens"),
    pytest.param({"max_completion_tokens": 9}, (9, None), id="max-completion-tokens"),
    pytest.param({"max_tokens": 7, "max_completion_tokens": 9}, (9, None), id="completion-tokens-wins"),
    pytest.param({"max_tokens": 0}, (None, "max_tokens must be at least 1, got 0"), id="zero"),
    pytest.param({"max_tokens": -3}, (None, "max_tokens must be at least 1, got -3"), id="negative"),
    pytest.param({"max_tokens": "7"}, (None, "max_tokens must be an integer, got '7'"), id="string"),
    pytest.param({"max_tokens": 7.5}, (None, "max_tokens must be an integer, got 7.5"), id="float"),
    pytest.param({"max_tokens": True}, (None, "max_tokens must be an integer, got True"), id="bool"),
    pytest.param({"max_completion_tokens": 0}, (None, "max_completion_tokens must be at least 1, got 0"),
                 id="completion-tokens-zero"),
]


@pytest.mark.parametrize(("body", "expected"), REQUESTED)
def test_requested_max_tokens(body: dict[str, object], expected: tuple[int | None, str | None]) -> None:
    value, refusal = d.requested_max_tokens(body)
    assert value == expected[0]
    if expected[1] is None:
        assert refusal is None
    else:
        assert refusal is not None
        assert refusal.message == expected[1]
        assert refusal.status == 400
        assert refusal.param in {"max_tokens", "max_completion_tokens"}
