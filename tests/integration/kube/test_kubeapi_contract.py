"""The KubeApi contract: one set of scenarios, run on two backends with the same assertions. `fake` is the
in-memory API server unit tests use (tests/support/fakekube), `real` is ClientKubeApi against the session's
kube-apiserver. What the fake claims to model is held to the server here; what it deliberately leaves out is
listed in its docstring. Server-side apply's field ownership is the server's alone: those scenarios run on `real`
only (`server`), as the contract ClientKubeApi relies on.

Every object a scenario makes carries the scenario's own label, and every list and watch selects by it: the real
namespace also holds the kube-root-ca.crt ConfigMap the controller manager publishes there, which the fake has not.
The "other writer" of an apply scenario is the same client's merge patch: on the server an Update by the manager its
user agent names (`vllm-operator`), next to the applies of manager `vllm-operator` (operation Apply).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testcluster.cluster import Cluster
from tests.support.fakekube import FakeKubeApi
from tests.support.kube import unique
from tests.support.paths import CRD_FILE, EXAMPLES
from vllm_operator import constants
from vllm_operator.k8s import (
    CONFIGMAPS,
    FIELD_MANAGER,
    VLLM_DEPLOYMENTS,
    ClientKubeApi,
    KubeApi,
    KubeError,
    WatchEvent,
    WatchExpired,
)

pytestmark = pytest.mark.integration

LABEL = "tests.vllm-operator.dev/contract"


@dataclass(frozen=True)
class Target:
    """Where a scenario runs: the backend, a namespace of its own, and for `real` the admin kubeconfig."""

    backend: str
    namespace: str
    kubeconfig: Path | None = None

    def selector(self, extra: str = "") -> str:
        """This scenario's objects, and of them those `extra` selects."""
        return f"{LABEL}={self.namespace}" + (f",{extra}" if extra else "")

    def configmap(self, name: str, labels: Mapping[str, str] | None = None, **data: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": self.namespace,
                             "labels": {LABEL: self.namespace, **(labels or {})}},
                "data": data}


@pytest.fixture(scope="module")
def crd(kube: Cluster) -> None:
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    kube.wait_established(constants.CRD_NAME)


