"""Workload classes in the operator: the cluster's VLLMWorkloadClasses in memory, and a class edit rolled out to the
VLLMDeployments that use it one at a time.

Why an index of our own rather than a read per plan: every status refresh re-plans, and the refresh is built to cost
one status PATCH; a class read there would add a request per Deployment event. The index lists the classes once
(lazily, so an operator on a cluster without the class CRD just plans from the built-in table) and is then kept
current by kopf's watch (`observe`/`forget`).

Why pinning: a class edit re-plans each dependent in turn, and waits for its engines to roll out before the next
(an edit that breaks serving then takes down one deployment, not all). Until its turn a dependent keeps planning with
the classes as they were — so a status refresh, a health check or its own spec edit does not roll it early.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from vllm_operator import constants
from vllm_operator.api.errors import SpecError
from vllm_operator.api.spec import VLLMDeploymentSpec
from vllm_operator.k8s import DEPLOYMENTS, VLLM_DEPLOYMENTS, WORKLOAD_CLASSES, KubeApi, KubeError
from vllm_operator.planning import profiles, resolve_class

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name) of a VLLMDeployment
Reconcile = Callable[[Mapping[str, Any]], Awaitable[bool]]
"""Reconcile one VLLMDeployment; True when it changed children (the roll-out then waits for them)."""

NO_READER = ("the operator may not read VLLMWorkloadClasses ({why}); only the built-in classes ({builtins}) can be "
             "used: grant list/watch on vllmworkloadclasses (chart value rbac.workloadClassReader: true)")


def _builtins() -> str:
    return ", ".join(c.value for c in profiles.PROFILES)


class ClassIndex:
    """The VLLMWorkloadClasses by name, with the per-dependent pins of a roll-out in progress."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._classes: dict[str, profiles.ClassProfile] = {}
        self._broken: dict[str, str] = {}  # stored objects that do not parse (written before a CRD upgrade)
        self._pinned: dict[Key, dict[str, profiles.ClassProfile]] = {}
        self._loaded = False
        self._forbidden: str | None = None
        self._load_lock = asyncio.Lock()
        self._rollouts: dict[str, asyncio.Task[None]] = {}

    async def load(self, kube: KubeApi) -> None:
        """List the classes once (a missing CRD means none; 403 is remembered and reported per dependent)."""
        if self._loaded or not self.enabled:
            return
        async with self._load_lock:
            if self._loaded:
                return
            try:
                items = await kube.list(WORKLOAD_CLASSES, None)
            except KubeError as err:
                if err.status == 403:
                    self._forbidden = "list vllmworkloadclasses was denied"
                    items = []
                elif err.status == 404:
                    items = []  # the class CRD is not installed: the built-in table serves
                else:
                    raise
            for item in items:
                self.observe(item)
            self._loaded = True

    def observe(self, obj: Mapping[str, Any]) -> profiles.ClassProfile | None:
        """Record a class as the watch delivered it; returns the profile it replaced (None when new)."""
        raw = copy.deepcopy(dict(obj))  # a kopf Body is a live view; the index keeps plain data
        name = str(raw.get("metadata", {}).get("name", ""))
        old = self._classes.get(name)
        try:
            self._classes[name] = profiles.parse_class(raw)
            self._broken.pop(name, None)
        except ValidationError as err:
            self._classes.pop(name, None)
            first = err.errors()[0]
            self._broken[name] = f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
        return old

    def forget(self, name: str) -> profiles.ClassProfile | None:
        self._broken.pop(name, None)
        return self._classes.pop(name, None)

    def snapshot(self) -> dict[str, profiles.ClassProfile]:
        return dict(self._classes)

    def pin(self, key: Key, classes: Mapping[str, profiles.ClassProfile]) -> None:
        self._pinned.setdefault(key, dict(classes))

    def unpin(self, key: Key) -> None:
        self._pinned.pop(key, None)

    def pinned(self, key: Key) -> bool:
        return key in self._pinned

    async def resolve(self, kube: KubeApi, key: Key, spec: VLLMDeploymentSpec) -> profiles.ClassProfile:
        """The class a VLLMDeployment plans with; SpecError naming spec.workloadClass when it cannot be had."""
        name = spec.workload_class
        if not self.enabled or self._forbidden:
            if name is not None and profiles.is_builtin(name):
                return profiles.profile(name)
            why = self._forbidden or "started with --no-workload-classes"
            raise SpecError("spec.workloadClass", ("unset: " if name is None else f"{name!r}: ") +
                            NO_READER.format(why=why, builtins=_builtins()))
        await self.load(kube)
        if self._forbidden:
            return await self.resolve(kube, key, spec)
        if name is not None and name in self._broken:
            raise SpecError("spec.workloadClass", f"VLLMWorkloadClass {name} is invalid: {self._broken[name]}")
        return resolve_class(spec, self._pinned.get(key, self._classes))

    # --- roll-out ---------------------------------------------------------------------------------------------

    def start_rollout(self, name: str, dependents: Sequence[Mapping[str, Any]], before: Mapping[str, Any],
                      run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Pin each dependent to the classes `before` the edit, then run the roll-out, replacing one in progress for
        the same class (its dependents still pinned stay on their older classes until their turn)."""
        for dep in dependents:
            meta = dep["metadata"]
            self.pin((meta["namespace"], meta["name"]), before)
        previous = self._rollouts.pop(name, None)
        if previous is not None:
            previous.cancel()
        self._rollouts[name] = asyncio.create_task(run(), name=f"workload-class-rollout-{name}")

    async def close(self) -> None:
        tasks = list(self._rollouts.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._rollouts.clear()


def depends_on(obj: Mapping[str, Any], names: set[str], default_changed: bool) -> bool:
    """True when a VLLMDeployment names one of `names`, or names none while which class is default may differ."""
    named = (obj.get("spec") or {}).get("workloadClass")
    return named in names if named else default_changed


async def dependents(kube: KubeApi, namespaces: Sequence[str], names: set[str], default_changed: bool,
                     ) -> list[dict[str, Any]]:
    """The VLLMDeployments the class edit concerns, in a stable order (namespace, name)."""
    found: list[dict[str, Any]] = []
    scopes: list[str | None] = list(namespaces) if namespaces else [None]
    for ns in scopes:
        found += [o for o in await kube.list(VLLM_DEPLOYMENTS, ns)
                  if not o["metadata"].get("deletionTimestamp") and depends_on(o, names, default_changed)]
    return sorted(found, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))


def rolled_out(deployments: Sequence[Mapping[str, Any]]) -> bool:
    """Every Deployment has observed its latest spec and runs only updated, ready replicas."""
    for d in deployments:
        want = (d.get("spec") or {}).get("replicas", 1)
        st = d.get("status") or {}
        if st.get("observedGeneration", 0) < d["metadata"].get("generation", 0):
            return False
        if st.get("updatedReplicas", 0) < want or st.get("readyReplicas", 0) < want or st.get("replicas", 0) > want:
            return False
    return True


async def wait_rolled_out(kube: KubeApi, namespace: str, selector: str, timeout: float, poll: float = 1.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if rolled_out(await kube.list(DEPLOYMENTS, namespace, selector)):
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(poll)


async def roll_out(index: ClassIndex, kube: KubeApi, name: str, targets: Sequence[Mapping[str, Any]],
                   reconcile: Reconcile, selector: Callable[[str], str], timeout: float) -> None:
    """Re-plan each dependent in turn: unpin it, reconcile it (a refused plan leaves its children as they were and
    says why on it), and wait for its engines to roll out before the next one."""
    for obj in targets:
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        if not index.pinned(key):
            continue  # already re-planned by a newer roll-out
        index.unpin(key)
        try:
            fresh = await kube.get(VLLM_DEPLOYMENTS, key[0], key[1])
            changed = fresh is not None and await reconcile(fresh)
        except Exception as err:
            log.warning("Could not re-plan VLLMDeployment %s/%s for VLLMWorkloadClass %s (its own handlers retry "
                        "on their next event): %s", *key, name, err)
            continue
        if not changed:
            continue
        log.info("Re-planned VLLMDeployment %s/%s for VLLMWorkloadClass %s; waiting for it to roll out", *key, name)
        if not await wait_rolled_out(kube, key[0], selector(key[1]), timeout):
            log.warning("VLLMDeployment %s/%s did not roll out within %.0f s after VLLMWorkloadClass %s changed; "
                        "went on with the next dependent", *key, timeout, name)
    log.info("Rolled VLLMWorkloadClass %s out to %d VLLMDeployment(s)", name, len(targets))


__all__ = ["ClassIndex", "constants", "dependents", "roll_out", "rolled_out"]
