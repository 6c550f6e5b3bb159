"""The operator's class index without a cluster: the message when classes may not be read, broken stored objects,
who depends on a class edit, and when a dependent counts as rolled out (the roll-out waits on it)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.support.paths import ROOT
from vllm_operator.api.errors import SpecError
from vllm_operator.api.resource import parse_resource
from vllm_operator.handlers.classes import ClassIndex, depends_on, rolled_out
from vllm_operator.k8s import KubeApi

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
    assert (klass.name, klass.generation, klass.short.max_model_len) == ("agent", 3, 12288)
    broken: dict[str, Any] = yaml.safe_load(yaml.safe_dump(AGENT))
    broken["spec"]["pools"]["short"]["maxTokens"] = 99999
    index.observe(broken)
    with pytest.raises(SpecError, match=r"VLLMWorkloadClass agent is invalid: .*maxTokens"):
        await index.resolve(NO_KUBE, ("ml", "a"), CHAT.model_copy(update={"workload_class": "agent"}))


async def test_a_pinned_dependent_keeps_the_classes_it_had() -> None:
    index = ClassIndex()
    index._loaded = True
    index.observe({**AGENT, "metadata": {"name": "agent", "generation": 1}})
    index.pin(("ml", "b"), index.snapshot())
    edited: dict[str, Any] = yaml.safe_load(yaml.safe_dump(AGENT))
    edited["metadata"] = {"name": "agent", "generation": 2}
    edited["spec"]["pools"]["short"]["maxModelLen"] = 8192
    edited["spec"]["promptLengthThreshold"] = 7168
    index.observe(edited)
    spec = CHAT.model_copy(update={"workload_class": "agent"})
    assert (await index.resolve(NO_KUBE, ("ml", "b"), spec)).generation == 1
    assert (await index.resolve(NO_KUBE, ("ml", "a"), spec)).generation == 2
    index.unpin(("ml", "b"))
    assert (await index.resolve(NO_KUBE, ("ml", "b"), spec)).generation == 2


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
