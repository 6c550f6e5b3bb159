"""The router's per-request decision, as a pure function: which pool, which max_tokens, or which refusal.

Why a module of its own: this is the contract (docs/architecture.md, max_tokens) that makes the engines' limits and the
clients' caps agree, and it must be testable as a table without a server, a tokenizer or a network. Everything that
needs I/O (counting tokens, picking an endpoint, forwarding) happens around it.

The order is exactly the max_tokens contract's pseudo-code:

    want = request max_tokens (or max_completion_tokens), else tier.defaultMaxTokens
    if want > tier.maxTokens:  clamp -> want = tier.maxTokens   | reject -> 400
    pool = short if prompt < threshold and prompt + want <= short.maxModelLen and want <= short.maxTokens else long
    if pool is long and want > long.maxTokens:            clamp -> want = long.maxTokens | reject -> 400
    if prompt >= long.maxModelLen:                        400 (names prompt tokens and the limit)
    if prompt + want > long.maxModelLen:                  clamp -> want = long.maxModelLen - prompt | reject -> 400

Disabled pools (a deployment may run one pool only): when the short pool is disabled every request takes the long
branch; when the long pool is disabled the short pool plays the long pool's part in the last three lines (it is the
only place a request can go, so its limits are the final ones). With both disabled the answer is a 503.
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Mapping
from typing import Any, Final

from vllm_operator import constants
from vllm_operator.api.router_config import PoolRoute, RouterConfig, TierConfig
from vllm_operator.api.spec import OverLimit

# Refusal reasons (the `reason` label of the refusal counter) and clamp causes (the `cap` label of the clamp counter).
REASON_BAD_MAX_TOKENS: Final = "invalid_max_tokens"
REASON_INVALID: Final = "invalid_request"
REASON_TIER_CAP: Final = "tier_cap"
REASON_POOL_CAP: Final = "pool_cap"
REASON_PROMPT_TOO_LONG: Final = "prompt_too_long"
REASON_CONTEXT: Final = "context_length"
REASON_NO_POOL: Final = "no_pool_enabled"
CAP_TIER: Final = "tier"
CAP_POOL: Final = "pool"
CAP_CONTEXT: Final = "context"

# OpenAI's error codes where one exists (clients match on context_length_exceeded).
CODE_CONTEXT: Final = "context_length_exceeded"
CODE_OVER_CAP: Final = "max_tokens_over_cap"
CODE_INVALID: Final = "invalid_value"


@dataclasses.dataclass(frozen=True, slots=True)
class PoolLimits:
    """What the decision needs of one pool."""

    name: str
    enabled: bool
    max_model_len: int
    max_tokens: int

    @classmethod
    def of(cls, name: str, route: PoolRoute) -> PoolLimits:
        return cls(name, route.enabled, route.max_model_len, route.max_tokens)


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """The deployment-wide inputs of the decision (from router.json)."""

    threshold: int
    over_limit: OverLimit
    short: PoolLimits
    long: PoolLimits

    @classmethod
    def from_config(cls, config: RouterConfig) -> Limits:
        return cls(
            threshold=config.prompt_length_threshold,
            over_limit=config.over_limit,
            short=PoolLimits.of(constants.POOL_SHORT, config.pools.short),
            long=PoolLimits.of(constants.POOL_LONG, config.pools.long),
        )


@dataclasses.dataclass(slots=True)  # not frozen: made two or three times per request, and a frozen init costs ~4x
class Route:
    """Forward to `pool` with `max_tokens`; `clamps` names every cap that lowered the client's value, in order."""

    pool: str
    max_tokens: int
    clamps: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """An OpenAI-style error answer the router gives instead of forwarding."""

    status: int
    message: str
    reason: str
    param: str | None = None
    code: str | None = None
    type: str = "invalid_request_error"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


Decision = Route | Refusal

