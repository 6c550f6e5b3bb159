"""RouterConfig: what the router reads from `router.json` in its ConfigMap (docs/architecture.md, RouterConfig).

Rendered by the planner from the same spec as the engine pools, so the router's length limits and max_tokens caps
can never disagree with what the engines were started with. The router never talks to the operator; this file is its
whole world.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from vllm_operator.api.base import ApiModel
from vllm_operator.api.spec import OverLimit, RoutingStrategy

Text = Annotated[str, StringConstraints(max_length=4096)]


class TierConfig(ApiModel):
    """A client tier with its max_tokens default and cap (defaultMaxTokens already filled)."""

    name: Text = Field(description="Tier name; key of its API keys in the keys file.")
    default_max_tokens: int = Field(ge=1, description="max_tokens used when a request omits it.")
    max_tokens: int = Field(ge=1, description="Highest max_tokens a request of this tier may get.")


class ServiceRef(ApiModel):
    """The headless Service whose EndpointSlices list a pool's engine pods."""

    namespace: Text = Field(description="Namespace of the Service.")
    name: Text = Field(description="Name of the Service (EndpointSlices carry kubernetes.io/service-name=<name>).")
    port: int = Field(ge=1, le=65535, description="Engine HTTP port.")


class PrefixRouting(ApiModel):
    """Settings of the prefix strategy (used only when the pool's strategy is prefix)."""

    block_tokens: int = Field(
        default=16, ge=1, le=4096,
        description="Tokens per prefix block: the engine's KV block size (16 on GPU, 128 on vLLM's CPU build).")
    index_blocks: int = Field(
        default=65_536, ge=1, le=4_194_304,
        description="Most prefix blocks the router remembers for this pool (least recently used forgotten first); "
        "bounds the router's memory for prefix state.")
    load_factor: float = Field(
        default=1.25, ge=1.0, le=10.0,
        description="A replica takes a request only while its requests among the pool's last 12 per replica, and "
        "its requests in flight less one, this one included, stay within load_factor x the pool's mean (consistent "
        "hashing with bounded loads).")


class PoolRoute(ApiModel):
    """One pool as the router sees it."""

    enabled: bool = Field(description="Whether the pool exists; a disabled pool gets no traffic.")
    max_model_len: int = Field(ge=1, description="Engine --max-model-len; prompt + max_tokens must fit.")
    max_tokens: int = Field(ge=1, description="Engine-side fuse; the router never forwards more.")
    service: ServiceRef | None = Field(default=None, description="Discover endpoints from this Service's slices.")
    endpoints: list[Text] = Field(
        default_factory=list, description="Static base URLs (http://host:port), used when service is unset.")
    strategy: RoutingStrategy = Field(
        default=RoutingStrategy.LEAST_OUTSTANDING,
        description="least-outstanding or prefix: how a replica of this pool is picked.")
    prefix: PrefixRouting = Field(default_factory=PrefixRouting, description="Settings of the prefix strategy.")
    wake_seconds: float | None = Field(
        default=None, gt=0,
        description="The pool may sleep at zero replicas: a request finding no healthy endpoint is held up to this "
                    "long (exported as held requests, which wake the pool) and then answered 503 with Retry-After; "
                    "unset: answered 503 at once.")


class PoolRoutes(ApiModel):
    short: PoolRoute = Field(description="The short-text pool.")
    long: PoolRoute = Field(description="The long-text pool.")


class TokenizerConfig(ApiModel):
    """Where the router loads tokenizer.json from; with neither, it estimates conservatively."""

    path: Text | None = Field(default=None, description="Directory holding tokenizer.json (mounted).")
    hf_repo: Text | None = Field(default=None, description="Hugging Face repo to download tokenizer.json from.")
    hf_revision: Text | None = Field(default=None, description="Revision of hfRepo.")
    hf_token_file: Text | None = Field(default=None, description="File holding an HF token for gated repos.")


class Timeouts(ApiModel):
    """Seconds; 504 with an OpenAI-style body when one expires."""

    connect_seconds: float = Field(gt=0, description="TCP connect to an engine.")
    first_byte_seconds: float = Field(gt=0, description="Until the engine's first response byte.")
    idle_seconds: float = Field(gt=0, description="Longest gap between streamed chunks.")
    total_seconds: float = Field(gt=0, description="Whole request.")


class HealthCheckConfig(ApiModel):
    """Active /health polling and passive ejection of engine endpoints."""

    interval_seconds: float = Field(default=2.0, gt=0, description="Seconds between /health polls per endpoint.")
    timeout_seconds: float = Field(default=1.0, gt=0, description="Timeout of one /health poll.")


class RouterConfig(ApiModel):
    """The router's complete configuration (router.json)."""

    model: Text = Field(description="Model name clients send and engines serve (--served-model-name).")
    deployment: Text = Field(description="Name of the VLLMDeployment (metric label vllmdeployment).")
    namespace: Text = Field(description="Namespace of the VLLMDeployment.")
    prompt_length_threshold: int = Field(ge=1, description="Prompts with fewer tokens may go to the short pool.")
    over_limit: OverLimit = Field(description="clamp or reject when max_tokens exceeds a cap.")
    tiers: list[TierConfig] = Field(min_length=1, description="Tiers; the first is used without a (known) API key.")
    pools: PoolRoutes = Field(description="Both pools' limits and endpoints.")
    tokenizer: TokenizerConfig = Field(description="Tokenizer source for prompt counting.")
    timeouts: Timeouts = Field(description="Timeouts towards engines.")
    api_keys_dir: Text | None = Field(
        default=None,
        description="Directory of the mounted API-key Secret (file per tier, one key per line); unset = auth off.")
    max_body_bytes: int = Field(ge=1024, description="Largest request body accepted (413 above).")
    health: HealthCheckConfig = Field(default_factory=HealthCheckConfig, description="Endpoint health checking.")
    port: int = Field(default=8080, ge=1, le=65535, description="Port the router listens on.")
    adapters: dict[Text, list[Text]] | None = Field(
        default=None,
        description="LoRA adapters clients may name as `model`, each with the pools that serve it (router.json "
                    "changes with the list and rolls the routers; the engines load adapters without a restart).")
    access_log: bool = Field(
        default=True, description="Log one INFO line per model request (method, path, status, pool, tier, prompt "
        "tokens, max_tokens before and after the router, upstream, latency).")
