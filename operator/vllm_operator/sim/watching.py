"""Per-resource event history that watches replay from, so no event is lost between a LIST and its WATCH.

A real API server serves `watch?resourceVersion=N` from its watch cache: every event after N, then live ones, or
410 Gone when N is older than the cache. Informers (kopf, client-go, the official client's Watch) rely on that
to list-then-watch without gaps; a server that only streams "from now" loses writes made in between, which is
exactly the race that makes controllers flaky in production. Each event keeps the object's previous state so a
label-selector watch can turn "stopped matching" into DELETED and "started matching" into ADDED, as the cache does.
"""

from __future__ import annotations

import asyncio
import bisect
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WatchEvent:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None


class EventHistory:
    """A bounded, ordered list of one resource's events with a condition that wakes the watchers."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._events: list[WatchEvent] = []
        self._rvs: list[int] = []
        self.expired_upto = 0  # events with rv <= this were dropped from the history
        self.changed = asyncio.Condition()

    def append(self, event: WatchEvent) -> None:
        self._events.append(event)
        self._rvs.append(event.rv)
        if len(self._events) > self.capacity + self.capacity // 4:
            cut = len(self._events) - self.capacity
            self.expired_upto = self._rvs[cut - 1]
            del self._events[:cut]
            del self._rvs[:cut]

    def after(self, rv: int) -> list[WatchEvent]:
        """Events strictly newer than `rv` (callers check `expired_upto` first)."""
        return self._events[bisect.bisect_right(self._rvs, rv):]

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()
