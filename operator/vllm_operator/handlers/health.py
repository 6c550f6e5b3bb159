"""The health loop's schedule: one per operator, over the VLLMDeployments kopf watches — thin, the work is in
`health.loop`.

Why not a kopf timer per object (what this replaced): kopf puts a finalizer on every object that has a timer, so
that it can stop the timer before the object goes. Every VLLMDeployment then carried `vllm-operator.dev/finalizer`:
with the operator stopped, a deleted VLLMDeployment (and its namespace) stayed Terminating, and in namespaced mode a
namespace deletion could take the operator's Role first and strand the finalizer behind a 403. The schedule needs
nothing on the object: it follows `watched.Parents` (the objects as kopf's one watch of the kind last delivered them),
and a check reads the object from there (no GET: its status write is conditional on that version, and a 409
re-reads and decides again); a deleted object just leaves the schedule.

Each VLLMDeployment sets its own interval (`spec.remediation.intervalSeconds`, or the operator's test override).
Every check is a request to the operator's one work queue (`queue.WorkQueue`), which runs it in a slot: health
checks and reconciles share its bounded concurrency and the API connections (reconciles first, each kind first come
first served), and the reconcile that follows a rung change runs in the check's slot, never beside the limit. The
Prometheus client is built once per operator run (no module-level client); without a Prometheus URL, metric-based
diagnoses are off and the MetricsAvailable condition says so.
"""

from __future__ import annotations

import functools
import logging
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

Check = Callable[[Key, Mapping[str, Any]], Awaitable[None]]
"""One check of a VLLMDeployment, given the object as kopf's watch last delivered it."""


def reconciled_once(body: Mapping[str, Any]) -> bool:
    """Whether the reconcile has written status (observedGeneration) yet: before that there are no pods to check,
    and with 500 VLLMDeployments applied at once the checks of those still waiting for their reconcile took most
    of the operator's API requests (a LIST of pods and reads of Deployments that did not exist yet)."""
    status = body.get("status")
    return isinstance(status, Mapping) and status.get("observedGeneration") is not None


class HealthChecks:
    """Each watched VLLMDeployment's check, once per its interval, as requests to the work queue.

    An object's first check is requested when the watch shows it reconciled (`observe`, a `Parents` listener); each
    check requests the next one its interval later, while the object is watched and not being deleted, so one check
    per object is waiting or running at a time. A failed check is logged and the next interval tries again.
    """

    def __init__(self, check: Check, queue: WorkQueue, parents: Parents, *,
                 interval_override: float | None = None) -> None:
        self._check = check
        self._queue = queue
        self._parents = parents
        self._override = interval_override
        self._scheduled: set[Key] = set()

    def _ready(self, key: Key) -> Mapping[str, Any] | None:
        """The object when it is worth checking: watched, reconciled once and not being deleted."""
        body = self._parents.objects.get(key)
        return body if body is not None and reconciled_once(body) \
            and not body["metadata"].get("deletionTimestamp") else None

    def observe(self, key: Key) -> None:
        if key not in self._scheduled and self._ready(key) is not None:
            self._scheduled.add(key)
            self._queue.request(("health check", *key), functools.partial(self._run, key), delay=0)

    async def _run(self, key: Key) -> None:
        body = self._ready(key)
        if body is None:
            self._scheduled.discard(key)  # deleted (or being deleted) while it waited: it leaves the schedule
            return
        try:
            await self._check(key, body)
        except KubeError as err:
            log.warning("Health check of VLLMDeployment %s/%s failed on an API call (retried next interval): %s",
                        *key, err)
        except Exception:
            log.exception("Health check of VLLMDeployment %s/%s failed (retried next interval)", *key)
        remediation = (body.get("spec") or {}).get("remediation") or {}
        interval = float(self._override or remediation.get("intervalSeconds") or constants.DEFAULT_INTERVAL_S)
        self._queue.request(("health check", *key), functools.partial(self._run, key), delay=interval)


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Attach the health checks to `registry`: started with the operator, over the VLLMDeployments kopf watches (the
    memo must carry `kube`, `metrics`, `classes`, `queue`, `parents` and `children`)."""
    source = PrometheusSource(config.prometheus_url) if config.prometheus_url else None

    @kopf.on.startup(registry=registry)
    async def _start(memo: kopf.Memo, **_: Any) -> None:
        checks = HealthChecks(functools.partial(check_one, memo, config, source), memo.queue, memo.parents,
                              interval_override=config.health_interval_override)
        memo.parents.listeners.append(checks.observe)


async def check_one(memo: Any, config: OperatorConfig, source: PrometheusSource | None, key: Key,
                    body: Mapping[str, Any]) -> None:
    """One health check, on the object as kopf's watch last delivered it: no GET. The status write that may follow
    goes through the one status writer, conditional on that object's resourceVersion; when the watch lagged behind
    a write, the 409 makes it read the object and decide again (`loop.execute`). A settled operator so sends no
    request for its checks (up to 2d3eb9d each check read its object afresh: 1 GET per object per interval)."""
    kube = memo.kube
    memo.metrics.health_checks.inc()
    check = functools.partial(loop.check, kube, source, interval_override=config.health_interval_override,
                              context=functools.partial(plan_context, kube, config=config, classes=memo.classes),
                              children=memo.children)
    result = await check(body)
    if result is not None:
        await loop.execute(kube, body, result, counters=memo.metrics, recheck=check,
                           reconcile=functools.partial(reconcile, config=config, classes=memo.classes))
