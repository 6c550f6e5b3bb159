"""The operator's informers: one watch per resource kind, shared by every reader (docs/architecture.md, Conventions).

- VLLMDeployments: kopf's own watch (kopf stays the framework: its create/update/resume handlers come from it). One
  `on.event` handler keeps the objects as last delivered in `Parents`, which the health checks, the coalesced
  status refresh and the deleted-child reconcile read.
- Engine pods, Deployments and PodDisruptionBudgets: `WatchedChildren`, list + watch. The health checks read them
  from here (and a class roll-out its dependent's Deployments while it waits for them), and a Deployment's change
  (`on_change`) requests its owner's coalesced status refresh, or its reconcile when it was deleted. Up to this
  change kopf watched Deployments too (for that refresh), unfiltered on the server: every Deployment of the cluster
  came to the operator twice.

Why a cache at all: every health check listed its engine pods, its pools' Deployments and their PDBs, three of the
four requests it sent. At 500 VLLMDeployments on the default 30 s interval that was ~50 LISTs/s in a converged
cluster (benchmarks/scale), on the 8 connections the reconciles wait for. Here each resource is listed once and the
API server sends only changes; a check reads memory.

- The watches select by label on the server (only the operator's children are sent; kopf's own watches filter on
  the operator's side), per watched namespace, or one cluster-wide when the operator watches every namespace.
- They run on a client of their own (`ClientKubeApi.sibling`): a watch holds its connection for minutes, and must
  not hold one of the few that requests share.
- A resource whose watch is not current (not listed yet, or failed and retrying) is read from the API as before:
  a check never acts on a cache that may have missed changes.
- Each kept object is a view of what its readers read (`health/snapshot.pod_facts`, `health/source.read_pools`,
  the status refresh's counts): metadata without managedFields, a pod's status but not its spec, a Deployment's
  `spec.replicas` and status, a PDB's `spec.maxUnavailable`. Whole objects cost 18 MiB more peak RSS at 100
  VLLMDeployments (benchmarks/scale).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vllm_operator import constants
from vllm_operator.k8s import DEPLOYMENTS, PDBS, PODS, KubeApi, Resource, changes, list_watch

log = logging.getLogger(__name__)

OWNED: dict[str, str] = {constants.LABEL_NAME: constants.APP_NAME}
"""The label every child carries."""


def child_view(obj: dict[str, Any], *, spec: str | None = None, status: bool = True) -> dict[str, Any]:
    """A child as its readers read it: identity and metadata without managedFields, `spec.<spec>` alone, and its
    status (a pod's: `pod_view`, no spec: the health loop reads its labels, timestamps and status)."""
    meta, whole = obj.get("metadata"), obj.get("spec")
    out = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
           "metadata": {k: v for k, v in meta.items() if k != "managedFields"} if isinstance(meta, Mapping) else {}}
    if spec is not None:
        out["spec"] = {spec: whole[spec]} if isinstance(whole, Mapping) and spec in whole else {}
    if status:
        out["status"] = obj.get("status") or {}
    return out


pod_view = child_view
deployment_view = functools.partial(child_view, spec="replicas")
pdb_view = functools.partial(child_view, spec="maxUnavailable", status=False)

Watched = tuple[Resource, Mapping[str, str], Callable[[dict[str, Any]], dict[str, Any]]]
WATCHED: tuple[Watched, ...] = (
    (PODS, {**OWNED, constants.LABEL_COMPONENT: constants.COMPONENT_ENGINE}, pod_view),
    (DEPLOYMENTS, OWNED, deployment_view),
    (PDBS, OWNED, pdb_view),
)
"""What the operator reads of its children: the labels each watch selects, and the view of each object it keeps."""

Key = tuple[str, str]
"""(namespace, name) of a VLLMDeployment."""
ChangeListener = Callable[[str, dict[str, Any]], None]
"""Told of every watch event of one resource: (ADDED | MODIFIED | DELETED, the object's view)."""


OWNED_DEPLOYMENTS = tuple(w for w in WATCHED if w[0] is DEPLOYMENTS)
"""What an operator without its health loop watches: the Deployments, for the status refresh."""


def watch_count(namespaces: Sequence[str], watched: Sequence[Watched] = WATCHED) -> int:
    """Watches `WatchedChildren` keeps: one per resource and scope (each watched namespace, or the cluster)."""
    return len(watched) * max(1, len(namespaces))


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


