"""Lifecycle handlers: create, update and resume all run the same reconcile; owned Deployments update status.

Thin on purpose — the work is in `reconcile.py`; owned-Deployment changes are coalesced into one status refresh
per VLLMDeployment (`refresh.py`) that reads kopf's in-memory indexes rather than the API. kopf's retry semantics:
a refused spec is handled, not an error (no retry until the spec changes; SpecValid=False and a Warning event say
why, and the operator's log has one WARNING line, not kopf's ERROR); API trouble is a TemporaryError with a delay.
There is no on.delete handler, no timer and no daemon: children go by ownerReference garbage collection, and the
health loop is an operator-level scheduler (`health.py`), so nothing asks kopf for a finalizer and a VLLMDeployment
is deleted at once, with or without a running operator. Releases up to 2d3eb9d ran the health loop as a kopf timer,
which put `vllm-operator.dev/finalizer` on every object; `configure_settings` keeps that name as kopf's finalizer so
that kopf, which takes its finalizer off objects no handler needs it for, removes it from them on its first sight.

Reconciles pass through `ReconcileSlots`, a few at a time in arrival order. kopf starts one handler per object at
once, and every reconcile's ~26 requests share the API client's few worker threads: with 500 VLLMDeployments
applied together all 500 reconciles started, each got 1/500 of the requests, and none had finished (none had
status) after 240 s on the real API server, although the children of every one of them were half written. With the
slots the first finishes after a few seconds and the rest follow steadily; the total work is the same.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from vllm_operator import constants, names
from vllm_operator.handlers import classes, refresh
from vllm_operator.handlers.childplan import is_owned_by
from vllm_operator.handlers.classes import ClassIndex
from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.metrics import OperatorMetrics
from vllm_operator.handlers.reconcile import child_selector, reconcile, refresh_status
from vllm_operator.images import DEFAULT_IMAGES, ImageDefaults
from vllm_operator.k8s import KubeApi, KubeError
from vllm_operator.planning.weights_cache import DEFAULT_NODE_CACHE, NodeCache

RESOURCE = (constants.GROUP, constants.VERSION, constants.PLURAL)
CHILD_EVENT_ID = "owned-deployment-changed"
PARENT_INDEX = "vllm_deployment_index"
"""kopf index (handler kwarg) of VLLMDeployment bodies by (namespace, child label value)."""
DEPLOYMENT_INDEX = "pool_deployment_index"
"""kopf index (handler kwarg) of owned Deployments' counts by (namespace, owner label value)."""


def configure_settings(settings: kopf.OperatorSettings) -> None:
    """Settings that make a no-op resync write nothing and keep kopf's bookkeeping out of status."""
    settings.posting.level = logging.WARNING  # our own events say what changed; kopf's info events would be noise
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=constants.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=constants.GROUP, key="last-handled-configuration")
    # No handler needs a finalizer; kopf removes this one (the health timer's, up to 2d3eb9d) where it finds it.
    settings.persistence.finalizer = constants.LEGACY_FINALIZER
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.reconnect_backoff = 1.0
    settings.networking.request_timeout = 30
    settings.queueing.error_delays = (1, 2, 5, 10, 30, 60)
    settings.execution.max_workers = 8


