"""Status subresource isolation, scale, label/field selectors and pagination."""

from __future__ import annotations

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

from tests.support import toy_crd
from tests.support.cluster import SimApi

pytestmark = pytest.mark.integration


@pytest.fixture
def client(sim_api: SimApi) -> kubernetes.client.ApiClient:
    sim_api.load_crd(toy_crd.toy_crd())
    return kubernetes.client.ApiClient(sim_api.client_configuration())


def _custom(client: kubernetes.client.ApiClient) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(client)


ARGS = (toy_crd.GROUP, toy_crd.VERSION, "default", toy_crd.PLURAL)


def test_status_sent_on_create_is_dropped(client: kubernetes.client.ApiClient) -> None:
    body = toy_crd.widget("w")
    body["status"] = {"phase": "Faked"}
    created = _custom(client).create_namespaced_custom_object(*ARGS, body)
    assert "status" not in created


def test_main_resource_writes_cannot_change_status(client: kubernetes.client.ApiClient) -> None:
    api = _custom(client)
    api.create_namespaced_custom_object(*ARGS, toy_crd.widget("w"))
    api.patch_namespaced_custom_object_status(*ARGS, "w", {"status": {"phase": "Ready"}})
    patched = api.patch_namespaced_custom_object(*ARGS, "w", {"spec": {"size": 4}, "status": {"phase": "Hacked"}})
    assert patched["spec"]["size"] == 4
    assert patched["status"] == {"phase": "Ready"}


def test_status_writes_cannot_change_spec_or_metadata(client: kubernetes.client.ApiClient) -> None:
    api = _custom(client)
    api.create_namespaced_custom_object(*ARGS, toy_crd.widget("w", size=2))
    patched = api.patch_namespaced_custom_object_status(
        *ARGS, "w", {"spec": {"size": 9}, "metadata": {"labels": {"sneaky": "yes"}}, "status": {"phase": "Ready"}}
    )
    assert patched["spec"]["size"] == 2
    assert "labels" not in patched["metadata"]
    assert patched["status"]["phase"] == "Ready"
    assert patched["metadata"]["generation"] == 1  # a status write is not a spec change


def test_status_isolation_on_a_builtin_kind(client: kubernetes.client.ApiClient) -> None:
    apps = kubernetes.client.AppsV1Api(client)
    apps.create_namespaced_deployment(
        "default",
        {
            "metadata": {"name": "web"},
            "status": {"replicas": 7},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"labels": {"a": "b"}},
                             "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
            },
        },
    )
    assert apps.read_namespaced_deployment("web", "default").status.replicas is None
    apps.patch_namespaced_deployment_status("web", "default", {"status": {"replicas": 2, "readyReplicas": 1}})
    after = apps.patch_namespaced_deployment("web", "default", {"status": {"readyReplicas": 99}})
    assert after.status.ready_replicas == 1


def test_status_subresource_is_absent_when_the_crd_does_not_declare_it(sim_api: SimApi) -> None:
    sim_api.load_crd(toy_crd.toy_crd(status_subresource=False))
    api = _custom(kubernetes.client.ApiClient(sim_api.client_configuration()))
    body = toy_crd.widget("w")
    body["status"] = {"phase": "Kept"}
    created = api.create_namespaced_custom_object(*ARGS, body)
    assert created["status"] == {"phase": "Kept"}  # without the subresource, status is ordinary content
    with pytest.raises(ApiException) as err:
        api.patch_namespaced_custom_object_status(*ARGS, "w", {"status": {"phase": "x"}})
    assert err.value.status == 404


def test_scale_subresource_reads_and_writes_the_declared_paths(client: kubernetes.client.ApiClient) -> None:
    api = _custom(client)
    api.create_namespaced_custom_object(*ARGS, toy_crd.widget("w", size=2))
    scale = api.get_namespaced_custom_object_scale(*ARGS, "w")
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 2
    api.patch_namespaced_custom_object_scale(*ARGS, "w", {"spec": {"replicas": 5}})
    assert api.get_namespaced_custom_object(*ARGS, "w")["spec"]["size"] == 5


@pytest.fixture
def labelled(client: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    core = kubernetes.client.CoreV1Api(client)
    for name, labels in {
        "a": {"app": "web", "tier": "front"},
        "b": {"app": "web", "tier": "back"},
        "c": {"app": "db"},
        "d": {},
    }.items():
        core.create_namespaced_config_map("default", {"metadata": {"name": name, "labels": labels}})
    return core


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", ["a", "b"]),
        ("app==web", ["a", "b"]),
        ("app!=web", ["c", "d"]),
        ("tier in (front,middle)", ["a"]),
        ("tier notin (front)", ["b", "c", "d"]),
        ("tier", ["a", "b"]),
        ("!tier", ["c", "d"]),
        ("app=web,tier!=back", ["a"]),
        ("app in (web, db),!tier", ["c"]),
    ],
    ids=["eq", "double-eq", "neq", "in", "notin", "exists", "not-exists", "and", "set-and-not-exists"],
)
def test_label_selectors_on_list(labelled: kubernetes.client.CoreV1Api, selector: str, expected: list[str]) -> None:
    items = labelled.list_namespaced_config_map("default", label_selector=selector).items
    assert [i.metadata.name for i in items] == expected


def test_malformed_label_selector_is_400(labelled: kubernetes.client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as err:
        labelled.list_namespaced_config_map("default", label_selector="app in web")
    assert err.value.status == 400


def test_field_selectors_and_unknown_fields(labelled: kubernetes.client.CoreV1Api) -> None:
    names = [
        i.metadata.name for i in labelled.list_config_map_for_all_namespaces(field_selector="metadata.name=b").items
    ]
    assert names == ["b"]
    others = labelled.list_namespaced_config_map("default", field_selector="metadata.name!=b").items
    assert [i.metadata.name for i in others] == ["a", "c", "d"]
    with pytest.raises(ApiException) as err:
        labelled.list_namespaced_config_map("default", field_selector="data.x=1")
    assert err.value.status == 400 and "field label not supported" in err.value.body


def test_pod_field_selector_spec_node_name(client: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(client)
    for name, node in (("p1", "n1"), ("p2", "n2"), ("p3", None)):
        spec = {"containers": [{"name": "c", "image": "x"}], **({"nodeName": node} if node else {})}
        core.create_namespaced_pod("default", {"metadata": {"name": name}, "spec": spec})
    assert [p.metadata.name for p in core.list_namespaced_pod("default", field_selector="spec.nodeName=n1").items] == [
        "p1"
    ]
    assert [p.metadata.name for p in core.list_namespaced_pod("default", field_selector="spec.nodeName=").items] == [
        "p3"
    ]
    assert {p.status.phase for p in core.list_namespaced_pod("default").items} == {"Pending"}


def test_pagination_with_limit_and_continue(labelled: kubernetes.client.CoreV1Api) -> None:
    first = labelled.list_namespaced_config_map("default", limit=3)
    assert [i.metadata.name for i in first.items] == ["a", "b", "c"]
    assert first.metadata.remaining_item_count == 1
    rest = labelled.list_namespaced_config_map("default", limit=3, _continue=first.metadata._continue)
    assert [i.metadata.name for i in rest.items] == ["d"] and not rest.metadata._continue


def test_delete_collection_honours_the_selector(labelled: kubernetes.client.CoreV1Api) -> None:
    labelled.delete_collection_namespaced_config_map("default", label_selector="app=web")
    assert [i.metadata.name for i in labelled.list_namespaced_config_map("default").items] == ["c", "d"]
