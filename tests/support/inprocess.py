"""The real operator in the test's own process, against a real API server (tests and benchmarks).

It runs in a thread of its own with its own event loop, so a test can read its log records and
stop it at any point, while it (and kopf, which logs in with the operator's own client's credentials) authenticates
with whatever kubeconfig it is given — in the tests, a TokenRequest
token of the chart's ServiceAccount, so anything outside the chart's rules is a real 403.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.run import run_operator
from vllm_operator.k8s import ClientKubeApi


@contextlib.asynccontextmanager
async def running_operator(kubeconfig: Path, admin_kubeconfig: Path, *, timeout: float = 30.0, **config: Any
                           ) -> AsyncIterator[ClientKubeApi]:
    """The operator logged in with `kubeconfig` until the block exits; yields a KubeApi of the test's own (with
    `admin_kubeconfig`: its requests are the test's, not the operator's, in the audit log).

    kopf owns its loop: on exit it cancels every task created after it started. Running it in a thread of its own
    keeps the test's tasks safe, and looks to the API server exactly like a separate process."""
    settings = OperatorConfig(**{"http_port": 0, "health_enabled": False, **config})
    stop, ready, failed = threading.Event(), threading.Event(), list[BaseException]()

    async def operator() -> None:
        # created in the operator's loop: a client's connections belong to one loop
        kube = await ClientKubeApi.from_environment(kubeconfig=str(kubeconfig), timeout=timeout)
        try:
            await run_operator(settings, kube, stop_flag=stop, ready_flag=ready)
        finally:
            await kube.close()

    def main() -> None:
        try:
            asyncio.run(operator())
        except BaseException as err:  # raised to the test when the operator stops
            failed.append(err)

    thread = threading.Thread(target=main, name="vllm-operator", daemon=True)
    thread.start()
    try:
        if not await asyncio.to_thread(ready.wait, 30.0):
            raise TimeoutError(f"the operator was not ready within 30 s (error: {failed!r})")
        api = await ClientKubeApi.from_environment(kubeconfig=str(admin_kubeconfig))
        try:
            yield api
        finally:
            await api.close()
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 30.0)
        if thread.is_alive():
            raise TimeoutError("the operator did not stop within 30 s")
        if failed and not isinstance(failed[0], asyncio.CancelledError | KeyboardInterrupt):
            raise RuntimeError(f"the operator failed: {failed[0]!r}") from failed[0]
