"""Deletion: Status bodies, finalizers, preconditions, propagation policies, ownerReference GC, namespaces."""

from __future__ import annotations

from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

from tests.support import toy_crd
from tests.support.cluster import SimApi

pytestmark = pytest.mark.integration


@pytest.fixture
def core(sim_api: SimApi) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(sim_api.client_configuration()))


def owner_ref(obj: Any, kind: str = "ConfigMap", **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "name": obj.metadata.name, "uid": obj.metadata.uid, **extra}


def names(core: kubernetes.client.CoreV1Api) -> list[str]:
    return [i.metadata.name for i in core.list_namespaced_config_map("default").items]


def test_delete_returns_a_status_the_official_client_accepts(core: kubernetes.client.CoreV1Api) -> None:
    cm = core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}})
    status = core.delete_namespaced_config_map("cm", "default")  # client 37 returns the decoded JSON
    assert (status["kind"], status["status"], status["details"]["uid"]) == ("Status", "Success", cm.metadata.uid)
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("cm", "default")
    assert err.value.status == 404 and '"reason": "NotFound"' in err.value.body


def test_pod_delete_returns_the_pod(core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", {"metadata": {"name": "p"},
                                          "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    deleted = core.delete_namespaced_pod("p", "default")
    assert deleted.kind == "Pod" and deleted.metadata.name == "p"  # typed: the client expects a V1Pod


def test_finalizers_hold_the_object_until_removed(core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespaced_config_map("default", {"metadata": {"name": "cm", "finalizers": ["example.com/hold"]}})
    held = core.delete_namespaced_config_map("cm", "default")
    assert held["kind"] == "ConfigMap" and held["metadata"]["deletionTimestamp"]  # still there: the object
    current = core.read_namespaced_config_map("cm", "default")
    assert current.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map(
            "cm", "default", {"metadata": {"finalizers": ["example.com/hold", "example.com/new"]}}
        )
    assert err.value.status == 422 and "no new finalizers" in err.value.body
    core.patch_namespaced_config_map("cm", "default", [{"op": "remove", "path": "/metadata/finalizers"}])
    assert names(core) == []


def test_delete_preconditions(core: kubernetes.client.CoreV1Api) -> None:
    cm = core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}})
    with pytest.raises(ApiException) as err:
        core.delete_namespaced_config_map(
            "cm",
            "default",
            body=kubernetes.client.V1DeleteOptions(preconditions=kubernetes.client.V1Preconditions(uid="not-the-uid")),
        )
    assert err.value.status == 409 and "Precondition failed" in err.value.body
    core.delete_namespaced_config_map(
        "cm",
        "default",
        body=kubernetes.client.V1DeleteOptions(preconditions=kubernetes.client.V1Preconditions(uid=cm.metadata.uid)),
    )
    assert names(core) == []


