"""Workload classes in the operator: the cluster's VLLMWorkloadClasses in memory, and a class edit rolled out to the
VLLMDeployments that use it one at a time.

Why an index of our own rather than a read per plan: every status refresh re-plans, and the refresh is built to cost
one status PATCH; a class read there would add a request per Deployment event. The index lists the classes once
(lazily, so an operator on a cluster without the class CRD just plans from the built-in table) and is then kept
current by kopf's watch (`observe`/`forget`).

Why pinning: a class edit re-plans each dependent in turn, and waits for its engines to roll out before the next
(an edit that breaks serving then takes down one deployment, not all). Until its turn a dependent keeps planning with
the class as it was — so a status refresh, a health check or its own spec edit does not roll it early.

Why the pins are persisted, and in an annotation: they lived in memory, so an operator restarted mid-roll-out
re-planned every dependent still waiting at once (its resume handlers saw only the edited class). Each pin is now
also the annotation `vllm-operator.dev/workload-class-pin` on its VLLMDeployment: the class it resolved to before
the edit, whole (the API server keeps only the edited class, so a reference would not do). At start the operator
lists the watched VLLMDeployments once, loads their pins before any handler runs, and resumes each class's roll-out
over the dependents still pinned. An annotation rather than a status field: the pin is an input to planning, not an
observation; status is rewritten from the plan by the one status writer (a diff with nulls) and a field it did not
recompute would be deleted, and the CRD would need a schema for a whole class under status. The pin is written by a
merge patch of metadata alone when the roll-out starts, and removed the same way at the dependent's turn, before it
re-plans (a pin that could not be removed keeps the dependent pinned, rather than re-pinning it to the old class at
the next start).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from vllm_operator import constants
from vllm_operator.api.errors import SpecError
from vllm_operator.api.resource import parse_resource
from vllm_operator.api.spec import VLLMDeploymentSpec
from vllm_operator.health.source import Lister
from vllm_operator.k8s import DEPLOYMENTS, VLLM_DEPLOYMENTS, WORKLOAD_CLASSES, KubeApi, KubeError
from vllm_operator.planning import profiles, resolve_class

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name) of a VLLMDeployment
Reconcile = Callable[[Mapping[str, Any]], Awaitable[bool]]
"""Reconcile one VLLMDeployment; True when it changed children (the roll-out then waits for them)."""

NO_READER = ("the operator may not read VLLMWorkloadClasses ({why}); only the built-in classes ({builtins}) can be "
             "used: grant list/watch on vllmworkloadclasses (chart value rbac.workloadClassReader: true)")


class Pin:
    """A dependent's class until its turn: `for_class` is the spec's workloadClass when it was pinned (None: the
    default), `profile` the class it resolved to then (None: it did not resolve, so it plans with the current
    classes and only its turn is kept, in memory)."""

    def __init__(self, for_class: str | None, profile: profiles.NamedClass | None) -> None:
        self.for_class = for_class
        self.profile = profile

    def annotation(self) -> str:
        """The class whole, as `profiles.parse_class` reads it back (name, generation and spec), or only its name
        for a built-in from the table (no generation)."""
        klass = self.profile
        assert klass is not None, "a turn without a class is not persisted"
        obj = None if klass.generation is None else {
            "metadata": {"name": klass.name, "generation": klass.generation}, "spec": klass.spec.to_wire()}
        return json.dumps({"for": self.for_class, "class": klass.name, "object": obj}, sort_keys=True,
                          separators=(",", ":"))

    @classmethod
    def parse(cls, text: str) -> Pin:
        """The annotation back; ValueError when it is not one (edited by hand)."""
        try:
            data = json.loads(text)
            obj = data.get("object")
            profile = profiles.parse_class(obj) if obj is not None else profiles.builtin(str(data["class"]))
        except (ValueError, KeyError, TypeError, AttributeError, ValidationError) as err:
            raise ValueError(f"not a workload-class pin: {err}") from err
        return cls(data.get("for"), profile)


class ClassIndex:
    """The VLLMWorkloadClasses by name, with the per-dependent pins of a roll-out in progress."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._classes: dict[str, profiles.NamedClass] = {}
        self._broken: dict[str, str] = {}  # stored objects that do not parse (written before a CRD upgrade)
        self._pinned: dict[Key, Pin] = {}
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

    def observe(self, obj: Mapping[str, Any]) -> profiles.NamedClass | None:
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

    def forget(self, name: str) -> profiles.NamedClass | None:
        self._broken.pop(name, None)
        return self._classes.pop(name, None)

    def snapshot(self) -> dict[str, profiles.NamedClass]:
        return dict(self._classes)

    def pin(self, obj: Mapping[str, Any], before: Mapping[str, profiles.NamedClass]) -> Pin | None:
        """Pin a dependent (in memory) to the class it resolves to among `before`; a dependent already pinned keeps
        its older pin, and one that did not resolve before keeps only its turn (it plans with the current classes at
        once: it had no plan to keep). Returns the new pin when it is to be persisted."""
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        if key in self._pinned:
            return None
        try:
            spec = parse_resource(dict(obj)).spec
        except SpecError:
            self._pinned[key] = Pin(None, None)
            return None
        try:
            profile = resolve_class(spec, before)
        except SpecError:
            self._pinned[key] = Pin(spec.workload_class, None)
            return None
        pin = self._pinned[key] = Pin(spec.workload_class, profile)
        return pin

    def restore(self, obj: Mapping[str, Any]) -> str | None:
        """Load the pin a VLLMDeployment carries (operator start); the pinned class's name, None when unpinned."""
        meta = obj["metadata"]
        text = (meta.get("annotations") or {}).get(constants.ANNOTATION_CLASS_PIN)
        if text is None:
            return None
        try:
            pin = Pin.parse(text)
        except ValueError as err:
            log.warning("Ignored the %s annotation of VLLMDeployment %s/%s: %s", constants.ANNOTATION_CLASS_PIN,
                        meta["namespace"], meta["name"], err)
            return None
        self._pinned[(meta["namespace"], meta["name"])] = pin
        return pin.profile.name if pin.profile is not None else None

    def unpin(self, key: Key) -> None:
        self._pinned.pop(key, None)

    def pinned(self, key: Key) -> bool:
        return key in self._pinned

    async def resolve(self, kube: KubeApi, key: Key, spec: VLLMDeploymentSpec) -> profiles.NamedClass:
        """The class a VLLMDeployment plans with; SpecError naming spec.workloadClass when it cannot be had."""
        name = spec.workload_class
        if not self.enabled or self._forbidden:
            if name is not None and profiles.is_builtin(name):
                return profiles.builtin(name)
            why = self._forbidden or "started with --no-workload-classes"
            raise SpecError("spec.workloadClass", ("unset: " if name is None else f"{name!r}: ") +
                            NO_READER.format(why=why, builtins=", ".join(c.value for c in profiles.BUILTINS)))
        await self.load(kube)
        if self._forbidden:
            return await self.resolve(kube, key, spec)
        if name is not None and name in self._broken:
            raise SpecError("spec.workloadClass", f"VLLMWorkloadClass {name} is invalid: {self._broken[name]}")
        pin = self._pinned.get(key)
        # a spec that names another class than it did when pinned plans with that one, at once
        if pin is not None and pin.profile is not None and spec.workload_class == pin.for_class:
            return pin.profile
        return resolve_class(spec, self._classes)

    # --- roll-out ---------------------------------------------------------------------------------------------

    def start_rollout(self, name: str, dependents: Sequence[Mapping[str, Any]], before: Mapping[str, Any],
                      run: Callable[[], Coroutine[Any, Any, None]], kube: KubeApi) -> None:
        """Pin each dependent to its class as it was `before` the edit (in memory at once, so no handler re-plans
        it early), then persist the new pins and run the roll-out, replacing one in progress for the same class (its
        dependents still pinned stay on their older classes until their turn)."""
        pins = [(dep, pin) for dep in dependents if (pin := self.pin(dep, before)) is not None]

        async def persist_then_run() -> None:
            await asyncio.gather(*(write_pin(kube, dep, pin) for dep, pin in pins))
            await run()

        self.resume(name, persist_then_run)

    def resume(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run a roll-out for class `name`, replacing one in progress."""
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


async def write_pin(kube: KubeApi, obj: Mapping[str, Any], pin: Pin | None) -> dict[str, Any] | None:
    """Persist a pin (None: remove it) on the VLLMDeployment, by a merge patch of its annotations alone, conditional
    on its uid (a same-named successor is not pinned); the object as written. None, logged, when the object is gone
    or the write failed."""
    meta = obj["metadata"]
    value = pin.annotation() if pin is not None else None
    try:
        return await kube.patch(VLLM_DEPLOYMENTS, meta["namespace"], meta["name"], {"metadata": {
            "uid": meta.get("uid"), "annotations": {constants.ANNOTATION_CLASS_PIN: value}}})
    except KubeError as err:
        log.warning("Could not %s the workload-class pin of VLLMDeployment %s/%s: %s",
                    "write" if pin is not None else "remove", meta["namespace"], meta["name"], err)
        return None


async def restore_pins(index: ClassIndex, kube: KubeApi, namespaces: Sequence[str]
                       ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Load the persisted pins of the watched VLLMDeployments (operator start): the pinned ones by class name, in
    the order a roll-out takes them, and the unpinned ones (among them the dependent whose turn it was)."""
    pinned: dict[str, list[dict[str, Any]]] = {}
    unpinned: list[dict[str, Any]] = []
    scopes: list[str | None] = list(namespaces) if namespaces else [None]
    for ns in scopes:
        for obj in await kube.list(VLLM_DEPLOYMENTS, ns):
            if obj["metadata"].get("deletionTimestamp"):
                continue
            name = index.restore(obj)
            if name is not None:
                pinned.setdefault(name, []).append(obj)
            else:
                unpinned.append(obj)
    for objs in (*pinned.values(), unpinned):
        objs.sort(key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))
    return pinned, unpinned