class Parents:
    """The VLLMDeployments as kopf's watch last delivered them (the one watch of the kind), by (namespace, name).

    Fed by one kopf `on.event` handler; read by the health checks (which objects to check, and the object a check
    reads), the coalesced status refresh and the deleted-child reconcile. Kept by reference: kopf parses each event
    afresh, so nothing is copied.
    """

    def __init__(self) -> None:
        self.objects: dict[Key, Mapping[str, Any]] = {}
        self.listeners: list[Callable[[Key], None]] = []
        """Told the key of every object observed (the health checks start an object's schedule from here)."""

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        key = key_of(body)
        if event_type == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = dict(body)
        for listener in self.listeners:
            listener(key)

    def owner(self, child: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The watched VLLMDeployment that owns `child` (by its ownerReference's name and uid), unless it is being
        deleted (then its children go by garbage collection and nothing is refreshed)."""
        meta = child.get("metadata") or {}
        for ref in meta.get("ownerReferences") or ():
            if ref.get("kind") != constants.KIND:
                continue
            parent = self.objects.get((str(meta.get("namespace")), str(ref.get("name"))))
            if parent is not None and parent["metadata"].get("uid") == ref.get("uid") \
                    and not parent["metadata"].get("deletionTimestamp"):
                return parent
        return None


def selector_text(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def equality_selector(text: str | None) -> dict[str, str] | None:
    """`k=v,k2=v2` as a dict; None for anything else (set-based terms, `!=`, `!k`), which only the API server
    evaluates here. The operator's own selectors are all equalities; no Python library parses the selector
    grammar without a Kubernetes client's models, and equality is all a cache lookup needs."""
    if not text:
        return {}
    out: dict[str, str] = {}
    for term in text.split(","):
        key, sep, value = term.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or value.startswith("=") or key.endswith("!") or any(c in key for c in " ()"):
            return None
        out[key] = value
    return out


class WatchedChildren:
    """`list(res, namespace, label_selector)` from memory where a current watch covers it, else from the API.

    `run()` keeps one list+watch per resource and scope until cancelled; `namespaces` empty means cluster-wide.
    """

    def __init__(self, kube: KubeApi, watcher: KubeApi, namespaces: Sequence[str] = (), *,
                 watched: Sequence[Watched] = WATCHED, retry_seconds: float = 2.0, max_retry_seconds: float = 30.0,
                 on_api_list: Callable[[], None] = lambda: None) -> None:
        self._kube = kube
        self._watcher = watcher
        self._scopes: tuple[str | None, ...] = tuple(namespaces) or (None,)
        self._retry = retry_seconds
        self._max_retry = max_retry_seconds
        self._current: dict[tuple[str, str | None], dict[str, dict[str, Any]]] = {}
        self._watched = tuple(watched)
        self._labels = {res.plural: labels for res, labels, _ in self._watched}
        self._on_api_list = on_api_list
        """Called for each LIST sent to the API server for a reader (a watch was not current, or did not cover it)."""
        self._listeners: dict[str, list[ChangeListener]] = {}

    def on_change(self, res: Resource, listener: ChangeListener) -> None:
        """Tell `listener` of every change of `res` the watches see (not of the first list: what exists at start is
        what kopf's resume reconciles anyway)."""
        self._listeners.setdefault(res.plural, []).append(listener)

    @property
    def current_watches(self) -> int:
        return len(self._current)

    def current(self, res: Resource, namespace: str | None) -> bool:
        """Whether a reader of `res` in `namespace` is served from memory."""
        return self._entry(res, namespace) is not None

    def _entry(self, res: Resource, namespace: str | None) -> dict[str, dict[str, Any]] | None:
        if self._scopes == (None,):
            return self._current.get((res.plural, None))
        return self._current.get((res.plural, namespace)) if namespace is not None else None

    async def list(self, res: Resource, namespace: str | None, label_selector: str | None = None
                   ) -> list[dict[str, Any]]:
        wanted = equality_selector(label_selector)
        labels = self._labels.get(res.plural)
        objects = self._entry(res, namespace)
        if objects is None or wanted is None or labels is None or any(wanted.get(k) != v for k, v in labels.items()):
            self._on_api_list()
            return await self._kube.list(res, namespace, label_selector)
        out = []
        for obj in objects.values():
            meta = obj.get("metadata") or {}
            have = meta.get("labels") or {}
            if (namespace is None or meta.get("namespace") == namespace) and all(
                    have.get(k) == v for k, v in wanted.items()):
                out.append(obj)
        return out

    async def run(self) -> None:
        """Every watch until cancelled; each retries on its own."""
        await asyncio.gather(*(self._keep(res, labels, view, scope) for res, labels, view in self._watched
                               for scope in self._scopes))

    async def _keep(self, res: Resource, labels: Mapping[str, str], view: Callable[[dict[str, Any]], dict[str, Any]],
                    scope: str | None) -> None:
        key = (res.plural, scope)
        where = f"namespace {scope}" if scope else "all namespaces"
        delay = self._retry
        listeners = self._listeners.setdefault(res.plural, [])  # the list on_change adds to, also later

        def changed(event_type: str, obj: dict[str, Any]) -> None:
            for listener in listeners:
                listener(event_type, obj)

        known: dict[str, dict[str, Any]] | None = None  # what the last watch had seen: a relist tells the difference
        while True:
            try:
                try:
                    async for objects in list_watch(self._watcher, res, scope, label_selector=selector_text(labels),
                                                    transform=view, on_event=changed):
                        if key not in self._current:
                            log.info("Listed %d %s in %s; the operator reads them from the watch", len(objects),
                                     res.plural, where)
                            if known is not None and listeners:
                                changes(known, objects, changed)
                        self._current[key] = known = objects
                        delay = self._retry
                finally:
                    self._current.pop(key, None)
            except Exception as err:
                log.warning("The watch of %s in %s failed (%s); the health loop lists them from the API until it "
                            "is back (retried in %.0f s)", res.plural, where, err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_retry)


__all__ = ["OWNED_DEPLOYMENTS", "WATCHED", "Parents", "WatchedChildren", "deployment_view", "equality_selector",
           "pdb_view", "pod_view", "selector_text", "watch_count"]
