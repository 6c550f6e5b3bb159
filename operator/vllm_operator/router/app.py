"""Wiring: the aiohttp application with its endpoints, pools, discovery and health tasks.

Kept apart from `main.py` so that tests build the same application in-process (`build_app`) and serve it on a free
port with `serve()`, while `main()` only parses arguments and runs it.

`/health` answers 200 when at least one enabled pool has a healthy endpoint (the router can serve something), else
503 — it is the router pod's readiness probe. `/livez` is always 200 while the event loop runs (liveness).
`/v1/models` is answered locally from router.json (the engines serve the same name).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any, Final

import aiohttp
from aiohttp import web

from vllm_operator import constants
from vllm_operator.api.router_config import RouterConfig
from vllm_operator.router import http1
from vllm_operator.router.auth import Auth
from vllm_operator.router.metrics import RouterMetrics
from vllm_operator.router.proxy import Router
from vllm_operator.router.tokens import TokenCounter
from vllm_operator.router.upstreams import HealthChecker, Pool, SliceWatcher, cancel_all, kube_access

log = logging.getLogger(__name__)

KEY_RELOAD_SECONDS: Final = 10.0
# Below uvicorn's (vLLM's server) 5 s keep-alive, so the router never reuses a connection the engine just closed.
UPSTREAM_KEEPALIVE_SECONDS: Final = 4.0

ROUTER_KEY: Final = web.AppKey("router", Router)
METRICS_KEY: Final = web.AppKey("metrics", RouterMetrics)
POOLS_KEY: Final = web.AppKey("pools", dict)


def build_app(config: RouterConfig, counter: TokenCounter, *, kubeconfig: str | None = None,
              metrics: RouterMetrics | None = None) -> web.Application:
    """The router application; its startup starts discovery and health polling, its cleanup stops them."""
    metrics = metrics or RouterMetrics()
    metrics.tokenizer_missing.set(0 if counter.has_tokenizer else 1)
    auth = Auth(config.tiers, config.api_keys_dir)
    pools = {name: Pool(name, metrics) for name in constants.POOLS}
    routes = {constants.POOL_SHORT: config.pools.short, constants.POOL_LONG: config.pools.long}
    app = web.Application(client_max_size=config.max_body_bytes)
    app[METRICS_KEY] = metrics
    app[POOLS_KEY] = pools
    tasks: list[asyncio.Task[Any]] = []

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=UPSTREAM_KEEPALIVE_SECONDS, ttl_dns_cache=30)
        session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        upstream = http1.Pool(keepalive_s=UPSTREAM_KEEPALIVE_SECONDS)
        router = Router(config, counter, auth, pools, metrics, upstream)
        app[ROUTER_KEY] = router
        access = None
        for name, route in routes.items():
            if not route.enabled:
                continue
            if route.service is not None:
                if access is None:
                    access = kube_access(kubeconfig)
                watcher = SliceWatcher(pools[name], route.service, access, session)
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
            upstream.close()
            await session.close()

    app.cleanup_ctx.append(lifecycle)

    async def chat(request: web.Request) -> web.StreamResponse:
        return await app[ROUTER_KEY].chat(request)

    async def completions(request: web.Request) -> web.StreamResponse:
        return await app[ROUTER_KEY].completions(request)

    async def models(request: web.Request) -> web.Response:
        enabled = [r.max_model_len for r in routes.values() if r.enabled]
        card = {"id": config.model, "object": "model", "created": 0, "owned_by": constants.APP_NAME,
                "root": config.model, "parent": None, "max_model_len": max(enabled, default=0)}
        return web.json_response({"object": "list", "data": [card]})

    async def health(request: web.Request) -> web.Response:
        state = {name: {"enabled": routes[name].enabled, "healthy": pool.healthy_count,
                        "endpoints": len(pool.endpoints)} for name, pool in pools.items()}
        ok = any(s["enabled"] and s["healthy"] for s in state.values())
        return web.Response(status=200 if ok else 503, body=json.dumps({"pools": state}).encode(),
                            content_type="application/json")

    async def livez(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def prometheus(request: web.Request) -> web.Response:
        body, content_type = metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/livez", livez)
    app.router.add_get("/metrics", prometheus)
    return app


async def _reload_keys(auth: Auth) -> None:
    while True:
        await asyncio.sleep(KEY_RELOAD_SECONDS)
        auth.reload()


@contextlib.asynccontextmanager
async def serve(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve `app` until the block ends; yields its base URL (port 0 picks a free one)."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    site = web.SockSite(runner, sock)
    await site.start()
    bound = sock.getsockname()[1]
    try:
        yield f"http://{host}:{bound}" if ":" not in host else f"http://[{host}]:{bound}"
    finally:
        await runner.cleanup()
