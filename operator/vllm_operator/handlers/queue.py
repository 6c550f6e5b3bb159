"""The operator's one work queue: every reconcile, health check and class roll-out step runs in one of its `limit`
slots, reconciles first, each kind first come first served; every coalesced status refresh in one of `limit` slots of
its own (docs/architecture.md, Conventions).

Why bounded: kopf starts one handler per object at once, and every reconcile's ~26 requests share the API client's
few connections: with 500 VLLMDeployments applied together none had status after 240 s on the real API server. With
the slots the first finishes after a few seconds and the rest follow steadily. Why one: work beside the limit (the
health loop's reconcile, the status refresh) took the connections the queued reconciles waited for, unmetered. Why
the refreshes have slots of their own (`LANE`): sharing the reconciles', they held the slots the reconciles of the
objects applied later waited for.

`async with queue.slot():` holds a slot (kopf's reconciles, class roll-outs). `request(key, action)` coalesces
(status refreshes, a deleted child's reconcile, health checks): `action` runs `delay` seconds after the first request
for its key, and later requests replace it (the one that runs reads the newest state; several watch events per pod
come for each Deployment while pods start). A request made while its action runs schedules the next round. A failed
action is retried with backoff (a lost refresh could leave Ready=False standing), unless a newer request supersedes
it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Final

log = logging.getLogger(__name__)

Action = Callable[[], Awaitable[object]]
Key = tuple[str, str, str]
"""(what, namespace, name): a requested action on a VLLMDeployment, e.g. ("status refresh", "ml", "chat")."""

DEFAULT_DELAY_S: Final = 2.0
RETRY_DELAYS_S: Final = (1.0, 2.0, 5.0, 10.0, 30.0)


LANE: Final = {"status refresh": "refresh", "reconcile": "work", "health check": "work"}
"""Whose slots each kind takes. A refresh is one status write (a reconcile ~26 requests) and must not wait behind
reconciles: in arrival order behind them, 100 VLLMDeployments applied at once had all their children but only a third
of them showed Ready until the last reconcile was done. Sharing one set of slots, refresh first, the refreshes of the
reconciled objects held slots the others' reconciles waited for: 100 were Ready 1.18x later than at 2d3eb9d, which
ran refreshes beside the limit (benchmarks/scale). So the refreshes have `limit` slots of their own, as many as the
rest: still bounded, never in a reconcile's way."""

PRIORITY: Final = {"status refresh": 0, "reconcile": 1, "health check": 2}
"""Which waiting work of a lane gets its next free slot, each kind in arrival order: reconciles before health checks,
as the first checks found nothing to check before the pods were up."""


class _Lane:
    """`limit` slots and the work waiting for them (a heap: (priority, arrival, waiter))."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0
        self.waiters: list[tuple[int, int, asyncio.Future[None]]] = []

    @property
    def waiting(self) -> int:
        return sum(1 for *_, waiter in self.waiters if not waiter.done())


class WorkQueue:
    """At most `limit` units of work in flight per `LANE`; the others wait by `PRIORITY`, then first come, first
    served. One per operator run, in kopf's memo. `waiting` and `running` (both lanes) feed the operator's metrics."""

    def __init__(self, limit: int, *, delay: float = DEFAULT_DELAY_S,
                 retry_delays: Sequence[float] = RETRY_DELAYS_S) -> None:
        if limit < 1:
            raise ValueError(f"max concurrent reconciles must be at least 1, got {limit}")
        self.delay = delay
        self.retry_delays = tuple(retry_delays)
        self._lanes = {lane: _Lane(limit) for lane in sorted(set(LANE.values()))}
        self._arrivals = itertools.count()
        self._actions: dict[Key, Action] = {}
        self._delays: dict[Key, float] = {}
        self._tasks: dict[Key, asyncio.Task[None]] = {}

    @property
    def waiting(self) -> int:
        return sum(lane.waiting for lane in self._lanes.values())

    @property
    def running(self) -> int:
        return sum(lane.running for lane in self._lanes.values())

    @contextlib.asynccontextmanager
    async def slot(self, what: str = "reconcile") -> AsyncIterator[None]:
        """Hold a slot of its `LANE` for work of kind `what` while the block runs."""
        lane = self._lanes[LANE[what]]
        if lane.running < lane.limit and not lane.waiting:
            lane.running += 1
        else:
            waiter = asyncio.get_running_loop().create_future()
            heapq.heappush(lane.waiters, (PRIORITY[what], next(self._arrivals), waiter))
            try:
                await waiter  # the slot is handed over with `running` already counting it
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release(lane)  # handed over just as this was cancelled: pass it on
                raise
        try:
            yield
        finally:
            self._release(lane)

    @staticmethod
    def _release(lane: _Lane) -> None:
        while lane.waiters:
            *_, waiter = heapq.heappop(lane.waiters)
            if not waiter.done():  # not cancelled while it waited
                waiter.set_result(None)
                return
        lane.running -= 1

    def request(self, key: Key, action: Action, delay: float | None = None) -> None:
        """Run `action` for `key` `delay` seconds from now (default: the queue's), in a slot, unless an action for
        `key` already waits (then it replaces that one, on that one's time: it reads the newest state when it
        runs)."""
        waiting = key in self._actions
        self._actions[key] = action
        if not waiting:
            self._delays[key] = self.delay if delay is None else delay
            if key not in self._tasks:
                self._tasks[key] = asyncio.create_task(self._run(key), name=f"{key[0]} {key[1]}/{key[2]}")

    async def _run(self, key: Key) -> None:
        try:
            while key in self._actions:
                await asyncio.sleep(self._delays.pop(key, self.delay))
                action = self._actions.pop(key)  # requests from here on schedule another round
                await self._attempt(key, action)
        finally:
            self._tasks.pop(key, None)

    async def _attempt(self, key: Key, action: Action) -> None:
        for attempt, backoff in enumerate((*self.retry_delays, None)):
            try:
                async with self.slot(key[0]):
                    await action()
                return
            except Exception as err:  # logged; retried unless a newer request supersedes it (a cancel is no Exception)
                if backoff is None:
                    log.error("Gave up the %s of VLLMDeployment %s/%s after %d attempts: %s", *key, attempt + 1, err)
                    return
                log.warning("The %s of VLLMDeployment %s/%s failed (retrying in %g s): %s", *key, backoff, err)
                await asyncio.sleep(backoff)
                if key in self._actions:
                    return  # a newer request is waiting; it does the same work with fresher state

    async def close(self) -> None:
        """Cancel every waiting and running requested action (operator shutdown)."""
        tasks = list(self._tasks.values())
        self._actions.clear()
        self._delays.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["DEFAULT_DELAY_S", "RETRY_DELAYS_S", "Key", "WorkQueue"]