class ReconcileSlots:
    """At most `limit` reconciles in flight; the others wait first come, first served (asyncio.Semaphore is fair).

    One per operator run, in kopf's memo (shared by reference by every object's copy of the memo). `waiting` and
    `running` feed the operator's metrics.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max concurrent reconciles must be at least 1, got {limit}")
        self.limit = limit
        self._semaphore = asyncio.Semaphore(limit)
        self.waiting = 0
        self.running = 0

    async def __aenter__(self) -> ReconcileSlots:
        self.waiting += 1
        try:
            await self._semaphore.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        return self

    async def __aexit__(self, *_: object) -> None:
        self.running -= 1
        self._semaphore.release()


async def run_reconcile(kube: KubeApi, metrics: OperatorMetrics, body: Any,
                        images: ImageDefaults = DEFAULT_IMAGES, classes: ClassIndex | None = None,
                        slots: ReconcileSlots | None = None, prometheus_url: str | None = None,
                        node_cache: NodeCache = DEFAULT_NODE_CACHE) -> bool:
    """Reconcile one VLLMDeployment for a handler (through `slots` when given); True when children were written.
    `prometheus_url`: the operator's --prometheus-url, which the ScaledObjects of autoscaled pools query."""
    if slots is not None:
        queued = time.monotonic()
        async with slots:
            metrics.reconcile_wait.observe(time.monotonic() - queued)
            return await run_reconcile(kube, metrics, body, images, classes, prometheus_url=prometheus_url,
                                       node_cache=node_cache)
    try:
        outcome = await reconcile(kube, body, images=images, classes=classes, prometheus_url=prometheus_url,
                                  node_cache=node_cache)
    except KubeError as err:
        metrics.reconcile_errors.inc()
        # A conflict means someone else wrote first: re-read and retry at once; anything else backs off.
        raise kopf.TemporaryError(f"API request failed: {err}", delay=1 if err.conflict else 5) from err
    if outcome.spec_error is not None:
        # Handled, not failed: the reconcile wrote SpecValid=False and posted a Warning event naming the problem.
        # A kopf.PermanentError here made kopf log "ERROR ... failed permanently" (and post an Error event) for
        # what is the user's mistake, not the operator's; returning also stops retries until the spec changes.
        metrics.reconciles.labels("refused").inc()
        return False
    metrics.reconciles.labels("changed" if outcome.changed else "unchanged").inc()
    for verb, items in (("create", outcome.created), ("update", outcome.updated), ("delete", outcome.deleted)):
        for item in items:
            metrics.child_writes.labels(verb, item.split(" ", 1)[0]).inc()
    return outcome.changed


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Attach the lifecycle handlers to `registry` (the memo must carry `kube`, `metrics`, a `refresher` and
    `slots`)."""

    @kopf.on.startup(registry=registry)
    async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_settings(settings)

    @kopf.on.resume(*RESOURCE, registry=registry)
    @kopf.on.create(*RESOURCE, registry=registry)
    @kopf.on.update(*RESOURCE, field="spec", registry=registry)
    async def _reconcile(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await run_reconcile(memo.kube, memo.metrics, body, config.images, memo.classes, memo.slots,
                            config.prometheus_url, config.node_cache)

    if config.workload_classes:
        register_classes(registry, config)

    deployment_labels: dict[str, Any] = {constants.LABEL_NAME: constants.APP_NAME,
                                         constants.LABEL_DEPLOYMENT: kopf.PRESENT}

    # In-memory indexes fed by the watch streams kopf keeps anyway (an informer cache): the coalesced status
    # refresh reads the parent and its Deployments from here instead of GET + LIST per event.
    @kopf.index(*RESOURCE, id=PARENT_INDEX, registry=registry)
    def vllm_deployment_index(body: kopf.Body, **_: Any) -> dict[refresh.Key, Any]:
        meta = body["metadata"]
        return {(meta["namespace"], names.dns_label(meta["name"])): copy.deepcopy(dict(body))}

    @kopf.index("apps", "v1", "deployments", labels=deployment_labels, id=DEPLOYMENT_INDEX, registry=registry)
    def pool_deployment_index(body: kopf.Body, **_: Any) -> dict[refresh.Key, Any]:
        meta = body["metadata"]
        return {(meta["namespace"], meta["labels"][constants.LABEL_DEPLOYMENT]): deployment_counts_view(body)}

    @kopf.on.cleanup(registry=registry)
    async def _cleanup(memo: kopf.Memo, **_: Any) -> None:
        await memo.refresher.close()
        await memo.classes.close()

    @kopf.on.event("apps", "v1", "deployments", labels=deployment_labels, id=CHILD_EVENT_ID, registry=registry)
    async def _child_changed(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, logger: Any,
                             **kwargs: Any) -> None:
        parents: kopf.Index[refresh.Key, Any] = kwargs[PARENT_INDEX]
        deployments: kopf.Index[refresh.Key, Any] = kwargs[DEPLOYMENT_INDEX]
        owner = body.get("metadata", {}).get("labels", {}).get(constants.LABEL_DEPLOYMENT)
        namespace = body.get("metadata", {}).get("namespace")
        if not owner or not namespace:
            return
        key = (namespace, owner)
        if event.get("type") == "DELETED":
            for parent in list(parents.get(key, ())):
                if is_owned_by(body, parent["metadata"]["uid"]) and not parent["metadata"].get("deletionTimestamp"):
                    logger.info("Deployment %s/%s was deleted; reconciled its VLLMDeployment", namespace,
                                body["metadata"]["name"])
                    await run_reconcile(memo.kube, memo.metrics, parent, config.images, memo.classes,
                                        memo.slots, config.prometheus_url, config.node_cache)
            return
        memo.refresher.request(key, functools.partial(_refresh_from_indexes, memo.kube, key, parents, deployments,
                                                      config.images, memo.classes, config.node_cache))


CLASS_RESOURCE = (constants.GROUP, constants.VERSION, constants.CLASS_PLURAL)


def register_classes(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Watch VLLMWorkloadClasses: keep the index current and roll a changed class out to its dependents."""

    @kopf.on.event(*CLASS_RESOURCE, registry=registry)
    async def _class_changed(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        index: ClassIndex = memo.classes
        await index.load(memo.kube)
        name = body["metadata"]["name"]
        before, objects = index.snapshot(), index.objects()
        if event.get("type") == "DELETED":
            old, new = index.forget(name), None
        else:
            old = index.observe(body)
            new = index.snapshot().get(name)
        if old is not None and new is not None and (old.generation, old.default) == (new.generation, new.default):
            return  # a resync or a metadata-only change: nothing to re-plan
        default_changed = bool((old and old.default) or (new and new.default))
        targets = await classes.dependents(memo.kube, config.namespaces, {name}, default_changed)
        if not targets:
            return
        what = "deleted" if event.get("type") == "DELETED" else (
            "created" if old is None else f"changed to generation {new.generation if new else '?'}")
        logging.getLogger(__name__).info("VLLMWorkloadClass %s was %s; re-planning %d VLLMDeployment(s) one at a "
                                         "time", name, what, len(targets))

        index.start_rollout(name, targets, before, objects, functools.partial(
            classes.roll_out, index, memo.kube, name, targets, _reconciler(memo, config), child_selector,
            config.class_rollout_timeout), memo.kube)

    @kopf.on.startup(registry=registry)
    async def _resume_rollouts(memo: kopf.Memo, logger: Any, **_: Any) -> None:
        """Pins persisted by a roll-out the previous operator did not finish: loaded before any handler plans, and
        their roll-outs resumed over the dependents still pinned, one at a time as before."""
        index: ClassIndex = memo.classes
        try:
            pinned, unpinned = await classes.restore_pins(index, memo.kube, config.namespaces)
            if pinned:
                await index.load(memo.kube)
        except KubeError as err:
            raise kopf.TemporaryError(f"listing VLLMDeployments for their workload-class pins failed: {err}",
                                      delay=5) from err
        current = index.snapshot()
        for name, targets in sorted(pinned.items()):
            default = name in current and current[name].default
            # The dependent whose turn it was is re-planned and unpinned, perhaps still rolling: wait for it first.
            settle = [o for o in unpinned if classes.depends_on(o, {name}, default)]
            logger.info("Resumed the roll-out of VLLMWorkloadClass %s: %d VLLMDeployment(s) still pinned", name,
                        len(targets))
            index.resume(name, functools.partial(classes.roll_out, index, memo.kube, name, targets,
                                                 _reconciler(memo, config), child_selector,
                                                 config.class_rollout_timeout, settle))


def _reconciler(memo: Any, config: OperatorConfig) -> classes.Reconcile:
    """A class roll-out's reconcile of one dependent: through the slots, like every other."""

    async def changed(obj: Mapping[str, Any]) -> bool:
        return await run_reconcile(memo.kube, memo.metrics, obj, config.images, memo.classes, memo.slots,
                                   config.prometheus_url, config.node_cache)

    return changed


def deployment_counts_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a Deployment that status is computed from (kept per Deployment in memory, so kept small)."""
    meta = body.get("metadata", {})
    return {"metadata": {"name": meta.get("name"), "labels": dict(meta.get("labels") or {}),
                         "ownerReferences": [{"uid": r.get("uid")} for r in meta.get("ownerReferences") or []]},
            "spec": {"replicas": (body.get("spec") or {}).get("replicas", 1)},
            "status": copy.deepcopy(dict(body.get("status") or {}))}


async def _refresh_from_indexes(kube: KubeApi, key: refresh.Key, parents: Mapping[refresh.Key, Any],
                                deployments: Mapping[refresh.Key, Any], images: ImageDefaults,
                                classes: ClassIndex | None = None,
                                node_cache: NodeCache = DEFAULT_NODE_CACHE) -> None:
    for parent in list(parents.get(key, ())):
        meta = parent["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        owned = [d for d in deployments.get(key, ()) if is_owned_by(d, meta["uid"])]
        await refresh_status(kube, parent, deployments=owned, images=images, classes=classes,
                             node_cache=node_cache)
