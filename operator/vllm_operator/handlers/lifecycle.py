"""Lifecycle handlers: create, update and resume all run the same reconcile; owned Deployments update status.

Thin on purpose — the work is in `reconcile.py`. kopf's retry semantics: a refused spec is handled, not an error
(no retry until the spec changes; SpecValid=False and a Warning event say why, and the operator's log has one
WARNING line, not kopf's ERROR); API trouble is a TemporaryError with a delay. There is no on.delete handler, no
timer and no daemon: children go by ownerReference garbage collection, and the health checks are work-queue
requests (`health.py`), so nothing asks kopf for a finalizer and a VLLMDeployment is deleted at once, with or
without a running operator. Releases up to 2d3eb9d ran the health loop as a kopf timer, which put
`vllm-operator.dev/finalizer` on every object; `configure_settings` keeps that name as kopf's finalizer so that
kopf, which takes its finalizer off objects no handler needs it for, removes it from them on its first sight.

Everything goes through the one work queue (`queue.WorkQueue`): kopf's reconciles take a slot; a change of an owned
Deployment, seen by the operator's one Deployment watch (`watched.WatchedChildren`), requests its owner's coalesced
status refresh, or its reconcile when the Deployment was deleted. Both read the owner as kopf's watch last delivered
it (`watched.Parents`) and the Deployments from the watch: the refresh's only request is its status write.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

import kopf

from vllm_operator import constants
from vllm_operator.handlers import classes
from vllm_operator.handlers.classes import ClassIndex
from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.metrics import OperatorMetrics
from vllm_operator.handlers.reconcile import child_selector, reconcile, refresh_status
from vllm_operator.handlers.watched import ChangeListener, Key, key_of
from vllm_operator.k8s import KubeError

log = logging.getLogger(__name__)

RESOURCE = (constants.GROUP, constants.VERSION, constants.PLURAL)
WATCH_ID = "watched-vllmdeployment"
"""The `on.event` handler that keeps `watched.Parents` (every VLLMDeployment event runs it)."""


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


async def run_reconcile(memo: Any, config: OperatorConfig, body: Any, *, slot: bool = True) -> bool:
    """Reconcile one VLLMDeployment for a handler, in a slot of the memo's queue (`slot=False`: the caller holds
    one); True when children were written."""
    metrics: OperatorMetrics = memo.metrics
    if slot:
        queued = time.monotonic()
        async with memo.queue.slot():
            metrics.reconcile_wait.observe(time.monotonic() - queued)
            return await run_reconcile(memo, config, body, slot=False)
    try:
        outcome = await reconcile(memo.kube, body, config, memo.classes)
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
    """Attach the lifecycle handlers to `registry` (the memo must carry `kube`, `metrics`, `queue`, `parents` and
    `classes`)."""

    @kopf.on.startup(registry=registry)
    async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_settings(settings)

    @kopf.on.resume(*RESOURCE, registry=registry)
    @kopf.on.create(*RESOURCE, registry=registry)
    @kopf.on.update(*RESOURCE, field="spec", registry=registry)
    async def _reconcile(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await run_reconcile(memo, config, body)

    @kopf.on.event(*RESOURCE, id=WATCH_ID, registry=registry)
    async def _watched(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        # async: kopf runs a sync handler in a thread, beside the readers of `parents` on the loop
        memo.parents.observe(event.get("type"), body)

    if config.workload_classes:
        register_classes(registry, config)

    @kopf.on.cleanup(registry=registry)
    async def _cleanup(memo: kopf.Memo, **_: Any) -> None:
        await memo.queue.close()
        await memo.classes.close()


def child_listener(memo: Any, config: OperatorConfig) -> ChangeListener:
    """What a change of an owned Deployment (from the operator's one Deployment watch) asks of the queue: its owner's
    coalesced status refresh, or, when it was deleted, its owner's reconcile (which puts it back)."""

    def changed(event_type: str, deployment: dict[str, Any]) -> None:
        parent = memo.parents.owner(deployment)
        if parent is not None:
            what = "reconcile" if event_type == "DELETED" else "status refresh"
            if event_type == "DELETED":
                log.info("Deployment %s/%s of VLLMDeployment %s was deleted; queued its reconcile",
                         *key_of(deployment), parent["metadata"]["name"])
            memo.queue.request((what, *key_of(parent)), functools.partial(_queued, memo, config, what,
                                                                           key_of(parent)))

    return changed


async def _queued(memo: Any, config: OperatorConfig, what: str, key: Key) -> None:
    """A requested reconcile or status refresh (in its queue slot) of the VLLMDeployment as last watched; the
    refresh counts its Deployments as watched."""
    parent = memo.parents.objects.get(key)
    if parent is None or parent["metadata"].get("deletionTimestamp"):
        return
    if what == "reconcile":
        await run_reconcile(memo, config, parent, slot=False)
    else:
        await refresh_status(memo.kube, parent, config, memo.classes, children=memo.children)


CLASS_RESOURCE = (constants.GROUP, constants.VERSION, constants.CLASS_PLURAL)


def register_classes(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Watch VLLMWorkloadClasses: keep the index current and roll a changed class out to its dependents."""

    @kopf.on.event(*CLASS_RESOURCE, registry=registry)
    async def _class_changed(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        index: ClassIndex = memo.classes
        await index.load(memo.kube)
        name = body["metadata"]["name"]
        before = index.snapshot()
        if event.get("type") == "DELETED":
            old, new = index.forget(name), None
        else:
            old = index.observe(body)
            new = index.snapshot().get(name)
        if old is not None and new is not None and (old.generation, old.default) == (new.generation, new.default):
            return  # a resync or a metadata-only change: nothing to re-plan
        default_changed = bool((old and old.default) or (new and new.default))
        targets = classes.dependents(memo.parents.objects.values(), {name}, default_changed)
        if not targets:
            return
        what = "deleted" if event.get("type") == "DELETED" else (
            "created" if old is None else f"changed to generation {new.generation if new else '?'}")
        logging.getLogger(__name__).info("VLLMWorkloadClass %s was %s; re-planning %d VLLMDeployment(s) one at a "
                                         "time", name, what, len(targets))

        index.start_rollout(name, targets, before, _roll_out(memo, config, name, targets), memo.kube)

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
            index.resume(name, _roll_out(memo, config, name, targets, settle))


def _roll_out(memo: Any, config: OperatorConfig, name: str, targets: Sequence[Mapping[str, Any]],
              settle: Sequence[Mapping[str, Any]] = ()) -> Callable[[], Coroutine[Any, Any, None]]:
    """The roll-out of class `name` over `targets` (`classes.roll_out`); each dependent's reconcile goes through
    the queue, like every other."""
    return functools.partial(classes.roll_out, memo.classes, memo.kube, memo.children, name, targets,
                             functools.partial(run_reconcile, memo, config), child_selector,
                             config.class_rollout_timeout, settle)
