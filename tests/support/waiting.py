"""Polling helpers for tests that wait on asynchronous systems (controllers, operators, engines)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Await `check()` until it returns something truthy and return that; fail with the last value on timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {result!r})")
        await asyncio.sleep(interval)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 90, every: float = 0.5) -> Any:
    """Call `check()` until it returns something truthy and return that (blocking: for tests that watch real nodes
    and processes from the test thread); fail naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(every)
