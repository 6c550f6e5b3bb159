"""Run the real operator in-process against a simulated cluster (tests and benchmarks)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.run import run_operator
from vllm_operator.k8s import ClientKubeApi
from vllm_operator.sim.cluster import SimCluster


@contextlib.asynccontextmanager
async def running_operator(cluster: SimCluster, *, timeout: float = 30.0, **config: Any
                           ) -> AsyncIterator[ClientKubeApi]:
    """The operator running until the block exits; yields its KubeApi (also handy for the test's own reads)."""
    kube = ClientKubeApi.from_environment(kubeconfig=str(cluster.kubeconfig), timeout=timeout)
    settings = {"http_port": 0, "api_server": cluster.url, "health_enabled": False, **config}
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run_operator(OperatorConfig(**settings), kube, stop_flag=stop, ready_flag=ready))
    try:
        await asyncio.wait_for(ready.wait(), 20)
        yield kube
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(task, 15)
        kube.close()