def depends_on(obj: Mapping[str, Any], names: set[str], default_changed: bool) -> bool:
    """True when a VLLMDeployment names one of `names`, or names none while which class is default may differ."""
    named = (obj.get("spec") or {}).get("workloadClass")
    return named in names if named else default_changed


def dependents(watched: Iterable[Mapping[str, Any]], names: set[str], default_changed: bool,
               ) -> list[Mapping[str, Any]]:
    """The VLLMDeployments the class edit concerns, among the watched ones, in a stable order (namespace, name)."""
    found = [o for o in watched if not o["metadata"].get("deletionTimestamp") and depends_on(o, names, default_changed)]
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


async def wait_rolled_out(children: Lister, namespace: str, dependent: str, selector: Callable[[str], str],
                          name: str, timeout: float, poll: float = 1.0) -> None:
    """Wait up to `timeout` for the Deployments of `dependent` (`selector`) to roll out after class `name` changed
    (a warning if they did not; the roll-out goes on), read every `poll` seconds from `children`: the operator's
    Deployment watch (`watched.WatchedChildren`), so waiting costs no request; up to issue 39 it LISTed them from
    the API server every second of every dependent's roll-out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not rolled_out(await children.list(DEPLOYMENTS, namespace, selector(dependent))):
        if loop.time() >= deadline:
            log.warning("VLLMDeployment %s/%s did not roll out within %.0f s after VLLMWorkloadClass %s changed; "
                        "went on with the next dependent", namespace, dependent, timeout, name)
            return
        await asyncio.sleep(poll)


async def roll_out(index: ClassIndex, kube: KubeApi, children: Lister, name: str,
                   targets: Sequence[Mapping[str, Any]], reconcile: Reconcile, selector: Callable[[str], str],
                   timeout: float, settle: Sequence[Mapping[str, Any]] = ()) -> None:
    """Re-plan each dependent in turn: unpin it, reconcile it (a refused plan leaves its children as they were and
    says why on it), and wait for its engines to roll out before the next one, reading its Deployments from
    `children` (the operator's watch). `settle`: dependents re-planned already (a resumed roll-out's: the one whose
    turn it was when the operator stopped) to wait for first."""
    for obj in settle:
        await wait_rolled_out(children, obj["metadata"]["namespace"], obj["metadata"]["name"], selector, name, timeout)
    for obj in targets:
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        if not index.pinned(key):
            continue  # already re-planned by a newer roll-out
        try:
            fresh = await kube.get(VLLM_DEPLOYMENTS, key[0], key[1])
            if fresh is None:
                index.unpin(key)
                continue
            unpinned: Mapping[str, Any] | None = fresh
            if constants.ANNOTATION_CLASS_PIN in (fresh["metadata"].get("annotations") or {}):
                unpinned = await write_pin(kube, fresh, None)
            if unpinned is None:
                continue  # still pinned, in memory and on the object: re-planned when the pin can be removed
            index.unpin(key)
            changed = await reconcile(unpinned)
        except Exception as err:
            log.warning("Could not re-plan VLLMDeployment %s/%s for VLLMWorkloadClass %s (its own handlers retry "
                        "on their next event): %s", *key, name, err)
            continue
        if not changed:
            continue
        log.info("Re-planned VLLMDeployment %s/%s for VLLMWorkloadClass %s; waiting for it to roll out", *key, name)
        await wait_rolled_out(children, *key, selector, name, timeout)
    log.info("Rolled VLLMWorkloadClass %s out to %d VLLMDeployment(s)", name, len(targets))


__all__ = ["ClassIndex", "Pin", "constants", "dependents", "restore_pins", "roll_out", "rolled_out", "write_pin"]