@pytest.fixture(params=["fake", "real"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """The backend's namespace; only `real` starts (or reuses) the session's control plane."""
    namespace = unique("contract")
    if request.param == "fake":
        yield Target("fake", namespace)
        return
    kube: Cluster = request.getfixturevalue("kube")
    request.getfixturevalue("crd")
    kube.kubectl("create", "namespace", namespace)
    try:
        yield Target("real", namespace, kube.kubeconfig)
    finally:
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture
def server(kube: Cluster, crd: None) -> Iterator[Target]:
    """The real backend alone, for what the fake does not model (field ownership)."""
    namespace = unique("contract")
    kube.kubectl("create", "namespace", namespace)
    try:
        yield Target("real", namespace, kube.kubeconfig)
    finally:
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture
async def server_api(server: Target) -> AsyncIterator[KubeApi]:
    client = await ClientKubeApi.from_environment(kubeconfig=str(server.kubeconfig))
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def api(target: Target) -> AsyncIterator[KubeApi]:
    if target.kubeconfig is None:
        yield FakeKubeApi()
        return
    client = await ClientKubeApi.from_environment(kubeconfig=str(target.kubeconfig))
    try:
        yield client
    finally:
        await client.close()


async def fails(call: Any) -> KubeError:
    with pytest.raises(KubeError) as info:
        await call
    return info.value


async def live(api: KubeApi, target: Target, name: str) -> dict[str, Any]:
    got = await api.get(CONFIGMAPS, target.namespace, name)
    assert got is not None, name
    return got


def managers(obj: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    return {(e["manager"], e["operation"], e.get("subresource", "")) for e in obj["metadata"].get("managedFields", [])}


async def collect(api: KubeApi, target: Target, version: str, until: Callable[[list[WatchEvent]], bool], *,
                  extra: str = "") -> list[WatchEvent]:
    """A watch's events from `version` (bookmarks left out) until `until` holds of them; closed after."""
    events: list[WatchEvent] = []
    stream = api.watch(CONFIGMAPS, target.namespace, resource_version=version,
                       label_selector=target.selector(extra), timeout_seconds=30)
    try:
        async with asyncio.timeout(60):
            async for event in stream:
                if event.type != "BOOKMARK":
                    events.append(event)
                if until(events):
                    break
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()
    return events


def seen(events: list[WatchEvent]) -> list[tuple[str, str]]:
    return [(e.type, e.object["metadata"]["name"]) for e in events]


# --- reads -----------------------------------------------------------------------------------------------------


SELECTED = {"web": {"app": "x", "tier": "web"}, "db": {"app": "y", "tier": "db"}, "plain": {"app": "x"}, "bare": {}}


async def test_create_get_and_list_with_label_selectors(api: KubeApi, target: Target) -> None:
    for name, labels in SELECTED.items():
        made = await api.create(CONFIGMAPS, target.namespace, target.configmap(name, labels, k=name))
        assert made["metadata"]["uid"] and made["metadata"]["resourceVersion"] and made["data"] == {"k": name}
    got = await live(api, target, "web")
    assert got["metadata"]["labels"] == {LABEL: target.namespace, "app": "x", "tier": "web"}
    assert await api.get(CONFIGMAPS, target.namespace, "absent") is None
    items = await api.list(CONFIGMAPS, target.namespace, target.selector())
    assert {o["metadata"]["name"] for o in items} == set(SELECTED)
    assert {(o["apiVersion"], o["kind"]) for o in items} == {("v1", "ConfigMap")}
    for extra, names in (("app=x", {"web", "plain"}), ("app!=x", {"db", "bare"}), ("tier", {"web", "db"}),
                         ("!tier", {"plain", "bare"}), ("app in (x,y)", {"web", "db", "plain"}),
                         ("app notin (x)", {"db", "bare"}), ("app=x,tier=web", {"web"})):
        listed = await api.list(CONFIGMAPS, target.namespace, target.selector(extra))
        assert {o["metadata"]["name"] for o in listed} == names, extra


async def test_a_duplicate_create_is_409_and_a_nameless_one_422(api: KubeApi, target: Target) -> None:
    await api.create(CONFIGMAPS, target.namespace, target.configmap("a"))
    dup = await fails(api.create(CONFIGMAPS, target.namespace, target.configmap("a")))
    assert (dup.status, dup.reason, dup.message) == (409, "AlreadyExists", 'configmaps "a" already exists')
    nameless = target.configmap("")
    del nameless["metadata"]["name"]
    err = await fails(api.create(CONFIGMAPS, target.namespace, nameless))
    assert (err.status, err.reason) == (422, "Invalid") and "name or generateName is required" in err.message


# --- patches ---------------------------------------------------------------------------------------------------


async def test_a_merge_patch_deletes_with_null(api: KubeApi, target: Target) -> None:
    await api.create(CONFIGMAPS, target.namespace, target.configmap("a", {"drop": "1"}, keep="1", gone="2"))
    patched = await api.patch(CONFIGMAPS, target.namespace, "a", {"metadata": {"labels": {"drop": None}},
                                                                  "data": {"gone": None, "new": "3"}})
    assert patched["metadata"]["labels"] == {LABEL: target.namespace}
    assert patched["data"] == {"keep": "1", "new": "3"}
    assert (await live(api, target, "a"))["data"] == {"keep": "1", "new": "3"}


async def test_a_stale_resource_version_in_a_patch_is_a_conflict(api: KubeApi, target: Target) -> None:
    made = await api.create(CONFIGMAPS, target.namespace, target.configmap("a", k="1"))
    await api.patch(CONFIGMAPS, target.namespace, "a", {"data": {"k": "2"}})
    err = await fails(api.patch(CONFIGMAPS, target.namespace, "a", {
        "metadata": {"resourceVersion": made["metadata"]["resourceVersion"]}, "data": {"k": "3"}}))
    assert (err.status, err.reason) == (409, "Conflict") and "the object has been modified" in err.message
    assert (await live(api, target, "a"))["data"] == {"k": "2"}


async def test_status_is_a_subresource(api: KubeApi, target: Target) -> None:
    body = yaml.safe_load((EXAMPLES / "chat.yaml").read_text())
    body["metadata"] = {"name": "chat", "namespace": target.namespace, "labels": {LABEL: target.namespace}}
    body["status"] = {"observedGeneration": 7}
    made = await api.create(VLLM_DEPLOYMENTS, target.namespace, body)
    assert "status" not in made and made["metadata"]["generation"] == 1
    status = await api.patch_status(VLLM_DEPLOYMENTS, target.namespace, "chat", {
        "status": {"observedGeneration": 1}, "spec": {"pools": {"short": {"replicas": 5}}}})
    assert status["status"] == {"observedGeneration": 1} and status["spec"]["pools"]["short"]["replicas"] == 2
    assert status["metadata"]["generation"] == 1
    main = await api.patch(VLLM_DEPLOYMENTS, target.namespace, "chat", {
        "status": {"observedGeneration": 9}, "spec": {"pools": {"short": {"replicas": 3}}}})
    assert main["status"] == {"observedGeneration": 1} and main["spec"]["pools"]["short"]["replicas"] == 3
    assert main["metadata"]["generation"] == 2
    err = await fails(api.patch_status(VLLM_DEPLOYMENTS, target.namespace, "chat", {
        "metadata": {"resourceVersion": status["metadata"]["resourceVersion"]}, "status": {"observedGeneration": 2}}))
    assert err.conflict


# --- server-side apply (the real server only: the fake keeps no field ownership) ------------------------------


async def test_an_apply_removes_what_it_no_longer_applies_and_keeps_another_writers_field(
        server_api: KubeApi, server: Target) -> None:
    made = await server_api.apply(CONFIGMAPS, server.namespace, "a",
                                  server.configmap("a", {"app": "x"}, keep="1", drop="2"))
    assert made["data"] == {"keep": "1", "drop": "2"} and managers(made) == {(FIELD_MANAGER, "Apply", "")}
    await server_api.patch(CONFIGMAPS, server.namespace, "a",
                           {"metadata": {"annotations": {"team.example/owner": "search"}}})
    again = await server_api.apply(CONFIGMAPS, server.namespace, "a", server.configmap("a", {"app": "x"}, keep="1"))
    assert again["data"] == {"keep": "1"}
    assert again["metadata"]["annotations"] == {"team.example/owner": "search"}
    assert again["metadata"]["labels"] == {LABEL: server.namespace, "app": "x"}
    assert managers(again) == {(FIELD_MANAGER, "Apply", ""), ("vllm-operator", "Update", "")}
    unchanged = await server_api.apply(CONFIGMAPS, server.namespace, "a", server.configmap("a", {"app": "x"}, keep="1"))
    assert unchanged["metadata"]["resourceVersion"] == again["metadata"]["resourceVersion"], "a no-op apply"


async def test_a_field_its_creator_also_owns_survives_the_apply_dropping_it(server_api: KubeApi,
                                                                           server: Target) -> None:
    await server_api.create(CONFIGMAPS, server.namespace, server.configmap("a", x="1", y="2"))
    await server_api.apply(CONFIGMAPS, server.namespace, "a", server.configmap("a", x="1", y="2"))
    after = await server_api.apply(CONFIGMAPS, server.namespace, "a", server.configmap("a", x="1"))
    assert after["data"] == {"x": "1", "y": "2"}, "the creator (an Update manager) still owns data.y"


async def test_a_contested_field_is_a_conflict_naming_its_manager_and_force_takes_it(
        server_api: KubeApi, server: Target) -> None:
    await server_api.create(CONFIGMAPS, server.namespace, server.configmap("a", x="1"))
    err = await fails(server_api.apply(CONFIGMAPS, server.namespace, "a", server.configmap("a", x="2")))
    assert (err.status, err.reason) == (409, "Conflict")
    assert err.causes == [{"reason": "FieldManagerConflict", "message": 'conflict with "vllm-operator" using v1',
                           "field": ".data.x"}]
    assert (await live(server_api, server, "a"))["data"] == {"x": "1"}
    forced = await server_api.apply(CONFIGMAPS, server.namespace, "a", server.configmap("a", x="2"), force=True)
    assert forced["data"] == {"x": "2"}
    dropped = await server_api.apply(CONFIGMAPS, server.namespace, "a", server.configmap("a"))
    assert "x" not in (dropped.get("data") or {}), "taken by force, owned by the applier alone, dropped"


# --- delete ----------------------------------------------------------------------------------------------------


async def test_a_delete_with_another_uid_is_a_conflict(api: KubeApi, target: Target) -> None:
    made = await api.create(CONFIGMAPS, target.namespace, target.configmap("a"))
    err = await fails(api.delete(CONFIGMAPS, target.namespace, "a", uid="00000000-0000-0000-0000-000000000000"))
    assert (err.status, err.reason) == (409, "Conflict") and "the UID in the precondition" in err.message
    assert await api.get(CONFIGMAPS, target.namespace, "a") is not None
    await api.delete(CONFIGMAPS, target.namespace, "a", uid=made["metadata"]["uid"])
    assert await api.get(CONFIGMAPS, target.namespace, "a") is None
    await api.delete(CONFIGMAPS, target.namespace, "a")  # absent: no error


# --- list and watch --------------------------------------------------------------------------------------------


async def test_a_watch_from_a_lists_version_sees_the_changes_after_it_in_order(api: KubeApi, target: Target) -> None:
    await api.create(CONFIGMAPS, target.namespace, target.configmap("before"))
    items, version = await api.list_versioned(CONFIGMAPS, target.namespace, target.selector())
    assert [o["metadata"]["name"] for o in items] == ["before"] and version
    await api.create(CONFIGMAPS, target.namespace, target.configmap("a", k="1"))
    await api.patch(CONFIGMAPS, target.namespace, "a", {"data": {"k": "2"}})
    await api.delete(CONFIGMAPS, target.namespace, "a")
    events = await collect(api, target, version, lambda e: bool(e) and e[-1].type == "DELETED")
    assert seen(events) == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    # resourceVersions are opaque to clients; both backends' are increasing integers, which the ordering shows.
    versions = [int(e.resource_version) for e in events]
    assert versions == sorted(set(versions)) and versions[0] > int(version), versions
    assert events[1].object["data"] == {"k": "2"} and events[2].object["data"] == {"k": "2"}
    assert events[0].object["kind"] == "ConfigMap"


async def test_an_object_leaving_the_selector_is_seen_deleted(api: KubeApi, target: Target) -> None:
    _, version = await api.list_versioned(CONFIGMAPS, target.namespace, target.selector("phase=in"))
    await api.create(CONFIGMAPS, target.namespace, target.configmap("a", {"phase": "in"}, k="1"))
    await api.patch(CONFIGMAPS, target.namespace, "a", {"metadata": {"labels": {"phase": "out"}}, "data": {"k": "2"}})
    await api.patch(CONFIGMAPS, target.namespace, "a", {"data": {"k": "3"}})
    await api.patch(CONFIGMAPS, target.namespace, "a", {"metadata": {"labels": {"phase": "in"}}})
    events = await collect(api, target, version, lambda e: len(e) == 3, extra="phase=in")
    assert seen(events) == [("ADDED", "a"), ("DELETED", "a"), ("ADDED", "a")]
    gone = events[1].object
    assert gone["metadata"]["labels"]["phase"] == "in" and gone["data"] == {"k": "1"}, "its previous content"
    assert int(events[0].resource_version) < int(events[1].resource_version) < int(events[2].resource_version)
    assert events[2].object["data"] == {"k": "3"}


async def test_a_watch_from_a_version_older_than_the_server_keeps_is_expired(api: KubeApi, target: Target) -> None:
    # The watch cache of a CRD's objects starts when the CRD is established, long after resourceVersion 1 on the
    # session's etcd; the fake's history starts at its first resourceVersion (1000).
    stream = api.watch(VLLM_DEPLOYMENTS, target.namespace, resource_version="1", timeout_seconds=10)
    with pytest.raises(WatchExpired) as info:
        async with asyncio.timeout(30):
            async for _ in stream:
                pass
    assert info.value.status == 410 and "too old resource version" in info.value.message
