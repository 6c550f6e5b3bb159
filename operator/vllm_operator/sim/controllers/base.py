"""A level-triggered controller skeleton: watches feed a de-duplicating work queue, one worker reconciles keys.

Like client-go's workqueue: a key queued several times before it is processed is reconciled once, a key that fails
(409 conflict, transient error) is retried after a short delay, and reconcile always reads fresh state instead of
trusting the event that queued it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

from vllm_operator.k8s import Resource
from vllm_operator.sim.client import ApiStatusError, SimClient

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects
Mapper = Callable[[str, dict[str, Any]], Iterable[Key]]


def own_key(_: str, obj: dict[str, Any]) -> list[Key]:
    meta = obj.get("metadata", {})
    return [(meta.get("namespace", ""), meta["name"])]


def owner_keys(kind: str) -> Mapper:
    """Map an object to its controller owner of `kind` (e.g. Pod -> ReplicaSet)."""
    def mapper(_: str, obj: dict[str, Any]) -> list[Key]:
        meta = obj.get("metadata", {})
        return [(meta.get("namespace", ""), ref["name"]) for ref in meta.get("ownerReferences", []) or []
                if ref.get("kind") == kind and ref.get("controller")]
    return mapper


class Controller:
    """Subclasses set `name`, list `watches` [(resource, mapper)], and implement `reconcile(key)`."""

    name = "controller"
    resync_seconds: float | None = None

    def __init__(self, client: SimClient) -> None:
        self.client = client
        self.watches: list[tuple[Resource, Mapper]] = []
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.errors: list[BaseException] = []

    def enqueue(self, key: Key) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    async def reconcile(self, key: Key) -> None:
        raise NotImplementedError

    async def resync(self) -> Iterable[Key]:
        """Keys to look at periodically (default: none)."""
        return []

    async def _watch(self, res: Resource, mapper: Mapper) -> None:
        async for kind, obj in self.client.watch(res):
            for key in mapper(kind, obj):
                self.enqueue(key)

    async def _resync_loop(self) -> None:
        assert self.resync_seconds is not None
        while True:
            await asyncio.sleep(self.resync_seconds)
            for key in await self.resync():
                self.enqueue(key)

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            try:
                await self.reconcile(key)
            except ApiStatusError as err:
                if err.status not in (404, 409, 500, 503, 504, 429):
                    log.warning("%s failed on %s: %s", self.name, key, err)
                asyncio.get_running_loop().call_later(0.1, self.enqueue, key)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # a bug in the simulation: record it for tests, keep serving
                log.exception("%s crashed on %s", self.name, key)
                self.errors.append(err)
                asyncio.get_running_loop().call_later(0.5, self.enqueue, key)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._watch(r, m), name=f"{self.name}-watch-{r.plural}")
                       for r, m in self.watches]
        self._tasks.append(asyncio.create_task(self._worker(), name=f"{self.name}-worker"))
        if self.resync_seconds:
            self._tasks.append(asyncio.create_task(self._resync_loop(), name=f"{self.name}-resync"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
