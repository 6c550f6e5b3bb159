"""The health loop's scheduler: one per operator, over the VLLMDeployments kopf watches — thin, the work is in
`health.loop`.

Why not a kopf timer per object (what this replaced): kopf puts a finalizer on every object that has a timer, so
that it can stop the timer before the object goes. Every VLLMDeployment then carried `vllm-operator.dev/finalizer`:
with the operator stopped, a deleted VLLMDeployment (and its namespace) stayed Terminating, and in namespaced mode a
namespace deletion could take the operator's Role first and strand the finalizer behind a 403. The scheduler needs
nothing on the object: it reads `watched.Parents` (the objects as kopf's one watch of the kind last delivered them),
and a check reads the object from there (no GET: its status write is conditional on that version, and a 409
re-reads and decides again); a deleted object just leaves the schedule.

Each VLLMDeployment sets its own interval (`spec.remediation.intervalSeconds`, or the operator's test override). The
scheduler wakes every `tick` seconds and starts the checks that are due, at most one per object at a time. A check
runs in a slot of the operator's one work queue (`queue.WorkQueue`): health checks and reconciles share its bounded
concurrency and the API connections, first come first served, and the reconcile that follows a rung change runs in
the check's slot, never beside the limit. The Prometheus client is built once per operator run (no module-level
client); without a Prometheus URL, metric-based diagnoses are off and the MetricsAvailable condition says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf

from vllm_operator import constants
from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.queue import WorkQueue
from vllm_operator.handlers.reconcile import plan_context, reconcile
from vllm_operator.handlers.watched import Key, Parents
from vllm_operator.health import loop
from vllm_operator.health.source import PrometheusSource
from vllm_operator.k8s import KubeError

log = logging.getLogger(__name__)

TICK_S = 5.0
Check = Callable[[Key, Mapping[str, Any]], Awaitable[None]]
"""One check of a VLLMDeployment, given the object as kopf's watch last delivered it."""


def reconciled_once(body: Mapping[str, Any]) -> bool:
    """Whether the reconcile has written status (observedGeneration) yet: before that there are no pods to check,
    and with 500 VLLMDeployments applied at once the checks of those still waiting for their reconcile took most
    of the operator's API requests (a LIST of pods and reads of Deployments that did not exist yet)."""
    status = body.get("status")
    return isinstance(status, Mapping) and status.get("observedGeneration") is not None


class HealthScheduler:
    """Runs `check(key, object)` for every watched VLLMDeployment once per its interval, in a slot of `queue`.

    `parents` is the operator's view of kopf's watch; `run()` is the operator-level loop (cancel to stop).
    """

    def __init__(self, check: Check, queue: WorkQueue, parents: Parents, *, tick: float = TICK_S,
                 interval_override: float | None = None) -> None:
        self._check = check
        self._queue = queue
        self._parents = parents
        self.tick = min(tick, interval_override) if interval_override else tick
        self._override = interval_override
        self._last: dict[Key, float] = {}
        """time.monotonic() of each object's last check start."""
        self._running: dict[Key, asyncio.Task[None]] = {}
        self.checks = 0

    def _interval(self, body: Mapping[str, Any]) -> float:
        remediation = (body.get("spec") or {}).get("remediation") or {}
        return float(self._override or remediation.get("intervalSeconds") or constants.DEFAULT_INTERVAL_S)

    @staticmethod
    def _ready(body: Mapping[str, Any]) -> bool:
        """Reconciled once and not being deleted: worth checking."""
        return reconciled_once(body) and not body["metadata"].get("deletionTimestamp")

    def due(self, now: float) -> list[Key]:
        """The objects whose check should start now (ready, not running, their interval passed since the last)."""
        objects = self._parents.objects
        for gone in self._last.keys() - objects.keys():
            del self._last[gone]
        return [key for key, body in objects.items()
                if key not in self._running and self._ready(body)
                and ((last := self._last.get(key)) is None or now - last >= self._interval(body) - self.tick / 2)]

    def start_due(self) -> int:
        now = time.monotonic()
        keys = self.due(now)
        for key in keys:
            self._last[key] = now
            self._running[key] = asyncio.create_task(self._run_one(key), name=f"health-{key[0]}/{key[1]}")
        return len(keys)

    async def _run_one(self, key: Key) -> None:
        try:
            async with self._queue:
                body = self._parents.objects.get(key)
                if body is None or not self._ready(body):
                    return  # deleted (or being deleted) while it waited for a slot
                self.checks += 1
                await self._check(key, body)
        except asyncio.CancelledError:
            raise
        except KubeError as err:
            log.warning("Health check of VLLMDeployment %s/%s failed on an API call (retried next interval): %s",
                        *key, err)
        except Exception:
            log.exception("Health check of VLLMDeployment %s/%s failed (retried next interval)", *key)
        finally:
            self._running.pop(key, None)

    async def run(self) -> None:
        """Start the due checks every tick until cancelled; cancelling also cancels the checks in flight."""
        try:
            while True:
                self.start_due()
                await asyncio.sleep(self.tick)
        finally:
            tasks = list(self._running.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Attach the scheduler to `registry`: started with the operator, over the VLLMDeployments kopf watches (the
    memo must carry `kube`, `metrics`, `classes`, `queue`, `parents` and `children`)."""
    source = PrometheusSource(config.prometheus_url) if config.prometheus_url else None

    @kopf.on.startup(registry=registry)
    async def _start(memo: kopf.Memo, **_: Any) -> None:
        check = functools.partial(check_one, memo, config, source)
        memo.health = HealthScheduler(check, memo.queue, memo.parents,
                                      interval_override=config.health_interval_override)
        memo.health_task = asyncio.create_task(memo.health.run(), name="health-scheduler")

    @kopf.on.cleanup(registry=registry)
    async def _stop(memo: kopf.Memo, **_: Any) -> None:
        task = getattr(memo, "health_task", None)  # none when the operator stopped before its startup ran
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def check_one(memo: Any, config: OperatorConfig, source: PrometheusSource | None, key: Key,
                    body: Mapping[str, Any]) -> None:
    """One health check, on the object as kopf's watch last delivered it: no GET. The status write that may follow
    goes through the one status writer, conditional on that object's resourceVersion; when the watch lagged behind
    a write, the 409 makes it read the object and decide again (`loop.execute`). A settled operator so sends no
    request for its checks (up to 2d3eb9d each check read its object afresh: 1 GET per object per interval)."""
    kube = memo.kube
    memo.metrics.health_checks.inc()
    check = functools.partial(loop.check, kube, source, interval_override=config.health_interval_override,
                              context=functools.partial(plan_context, kube, images=config.images,
                                                        classes=memo.classes),
                              children=memo.children)
    result = await check(body)
    if result is not None:
        await loop.execute(kube, body, result, counters=memo.metrics, recheck=check,
                           reconcile=functools.partial(reconcile, images=config.images, classes=memo.classes,
                                                       prometheus_url=config.prometheus_url))
