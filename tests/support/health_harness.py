"""Fake vLLM engines scraped by a real Prometheus, with traffic, for the health loop's integration tests and the
detection-time benchmark.

Each engine is a `FakeVllm` (vLLM's /metrics names and shapes) registered as a file_sd target with the label
contract. `Traffic` keeps a few requests in flight against each engine so `num_requests_running` and
`generation_tokens_total` move as they do under load; faults are injected through the fake's own knobs (stall,
natural_tokens, pinned gauges), never by writing series directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from fakevllm.engine import FakeVllm
from tests.support.prometheus import Prometheus, Target
from vllm_operator import constants
from vllm_operator.health.snapshot import format_time

NAMESPACE = "health"
DEPLOYMENT = "chat"


@dataclass
class Engine:
    pod: str
    pool: str
    fake: FakeVllm
    max_tokens: int = 8
    concurrency: int = 2
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{self.fake.host}:{self.fake.port}"

    def target(self, namespace: str = NAMESPACE, deployment: str = DEPLOYMENT) -> Target:
        return Target(self.address, {"namespace": namespace, "vllmdeployment": deployment, "pool": self.pool,
                                     "pod": self.pod})


async def client_loop(session: aiohttp.ClientSession, engine: Engine) -> None:
    body = {"model": engine.fake.behaviour.model, "prompt": "the quick brown fox", "max_tokens": engine.max_tokens}
    while True:
        body["max_tokens"] = engine.max_tokens
        try:
            async with session.post(f"{engine.fake.url}/v1/completions", json=body) as resp:
                await resp.read()
        except aiohttp.ClientError:
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def engines(specs: Sequence[tuple[str, str]], prom: Prometheus, *, namespace: str = NAMESPACE,
                  deployment: str = DEPLOYMENT, **knobs: Any) -> AsyncIterator[list[Engine]]:
    """Start one fake engine per (pod, pool), register them with Prometheus and keep traffic on them."""
    started: list[Engine] = []
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
    defaults = {"natural_tokens": 4, "chunk_delay_s": 0.05, "kv_cache_size_tokens": 32768, **knobs}
    try:
        for pod, pool in specs:
            fake = FakeVllm(**defaults)
            await fake.start()
            started.append(Engine(pod=pod, pool=pool, fake=fake))
        prom.set_targets([e.target(namespace, deployment) for e in started])
        for engine in started:
            engine.tasks = [asyncio.create_task(client_loop(session, engine)) for _ in range(engine.concurrency)]
        yield started
    finally:
        for engine in started:
            for task in engine.tasks:
                task.cancel()
            for task in engine.tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await engine.fake.stop()
        await session.close()


def pod_json(name: str, pool: str, *, started_ago: float = 3600.0, ready: bool = True,
             namespace: str = NAMESPACE, deployment: str = DEPLOYMENT) -> dict[str, Any]:
    """A running engine pod as the API server would show it (times relative to now)."""
    now = time.time()
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                     "creationTimestamp": format_time(now - started_ago - 5),
                     "labels": {constants.LABEL_POOL: pool, constants.LABEL_DEPLOYMENT: deployment,
                                constants.LABEL_NAME: constants.APP_NAME,
                                constants.LABEL_COMPONENT: constants.COMPONENT_ENGINE}},
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                   "containerStatuses": [{"name": "engine", "ready": ready, "restartCount": 0,
                                          "state": {"running": {"startedAt": format_time(now - started_ago)}},
                                          "lastState": {}}]},
    }


def record_timing(fault: str, seconds: float, **facts: Any) -> None:
    """Log a fault-to-detection/action time; append it as a JSON line to $HEALTH_TIMINGS when set (the benchmark
    script benchmarks/health/run.sh collects them). A measurement, never an assertion."""
    import json
    import os

    line = {"fault": fault, "seconds": round(seconds, 2), **facts}
    print(f"fault->detection {line}")
    path = os.environ.get("HEALTH_TIMINGS")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(line) + "\n")
