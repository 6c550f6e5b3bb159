"""Coalesced status refreshes: many owned-Deployment events, one status write per VLLMDeployment.

Why: while pods come up, each of a VLLMDeployment's three Deployments changes status once per pod (replicas,
updatedReplicas, readyReplicas, availableReplicas, conditions: several watch events per pod). Refreshing status on
every one of them cost a parent GET, a Deployment LIST, a discovery GET and usually a status PATCH each; with 500
VLLMDeployments applied at once the operator never caught up (benchmarks/controller). Now the first event for a
VLLMDeployment schedules one refresh `delay` seconds later; events that arrive meanwhile join it. The refresh reads
the parent and its Deployments from kopf's in-memory indexes (the watch streams the operator keeps anyway), so its
only request is the status PATCH, and only when the status changed.

A refresh that fails on an API error is retried with backoff (a lost refresh could leave Ready=False standing after
the last pod became ready: no later event would come to fix it). A request made while a refresh runs schedules the
next one, because the running refresh may have read the state from before that event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""(namespace, name) of a VLLMDeployment."""

Action = Callable[[], Awaitable[object]]

DEFAULT_DELAY_S: Final = 2.0
RETRY_DELAYS_S: Final = (1.0, 2.0, 5.0, 10.0, 30.0)


class Coalescer:
    """Runs at most one pending action per key, `delay` seconds after the first request for it."""

    def __init__(self, delay: float = DEFAULT_DELAY_S, retry_delays: Sequence[float] = RETRY_DELAYS_S) -> None:
        self.delay = delay
        self.retry_delays = tuple(retry_delays)
        self._actions: dict[Key, Action] = {}
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        self.runs = 0
        self.requests = 0

    @property
    def pending(self) -> int:
        """Keys waiting for their refresh."""
        return len(self._actions)

    def request(self, key: Key, action: Action) -> None:
        """Run `action` for `key` after the delay, unless a refresh for `key` is already waiting (then it joins it:
        the waiting one will read the newest state when it runs)."""
        self.requests += 1
        waiting = key in self._actions
        self._actions[key] = action
        if not waiting and key not in self._tasks:
            self._tasks[key] = asyncio.get_running_loop().create_task(self._run(key), name=f"refresh-{key[0]}/{key[1]}")

    async def _run(self, key: Key) -> None:
        try:
            while key in self._actions:
                await asyncio.sleep(self.delay)
                action = self._actions.pop(key)  # requests from here on schedule another round
                await self._attempt(key, action)
        finally:
            self._tasks.pop(key, None)

    async def _attempt(self, key: Key, action: Action) -> None:
        for attempt, backoff in enumerate((*self.retry_delays, None)):
            try:
                self.runs += 1
                await action()
                return
            except asyncio.CancelledError:
                raise
            except Exception as err:  # logged; retried unless a newer request supersedes it
                if backoff is None:
                    log.error("Gave up refreshing the status of VLLMDeployment %s/%s after %d attempts: %s",
                              key[0], key[1], attempt + 1, err)
                    return
                log.warning("Refreshing the status of VLLMDeployment %s/%s failed (retrying in %g s): %s",
                            key[0], key[1], backoff, err)
                await asyncio.sleep(backoff)
                if key in self._actions:
                    return  # a newer request is waiting; it does the same work with fresher state

    async def close(self) -> None:
        """Cancel every waiting and running refresh (operator shutdown)."""
        tasks = list(self._tasks.values())
        self._actions.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["DEFAULT_DELAY_S", "Coalescer", "Key"]
