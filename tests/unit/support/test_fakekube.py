"""tests/support/fakekube: the in-memory KubeApi behaves as its docstring says (what the real kube-apiserver does with
the same requests is tests/integration/kube/test_kubeapi_contract.py's, on both)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import pytest

from tests.support.fakekube import (
    FakeCluster,
    FakeKubeApi,
    merge_patch,
    parse_selector,
    same,
    selector_matches,
)
from vllm_operator.k8s import (
    CONFIGMAPS,
    DEPLOYMENTS,
    EVENTS,
    NODES,
    POD_MONITORS,
    SCALED_OBJECTS,
    KubeApi,
    KubeError,
    WatchEvent,
    WatchExpired,
    list_watch,
)

NS = "ns"


def cm(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels or {}},
            "data": data}


def deployment(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS}, "spec": spec}


async def fails(call: Any) -> KubeError:
    with pytest.raises(KubeError) as info:
        await call
    return info.value


def test_the_fake_is_a_kube_api() -> None:
    api: KubeApi = FakeKubeApi()  # mypy holds the fake to the Protocol here
    assert api is not None


# --- storage ---------------------------------------------------------------------------------------------------


async def test_create_sets_the_server_metadata_and_every_answer_is_a_copy() -> None:
    api = FakeKubeApi()
    start = int(api.cluster.resource_version)
    body = cm("a", {"app": "x"}, k="v")
    body["metadata"]["uid"] = "mine"
    made = await api.create(CONFIGMAPS, NS, body)
    meta = made["metadata"]
    assert meta["uid"] != "mine" and meta["creationTimestamp"] and meta["generation"] == 1
    assert int(meta["resourceVersion"]) == start + 1 == int(api.cluster.resource_version)
    assert meta["namespace"] == NS and (made["apiVersion"], made["kind"]) == ("v1", "ConfigMap")
    made["data"]["k"] = "changed"
    body["data"]["k"] = "changed too"
    got = await api.get(CONFIGMAPS, NS, "a")
    assert got is not None and got["data"] == {"k": "v"}
    got["metadata"]["labels"]["app"] = "y"
    (listed,) = await api.list(CONFIGMAPS, NS)
    assert listed["metadata"]["labels"] == {"app": "x"} and (listed["apiVersion"], listed["kind"]) == ("v1",
                                                                                                      "ConfigMap")


async def test_create_refuses_duplicates_nameless_objects_and_versions_as_the_server_does() -> None:
    api = FakeKubeApi()
    await api.create(CONFIGMAPS, NS, cm("a"))
    dup = await fails(api.create(CONFIGMAPS, NS, cm("a")))
    assert (dup.status, dup.reason, dup.message) == (409, "AlreadyExists", 'configmaps "a" already exists')
    assert dup.conflict
    nameless = await fails(api.create(CONFIGMAPS, NS, {"metadata": {}}))
    assert (nameless.status, nameless.reason) == (422, "Invalid") and "name or generateName" in nameless.message
    versioned = cm("b")
    versioned["metadata"]["resourceVersion"] = "5"
    assert (await fails(api.create(CONFIGMAPS, NS, versioned))).status == 500
    elsewhere = cm("c")
    elsewhere["metadata"]["namespace"] = "other"
    assert (await fails(api.create(CONFIGMAPS, NS, elsewhere))).status == 400
    generated = await api.create(CONFIGMAPS, NS, {"metadata": {"generateName": "gen-"}})
    assert generated["metadata"]["name"].startswith("gen-") and len(generated["metadata"]["name"]) == 9


async def test_get_of_an_absent_object_is_none_and_404s_name_the_object() -> None:
    api = FakeKubeApi()
    assert await api.get(CONFIGMAPS, NS, "absent") is None
    for call in (api.patch(CONFIGMAPS, NS, "absent", {"data": {}}),
                 api.patch_status(DEPLOYMENTS, NS, "absent", {"status": {}})):
        err = await fails(call)
        assert err.not_found
    assert (await fails(api.patch(DEPLOYMENTS, NS, "absent", {}))).message == 'deployments.apps "absent" not found'
    await api.delete(CONFIGMAPS, NS, "absent")  # ignored, as ClientKubeApi ignores the 404


async def test_the_version_moves_on_every_change_and_not_on_a_write_that_changes_nothing() -> None:
    api = FakeKubeApi()
    first = (await api.create(CONFIGMAPS, NS, cm("a", k="v")))["metadata"]["resourceVersion"]
    same_again = await api.patch(CONFIGMAPS, NS, "a", {"data": {"k": "v"}})
    assert same_again["metadata"]["resourceVersion"] == first == api.cluster.resource_version
    changed = await api.patch(CONFIGMAPS, NS, "a", {"data": {"k": "w"}})
    assert int(changed["metadata"]["resourceVersion"]) == int(first) + 1


async def test_generation_counts_spec_changes_not_metadata_or_status() -> None:
    api = FakeKubeApi()
    await api.create(DEPLOYMENTS, NS, deployment("d", replicas=1))
    assert (await api.patch(DEPLOYMENTS, NS, "d", {"metadata": {"labels": {"a": "b"}}}))["metadata"][
        "generation"] == 1
    assert (await api.patch_status(DEPLOYMENTS, NS, "d", {"status": {"readyReplicas": 1}}))["metadata"][
        "generation"] == 1
    assert (await api.patch(DEPLOYMENTS, NS, "d", {"spec": {"replicas": 2}}))["metadata"]["generation"] == 2


async def test_cluster_scoped_objects_ignore_the_namespace() -> None:
    api = FakeKubeApi()
    made = await api.create(NODES, None, {"metadata": {"name": "n1", "namespace": "x", "labels": {"gpu": "l4"}}})
    assert "namespace" not in made["metadata"]
    assert [n["metadata"]["name"] for n in await api.list(NODES, "whatever", "gpu=l4")] == ["n1"]


# --- label selectors -------------------------------------------------------------------------------------------


LABELLED = {"web": {"app": "x", "tier": "web"}, "db": {"app": "y", "tier": "db"}, "bare": {}, "plain": {"app": "x"},
            "count": {"replicas": "3"}}


@pytest.mark.parametrize(("selector", "names"), [
    ("app=x", {"web", "plain"}),
    ("app==x", {"web", "plain"}),
    ("app!=x", {"db", "bare", "count"}),
    ("tier", {"web", "db"}),
    ("!tier", {"bare", "plain", "count"}),
    ("app in (x, y)", {"web", "db", "plain"}),
    ("app notin (x)", {"db", "bare", "count"}),
    ("app=x,tier=web", {"web"}),
    ("app in (x,y),!tier", {"plain"}),
    (" app = x , tier ", {"web"}),
    ("replicas>2", {"count"}),
    ("replicas<3", set()),
    ("", set(LABELLED)),
])
async def test_list_filters_by_label_selector(selector: str, names: set[str]) -> None:
    api = FakeKubeApi()
    for name, labels in LABELLED.items():
        await api.create(CONFIGMAPS, NS, cm(name, labels))
    assert {o["metadata"]["name"] for o in await api.list(CONFIGMAPS, NS, selector)} == names


@pytest.mark.parametrize("selector", ["app=x,", "app in x", "app in (x", "app in ()", "=x", "app x", "!", "a>b",
                                      "app=x y"])
def test_a_malformed_selector_is_a_bad_request(selector: str) -> None:
    with pytest.raises(KubeError) as info:
        parse_selector(selector)
    assert (info.value.status, info.value.reason) == (400, "BadRequest")


def test_an_empty_value_is_a_value() -> None:
    assert selector_matches(parse_selector("app="), {"metadata": {"labels": {"app": ""}}})
    assert not selector_matches(parse_selector("app="), {"metadata": {"labels": {"app": "x"}}})


async def test_lists_are_per_namespace_or_across_all() -> None:
    api = FakeKubeApi()
    await api.create(CONFIGMAPS, "one", cm("a"))
    await api.create(CONFIGMAPS, "two", cm("a"))
    assert len(await api.list(CONFIGMAPS, "one")) == 1
    assert [o["metadata"]["namespace"] for o in await api.list(CONFIGMAPS, None)] == ["one", "two"]


# --- patches ---------------------------------------------------------------------------------------------------


def test_merge_patch_is_rfc_7386() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}
    assert merge_patch(target, {"a": "z", "c": {"f": None}, "l": [3], "n": {"x": None, "y": 1}}) == {
        "a": "z", "c": {"d": "e"}, "l": [3], "n": {"y": 1}}
    assert target == {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}, "the target is not changed"


def test_json_equality_tells_booleans_from_numbers() -> None:
    assert same({"a": [1, 2.0]}, {"a": [1.0, 2]}) and not same(True, 1) and not same(0, False) and not same(1, "1")


async def test_merge_patch_with_null_deletion_and_a_version_precondition() -> None:
    api = FakeKubeApi()
    made = await api.create(CONFIGMAPS, NS, cm("a", {"keep": "1", "drop": "2"}, x="1", y="2"))
    patched = await api.patch(CONFIGMAPS, NS, "a", {"metadata": {"labels": {"drop": None}}, "data": {"y": None}})
    assert patched["metadata"]["labels"] == {"keep": "1"} and patched["data"] == {"x": "1"}
    stale = {"metadata": {"resourceVersion": made["metadata"]["resourceVersion"]}, "data": {"x": "2"}}
    err = await fails(api.patch(CONFIGMAPS, NS, "a", stale))
    assert (err.status, err.reason) == (409, "Conflict") and "the object has been modified" in err.message


async def test_status_is_a_subresource_where_the_kind_has_one() -> None:
    api = FakeKubeApi()
    body = deployment("d", replicas=1)
    body["status"] = {"replicas": 7}
    made = await api.create(DEPLOYMENTS, NS, body)
    assert "status" not in made, "create ignores status"
    status = await api.patch_status(DEPLOYMENTS, NS, "d", {"status": {"readyReplicas": 1}, "spec": {"replicas": 5},
                                                           "metadata": {"labels": {"a": "b"}}})
    assert status["status"] == {"readyReplicas": 1} and status["spec"] == {"replicas": 1}
    assert "labels" not in status["metadata"]
    main = await api.patch(DEPLOYMENTS, NS, "d", {"status": {"readyReplicas": 9}, "spec": {"replicas": 2}})
    assert main["status"] == {"readyReplicas": 1} and main["spec"] == {"replicas": 2}
    assert "managedFields" not in main["metadata"], "no field ownership (test_children_ssa: the real server's)"
    stale = {"metadata": {"resourceVersion": made["metadata"]["resourceVersion"]}, "status": {"readyReplicas": 2}}
    assert (await fails(api.patch_status(DEPLOYMENTS, NS, "d", stale))).conflict
    await api.create(CONFIGMAPS, NS, cm("c"))
    assert (await fails(api.patch_status(CONFIGMAPS, NS, "c", {"status": {}}))).not_found, "no /status route"


# --- apply -----------------------------------------------------------------------------------------------------


async def test_apply_creates_then_merges_its_body_and_a_no_op_apply_writes_nothing() -> None:
    api = FakeKubeApi()
    made = await api.apply(CONFIGMAPS, NS, "a", cm("a", {"app": "x"}, keep="1"))
    assert made["data"] == {"keep": "1"} and made["metadata"]["labels"] == {"app": "x"}
    await api.patch(CONFIGMAPS, NS, "a", {"metadata": {"annotations": {"team": "search"}}})
    again = await api.apply(CONFIGMAPS, NS, "a", cm("a", {"app": "y"}, keep="2"))
    assert again["data"] == {"keep": "2"} and again["metadata"]["labels"] == {"app": "y"}
    assert again["metadata"]["annotations"] == {"team": "search"}, "merged into the object, not replacing it"
    unchanged = await api.apply(CONFIGMAPS, NS, "a", cm("a", {"app": "y"}, keep="2"), force=True)
    assert unchanged["metadata"]["resourceVersion"] == again["metadata"]["resourceVersion"], "a no-op apply"
    await api.apply(DEPLOYMENTS, NS, "d", deployment("d", ports=[{"name": "a"}, {"name": "b"}]))
    listed = await api.apply(DEPLOYMENTS, NS, "d", deployment("d", ports=[{"name": "b"}]))
    assert listed["spec"]["ports"] == [{"name": "b"}], "lists are replaced whole"


async def test_apply_refuses_what_the_server_refuses_and_ignores_status() -> None:
    api = FakeKubeApi()
    assert (await fails(api.apply(CONFIGMAPS, NS, "a", cm("b")))).status == 400
    assert (await fails(api.apply(CONFIGMAPS, NS, "a", {"metadata": {"name": "a"}}))).status == 400
    body = deployment("d", replicas=1)
    body["status"] = {"replicas": 3}
    assert "status" not in await api.apply(DEPLOYMENTS, NS, "d", body)


# --- delete, garbage collection, finalizers ---------------------------------------------------------------------


async def test_delete_with_a_uid_precondition() -> None:
    api = FakeKubeApi()
    made = await api.create(CONFIGMAPS, NS, cm("a"))
    err = await fails(api.delete(CONFIGMAPS, NS, "a", uid="someone-else"))
    assert (err.status, err.reason) == (409, "Conflict") and "the UID in the precondition" in err.message
    assert await api.get(CONFIGMAPS, NS, "a") is not None
    await api.delete(CONFIGMAPS, NS, "a", uid=made["metadata"]["uid"])
    assert await api.get(CONFIGMAPS, NS, "a") is None


def owned_by(*owners: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"apiVersion": o["apiVersion"], "kind": o["kind"], "name": o["metadata"]["name"],
             "uid": o["metadata"]["uid"]} for o in owners]


async def test_garbage_collection_deletes_orphans_and_unlinks_dependents_with_another_owner() -> None:
    api = FakeKubeApi()
    parent = await api.create(DEPLOYMENTS, NS, deployment("parent"))
    other = await api.create(DEPLOYMENTS, NS, deployment("other"))
    child = await api.create(CONFIGMAPS, NS, {**cm("child"), "metadata": {"name": "child",
                                                                          "ownerReferences": owned_by(parent)}})
    await api.create(CONFIGMAPS, NS, {**cm("grandchild"), "metadata": {"name": "grandchild",
                                                                       "ownerReferences": owned_by(child)}})
    await api.create(CONFIGMAPS, NS, {**cm("shared"), "metadata": {"name": "shared",
                                                                   "ownerReferences": owned_by(parent, other)}})
    await api.delete(DEPLOYMENTS, NS, "parent")
    assert {o["metadata"]["name"] for o in await api.list(CONFIGMAPS, NS)} == {"shared"}
    shared = await api.get(CONFIGMAPS, NS, "shared")
    assert shared is not None and shared["metadata"]["ownerReferences"] == owned_by(other)


async def test_finalizers_hold_a_deleted_object_until_they_are_removed() -> None:
    api = FakeKubeApi()
    await api.create(CONFIGMAPS, NS, {**cm("a"), "metadata": {"name": "a", "finalizers": ["example.com/hold"]}})
    await api.delete(CONFIGMAPS, NS, "a")
    held = await api.get(CONFIGMAPS, NS, "a")
    assert held is not None and held["metadata"]["deletionTimestamp"]
    await api.patch(CONFIGMAPS, NS, "a", {"metadata": {"finalizers": None}})
    assert await api.get(CONFIGMAPS, NS, "a") is None


# --- events, discovery, faults ---------------------------------------------------------------------------------


async def test_events_are_stored_objects() -> None:
    api = FakeKubeApi(component="tests")
    involved = await api.create(CONFIGMAPS, NS, cm("a"))
    await api.emit_event(involved, "Warning", "Broken", "x" * 2000)
    (event,) = await api.list(EVENTS, NS)
    assert (event["type"], event["reason"], len(event["message"])) == ("Warning", "Broken", 1024)
    assert event["involvedObject"]["uid"] == involved["metadata"]["uid"] and event["source"] == {"component": "tests"}


async def test_discovery_serves_the_built_in_kinds_until_told_otherwise() -> None:
    api = FakeKubeApi()
    assert await api.has_resource("apps", "v1", "deployments")
    assert await api.has_resource("vllm-operator.dev", "v1alpha1", "vllmdeployments")
    assert not await api.has_resource(POD_MONITORS.group, POD_MONITORS.version, POD_MONITORS.plural)
    assert (await fails(api.list(POD_MONITORS, NS))).not_found
    assert await api.get(POD_MONITORS, NS, "x") is None
    api.cluster.serve(SCALED_OBJECTS)
    assert await api.has_resource(SCALED_OBJECTS.group, SCALED_OBJECTS.version, SCALED_OBJECTS.plural)
    await api.create(SCALED_OBJECTS, NS, {"metadata": {"name": "s"}, "spec": {}})
    api.cluster.withdraw(DEPLOYMENTS)
    assert not await api.has_resource("apps", "v1", "deployments")
    assert (await fails(api.apply(DEPLOYMENTS, NS, "d", deployment("d")))).not_found


async def test_faults_fail_the_next_calls_of_a_verb_and_calls_are_counted() -> None:
    api = FakeKubeApi()
    api.fail("apply", KubeError(500, "InternalError", "etcd is down"), times=2, res=DEPLOYMENTS)
    api.fail("list", KubeError(403, "Forbidden", "nodes is forbidden"), res=NODES)
    for _ in range(2):
        assert (await fails(api.apply(DEPLOYMENTS, NS, "d", deployment("d")))).status == 500
    await api.apply(CONFIGMAPS, NS, "c", cm("c"))  # another resource: not affected
    await api.apply(DEPLOYMENTS, NS, "d", deployment("d"))
    assert (await fails(api.list(NODES, None))).status == 403
    assert await api.list(NODES, None) == []
    assert api.calls == {"apply": 4, "list": 2} and api.writes == 4
    with pytest.raises(ValueError, match="not a KubeApi verb"):
        api.fail("frobnicate", KubeError(500, "x", "y"))


# --- watch -----------------------------------------------------------------------------------------------------


async def collect(stream: AsyncIterator[WatchEvent], until: Callable[[list[WatchEvent]], bool] = lambda _: False,
                  timeout: float = 5) -> list[WatchEvent]:
    """The events of a watch until `until` holds of them or the watch ends (a test fails after `timeout`); the
    watch is closed after."""
    events: list[WatchEvent] = []
    assert isinstance(stream, AsyncGenerator)
    try:
        async with asyncio.timeout(timeout):
            async for event in stream:
                events.append(event)
                if until(events):
                    break
    finally:
        await stream.aclose()
    return events


def kinds(events: list[WatchEvent]) -> list[tuple[str, str]]:
    return [(e.type, e.object["metadata"].get("name", "")) for e in events]


async def test_a_watch_replays_the_changes_after_the_lists_version_in_order() -> None:
    api = FakeKubeApi()
    await api.create(CONFIGMAPS, NS, cm("before"))
    items, version = await api.list_versioned(CONFIGMAPS, NS)
    assert [o["metadata"]["name"] for o in items] == ["before"] and version == api.cluster.resource_version
    await api.create(CONFIGMAPS, NS, cm("a"))
    await api.patch(CONFIGMAPS, NS, "a", {"data": {"k": "v"}})
    await api.create(CONFIGMAPS, "elsewhere", cm("b"))
    await api.delete(CONFIGMAPS, NS, "a")
    events = await collect(api.watch(CONFIGMAPS, NS, resource_version=version),
                           until=lambda e: e[-1].type == "DELETED")
    assert kinds(events) == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    versions = [int(e.resource_version) for e in events]
    assert versions == sorted(versions) and versions[-1] == int(api.cluster.resource_version)
    assert events[-1].object["data"] == {"k": "v"} and events[0].object["kind"] == "ConfigMap"


async def test_a_watch_waits_for_new_changes() -> None:
    api = FakeKubeApi()
    _, version = await api.list_versioned(CONFIGMAPS, NS)
    watching = asyncio.create_task(collect(api.watch(CONFIGMAPS, NS, resource_version=version),
                                           until=lambda e: len(e) == 2))
    await asyncio.sleep(0.01)
    await api.create(CONFIGMAPS, NS, cm("a"))
    await asyncio.sleep(0.01)
    await api.patch(CONFIGMAPS, NS, "a", {"data": {"k": "v"}})
    assert kinds(await watching) == [("ADDED", "a"), ("MODIFIED", "a")]


async def test_an_object_leaving_the_selector_is_deleted_and_one_entering_it_added() -> None:
    api = FakeKubeApi()
    _, version = await api.list_versioned(CONFIGMAPS, NS, "phase=in")
    await api.create(CONFIGMAPS, NS, cm("a", {"phase": "in"}, k="1"))
    await api.patch(CONFIGMAPS, NS, "a", {"metadata": {"labels": {"phase": "out"}}, "data": {"k": "2"}})
    await api.patch(CONFIGMAPS, NS, "a", {"data": {"k": "3"}})  # not seen: not matching
    await api.patch(CONFIGMAPS, NS, "a", {"metadata": {"labels": {"phase": "in"}}})
    events = await collect(api.watch(CONFIGMAPS, NS, resource_version=version, label_selector="phase=in"),
                           until=lambda e: len(e) == 3)
    assert kinds(events) == [("ADDED", "a"), ("DELETED", "a"), ("ADDED", "a")]
    gone = events[1].object
    assert gone["metadata"]["labels"] == {"phase": "in"} and gone["data"] == {"k": "1"}, "the previous content"
    assert int(gone["metadata"]["resourceVersion"]) > int(events[0].resource_version), "at the change's version"


async def test_version_zero_starts_with_the_current_objects() -> None:
    api = FakeKubeApi()
    await api.create(CONFIGMAPS, NS, cm("a"))
    events = await collect(api.watch(CONFIGMAPS, NS, resource_version="0"), until=lambda e: len(e) == 1)
    assert kinds(events) == [("ADDED", "a")]


async def test_a_version_older_than_the_history_is_expired() -> None:
    api = FakeKubeApi(FakeCluster(history=3))
    with pytest.raises(WatchExpired) as info:
        await collect(api.watch(CONFIGMAPS, NS, resource_version="1"))
    assert info.value.status == 410 and "too old resource version: 1" in info.value.message
    _, version = await api.list_versioned(CONFIGMAPS, NS)
    for i in range(3):
        await api.create(CONFIGMAPS, NS, cm(f"c{i}"))
    assert len(await collect(api.watch(CONFIGMAPS, NS, resource_version=version), until=lambda e: len(e) == 3)) == 3
    await api.create(CONFIGMAPS, NS, cm("c3"))  # the first change falls out of the history
    with pytest.raises(WatchExpired):
        await collect(api.watch(CONFIGMAPS, NS, resource_version=version))
    _, now = await api.list_versioned(CONFIGMAPS, NS)
    api.cluster.compact()
    with pytest.raises(WatchExpired):
        await collect(api.watch(CONFIGMAPS, NS, resource_version=str(int(now) - 1)))
    assert await collect(api.watch(CONFIGMAPS, NS, resource_version=now, timeout_seconds=0)) == []


async def test_an_idle_watch_bookmarks_and_ends_after_its_timeout() -> None:
    api = FakeKubeApi(FakeCluster(bookmark_interval=0.05, max_watch_seconds=0.3))
    _, version = await api.list_versioned(CONFIGMAPS, NS)
    await api.create(CONFIGMAPS, "elsewhere", cm("a"))  # not this watch's namespace
    events = await collect(api.watch(CONFIGMAPS, NS, resource_version=version))
    assert events and {e.type for e in events} == {"BOOKMARK"}
    assert events[0].object == {"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"resourceVersion": api.cluster.resource_version}}


async def test_a_watch_fault_is_raised_on_the_first_iteration() -> None:
    api = FakeKubeApi()
    api.fail("watch", KubeError(500, "InternalError", "boom"))
    stream = api.watch(CONFIGMAPS, NS, resource_version=api.cluster.resource_version)
    assert (await fails(collect(stream))).status == 500


async def test_the_products_list_watch_relists_when_it_fell_behind_the_history() -> None:
    api = FakeKubeApi(FakeCluster(history=2))
    await api.create(CONFIGMAPS, NS, cm("a"))
    snapshots = list_watch(api, CONFIGMAPS, NS)
    assert set(await anext(snapshots)) == {f"{NS}/a"}
    await api.create(CONFIGMAPS, NS, cm("b"))
    assert set(await anext(snapshots)) == {f"{NS}/a", f"{NS}/b"}
    assert api.calls["list_versioned"] == 1, "a watch, not a list"
    for name in ("c", "d", "e"):  # more changes than the history keeps while the consumer is away
        await api.create(CONFIGMAPS, NS, cm(name))
    assert set(await anext(snapshots)) == {f"{NS}/{n}" for n in "abcde"}
    assert api.calls["list_versioned"] == 2, "410: listed again"
    assert isinstance(snapshots, AsyncGenerator)
    await snapshots.aclose()
