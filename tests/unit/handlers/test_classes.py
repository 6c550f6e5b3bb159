"""The operator's class index without a cluster: the message when classes may not be read, broken stored objects,
who depends on a class edit, and when a dependent counts as rolled out (the roll-out waits on it)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest
import yaml

from tests.support.fakekube import FakeCluster, FakeKubeApi
from tests.support.paths import ROOT
from tests.support.waiting import eventually
from vllm_operator import constants
from vllm_operator.api.errors import SpecError
from vllm_operator.api.resource import parse_resource
from vllm_operator.handlers.classes import (
    ClassIndex,
    Pin,
    dependents,
    depends_on,
    restore_pins,
    roll_out,
    rolled_out,
)
from vllm_operator.handlers.reconcile import child_selector
from vllm_operator.handlers.watched import OWNED, OWNED_DEPLOYMENTS, WatchedChildren
from vllm_operator.k8s import DEPLOYMENTS, VLLM_DEPLOYMENTS, KubeApi, Resource
from vllm_operator.planning.profiles import NamedClass

CHAT = parse_resource(yaml.safe_load((ROOT / "examples" / "chat.yaml").read_text())).spec
AGENT = yaml.safe_load((ROOT / "examples" / "classes" / "agent.yaml").read_text())
NO_KUBE: KubeApi = None  # type: ignore[assignment]  # a disabled or loaded index sends no request


async def test_without_the_class_reader_builtins_plan_and_other_names_are_refused_naming_the_value() -> None:
    index = ClassIndex(enabled=False)
    assert (await index.resolve(NO_KUBE, ("ml", "chat"), CHAT)).name == "chat"
    with pytest.raises(SpecError) as err:
        await index.resolve(NO_KUBE, ("ml", "chat"), CHAT.model_copy(update={"workload_class": "agent"}))
    assert err.value.field == "spec.workloadClass"
    assert "'agent'" in err.value.message and "rbac.workloadClassReader" in err.value.message


async def test_observed_classes_resolve_and_a_broken_one_is_named() -> None:
    index = ClassIndex()
    index._loaded = True  # as after the first list
    index.observe({**AGENT, "metadata": {"name": "agent", "generation": 3}})
    klass = await index.resolve(NO_KUBE, ("ml", "a"), CHAT.model_copy(update={"workload_class": "agent"}))
    assert (klass.name, klass.generation, klass.pool("short").max_model_len) == ("agent", 3, 12288)
    broken: dict[str, Any] = yaml.safe_load(yaml.safe_dump(AGENT))
    broken["spec"]["pools"]["short"]["maxTokens"] = 99999
    index.observe(broken)
    with pytest.raises(SpecError, match=r"VLLMWorkloadClass agent is invalid: .*maxTokens"):
        await index.resolve(NO_KUBE, ("ml", "a"), CHAT.model_copy(update={"workload_class": "agent"}))


def agent(generation: int, max_model_len: int = 12288) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(yaml.safe_dump(AGENT))
    doc["metadata"] = {"name": "agent", "generation": generation}
    doc["spec"]["pools"]["short"]["maxModelLen"] = max_model_len
    if max_model_len < 12288:
        doc["spec"]["promptLengthThreshold"] = max_model_len - 1024
    return doc


def dependent(name: str, workload_class: str | None = "agent") -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "chat.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": "ml"}
    if workload_class:
        doc["spec"]["workloadClass"] = workload_class
    return doc


async def agent_edited(api: FakeKubeApi) -> tuple[ClassIndex, dict[str, NamedClass], list[Mapping[str, Any]]]:
    """An index that has seen class `agent` at generation 1 and then its edit to generation 2 (maxModelLen 8192):
    the index, its snapshot before the edit, and the edit's dependents among `api`'s objects in ml."""
    index = ClassIndex()
    index._loaded = True  # as after the first list
    index.observe(agent(1))
    before = index.snapshot()
    index.observe(agent(2, 8192))
    return index, before, dependents(await api.list(VLLM_DEPLOYMENTS, "ml"), {"agent"}, False)


async def test_a_pinned_dependent_keeps_the_class_it_had() -> None:
    index = ClassIndex()
    index._loaded = True
    index.observe(agent(1))
    index.pin(dependent("b"), index.snapshot())
    index.observe(agent(2, 8192))
    spec = CHAT.model_copy(update={"workload_class": "agent"})
    assert (await index.resolve(NO_KUBE, ("ml", "b"), spec)).generation == 1
    assert (await index.resolve(NO_KUBE, ("ml", "a"), spec)).generation == 2
    other = CHAT.model_copy(update={"workload_class": "chat"})
    assert (await index.resolve(NO_KUBE, ("ml", "b"), other)).name == "chat", "re-pointed by its spec: no pin"
    index.unpin(("ml", "b"))
    assert (await index.resolve(NO_KUBE, ("ml", "b"), spec)).generation == 2


async def test_pins_are_persisted_on_the_objects_and_a_restarted_index_plans_with_them() -> None:
    """The roll-out pins each dependent on the object (annotation), so an operator that restarts mid-roll-out loads
    them before planning and resumes over the ones still pinned; each turn removes the pin before re-planning."""
    api = FakeKubeApi()
    for name in ("a", "b"):
        await api.create(VLLM_DEPLOYMENTS, "ml", dependent(name))
    await api.create(VLLM_DEPLOYMENTS, "ml", dependent("c", "chat"))  # another class: not a dependent
    index, before, targets = await agent_edited(api)
    assert [t["metadata"]["name"] for t in targets] == ["a", "b"]
    started = asyncio.Event()

    async def hold() -> None:
        started.set()
        await asyncio.Event().wait()  # the operator stops here, mid-roll-out

    index.start_rollout("agent", targets, before, hold, api)
    await started.wait()
    await index.close()
    for name in ("a", "b"):
        stored = await api.get(VLLM_DEPLOYMENTS, "ml", name)
        assert stored is not None and constants.ANNOTATION_CLASS_PIN in stored["metadata"]["annotations"]

    restarted = ClassIndex()  # a new operator: nothing in memory
    restarted._loaded = True
    restarted.observe(agent(2, 8192))
    pinned, unpinned = await restore_pins(restarted, api, ["ml"])
    assert [o["metadata"]["name"] for o in pinned["agent"]] == ["a", "b"]
    assert [o["metadata"]["name"] for o in unpinned] == ["c"]
    spec = CHAT.model_copy(update={"workload_class": "agent"})
    klass = await restarted.resolve(NO_KUBE, ("ml", "b"), spec)
    assert (klass.generation, klass.pool("short").max_model_len) == (1, 12288), "planned as before the edit"

    planned: list[tuple[str, int | None]] = []

    async def reconcile(obj: Any) -> bool:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        assert constants.ANNOTATION_CLASS_PIN not in (obj["metadata"].get("annotations") or {})
        planned.append((key[1], (await restarted.resolve(NO_KUBE, key, spec)).generation))
        return False

    await roll_out(restarted, api, api, "agent", pinned["agent"], reconcile, lambda n: f"x={n}", timeout=1)
    assert planned == [("a", 2), ("b", 2)]
    for name in ("a", "b"):
        stored = await api.get(VLLM_DEPLOYMENTS, "ml", name)
        assert stored is not None and constants.ANNOTATION_CLASS_PIN not in stored["metadata"].get("annotations", {})


def test_a_pin_annotation_round_trips_and_a_hand_edited_one_is_refused() -> None:
    index = ClassIndex()
    index.observe(agent(4))
    pin = index.pin(dependent("b"), index.snapshot())
    assert pin is not None
    back = Pin.parse(pin.annotation())
    assert back.profile == pin.profile and back.for_class == "agent"
    builtin = index.pin(dependent("c", "chat"), index.snapshot())
    assert builtin is not None and Pin.parse(builtin.annotation()).profile.name == "chat"
    with pytest.raises(ValueError, match="not a workload-class pin"):
        Pin.parse('{"class": "nonexistent-class", "object": null}')


def test_dependents_and_roll_out_state() -> None:
    named = {"spec": {"workloadClass": "agent"}}
    unnamed: dict[str, Any] = {"spec": {}}
    assert depends_on(named, {"agent"}, False) and not depends_on(named, {"chat"}, True)
    assert depends_on(unnamed, {"agent"}, True) and not depends_on(unnamed, {"agent"}, False)

    def dep(generation: int, observed: int, replicas: int, updated: int, ready: int, total: int) -> dict[str, Any]:
        return {"metadata": {"generation": generation}, "spec": {"replicas": replicas},
                "status": {"observedGeneration": observed, "updatedReplicas": updated, "readyReplicas": ready,
                           "replicas": total}}

    assert rolled_out([dep(2, 2, 1, 1, 1, 1), dep(1, 1, 2, 2, 2, 2)])
    assert not rolled_out([dep(2, 1, 1, 1, 1, 1)])  # the controller has not seen the new template yet
    assert not rolled_out([dep(2, 2, 2, 1, 2, 2)])  # one old pod left
    assert not rolled_out([dep(2, 2, 1, 1, 1, 2)])  # an old pod still terminating


async def test_a_dependent_that_did_not_resolve_before_plans_at_once_and_still_gets_its_turn() -> None:
    """A class created for a dependent that named it: nothing to pin (no plan to keep), nothing persisted, but the
    roll-out still re-plans it."""
    api = FakeKubeApi()
    await api.create(VLLM_DEPLOYMENTS, "ml", dependent("a"))
    index = ClassIndex()
    index._loaded = True
    before = index.snapshot()
    index.observe(agent(1))
    targets = dependents(await api.list(VLLM_DEPLOYMENTS, "ml"), {"agent"}, False)
    done = asyncio.Event()
    planned: list[str] = []

    async def reconcile(obj: Any) -> bool:
        planned.append(obj["metadata"]["name"])
        return False

    async def run() -> None:
        await roll_out(index, api, api, "agent", targets, reconcile, lambda n: f"x={n}", timeout=1)
        done.set()

    index.start_rollout("agent", targets, before, run, api)
    spec = CHAT.model_copy(update={"workload_class": "agent"})
    assert (await index.resolve(NO_KUBE, ("ml", "a"), spec)).generation == 1, "the new class, at once"
    await done.wait()
    assert planned == ["a"]
    stored = await api.get(VLLM_DEPLOYMENTS, "ml", "a")
    assert stored is not None and constants.ANNOTATION_CLASS_PIN not in stored["metadata"].get("annotations", {})
    assert api.calls["patch"] == 0, "no pin written or removed"


class CountingReader:
    """The watch cache, counting the roll-out's reads of it."""

    def __init__(self, children: WatchedChildren) -> None:
        self.children = children
        self.reads = 0

    async def list(self, res: Resource, namespace: str | None, label_selector: str | None = None
                   ) -> list[dict[str, Any]]:
        self.reads += 1
        return await self.children.list(res, namespace, label_selector)


