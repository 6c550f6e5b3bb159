"""The health loop's scheduler: one per operator, over the VLLMDeployments kopf watches — thin, the work is in
`health.loop`.

Why not a kopf timer per object (what this replaced): kopf puts a finalizer on every object that has a timer, so
that it can stop the timer before the object goes. Every VLLMDeployment then carried `vllm-operator.dev/finalizer`:
with the operator stopped, a deleted VLLMDeployment (and its namespace) stayed Terminating, and in namespaced mode a
namespace deletion could take the operator's Role first and strand the finalizer behind a 403. The scheduler needs
nothing on the object: kopf's watch of VLLMDeployments (an `on.event` handler, which needs no finalizer) tells it
which objects exist, with their interval, and the object as last delivered, which the check reads (no GET: its
status write is conditional on that version, and a 409 re-reads and decides again); a deleted object just leaves
the schedule.

Each VLLMDeployment sets its own interval (`spec.remediation.intervalSeconds`, or the operator's test override). The
scheduler wakes every `tick` seconds and starts the checks that are due, at most one per object at a time. A check
runs in a reconcile slot (`ReconcileSlots`): health checks and reconciles share the operator's bounded concurrency
and its API connections, first come first served, and the reconcile that follows a rung change runs in the check's
slot, never beside the limit. The Prometheus client is built once per operator run (no module-level client);
without a Prometheus URL, metric-based diagnoses are off and the MetricsAvailable condition says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from vllm_operator import constants
from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.lifecycle import ReconcileSlots
from vllm_operator.handlers.reconcile import plan_context, reconcile
from vllm_operator.health import loop
from vllm_operator.health.source import PrometheusSource
from vllm_operator.k8s import KubeError

log = logging.getLogger(__name__)

RESOURCE = (constants.GROUP, constants.VERSION, constants.PLURAL)
TICK_S = 5.0
HANDLER_ID = "health-schedule"
Key = tuple[str, str]
"""(namespace, name) of a VLLMDeployment."""
Check = Callable[[Key, Mapping[str, Any]], Awaitable[None]]
"""One check of a VLLMDeployment, given the object as kopf's watch last delivered it."""


def reconciled_once(body: Mapping[str, Any]) -> bool:
    """Whether the reconcile has written status (observedGeneration) yet: before that there are no pods to check,
    and with 500 VLLMDeployments applied at once the checks of those still waiting for their reconcile took most
    of the operator's API requests (a LIST of pods and reads of Deployments that did not exist yet)."""
    status = body.get("status")
    return isinstance(status, Mapping) and status.get("observedGeneration") is not None


@dataclass
class _Entry:
    body: Mapping[str, Any]
    """The object as the watch last delivered it (a shallow copy of kopf's event object: nothing is duplicated)."""
    interval: float
    ready: bool
    """Reconciled once and not being deleted: worth checking."""
    last: float | None = None
    """time.monotonic() of the last check's start."""


class HealthScheduler:
    """Runs `check(key)` for every observed VLLMDeployment once per its interval, in a reconcile slot.

    `observe(body)` / `forget(key)` come from kopf's watch; `run()` is the operator-level loop (cancel to stop).
    """

    def __init__(self, check: Check, slots: ReconcileSlots, *, tick: float = TICK_S,
                 interval_override: float | None = None) -> None:
        self._check = check
        self._slots = slots
        self.tick = min(tick, interval_override) if interval_override else tick
        self._override = interval_override
        self._entries: dict[Key, _Entry] = {}
        self._running: dict[Key, asyncio.Task[None]] = {}
        self.checks = 0

    @property
    def scheduled(self) -> int:
        return len(self._entries)

    def observe(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        remediation = (body.get("spec") or {}).get("remediation") or {}
        interval = float(self._override or remediation.get("intervalSeconds") or constants.DEFAULT_INTERVAL_S)
        ready = reconciled_once(body) and not meta.get("deletionTimestamp")
        entry = self._entries.get(key)
        if entry is None:
            self._entries[key] = _Entry(dict(body), interval, ready)
        else:
            entry.body, entry.interval, entry.ready = dict(body), interval, ready

    def forget(self, key: Key) -> None:
        self._entries.pop(key, None)

    def due(self, now: float) -> list[Key]:
        """The objects whose check should start now (ready, not running, their interval passed since the last)."""
        return [key for key, e in self._entries.items()
                if e.ready and key not in self._running
                and (e.last is None or now - e.last >= e.interval - self.tick / 2)]

    def start_due(self) -> int:
        now = time.monotonic()
        keys = self.due(now)
        for key in keys:
            self._entries[key].last = now
            self._running[key] = asyncio.create_task(self._run_one(key), name=f"health-{key[0]}/{key[1]}")
        return len(keys)

    async def _run_one(self, key: Key) -> None:
        try:
            async with self._slots:
                entry = self._entries.get(key)
                if entry is None or not entry.ready:
                    return  # deleted (or being deleted) while it waited for a slot
                self.checks += 1
                await self._check(key, entry.body)
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
    """Attach the scheduler to `registry`: started with the operator, fed by kopf's watch of VLLMDeployments (the
    memo must carry `kube`, `metrics`, `classes`, `slots` and `children`)."""
    source = PrometheusSource(config.prometheus_url) if config.prometheus_url else None

    @kopf.on.startup(registry=registry)
    async def _start(memo: kopf.Memo, **_: Any) -> None:
        check = functools.partial(check_one, memo, config, source)
        memo.health = HealthScheduler(check, memo.slots, interval_override=config.health_interval_override)
        memo.health_task = asyncio.create_task(memo.health.run(), name="health-scheduler")

    @kopf.on.cleanup(registry=registry)
    async def _stop(memo: kopf.Memo, **_: Any) -> None:
        task = getattr(memo, "health_task", None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @kopf.on.event(*RESOURCE, id=HANDLER_ID, registry=registry)
    async def _schedule(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        scheduler: HealthScheduler | None = getattr(memo, "health", None)
        if scheduler is None:
            return
        if event.get("type") == "DELETED":
            meta = body.get("metadata", {})
            scheduler.forget((meta.get("namespace"), meta.get("name")))
        else:
            scheduler.observe(body)


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
                                                        classes=memo.classes, node_cache=config.node_cache),
                              children=getattr(memo, "children", None))
    result = await check(body)
    if result is not None:
        await loop.execute(kube, body, result, counters=memo.metrics, recheck=check,
                           reconcile=functools.partial(reconcile, images=config.images, classes=memo.classes,
                                                       prometheus_url=config.prometheus_url,
                                                       node_cache=config.node_cache))
