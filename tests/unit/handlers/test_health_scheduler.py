"""The health scheduler: which watched VLLMDeployments are due, one check per object at a time, through the work
queue."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.health import HealthScheduler, reconciled_once
from vllm_operator.handlers.lifecycle import WATCH_ID
from vllm_operator.handlers.queue import WorkQueue
from vllm_operator.handlers.run import build_registry
from vllm_operator.handlers.watched import Parents


def body(name: str, *, interval: int | None = None, reconciled: bool = True, deleting: bool = False
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


def test_due_by_each_objects_own_interval() -> None:
    async def scenario() -> None:
        async def check(_: tuple[str, str], __: Any) -> None:
            return None

        parents = Parents()
        s = HealthScheduler(check, WorkQueue(4), parents, tick=5.0)
        parents.observe("ADDED", body("a", interval=10))
        parents.observe("ADDED", body("b", interval=60))
        parents.observe("ADDED", body("new", reconciled=False))
        parents.observe("MODIFIED", body("going", deleting=True))
        assert sorted(s.due(100.0)) == [("ml", "a"), ("ml", "b")], "first check at once, once reconciled"
        s._last[("ml", "a")] = s._last[("ml", "b")] = 100.0
        assert s.due(107.0) == [], "within the interval, less half a tick"
        assert s.due(108.0) == [("ml", "a")]
        assert sorted(s.due(158.0)) == [("ml", "a"), ("ml", "b")]
        parents.observe("DELETED", body("a"))
        parents.observe("MODIFIED", body("new"))
        assert sorted(s.due(158.0)) == [("ml", "b"), ("ml", "new")]
        assert ("ml", "a") not in s._last, "a deleted object leaves the schedule"

    asyncio.run(scenario())


def test_checks_wait_for_a_reconcile_slot_and_run_once_per_object_at_a_time() -> None:
    async def scenario() -> None:
        slots = WorkQueue(1)
        parents = Parents()
        started: list[tuple[str, str]] = []
        release = asyncio.Event()

        async def check(key: tuple[str, str], seen: Any) -> None:
            assert seen["metadata"]["name"] == key[1], "the check gets the object as watched"
            started.append(key)
            await release.wait()

        s = HealthScheduler(check, slots, parents, tick=5.0, interval_override=1.0)
        parents.observe("ADDED", body("a"))
        parents.observe("ADDED", body("b"))
        async with slots:  # a reconcile holds the only slot
            assert s.start_due() == 2
            await asyncio.sleep(0.01)
            assert started == [] and slots.waiting == 2, "no check runs beside the slot limit"
        await asyncio.sleep(0.01)
        assert started == [("ml", "a")] and slots.running == 1 and slots.waiting == 1
        for key in s._last:
            s._last[key] = -1e9  # due again, but still in flight: not started twice
        assert s.start_due() == 0
        parents.observe("DELETED", body("b"))  # deleted while it waited: its turn does nothing
        release.set()
        await asyncio.sleep(0.01)
        assert started == [("ml", "a")] and s.checks == 1 and slots.running == slots.waiting == 0

    asyncio.run(scenario())


def test_a_failing_check_is_logged_and_the_next_interval_tries_again(caplog: Any) -> None:
    async def scenario() -> int:
        calls = 0

        async def check(_: tuple[str, str], __: Any) -> None:
            nonlocal calls
            calls += 1
            raise RuntimeError("boom")

        parents = Parents()
        s = HealthScheduler(check, WorkQueue(1), parents, tick=0.01, interval_override=0.01)
        parents.observe("ADDED", body("a"))
        task = asyncio.create_task(s.run())
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
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
