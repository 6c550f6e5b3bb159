"""Run the real operator against a simulated cluster, in its own thread and event loop (tests and benchmarks)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.run import OperatorThread
from vllm_operator.k8s import ClientKubeApi
from vllm_operator.sim.cluster import SimCluster


@contextlib.asynccontextmanager
async def running_operator(cluster: SimCluster, *, timeout: float = 30.0, **config: Any
                           ) -> AsyncIterator[ClientKubeApi]:
    """The operator running until the block exits; yields a KubeApi of the test's own for reads and writes."""
    settings = {"http_port": 0, "api_server": cluster.url, "health_enabled": False, **config}
    kubeconfig = str(cluster.kubeconfig)
    operator = OperatorThread(OperatorConfig(**settings),
                              lambda: ClientKubeApi.from_environment(kubeconfig=kubeconfig, timeout=timeout))
    await asyncio.to_thread(operator.start)
    kube = ClientKubeApi.from_environment(kubeconfig=kubeconfig)
    try:
        yield kube
    finally:
        kube.close()
        await asyncio.to_thread(operator.stop)
