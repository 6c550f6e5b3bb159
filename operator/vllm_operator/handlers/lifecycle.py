"""Lifecycle handlers: create, update and resume all run the same reconcile; owned Deployments update status.

Thin on purpose — the work is in `reconcile.py`. kopf's retry semantics: a refused spec is a PermanentError (no
retry until the spec changes; the status and a Warning event say why); API trouble is a TemporaryError with a delay.
There is no on.delete handler, so kopf adds no finalizer: children go by ownerReference garbage collection.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from vllm_operator import constants
from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.metrics import OperatorMetrics
from vllm_operator.handlers.reconcile import reconcile, refresh_status
from vllm_operator.k8s import VLLM_DEPLOYMENTS, KubeApi, KubeError

RESOURCE = (constants.GROUP, constants.VERSION, constants.PLURAL)


def configure_settings(settings: kopf.OperatorSettings) -> None:
    """Settings that make a no-op resync write nothing and keep kopf's bookkeeping out of status."""
    settings.posting.level = logging.WARNING  # our own events say what changed; kopf's info events would be noise
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=constants.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=constants.GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{constants.GROUP}/finalizer"
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.reconnect_backoff = 1.0
    settings.networking.request_timeout = 30
    settings.queueing.error_delays = (1, 2, 5, 10, 30, 60)
    settings.execution.max_workers = 8


async def run_reconcile(kube: KubeApi, metrics: OperatorMetrics, body: Any) -> None:
    try:
        outcome = await reconcile(kube, body)
    except KubeError as err:
        metrics.reconcile_errors.inc()
        # A conflict means someone else wrote first: re-read and retry at once; anything else backs off.
        raise kopf.TemporaryError(f"API request failed: {err}", delay=1 if err.conflict else 5) from err
    if outcome.spec_error is not None:
        metrics.reconciles.labels("refused").inc()
        raise kopf.PermanentError(str(outcome.spec_error))
    metrics.reconciles.labels("changed" if outcome.changed else "unchanged").inc()
    for verb, items in (("create", outcome.created), ("update", outcome.updated), ("delete", outcome.deleted)):
        for item in items:
            metrics.child_writes.labels(verb, item.split(" ", 1)[0]).inc()


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Attach the lifecycle handlers to `registry`."""
    del config  # lifecycle needs no settings beyond the memo's clients

    @kopf.on.startup(registry=registry)
    async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_settings(settings)

    @kopf.on.resume(*RESOURCE, registry=registry)
    @kopf.on.create(*RESOURCE, registry=registry)
    @kopf.on.update(*RESOURCE, field="spec", registry=registry)
    async def _reconcile(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await run_reconcile(memo.kube, memo.metrics, body)

    @kopf.on.event("apps", "v1", "deployments", labels={constants.LABEL_NAME: constants.APP_NAME,
                                                       constants.LABEL_DEPLOYMENT: kopf.PRESENT}, registry=registry)
    async def _child_changed(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, logger: Any, **_: Any) -> None:
        owner = body.get("metadata", {}).get("labels", {}).get(constants.LABEL_DEPLOYMENT)
        namespace = body.get("metadata", {}).get("namespace")
        if not owner or not namespace:
            return
        parent = await memo.kube.get(VLLM_DEPLOYMENTS, namespace, owner)
        if parent is None or parent.get("metadata", {}).get("deletionTimestamp"):
            return
        if event.get("type") == "DELETED":
            logger.info("Deployment %s/%s was deleted; reconciled its VLLMDeployment", namespace,
                        body["metadata"]["name"])
            await run_reconcile(memo.kube, memo.metrics, parent)
        else:
            await refresh_status(memo.kube, parent)
