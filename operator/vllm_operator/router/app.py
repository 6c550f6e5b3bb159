"""Wiring: the router's HTTP application (server.py) with its endpoints, pools, discovery and health tasks.

Kept apart from `main.py` so that tests build the same application in-process (`build_app`) and serve it on a free
port with `serve()`, while `main()` only parses arguments and runs it.

`/health` answers 200 when at least one enabled pool has a healthy endpoint (the router can serve something), else
503 — it is the router pod's readiness probe. `/livez` is always 200 while the event loop runs (liveness).
`/v1/models` is answered locally from router.json: the base model and its LoRA adapters (parent: the base model).
No other path reaches an engine: vLLM's unauthenticated `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`
(and everything else it serves) answer 404 here; only the engine wrapper inside the pod calls them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Final, TextIO

import aiohttp

from vllm_operator import constants
from vllm_operator.api.router_config import RouterConfig
from vllm_operator.api.spec import RoutingStrategy
from vllm_operator.k8s import ClientKubeApi
from vllm_operator.router import http1
from vllm_operator.router.access import AccessLog
from vllm_operator.router.auth import Auth
from vllm_operator.router.metrics import RouterMetrics
from vllm_operator.router.prefix import PrefixBalancer
from vllm_operator.router.proxy import Router
from vllm_operator.router.server import App, Request, Response, serve
from vllm_operator.router.tokens import TokenCounter
from vllm_operator.router.upstreams import HealthChecker, Pool, SliceWatcher, cancel_all

__all__ = ["build_app", "serve"]

log = logging.getLogger(__name__)

KEY_RELOAD_SECONDS: Final = 10.0
# Below uvicorn's (vLLM's server) 5 s keep-alive, so the router never reuses a connection the engine just closed.
UPSTREAM_KEEPALIVE_SECONDS: Final = 4.0
_JSON: Final = "application/json"


def build_app(config: RouterConfig, counter: TokenCounter, *, kubeconfig: str | None = None,
              metrics: RouterMetrics | None = None, access_stream: TextIO | None = None) -> App:
    """The router application; its lifespan starts discovery and health polling before serving and stops them
    after. Access lines go to `access_stream` (default stderr, where the other log lines go)."""
    metrics = metrics or RouterMetrics()
    metrics.tokenizer_missing.set(0 if counter.has_tokenizer else 1)
    auth = Auth(config.tiers, config.api_keys_dir)
    routes = {constants.POOL_SHORT: config.pools.short, constants.POOL_LONG: config.pools.long}
    pools = {name: Pool(name, metrics, PrefixBalancer(route.prefix, counter.tokenizer)
                        if route.strategy == RoutingStrategy.PREFIX else None) for name, route in routes.items()}
    upstream = http1.Pool(keepalive_s=UPSTREAM_KEEPALIVE_SECONDS)
    access_log = AccessLog(config.access_log, access_stream)
    router = Router(config, counter, auth, pools, metrics, upstream, access_log)
    app = App(max_body_bytes=config.max_body_bytes)

    @contextlib.asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        tasks: list[asyncio.Task[Any]] = []
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=UPSTREAM_KEEPALIVE_SECONDS, ttl_dns_cache=30)
        session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        kube: ClientKubeApi | None = None
        for name, route in routes.items():
            if not route.enabled:
                continue
            if route.service is not None:
                if kube is None:
                    kube = await ClientKubeApi.from_environment(
                        kubeconfig, component=f"{constants.APP_NAME}-{constants.COMPONENT_ROUTER}")
                watcher = SliceWatcher(pools[name], route.service, kube)
                tasks.append(asyncio.create_task(watcher.run(), name=f"slices-{name}"))
            else:
                pools[name].set_endpoints(u.rstrip("/") for u in route.endpoints)
        checker = HealthChecker([pools[n] for n, r in routes.items() if r.enabled], session,
                                interval=config.health.interval_seconds, timeout=config.health.timeout_seconds)
        tasks.append(asyncio.create_task(checker.run(), name="health"))
        if auth.enabled:
            tasks.append(asyncio.create_task(_reload_keys(auth), name="api-keys"))
        try:
            yield
        finally:
            await cancel_all(tasks)
            access_log.flush()
            upstream.close()
            await session.close()
            if kube is not None:
                await kube.close()

    app.lifespans.append(lifespan)

    enabled = [r.max_model_len for r in routes.values() if r.enabled]
    cards = [{"id": config.model, "object": "model", "created": 0, "owned_by": constants.APP_NAME,
              "root": config.model, "parent": None, "max_model_len": max(enabled, default=0)}]
    for name, served_by in sorted((config.adapters or {}).items()):
        lengths = [r.max_model_len for p, r in routes.items() if r.enabled and p in served_by]
        cards.append({"id": name, "object": "model", "created": 0, "owned_by": constants.APP_NAME, "root": name,
                      "parent": config.model, "max_model_len": max(lengths, default=0)})
    models_body = json.dumps({"object": "list", "data": cards}).encode()

    async def models(request: Request) -> Response:
        return Response(200, models_body, content_type=_JSON)

    async def health(request: Request) -> Response:
        state = {name: {"enabled": routes[name].enabled, "healthy": pool.healthy_count,
                        "endpoints": len(pool.endpoints)} for name, pool in pools.items()}
        ok = any(s["enabled"] and s["healthy"] for s in state.values())
        return Response(200 if ok else 503, json.dumps({"pools": state}).encode(), content_type=_JSON)

    async def livez(request: Request) -> Response:
        return Response(200, b"ok", content_type="text/plain; charset=utf-8")

    async def prometheus(request: Request) -> Response:
        body, content_type = metrics.exposition()
        return Response(200, body, content_type=content_type)

    app.add("POST", "/v1/chat/completions", router.chat)
    app.add("POST", "/v1/completions", router.completions)
    app.add("GET", "/v1/models", models)
    app.add("GET", "/health", health)
    app.add("GET", "/livez", livez)
    app.add("GET", "/metrics", prometheus)
    return app


async def _reload_keys(auth: Auth) -> None:
    while True:
        await asyncio.sleep(KEY_RELOAD_SECONDS)
        auth.reload()
