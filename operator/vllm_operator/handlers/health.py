"""The health loop's kopf timer: one per VLLMDeployment, thin — the work is in `health.loop`.

kopf fixes a timer's interval at registration, but each VLLMDeployment sets its own
(`spec.remediation.intervalSeconds`): the timer ticks at `TICK_S` (or the operator's test override) and runs a
check only when the object's interval has passed since its last one. The Prometheus client is built once per
operator run (no module-level client); without a Prometheus URL, metric-based diagnoses are off and the
MetricsAvailable condition says so.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any

import kopf

from vllm_operator import constants
from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.reconcile import reconcile
from vllm_operator.health import loop
from vllm_operator.health.source import PrometheusSource
from vllm_operator.k8s import VLLM_DEPLOYMENTS, KubeError

RESOURCE = (constants.GROUP, constants.VERSION, constants.PLURAL)
TICK_S = 5.0
HANDLER_ID = "health"


def reconciled_once(body: Mapping[str, Any]) -> bool:
    """Whether the reconcile has written status (observedGeneration) yet: before that there are no pods to check,
    and with 500 VLLMDeployments applied at once the checks of those still waiting for their reconcile took most
    of the operator's API requests (a LIST of pods and reads of Deployments that did not exist yet)."""
    status = body.get("status")
    return isinstance(status, Mapping) and status.get("observedGeneration") is not None


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Attach the health timer to `registry`."""
    source = PrometheusSource(config.prometheus_url) if config.prometheus_url else None
    tick = min(TICK_S, config.health_interval_override) if config.health_interval_override else TICK_S

    @kopf.timer(*RESOURCE, interval=tick, id=HANDLER_ID, registry=registry)
    async def _health(body: kopf.Body, memo: kopf.Memo, logger: Any, **_: Any) -> None:
        meta = body.get("metadata", {})
        if meta.get("deletionTimestamp") or not reconciled_once(body):
            return
        remediation = (body.get("spec") or {}).get("remediation") or {}
        interval = (config.health_interval_override or remediation.get("intervalSeconds")
                    or constants.DEFAULT_INTERVAL_S)
        now = time.monotonic()
        last = getattr(memo, "health_last_check", None)  # kopf's memo is per object (a copy of the operator's)
        if last is not None and now - float(last) < float(interval) - tick / 2:
            return
        memo.health_last_check = now
        try:
            # kopf's body may lag the API; the loop's status write is conditional on what it read, so read afresh.
            fresh = await memo.kube.get(VLLM_DEPLOYMENTS, meta.get("namespace"), meta.get("name"))
            if fresh is None:
                return
            key = (meta.get("namespace"), meta.get("name"))
            check = functools.partial(loop.check, memo.kube, source, interval_override=config.health_interval_override,
                                      resolve_class=functools.partial(memo.classes.resolve, memo.kube, key),
                                      children=getattr(memo, "children", None))
            result = await check(fresh)
            if result is not None:
                await loop.execute(memo.kube, fresh, result, counters=memo.metrics, recheck=check,
                                   reconcile=functools.partial(reconcile, images=config.images,
                                                               classes=memo.classes,
                                                               prometheus_url=config.prometheus_url))
        except KubeError as err:
            logger.warning("Health check of VLLMDeployment %s/%s failed on an API call (retried next interval): %s",
                           meta.get("namespace"), meta.get("name"), err)
