"""WatchedChildren: the health loop's pods, Deployments and PDBs from list + watch, and from the API whenever the
watch is not current or does not cover the request."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.support.fakekube import FakeCluster, FakeKubeApi
from vllm_operator import constants
from vllm_operator.handlers.watched import WatchedChildren, deployment_view, equality_selector, pdb_view, pod_view
from vllm_operator.health.snapshot import pod_facts
from vllm_operator.health.source import engine_selector, read_pods, read_pools
from vllm_operator.k8s import DEPLOYMENTS, PDBS, PODS, KubeError

ENGINE = {constants.LABEL_NAME: constants.APP_NAME, constants.LABEL_DEPLOYMENT: "chat",
          constants.LABEL_COMPONENT: constants.COMPONENT_ENGINE, constants.LABEL_POOL: "short"}


def pod(name: str, namespace: str = "ml", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                            "labels": dict(ENGINE if labels is None else labels)},
            "spec": {"containers": [{"name": "engine", "image": "vllm"}]}}


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


def scenario(body: Callable[[FakeKubeApi, FakeKubeApi, WatchedChildren], Awaitable[None]],
             namespaces: tuple[str, ...] = ()) -> None:
    async def main() -> None:
        cluster = FakeCluster(max_watch_seconds=0.2)  # watches end and resume often, as the server's do
        kube, watcher = FakeKubeApi(cluster), FakeKubeApi(cluster)
        children = WatchedChildren(kube, watcher, namespaces, retry_seconds=0.05,
                                   on_api_list=lambda: kube.calls.update(["api_list"]))
        task = asyncio.create_task(children.run())
        try:
            await body(kube, watcher, children)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    asyncio.run(main())


def test_a_current_watch_answers_from_memory_and_follows_changes() -> None:
    async def body(kube: FakeKubeApi, watcher: FakeKubeApi, children: WatchedChildren) -> None:
        await kube.create(PODS, "ml", pod("chat-short-a"))
        await until(lambda: children.current(PODS, "ml"))
        await until(lambda: len(children._current.get(("pods", None), {})) == 1)
        assert [p.name for p in await read_pods(children, "ml", "chat")] == ["chat-short-a"]
        await kube.create(PODS, "ml", pod("chat-short-b"))
        await kube.create(PODS, "other", pod("chat-short-c", "other"))
        await until(lambda: len(children._current[("pods", None)]) == 3)
        assert [p.name for p in await read_pods(children, "ml", "chat")] == ["chat-short-a", "chat-short-b"]
        await kube.delete(PODS, "ml", "chat-short-a")
        await until(lambda: len(children._current[("pods", None)]) == 2)
        assert [p.name for p in await read_pods(children, "ml", "chat")] == ["chat-short-b"]
        assert kube.calls["list"] == 0 and kube.calls["api_list"] == 0, "every read came from memory"
    scenario(body)


def test_kept_objects_are_views_without_managed_fields_or_pod_specs_that_read_as_the_whole_ones() -> None:
    async def body(kube: FakeKubeApi, watcher: FakeKubeApi, children: WatchedChildren) -> None:
        await kube.create(PODS, "ml", pod("chat-short-a"))
        made = await kube.patch_status(PODS, "ml", "chat-short-a", {"status": {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "engine", "restartCount": 2, "state": {"running": {}}}]}})
        assert pod_facts(made).restart_count == 2 and pod_facts(made).ready
        def has_status() -> bool:
            return bool((children._current.get(("pods", None)) or {}).get("ml/chat-short-a", {}).get("status"))
        await until(has_status)
        [kept] = await children.list(PODS, "ml", engine_selector("chat"))
        assert "managedFields" not in kept["metadata"] and "spec" not in kept
        assert kept["metadata"]["name"] == "chat-short-a"
        assert pod_facts(kept) == pod_facts(made), "the health loop reads the same facts off the view"
        fields = [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}]  # the server's
        assert "managedFields" not in pod_view({**made, "metadata": {**made["metadata"], "managedFields": fields}}
                                               )["metadata"]
        whole = {**made, "spec": {"replicas": 4, "selector": {}, "template": {"spec": {"containers": []}}}}
        assert deployment_view(whole)["spec"] == {"replicas": 4} and pdb_view(whole)["spec"] == {}
    scenario(body)


def test_pools_read_deployments_and_pdbs_from_their_watches() -> None:
    async def body(kube: FakeKubeApi, watcher: FakeKubeApi, children: WatchedChildren) -> None:
        labels = {constants.LABEL_NAME: constants.APP_NAME, constants.LABEL_DEPLOYMENT: "chat"}
        await kube.create(DEPLOYMENTS, "ml", {"metadata": {"name": "chat-short", "labels": labels},
                                              "spec": {"replicas": 3}})
        await kube.create(PDBS, "ml", {"metadata": {"name": "chat-short", "labels": labels},
                                       "spec": {"maxUnavailable": 2}})
        await until(lambda: all(children._current.get((r.plural, None)) for r in (DEPLOYMENTS, PDBS)))
        pools = await read_pools(children, "ml", "chat", {"short": 1})
        assert (pools["short"].desired_replicas, pools["short"].max_unavailable) == (3, 2)
        assert kube.calls["list"] == 0
    scenario(body)


def test_reads_the_watch_does_not_cover_go_to_the_api() -> None:
    async def body(kube: FakeKubeApi, watcher: FakeKubeApi, children: WatchedChildren) -> None:
        await until(lambda: children.current(PODS, "ml"))
        router = {constants.LABEL_NAME: constants.APP_NAME, constants.LABEL_COMPONENT: constants.COMPONENT_ROUTER}
        await kube.create(PODS, "ml", pod("chat-router-a", labels=router))
        # not engine pods (the pod watch selects engines), a set-based selector, an unwatched namespace
        assert [p["metadata"]["name"] for p in await children.list(PODS, "ml", f"{constants.LABEL_NAME}=vllm-operator")
                ] == ["chat-router-a"]
        await children.list(PODS, "ml", f"{constants.LABEL_NAME} in (vllm-operator)")
        assert kube.calls["list"] == 2 and kube.calls["api_list"] == 2
    scenario(body)


def test_namespaced_watches_cover_only_their_namespaces() -> None:
    async def body(kube: FakeKubeApi, watcher: FakeKubeApi, children: WatchedChildren) -> None:
        await until(lambda: children.current_watches == 6)  # 3 resources x 2 namespaces
        assert not children.current(PODS, "other") and not children.current(PODS, None)
        await children.list(PODS, "other", engine_selector("chat"))
        await children.list(PODS, "ml", engine_selector("chat"))
        assert kube.calls["list"] == 1
    scenario(body, namespaces=("ml", "team-b"))


def test_before_its_first_list_and_while_its_watch_fails_a_resource_is_read_from_the_api() -> None:
    async def body(kube: FakeKubeApi, watcher: FakeKubeApi, children: WatchedChildren) -> None:
        await kube.create(PODS, "ml", pod("chat-short-a"))
        assert [p.name for p in await read_pods(children, "ml", "chat")] == ["chat-short-a"]
        assert kube.calls["list"] == 1, "not listed yet: the API answered"
        await until(lambda: children.current(PODS, "ml"))
        watcher.fail("watch", KubeError(0, "ClientConnectorError", "connection reset"), times=1000, res=PODS)
        watcher.fail("list_versioned", KubeError(503, "ServiceUnavailable", "etcd"), times=1000, res=PODS)
        await kube.create(PODS, "ml", pod("chat-short-b"))  # seen by the current watch; the next fails
        await until(lambda: not children.current(PODS, "ml"))
        await kube.create(PODS, "ml", pod("chat-short-c"))
        assert [p.name for p in await read_pods(children, "ml", "chat")] == ["chat-short-a", "chat-short-b",
                                                                             "chat-short-c"]
        assert kube.calls["list"] == 2
        assert children.current(DEPLOYMENTS, "ml"), "the other watches are unaffected"
    scenario(body)


def test_listeners_hear_every_change_of_their_resource_also_across_a_failed_watch() -> None:
    """The refresh and the deleted-child reconcile hear of Deployments from this one watch: every change after the
    first list, and what a relist after a failure found changed meanwhile."""
    heard: list[tuple[str, str]] = []
    labels = {constants.LABEL_NAME: constants.APP_NAME, constants.LABEL_DEPLOYMENT: "chat"}

    def deployment(name: str, replicas: int = 1) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": labels}, "spec": {"replicas": replicas}}

    async def body(kube: FakeKubeApi, watcher: FakeKubeApi, children: WatchedChildren) -> None:
        await kube.create(DEPLOYMENTS, "ml", deployment("chat-short"))
        await until(lambda: children.current(DEPLOYMENTS, "ml"))
        assert heard == [], "the first list is not news"
        await kube.create(DEPLOYMENTS, "ml", deployment("chat-long"))
        await kube.patch_status(DEPLOYMENTS, "ml", "chat-short", {"status": {"readyReplicas": 1}})
        await kube.create(PODS, "ml", pod("chat-short-a"))  # another resource: not heard
        await until(lambda: len(heard) == 2)
        assert heard == [("ADDED", "chat-long"), ("MODIFIED", "chat-short")]
        owned = f"{constants.LABEL_NAME}={constants.APP_NAME}"
        [short] = [d for d in await children.list(DEPLOYMENTS, "ml", owned) if d["metadata"]["name"] == "chat-short"]
        assert short["status"] == {"readyReplicas": 1} and kube.calls["list"] == 0, \
            "the refresh counts pods off the view, from memory"
        watcher.fail("watch", KubeError(0, "ClientConnectorError", "connection reset"), times=1, res=DEPLOYMENTS)
        await kube.delete(DEPLOYMENTS, "ml", "chat-long")
        await until(lambda: len(heard) == 3)
        assert heard[2] == ("DELETED", "chat-long")

    def scenario_with_listener(kube: FakeKubeApi, watcher: FakeKubeApi, children: WatchedChildren) -> Awaitable[None]:
        children.on_change(DEPLOYMENTS, lambda kind, obj: heard.append((kind, obj["metadata"]["name"])))
        return body(kube, watcher, children)

    scenario(scenario_with_listener)


@pytest.mark.parametrize(("text", "parsed"), [
    (None, {}), ("", {}), ("a=1,b=2", {"a": "1", "b": "2"}), ("a==1", None), ("a!=1", None), ("!a", None),
    ("a in (1)", None), ("a", None), (" a = 1 ", {"a": "1"}),
])
def test_only_equality_selectors_are_evaluated_in_memory(text: str | None, parsed: dict[str, str] | None) -> None:
    assert equality_selector(text) == parsed
