"""ReconcileSlots: at most `limit` reconciles in flight, the rest started in the order they arrived."""

from __future__ import annotations

import asyncio

import pytest

from vllm_operator.handlers.lifecycle import ReconcileSlots


def test_at_most_the_limit_run_and_the_waiting_start_in_arrival_order() -> None:
    async def scenario() -> tuple[list[int], int, list[tuple[int, int]]]:
        slots = ReconcileSlots(2)
        started: list[int] = []
        peak = 0
        gauges: list[tuple[int, int]] = []
        release = asyncio.Event()

        async def reconcile(i: int) -> None:
            nonlocal peak
            async with slots:
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
        slots = ReconcileSlots(1)

        async def fails() -> None:
            async with slots:
                raise RuntimeError("API request failed")

        with pytest.raises(RuntimeError):
            await fails()
        async with slots:
            return slots.running

    assert asyncio.run(scenario()) == 1


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1, got 0"):
        ReconcileSlots(0)
