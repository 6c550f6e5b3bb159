"""The real operator in the test's own process, against a real API server (tests and benchmarks).

It runs in a thread of its own with its own event loop (`OperatorThread`), so a test can read its log records and
stop it at any point, while it (and kopf, which logs in with the operator's own client's credentials) authenticates
with whatever kubeconfig it is given — in the tests, a TokenRequest
token of the chart's ServiceAccount, so anything outside the chart's rules is a real 403.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.run import OperatorThread
from vllm_operator.k8s import ClientKubeApi


@contextlib.asynccontextmanager
async def running_operator(kubeconfig: Path, admin_kubeconfig: Path, *, timeout: float = 30.0, **config: Any
                           ) -> AsyncIterator[ClientKubeApi]:
    """The operator logged in with `kubeconfig` until the block exits; yields a KubeApi of the test's own (with
    `admin_kubeconfig`: its requests are the test's, not the operator's, in the audit log)."""
    settings = {"http_port": 0, "health_enabled": False, **config}
    path = str(kubeconfig)
    operator = OperatorThread(OperatorConfig(**settings),
                              lambda: ClientKubeApi.from_environment(kubeconfig=path, timeout=timeout))
    await asyncio.to_thread(operator.start)
    api = await ClientKubeApi.from_environment(kubeconfig=str(admin_kubeconfig))
    try:
        yield api
    finally:
        await api.close()
        await asyncio.to_thread(operator.stop)