def test_background_gc_deletes_dependents_and_honours_their_finalizers(
    sim_api: SimApi, core: kubernetes.client.CoreV1Api
) -> None:
    owner = core.create_namespaced_config_map("default", {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(
        "default",
        {
            "metadata": {
                "name": "child",
                "ownerReferences": [owner_ref(owner, controller=True, blockOwnerDeletion=True)],
            }
        },
    )
    core.create_namespaced_config_map(
        "default",
        {
            "metadata": {
                "name": "held-child",
                "finalizers": ["example.com/cleanup"],
                "ownerReferences": [owner_ref(owner)],
            }
        },
    )
    grandchild_owner = core.read_namespaced_config_map("child", "default")
    core.create_namespaced_config_map(
        "default", {"metadata": {"name": "grandchild", "ownerReferences": [owner_ref(grandchild_owner)]}}
    )
    core.delete_namespaced_config_map("owner", "default")
    sim_api.settled()
    assert names(core) == ["held-child"]
    held = core.read_namespaced_config_map("held-child", "default")
    assert held.metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map("held-child", "default", {"metadata": {"finalizers": None}})
    assert names(core) == []


def test_dangling_owner_reference_is_removed_when_another_owner_lives(
    sim_api: SimApi, core: kubernetes.client.CoreV1Api
) -> None:
    a = core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    b = core.create_namespaced_config_map("default", {"metadata": {"name": "b"}})
    core.create_namespaced_config_map(
        "default", {"metadata": {"name": "kid", "ownerReferences": [owner_ref(a), owner_ref(b)]}}
    )
    core.delete_namespaced_config_map("a", "default")
    sim_api.settled()
    kid = core.read_namespaced_config_map("kid", "default")
    assert [r.name for r in kid.metadata.owner_references] == ["b"]


def test_orphan_propagation_keeps_dependents(sim_api: SimApi, core: kubernetes.client.CoreV1Api) -> None:
    owner = core.create_namespaced_config_map("default", {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "kid", "ownerReferences": [owner_ref(owner)]}})
    core.delete_namespaced_config_map("owner", "default", propagation_policy="Orphan")
    sim_api.settled()
    assert names(core) == ["kid"]
    assert core.read_namespaced_config_map("kid", "default").metadata.owner_references is None


def test_foreground_propagation_deletes_dependents_first(sim_api: SimApi, core: kubernetes.client.CoreV1Api) -> None:
    owner = core.create_namespaced_config_map("default", {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(
        "default", {"metadata": {"name": "kid", "finalizers": ["example.com/x"], "ownerReferences": [owner_ref(owner)]}}
    )
    core.delete_namespaced_config_map("owner", "default", propagation_policy="Foreground")
    sim_api.settled()
    waiting = core.read_namespaced_config_map("owner", "default")
    assert "foregroundDeletion" in waiting.metadata.finalizers  # the owner waits for its dependents
    core.patch_namespaced_config_map("kid", "default", {"metadata": {"finalizers": None}})
    sim_api.settled()
    assert names(core) == []


def test_gc_crosses_kinds_custom_owner_and_builtin_child(sim_api: SimApi) -> None:
    sim_api.load_crd(toy_crd.toy_crd())
    client = kubernetes.client.ApiClient(sim_api.client_configuration())
    custom = kubernetes.client.CustomObjectsApi(client)
    core = kubernetes.client.CoreV1Api(client)
    owner = custom.create_namespaced_custom_object(
        toy_crd.GROUP, toy_crd.VERSION, "default", toy_crd.PLURAL, toy_crd.widget("w")
    )
    core.create_namespaced_config_map(
        "default",
        {
            "metadata": {
                "name": "cfg",
                "ownerReferences": [
                    {
                        "apiVersion": f"{toy_crd.GROUP}/{toy_crd.VERSION}",
                        "kind": toy_crd.KIND,
                        "name": "w",
                        "uid": owner["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            }
        },
    )
    custom.delete_namespaced_custom_object(toy_crd.GROUP, toy_crd.VERSION, "default", toy_crd.PLURAL, "w")
    sim_api.settled()
    assert names(core) == []


def test_deleting_a_namespace_deletes_its_contents(sim_api: SimApi, core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespace({"metadata": {"name": "team"}})
    core.create_namespaced_config_map("team", {"metadata": {"name": "cm"}})
    terminating = core.delete_namespace("team")
    assert terminating["status"]["phase"] == "Terminating"
    sim_api.settled()
    with pytest.raises(ApiException) as err:
        core.read_namespace("team")
    assert err.value.status == 404
    assert core.list_config_map_for_all_namespaces(field_selector="metadata.namespace=team").items == []


def test_deleting_a_crd_removes_its_resource_and_objects(sim_api: SimApi) -> None:
    sim_api.load_crd(toy_crd.toy_crd())
    client = kubernetes.client.ApiClient(sim_api.client_configuration())
    custom = kubernetes.client.CustomObjectsApi(client)
    custom.create_namespaced_custom_object(
        toy_crd.GROUP, toy_crd.VERSION, "default", toy_crd.PLURAL, toy_crd.widget("w")
    )
    ext = kubernetes.client.ApiextensionsV1Api(client)
    ext.delete_custom_resource_definition(f"{toy_crd.PLURAL}.{toy_crd.GROUP}")
    sim_api.settled()
    with pytest.raises(ApiException) as err:
        custom.list_namespaced_custom_object(toy_crd.GROUP, toy_crd.VERSION, "default", toy_crd.PLURAL)
    assert err.value.status == 404
    assert sim_api.api.objects  # the store itself survives; only the CRD's objects are gone
    assert not [k for k in sim_api.api.objects if k[0].group == toy_crd.GROUP and not sim_api.api.objects[k].deleted]


def test_dependent_of_a_missing_owner_is_collected(sim_api: SimApi, core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespaced_config_map("default", {"metadata": {"name": "orphan", "ownerReferences": [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": "ghost", "uid": "00000000-0000-0000-0000-000000000000"}]}})
    sim_api.settled()
    assert names(core) == []
