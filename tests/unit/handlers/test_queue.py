"""The operator's one work queue: at most `limit` units of work in flight per lane (status refreshes; the rest), the
rest started in arrival order; a requested (coalesced) action takes a slot like any other; many requests per key
become one run; failures retry; close cancels."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from vllm_operator.handlers.queue import WorkQueue

KEY = ("status refresh", "ns", "a")


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
    c = WorkQueue(4, delay=0.05)
    for i in range(20):
        c.request(KEY, recorder(runs, f"v{i}"))
    await asyncio.sleep(0.2)
    assert runs == ["v19"]


async def test_keys_are_independent() -> None:
    runs: list[str] = []
    c = WorkQueue(4, delay=0.02)
    c.request(("status refresh", "ns", "a"), recorder(runs, "a"))
    c.request(("status refresh", "ns", "b"), recorder(runs, "b"))
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

    c = WorkQueue(4, delay=0.01)
    c.request(KEY, slow)
    await started.wait()
    c.request(KEY, recorder(runs, "after"))  # state changed after `slow` read it
    release.set()
    await asyncio.sleep(0.1)
    assert runs == ["slow", "after"]


async def test_a_failed_refresh_is_retried_until_it_succeeds() -> None:
    runs: list[str] = []
    c = WorkQueue(4, delay=0.01, retry_delays=(0.01, 0.01, 0.01))
    c.request(KEY, recorder(runs, "x", fail=2))
    await asyncio.sleep(0.2)
    assert runs == ["x", "x", "x"]


async def test_retries_are_bounded() -> None:
    runs: list[str] = []
    c = WorkQueue(4, delay=0.01, retry_delays=(0.01, 0.01))
    c.request(KEY, recorder(runs, "x", fail=100))
    await asyncio.sleep(0.3)
    assert runs == ["x", "x", "x"]


async def test_a_newer_request_replaces_the_retry() -> None:
    runs: list[str] = []
    c = WorkQueue(4, delay=0.01, retry_delays=(0.1,))
    c.request(KEY, recorder(runs, "old", fail=100))
    await asyncio.sleep(0.05)  # "old" failed once and waits for its retry
    c.request(KEY, recorder(runs, "new"))
    await asyncio.sleep(0.3)
    assert runs == ["old", "new"]


async def test_close_cancels_waiting_and_running_refreshes() -> None:
    runs: list[str] = []
    c = WorkQueue(4, delay=10)
    c.request(KEY, recorder(runs, "never"))
    await c.close()
    assert runs == []


def test_at_most_the_limit_run_and_the_waiting_start_in_arrival_order() -> None:
    async def scenario() -> tuple[list[int], int, list[tuple[int, int]]]:
        slots = WorkQueue(2)
        started: list[int] = []
        peak = 0
        gauges: list[tuple[int, int]] = []
        release = asyncio.Event()

        async def reconcile(i: int) -> None:
            nonlocal peak
            async with slots.slot():
                started.append(i)
                peak = max(peak, slots.running)
                if i < 2:
                    await release.wait()
                await asyncio.sleep(0)

        tasks = [asyncio.create_task(reconcile(i)) for i in range(6)]
        for _ in range(5):
            await asyncio.sleep(0)
        gauges.append((slots.running, slots.waiting))
        release.set()
        await asyncio.gather(*tasks)
        gauges.append((slots.running, slots.waiting))
        return started, peak, gauges

    started, peak, gauges = asyncio.run(scenario())
    assert started == [0, 1, 2, 3, 4, 5]
    assert peak == 2
    assert gauges == [(2, 4), (0, 0)]


def test_a_failed_reconcile_frees_its_slot() -> None:
    async def scenario() -> int:
        slots = WorkQueue(1)

        async def fails() -> None:
            async with slots.slot():
                raise RuntimeError("API request failed")

        with pytest.raises(RuntimeError):
            await fails()
        async with slots.slot():
            return slots.running

    assert asyncio.run(scenario()) == 1


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1, got 0"):
        WorkQueue(0)


@pytest.mark.parametrize("what", ["status refresh", "health check"])
async def test_a_requested_action_waits_for_a_slot_like_any_other(what: str) -> None:
    runs: list[str] = []
    q = WorkQueue(1, delay=0.01)
    async with q.slot(what):  # the only slot of its lane is held
        q.request((what, "ns", "a"), recorder(runs, what))
        await asyncio.sleep(0.1)
        assert runs == [] and q.waiting == 1, "nothing runs beside the slot limit"
    await asyncio.sleep(0.05)
    assert runs == [what] and q.running == q.waiting == 0


async def test_refreshes_never_wait_for_reconciles_and_checks_wait_for_them() -> None:
    """A refresh (one status write) runs in slots of its own, beside the reconciles and whatever waits for them; a
    free slot goes to waiting reconciles before health checks, each in arrival order."""
    order: list[str] = []
    q = WorkQueue(1, delay=0)

    async def reconcile(name: str) -> None:
        async with q.slot():
            order.append(name)

    async with q.slot():  # a reconcile holds the only slot
        waiting = [asyncio.create_task(reconcile(f"reconcile-{i}")) for i in range(2)]
        await asyncio.sleep(0.01)
        q.request(("health check", "ns", "a"), recorder(order, "check"))
        q.request(("status refresh", "ns", "a"), recorder(order, "refresh"))
        await asyncio.sleep(0.05)
        assert order == ["refresh"] and q.waiting == 3
    await asyncio.gather(*waiting)
    await asyncio.sleep(0.05)
    assert order == ["refresh", "reconcile-0", "reconcile-1", "check"]
    assert q.running == q.waiting == 0


async def test_a_waiter_cancelled_before_its_turn_gives_its_slot_on() -> None:
    q = WorkQueue(1)
    order: list[str] = []

    async def work(name: str) -> None:
        async with q.slot():
            order.append(name)

    async with q.slot():
        first, second = asyncio.create_task(work("first")), asyncio.create_task(work("second"))
        await asyncio.sleep(0.01)
        first.cancel()
        await asyncio.sleep(0.01)
    await second
    assert order == ["second"] and q.running == q.waiting == 0
