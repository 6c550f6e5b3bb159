"""The health checks' schedule: each watched VLLMDeployment checked once reconciled, then once per its interval,
one check per object at a time, each a request to the work queue."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import kopf

from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.health import HealthChecks, reconciled_once
from vllm_operator.handlers.lifecycle import WATCH_ID
from vllm_operator.handlers.queue import WorkQueue
from vllm_operator.handlers.run import build_registry
from vllm_operator.handlers.watched import Parents


def body(name: str, *, interval: float | None = None, reconciled: bool = True, deleting: bool = False
         ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    spec = {"remediation": {"intervalSeconds": interval}} if interval else {}
    return {"metadata": meta, "spec": spec, "status": {"observedGeneration": 1} if reconciled else {}}


def test_only_a_reconciled_object_is_checked() -> None:
    assert not reconciled_once({"metadata": {"name": "a"}})
    assert not reconciled_once({"metadata": {"name": "a"}, "status": {}})
    assert not reconciled_once({"metadata": {"name": "a"}, "status": {"kopf": {"progress": {}}}})
    assert reconciled_once({"metadata": {"name": "a"}, "status": {"observedGeneration": 1}})
    assert reconciled_once({"metadata": {"name": "a", "generation": 3}, "status": {"observedGeneration": 2}})


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.01)


def schedule(queue: WorkQueue, *, interval_override: float | None = None
             ) -> tuple[Parents, list[str], asyncio.Event]:
    """Parents with the health checks listening; the names checked, in order; set the event to let checks end."""
    parents, checked, release = Parents(), [], asyncio.Event()
    release.set()

    async def check(key: tuple[str, str], seen: Any) -> None:
        assert seen["metadata"]["name"] == key[1], "the check gets the object as watched"
        checked.append(key[1])
        await release.wait()

    parents.listeners.append(HealthChecks(check, queue, parents, interval_override=interval_override).observe)
    return parents, checked, release


def test_first_check_once_reconciled_then_each_by_its_own_interval() -> None:
    async def scenario() -> list[str]:
        parents, checked, _ = schedule(WorkQueue(4))
        parents.observe("ADDED", body("fast", interval=0.2))
        parents.observe("ADDED", body("slow", interval=60))
        parents.observe("ADDED", body("new", reconciled=False))
        parents.observe("MODIFIED", body("going", deleting=True))
        parents.observe("MODIFIED", body("fast", interval=0.2))  # a later event does not schedule twice
        await asyncio.sleep(0.05)
        assert sorted(checked) == ["fast", "slow"], "first check at once, once reconciled"
        parents.observe("MODIFIED", body("new"))
        await until(lambda: checked.count("fast") >= 3 and "new" in checked)
        return checked

    checked = asyncio.run(scenario())
    assert checked.count("slow") == 1 and checked.count("new") == 1, "a 60 s interval has not come round again"


def test_checks_wait_for_a_queue_slot_and_run_once_per_object_at_a_time() -> None:
    async def scenario() -> None:
        queue = WorkQueue(1)
        parents, checked, release = schedule(queue, interval_override=0.01)
        release.clear()
        async with queue.slot():  # a reconcile holds the only slot
            parents.observe("ADDED", body("a"))
            parents.observe("ADDED", body("b"))
            await asyncio.sleep(0.05)
            assert checked == [] and queue.waiting == 2, "no check runs beside the slot limit"
        await asyncio.sleep(0.05)
        assert checked == ["a"] and queue.running == 1 and queue.waiting == 1
        parents.observe("DELETED", body("b"))  # deleted while it waited: its turn does nothing
        await asyncio.sleep(0.05)
        assert checked == ["a"], "still running: not started twice, and b's turn did nothing"
        release.set()
        await until(lambda: len(checked) >= 3)
        assert set(checked) == {"a"}, "a goes on, b left the schedule"
        await queue.close()

    asyncio.run(scenario())


def test_a_failing_check_is_logged_and_the_next_interval_tries_again(caplog: Any) -> None:
    async def scenario() -> int:
        calls = 0

        async def check(_: tuple[str, str], __: Any) -> None:
            nonlocal calls
            calls += 1
            raise RuntimeError("boom")

        queue, parents = WorkQueue(1), Parents()
        parents.listeners.append(HealthChecks(check, queue, parents, interval_override=0.01).observe)
        parents.observe("ADDED", body("a"))
        await until(lambda: calls >= 2)
        await queue.close()
        return calls

    assert asyncio.run(scenario()) >= 2
    assert "Health check of VLLMDeployment ml/a failed" in caplog.text


def test_no_handler_asks_kopf_for_a_finalizer() -> None:
    """kopf finalizes an object when a timer or daemon, or a mandatory on.delete handler, serves its kind; the
    operator registers none of them (the health loop was a timer up to 2d3eb9d)."""
    registry = build_registry(OperatorConfig(http_port=0, prometheus_url="http://prometheus.invalid:9090"))
    assert registry._spawning.get_all_handlers() == [], "timers and daemons make kopf finalize every object"
    deletion = [h for h in registry._changing.get_all_handlers() if h.reason == kopf.Reason.DELETE]
    assert deletion == [], deletion
    assert any(h.id == WATCH_ID for h in registry._watching.get_all_handlers())