SHOWN_CHARS: Final = 80
"""Longest echo of a client's value in an error message."""
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = SHOWN_CHARS
_repr.maxlong = SHOWN_CHARS // 2


def shown(value: object) -> str:
    """`repr(value)` for an error message, shortened to about SHOWN_CHARS characters (reprlib abbreviates long
    strings, integers, lists and dicts with `...`): a 60 KB string or a 4,000-digit integer a client sent is not
    copied into the answer or the access log."""
    try:
        return _repr.repr(value)
    except ValueError:  # an integer longer than sys.get_int_max_str_digits() (set below msgspec's 4,300)
        return "<an integer too long to show>"


def requested_max_tokens(body: Mapping[str, Any]) -> tuple[int | None, Refusal | None]:
    """The client's max_tokens: `max_completion_tokens` wins over `max_tokens` (as in vLLM); None when omitted.

    A value that is not a positive integer is a 400 naming the field and the value.
    """
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            return None, Refusal(400, f"{field} must be an integer, got {shown(value)}", REASON_BAD_MAX_TOKENS,
                                 param=field, code=CODE_INVALID)
        if value < 1:
            return None, Refusal(400, f"{field} must be at least 1, got {value}", REASON_BAD_MAX_TOKENS,
                                 param=field, code=CODE_INVALID)
        return value, None
    return None, None


def decide(prompt_tokens: int, requested: int | None, tier: TierConfig, limits: Limits, *,
           prompt_param: str = "messages") -> Decision:
    """The max_tokens contract, line by line. `prompt_param` is the request field named in prompt-length errors."""
    short = limits.short if limits.short.enabled else None
    final = limits.long if limits.long.enabled else short
    if final is None:
        return Refusal(503, "no pool of this deployment is enabled", REASON_NO_POOL, type="service_unavailable")
    reject = limits.over_limit == OverLimit.REJECT
    clamps: list[str] = []

    want = tier.default_max_tokens if requested is None else requested
    if want > tier.max_tokens:
        if reject:
            return Refusal(
                400, f"max_tokens={want} exceeds the cap of {tier.max_tokens} for tier {tier.name!r}",
                REASON_TIER_CAP, param="max_tokens", code=CODE_OVER_CAP)
        want = tier.max_tokens
        clamps.append(CAP_TIER)

    if (short is not None and short is not final and prompt_tokens < limits.threshold
            and prompt_tokens + want <= short.max_model_len and want <= short.max_tokens):
        return Route(short.name, want, tuple(clamps))

    if want > final.max_tokens:
        if reject:
            return Refusal(
                400, f"max_tokens={want} exceeds the {final.name} pool's limit of {final.max_tokens} output tokens "
                f"(prompt: {prompt_tokens} tokens)", REASON_POOL_CAP, param="max_tokens", code=CODE_OVER_CAP)
        want = final.max_tokens
        clamps.append(CAP_POOL)
    if prompt_tokens >= final.max_model_len:
        return Refusal(
            400, f"This model's maximum context length is {final.max_model_len} tokens. However, your prompt "
            f"contains {prompt_tokens} tokens (max_tokens {want}), which exceeds this limit even without any output "
            f"tokens. Please shorten the prompt to fewer than {final.max_model_len} tokens.",
            REASON_PROMPT_TOO_LONG, param=prompt_param, code=CODE_CONTEXT)
    if prompt_tokens + want > final.max_model_len:
        room = final.max_model_len - prompt_tokens
        if reject:
            return Refusal(
                400, f"This model's maximum context length is {final.max_model_len} tokens. However, you requested "
                f"{prompt_tokens + want} tokens ({prompt_tokens} in the prompt, {want} for the completion). Please "
                f"lower max_tokens to at most {room} or shorten the prompt.",
                REASON_CONTEXT, param="max_tokens", code=CODE_CONTEXT)
        want = room
        clamps.append(CAP_CONTEXT)
    return Route(final.name, want, tuple(clamps))
