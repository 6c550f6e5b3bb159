"""Pytest fixtures for the simulated Kubernetes API server (registered in tests/conftest.py).

`sim_api` is a running `ApiServerThread` with a kubeconfig on disk; code under test reaches it only over HTTP, with
real clients. Teardown fails the test if the emulator itself raised (a bug in the substrate must never pass).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import CRD_FILE, ROOT
from vllm_operator.sim.apiserver import ApiServer
from vllm_operator.sim.runner import ApiServerThread

KUBECTL = ROOT / ".venv" / "bin" / "kubectl"


class SimApi(ApiServerThread):
    """An ApiServerThread with test conveniences: kubectl, the project CRD, client configuration."""

    def load_project_crd(self) -> list[dict[str, Any]]:
        return self.load_crd(CRD_FILE)

    def env(self) -> dict[str, str]:
        """Environment for subprocesses (kubectl, an operator process) that should use this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    async def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> tuple[int, str, str]:
        """Run the real kubectl from the venv against this server without blocking the caller's loop."""
        proc = await asyncio.create_subprocess_exec(
            str(KUBECTL), "--kubeconfig", str(self.kubeconfig), *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else None,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
        code = proc.returncode if proc.returncode is not None else -1
        if check and code != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({code}): {err.decode()}{out.decode()}")
        return code, out.decode(), err.decode()

    def client_configuration(self) -> Any:
        """A `kubernetes.client.Configuration` for this server (no global state touched)."""
        import kubernetes.client

        config = kubernetes.client.Configuration()
        config.host = self.url
        config.api_key = {"authorization": "Bearer sim-token"}
        return config


@pytest.fixture
def make_sim_api(tmp_path: Path) -> Iterator[Callable[..., SimApi]]:
    """Factory: `make_sim_api(faults=..., gc_delay=...)` starts a server with ApiServer options."""
    started: list[SimApi] = []

    def make(**options: Any) -> SimApi:
        index = len(started)
        handle = SimApi(ApiServer(**options), kubeconfig=tmp_path / f"kubeconfig-{index}")
        handle.start()
        started.append(handle)
        return handle

    yield make
    for handle in started:
        handle.stop()
    for handle in started:
        assert handle.api.internal_errors == [], f"the emulator raised: {handle.api.internal_errors!r}"


@pytest.fixture
def sim_api(make_sim_api: Callable[..., SimApi]) -> SimApi:
    """A fresh simulated API server (default options) with `.url`, `.kubeconfig`, `.api`, `.request_log`."""
    return make_sim_api()
