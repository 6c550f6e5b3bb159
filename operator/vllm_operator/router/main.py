"""`vllm-operator router --config router.json [--port N]`: run the length-aware router.

The config is the RouterConfig the planner renders into the router's ConfigMap (docs/architecture.md, RouterConfig); a
file that does not validate, or a tokenizer source that cannot be read, stops the router at start with exit code 2 and
a message naming the problem, rather than serving with limits it does not know. uvloop is used when installed (optional
speed-up).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import pathlib
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic

from vllm_operator.api.router_config import RouterConfig
from vllm_operator.listen import listen_failure
from vllm_operator.router.app import build_app, serve
from vllm_operator.router.tokens import TokenizerLoadError, load_counter
from vllm_operator.router.upstreams import Endpoint

log = logging.getLogger("vllm_operator.router")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm-operator router", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="router.json (RouterConfig)")
    p.add_argument("--port", type=int, default=None, help="listen port (default: the config's port)")
    p.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig for EndpointSlice discovery (default: in-cluster, else $KUBECONFIG)")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--no-access-log", action="store_true",
                   help="no INFO line per request, whatever the config's accessLog says")
    return p


def load_config(path: str) -> RouterConfig:
    """Parse and validate router.json; ValueError with a readable message otherwise."""
    try:
        text = pathlib.Path(path).read_text()
    except OSError as err:
        raise ValueError(f"cannot read router config {path}: {err}") from err
    try:
        config = RouterConfig.model_validate_json(text)
    except pydantic.ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or '(root)'}: {e['msg']}" for e in err.errors())
        raise ValueError(f"invalid router config {path}: {problems}") from err
    for name, route in (("short", config.pools.short), ("long", config.pools.long)):
        for url in route.endpoints:
            try:
                Endpoint(url.rstrip("/"), name)
            except ValueError as err:
                raise ValueError(f"invalid router config {path}: pools.{name}.endpoints: {err}") from err
    return config


def freeze_startup_objects() -> int:
    """Move everything alive after start-up (modules, pydantic models, aiohttp, the tokenizer wrapper: ~55k objects)
    into the garbage collector's permanent generation and return how many there are.

    Why: a full (generation 2) collection scans every tracked object; with the start-up objects in it, one took
    ~20 ms of CPU here, and it came every few thousand requests, stalling every request in flight for that long
    (benchmarks/router: the router's p99 added latency was far above nginx's). Frozen objects are never scanned again;
    they are never freed either, which is what start-up state is for. Garbage made during start-up is collected
    first so that it is not kept forever.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


async def _run(args: argparse.Namespace, config: RouterConfig) -> None:
    counter = await asyncio.to_thread(load_counter, config.tokenizer)
    app = build_app(config, counter, kubeconfig=args.kubeconfig)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    port = args.port if args.port is not None else config.port
    async with serve(app, args.host, port) as url:
        frozen = freeze_startup_objects()
        log.info("Started router for %s/%s on %s (%d start-up objects frozen out of GC scans)", config.namespace,
                 config.deployment, url, frozen)
        print(f"router listening on {url}", flush=True)
        await stop.wait()
    log.info("Stopped router for %s/%s", config.namespace, config.deployment)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
    except ValueError as err:
        print(f"vllm-operator router: {err}", file=sys.stderr)
        return 2
    if args.no_access_log:
        config = config.model_copy(update={"access_log": False})
    runner: Callable[[Coroutine[Any, Any, None]], None]
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]

        runner = uvloop.run  # a dependency on Linux (benchmarks/router); plain asyncio where it is missing
    except ImportError:
        runner = asyncio.run
    try:
        runner(_run(args, config))
    except TokenizerLoadError as err:
        print(f"vllm-operator router: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        message = listen_failure(err, args.host, args.port if args.port is not None else config.port)
        if message is None:
            raise
        print(f"vllm-operator router: {message}", file=sys.stderr)
        return 2
    return 0
