"""The reconcile routine against the in-memory API server (tests/support/fakekube): what test_children_ssa proves on
the real kube-apiserver, in milliseconds and without one, and what needs a server to misbehave on cue (a failing
write, a status write that loses a race).

The VLLMDeployment is created through the API first, as on the real server, so that it has a uid the children's
owner references name. Requests are counted by the fake itself (`FakeKubeApi.calls`, per verb, like test_children_ssa's
Recording wrapper). The fake's lists are atomic, so a field taken back from another manager is named as its list
(`.spec.template.spec.containers`) where the real server names the container's field (`...[name="engine"].image`);
the assertions below hold for both.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from tests.support.fakekube import FakeKubeApi
from tests.support.paths import EXAMPLES
from vllm_operator import constants, names
from vllm_operator.api.resource import parse_resource
from vllm_operator.handlers import childplan
from vllm_operator.handlers.reconcile import child_selector, reconcile, refresh_status
from vllm_operator.k8s import CHILD_RESOURCES, DEPLOYMENTS, EVENTS, FIELD_MANAGER, VLLM_DEPLOYMENTS, KubeError
from vllm_operator.planning import RemediationState, plan
from vllm_operator.rendering import render

NS = "ml"
TOLERATION = {"key": "team", "operator": "Exists", "effect": "NoSchedule"}


def chat(**pools: Any) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((EXAMPLES / "chat.yaml").read_text())
    obj["metadata"] = {"name": "chat", "namespace": NS}
    for pool, fields in pools.items():
        obj["spec"]["pools"][pool].update(fields)
    return obj


async def create(api: FakeKubeApi, obj: Mapping[str, Any]) -> dict[str, Any]:
    return await api.create(VLLM_DEPLOYMENTS, NS, obj)


async def edit(api: FakeKubeApi, patch: Mapping[str, Any]) -> dict[str, Any]:
    return await api.patch(VLLM_DEPLOYMENTS, NS, "chat", patch)


async def fresh(api: FakeKubeApi) -> dict[str, Any]:
    got = await api.get(VLLM_DEPLOYMENTS, NS, "chat")
    assert got is not None
    return got


async def deployment(api: FakeKubeApi, name: str) -> dict[str, Any]:
    got = await api.get(DEPLOYMENTS, NS, name)
    assert got is not None
    return got


async def children(api: FakeKubeApi) -> list[dict[str, Any]]:
    out = []
    for res in CHILD_RESOURCES.values():
        if await api.has_resource(res.group, res.version, res.plural):
            out += await api.list(res, NS, child_selector("chat"))
    return out


def managers(obj: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    return {(e["manager"], e["operation"], e.get("subresource", "")) for e in obj["metadata"].get("managedFields", [])}


async def test_children_are_applied_owned_by_the_vllmdeployment_and_a_resync_writes_nothing() -> None:
    api = FakeKubeApi()
    obj = await create(api, chat())
    api.calls.clear()
    outcome = await reconcile(api, obj)
    assert outcome.plan is not None and not outcome.updated and not outcome.deleted
    assert Counter(label.split()[0] for label in outcome.created) == Counter({
        "Deployment": 3, "Service": 3, "PodDisruptionBudget": 3, "ConfigMap": 1, "ServiceAccount": 1, "Role": 1,
        "RoleBinding": 1, "NetworkPolicy": 1}), "PodMonitor and PrometheusRule: not served, so not rendered"
    assert api.calls["apply"] == 14 and api.calls["create"] == 0 and api.calls["patch_status"] == 1, api.calls
    listed = await children(api)
    assert len(listed) == 14
    for child in listed:
        assert child["metadata"]["ownerReferences"] == [childplan.owner_reference(obj)], child["kind"]
        assert managers(child) == {(FIELD_MANAGER, "Apply", "")}, (child["kind"], managers(child))
    status = (await fresh(api))["status"]
    assert status["observedGeneration"] == 1
    api.calls.clear()
    resync = await reconcile(api, await fresh(api))
    assert not resync.changed and not resync.status_patched
    assert api.writes == 0 and api.calls["emit_event"] == 0, api.calls


async def test_a_field_the_spec_no_longer_asks_for_disappears_from_the_child() -> None:
    api = FakeKubeApi()
    obj = await create(api, chat(short={"tolerations": [TOLERATION], "nodeSelector": {"kubernetes.io/os": "linux"}}))
    await reconcile(api, obj)
    short = names.pool("chat", "short")
    pod = (await deployment(api, short))["spec"]["template"]["spec"]
    assert TOLERATION in pod["tolerations"] and pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    obj = await edit(api, {"spec": {"pools": {"short": {"tolerations": None, "nodeSelector": None}}}})
    outcome = await reconcile(api, obj)
    assert outcome.updated == [f"Deployment {NS}/{short}"], "only the pool whose rendering changed"
    pod = (await deployment(api, short))["spec"]["template"]["spec"]
    # The GPU pool keeps the toleration the renderer adds for nvidia.com/gpu taints; the spec's is gone.
    assert TOLERATION not in pod.get("tolerations", []) and "nodeSelector" not in pod, pod


async def test_other_managers_survive_and_a_taken_field_is_named_in_an_event() -> None:
    api = FakeKubeApi()
    obj = await create(api, chat(short={"externalAutoscaler": True}))
    await reconcile(api, obj)
    short, long_ = names.pool("chat", "short"), names.pool("chat", "long")
    # Never applied (the real server defaults it to 1; the fake defaults nothing).
    assert "replicas" not in (await deployment(api, short))["spec"]
    await api.as_manager("kubectl-scale").patch(DEPLOYMENTS, NS, short, {"spec": {"replicas": 4}})
    await api.as_manager("kubectl-annotate").patch(DEPLOYMENTS, NS, short, {
        "metadata": {"annotations": {"team.example/owner": "search"}}})
    containers = (await deployment(api, long_))["spec"]["template"]["spec"]["containers"]
    for container in containers:
        if container["name"] == "engine":
            container["image"] = "registry.example/hand-edited:1"
    await api.as_manager("kubectl-set").patch(DEPLOYMENTS, NS, long_, {
        "spec": {"template": {"spec": {"containers": containers}}}})
    obj = await edit(api, {"spec": {"pools": {"short": {"tolerations": [TOLERATION]},
                                              "long": {"tolerations": [TOLERATION]}}}})
    outcome = await reconcile(api, obj)
    assert {f"Deployment {NS}/{short}", f"Deployment {NS}/{long_}"} <= set(outcome.updated)
    dep = await deployment(api, short)
    assert dep["spec"]["replicas"] == 4, "the autoscaler's replicas survived"
    assert dep["metadata"]["annotations"]["team.example/owner"] == "search"
    assert TOLERATION in dep["spec"]["template"]["spec"]["tolerations"]
    engine = next(c for c in (await deployment(api, long_))["spec"]["template"]["spec"]["containers"]
                  if c["name"] == "engine")
    assert engine["image"] != "registry.example/hand-edited:1", "the operator took its field back"
    events = [e for e in await api.list(EVENTS, NS) if e["reason"] == "FieldsTakenOver"]
    assert len(events) == 1 and events[0]["type"] == "Warning", events
    message = events[0]["message"]
    assert f"Deployment {NS}/{long_}" in message and "kubectl-set" in message, message
    assert ".spec.template.spec.containers" in message, message


def previous_release_children(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The children as the release before server-side apply wrote them (test_children_ssa's): the rendering, its
    controller reference, and the applied-fields annotation (the key tree of what it set, leaves `{}`)."""
    rendered = render(plan(parse_resource(dict(obj)).spec, None, RemediationState(), name="chat", namespace=NS))
    out = []
    for child in rendered:
        if child["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # not served

        def tree(value: Any) -> Any:
            return {str(k): tree(v) for k, v in value.items()} if isinstance(value, Mapping) else {}

        body = copy.deepcopy(child)
        body["metadata"]["ownerReferences"] = [childplan.owner_reference(obj)]
        body["metadata"]["annotations"][constants.ANNOTATION_APPLIED_FIELDS] = json.dumps(
            tree(body), sort_keys=True, separators=(",", ":"))
        out.append(body)
    return out


async def test_children_of_the_previous_release_migrate_and_then_lose_dropped_fields() -> None:
    api = FakeKubeApi()
    obj = await create(api, chat(short={"tolerations": [TOLERATION]}))
    for child in previous_release_children(obj):  # POSTed by the operator: the Update manager "vllm-operator"
        await api.create(CHILD_RESOURCES[(child["apiVersion"], child["kind"])], NS, child)
    short = names.pool("chat", "short")
    assert managers(await deployment(api, short)) == {(FIELD_MANAGER, "Update", "")}
    obj = await edit(api, {"spec": {"pools": {"short": {"tolerations": None}}}})
    api.calls.clear()
    outcome = await reconcile(api, obj)
    assert f"Deployment {NS}/{short}" in outcome.updated
    assert api.calls["json_patch"] == 14, "one conditional managedFields write per child, no race here"
    for child in await children(api):
        assert managers(child) == {(FIELD_MANAGER, "Apply", "")}, (child["kind"], managers(child))
        assert constants.ANNOTATION_APPLIED_FIELDS not in child["metadata"].get("annotations", {}), child["kind"]
    pod = (await deployment(api, short))["spec"]["template"]["spec"]
    assert TOLERATION not in pod.get("tolerations", []), "the migrated child lost the dropped field"
    api.calls.clear()
    assert not (await reconcile(api, await fresh(api))).changed
    assert api.writes - api.calls["patch_status"] == 0, api.calls


async def test_a_failed_write_fails_the_reconcile_and_the_next_one_converges() -> None:
    api = FakeKubeApi()
    obj = await create(api, chat())
    api.fail("apply", KubeError(500, "InternalError", "etcdserver: request timed out"), res=DEPLOYMENTS)
    with pytest.raises(KubeError, match="request timed out"):
        await reconcile(api, obj)
    # The first wave (what the pods refer to) is there; of the Deployments, the two the fault did not hit.
    assert len(await api.list(DEPLOYMENTS, NS, child_selector("chat"))) == 2
    outcome = await reconcile(api, await fresh(api))
    assert [label.split()[0] for label in outcome.created] == ["Deployment"]
    assert len(await children(api)) == 14


async def test_a_status_write_that_lost_a_race_is_made_again_from_a_fresh_read() -> None:
    api = FakeKubeApi()
    stale = await create(api, chat())
    await api.as_manager("kubectl-label").patch(VLLM_DEPLOYMENTS, NS, "chat", {"metadata": {"labels": {"a": "b"}}})
    api.calls.clear()
    outcome = await reconcile(api, stale)
    assert outcome.status_patched and api.calls["patch_status"] == 2 and api.calls["get"] == 1, api.calls
    assert (await fresh(api))["status"]["observedGeneration"] == 1


async def test_disabling_a_pool_removes_its_status() -> None:
    """The one status writer diffs against the object read, with nulls: a merge patch of the whole new status (what
    the reconcile and the refresh wrote before) cannot delete `status.pools.long` or `status.plan.long`."""
    api = FakeKubeApi()
    await reconcile(api, await create(api, chat()))
    before = (await fresh(api))["status"]
    assert "long" in before["pools"] and "long" in before["plan"]
    await reconcile(api, await edit(api, {"spec": {"pools": {"long": {"enabled": False}}}}))
    after = (await fresh(api))["status"]
    assert after["observedGeneration"] == 2
    assert "long" not in after["pools"] and "long" not in after["plan"], after
    assert after["longReplicas"] == "-" and "short" in after["pools"]
    await refresh_status(api, await fresh(api))
    assert "long" not in (await fresh(api))["status"]["pools"]
