"""The status-refresh coalescer: many requests per key become one run; failures retry; close cancels."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from vllm_operator.handlers.refresh import Coalescer

KEY = ("ns", "a")


def recorder(log: list[str], name: str, fail: int = 0) -> Callable[[], Awaitable[None]]:
    state = {"fail": fail}

    async def action() -> None:
        log.append(name)
        if state["fail"] > 0:
            state["fail"] -= 1
            raise RuntimeError("API said no")

    return action


async def test_requests_within_the_delay_join_one_run_with_the_newest_action() -> None:
    runs: list[str] = []
    c = Coalescer(delay=0.05)
    for i in range(20):
        c.request(KEY, recorder(runs, f"v{i}"))
    assert c.pending == 1
    await asyncio.sleep(0.2)
    assert runs == ["v19"]
    assert c.pending == 0 and c.requests == 20 and c.runs == 1


async def test_keys_are_independent() -> None:
    runs: list[str] = []
    c = Coalescer(delay=0.02)
    c.request(("ns", "a"), recorder(runs, "a"))
    c.request(("ns", "b"), recorder(runs, "b"))
    await asyncio.sleep(0.1)
    assert sorted(runs) == ["a", "b"]


async def test_a_request_during_a_run_schedules_another_run() -> None:
    runs: list[str] = []
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow() -> None:
        runs.append("slow")
        started.set()
        await release.wait()

    c = Coalescer(delay=0.01)
    c.request(KEY, slow)
    await started.wait()
    c.request(KEY, recorder(runs, "after"))  # state changed after `slow` read it
    release.set()
    await asyncio.sleep(0.1)
    assert runs == ["slow", "after"]


async def test_a_failed_refresh_is_retried_until_it_succeeds() -> None:
    runs: list[str] = []
    c = Coalescer(delay=0.01, retry_delays=(0.01, 0.01, 0.01))
    c.request(KEY, recorder(runs, "x", fail=2))
    await asyncio.sleep(0.2)
    assert runs == ["x", "x", "x"]
    assert c.pending == 0


async def test_retries_are_bounded() -> None:
    runs: list[str] = []
    c = Coalescer(delay=0.01, retry_delays=(0.01, 0.01))
    c.request(KEY, recorder(runs, "x", fail=100))
    await asyncio.sleep(0.3)
    assert runs == ["x", "x", "x"]


async def test_a_newer_request_replaces_the_retry() -> None:
    runs: list[str] = []
    c = Coalescer(delay=0.01, retry_delays=(0.1,))
    c.request(KEY, recorder(runs, "old", fail=100))
    await asyncio.sleep(0.05)  # "old" failed once and waits for its retry
    c.request(KEY, recorder(runs, "new"))
    await asyncio.sleep(0.3)
    assert runs == ["old", "new"]


async def test_close_cancels_waiting_and_running_refreshes() -> None:
    runs: list[str] = []
    c = Coalescer(delay=10)
    c.request(KEY, recorder(runs, "never"))
    await c.close()
    assert runs == [] and c.pending == 0
