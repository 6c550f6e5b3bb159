"""Run the simulated API server on its own thread and event loop, for callers of any kind.

The official Kubernetes client and kubectl block; kopf and aiohttp clients run on the caller's loop. A server on the
test's own loop would deadlock the first blocking call, so the server gets a private loop in a daemon thread and
everything reaches it over real HTTP, as controllers reach a real API server. `ApiServerThread` is also what the
demo uses to host the cluster next to the operator.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import yaml

from vllm_operator.sim.apiserver import ApiServer, serve
from vllm_operator.sim.kubeconfig import write_kubeconfig
from vllm_operator.sim.requestlog import RequestLog

T = TypeVar("T")
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


class SimApiError(RuntimeError):
    """An HTTP call from the helper methods came back with an error status."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


class ApiServerThread:
    """`with ApiServerThread() as cluster:` — a running server with `.url`, `.kubeconfig`, `.api`."""

    def __init__(self, server: ApiServer | None = None, *, kubeconfig: str | Path | None = None,
                 host: str = "127.0.0.1", port: int | None = None) -> None:
        self.api = server if server is not None else ApiServer()
        self.host = host
        self.port = port
        self._kubeconfig_path = Path(kubeconfig) if kubeconfig is not None else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self.url = ""

    # ---------------------------------------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 30.0) -> ApiServerThread:
        self._thread = threading.Thread(target=self._run, name="sim-apiserver", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"simulated API server did not start within {timeout} s")
        if self._failure is not None:
            raise RuntimeError("simulated API server failed to start") from self._failure
        if self._kubeconfig_path is not None:
            write_kubeconfig(self._kubeconfig_path, self.url)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)
        self._thread = None

    def __enter__(self) -> ApiServerThread:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self._failure = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with serve(self.api, host=self.host, port=self.port) as (_, url):
            self.url = url
            self._ready.set()
            await self._stop.wait()

    # ------------------------------------------------------------------------------------------------ access
    @property
    def kubeconfig(self) -> Path:
        if self._kubeconfig_path is None:
            raise RuntimeError("this server was started without a kubeconfig path")
        return self._kubeconfig_path

    @property
    def request_log(self) -> RequestLog:
        return self.api.request_log

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run a coroutine on the server's loop (e.g. `cluster.call(cluster.api.settled())`)."""
        if self._loop is None:
            raise RuntimeError("the server is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def settled(self, timeout: float = 5.0) -> None:
        """Block until the garbage collector is idle."""
        self.call(self.api.settled(timeout), timeout + 1)

    def request(self, method: str, path: str, body: Any = None, *,
                content_type: str = "application/json") -> Any:
        """A plain HTTP call to the server (for fixtures; code under test should use a real client)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": content_type, "User-Agent": "sim-fixture"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise SimApiError(exc.code, exc.read().decode(errors="replace")) from exc

    def load_crd(self, source: dict[str, Any] | str | Path, timeout: float = 10.0) -> list[dict[str, Any]]:
        """POST one CRD (a dict) or every CRD in a YAML file and wait until each is Established."""
        docs: list[dict[str, Any]]
        if isinstance(source, dict):
            docs = [source]
        else:
            with open(source, encoding="utf-8") as handle:
                docs = [d for d in yaml.safe_load_all(handle) if d]
        created = []
        for doc in docs:
            try:
                created.append(self.request("POST", CRD_PATH, doc))
            except SimApiError as exc:
                if exc.status != 409:
                    raise
                current = self.request("GET", f"{CRD_PATH}/{doc['metadata']['name']}")
                replacement = dict(doc, metadata=dict(doc["metadata"],
                                                      resourceVersion=current["metadata"]["resourceVersion"]))
                created.append(self.request("PUT", f"{CRD_PATH}/{doc['metadata']['name']}", replacement))
            self._wait_established(doc["metadata"]["name"], timeout)
        return created

    def _wait_established(self, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            crd = self.request("GET", f"{CRD_PATH}/{name}")
            conditions = (crd.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                return
            time.sleep(0.01)
        raise TimeoutError(f"CRD {name} was not Established within {timeout} s")