async def test_a_roll_out_waits_on_the_watched_deployments_without_listing_them_from_the_api() -> None:
    """A re-planned dependent's roll-out is awaited by reading the operator's Deployment watch: however long it
    takes, the API server gets no LIST (up to issue 39 it got one every second of every dependent's roll-out)."""
    cluster = FakeCluster()
    api, watcher = FakeKubeApi(cluster), FakeKubeApi(cluster)
    await api.create(VLLM_DEPLOYMENTS, "ml", dependent("a"))
    labels = {**OWNED, constants.LABEL_DEPLOYMENT: "a"}
    await api.create(DEPLOYMENTS, "ml", {"metadata": {"name": "a-short", "labels": labels}, "spec": {"replicas": 1}})
    index, before, targets = await agent_edited(api)
    api.calls.clear()
    children = WatchedChildren(api, watcher, ("ml",), watched=OWNED_DEPLOYMENTS)
    watching = asyncio.create_task(children.run())
    reader = CountingReader(children)
    replanned = asyncio.Event()

    async def reconcile(obj: Any) -> bool:
        replanned.set()
        return True  # children changed: the roll-out waits for them

    def when(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return predicate()
        return check

    try:
        await eventually(when(lambda: children.current(DEPLOYMENTS, "ml")), timeout=30)
        done = asyncio.Event()

        async def run() -> None:
            await roll_out(index, api, reader, "agent", targets, reconcile, child_selector, timeout=60)
            done.set()

        index.start_rollout("agent", targets, before, run, api)
        await asyncio.wait_for(replanned.wait(), 30)
        # it polled twice: the Deployment had not rolled out at the first
        await eventually(when(lambda: reader.reads + api.calls["list"] >= 2), timeout=30)
        assert not done.is_set()
        await api.patch_status(DEPLOYMENTS, "ml", "a-short", {"status": {
            "observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1}})
        await asyncio.wait_for(done.wait(), 30)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await index.close()
    assert api.calls["list"] == 0, f"the roll-out LISTed Deployments from the API: {dict(api.calls)}"
    assert reader.reads >= 3, "read the watch until the Deployment had rolled out"
