"""Server-set metadata, namespaces, create/replace/patch semantics and optimistic concurrency (official client)."""

from __future__ import annotations

import threading
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


@pytest.fixture
def apps(sim_api: SimApi) -> kubernetes.client.AppsV1Api:
    return kubernetes.client.AppsV1Api(kubernetes.client.ApiClient(sim_api.client_configuration()))


@pytest.fixture
def custom(sim_api: SimApi) -> kubernetes.client.CustomObjectsApi:
    sim_api.load_crd(toy_crd.toy_crd())
    return kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(sim_api.client_configuration()))


def deployment(name: str, replicas: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"app": name}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}


def test_create_answers_201_with_server_set_metadata(core: kubernetes.client.CoreV1Api) -> None:
    body, status, _ = core.create_namespaced_config_map_with_http_info("default", {"metadata": {"name": "cm"}})
    assert status == 201
    meta = body.metadata
    assert meta.uid and meta.resource_version and meta.creation_timestamp is not None
    assert meta.namespace == "default"  # taken from the URL: the body had none


def test_namespace_in_body_must_match_the_url(core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespace({"metadata": {"name": "other"}})
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {"name": "cm", "namespace": "other"}})
    assert err.value.status == 400
    assert "does not match the namespace" in err.value.body


def test_generate_name_makes_unique_names(core: kubernetes.client.CoreV1Api) -> None:
    names = {core.create_namespaced_config_map("default", {"metadata": {"generateName": "gen-"}}).metadata.name
             for _ in range(5)}
    assert len(names) == 5
    assert all(n.startswith("gen-") and len(n) == len("gen-") + 5 for n in names)


def test_missing_name_and_invalid_name_are_422(core: kubernetes.client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {}})
    assert err.value.status == 422 and "name or generateName is required" in err.value.body
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {"name": "Not_Valid"}})
    assert err.value.status == 422 and "RFC 1123" in err.value.body


def test_duplicate_create_is_409_already_exists(core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespaced_config_map("default", {"metadata": {"name": "dup"}})
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {"name": "dup"}})
    assert err.value.status == 409 and '"reason": "AlreadyExists"' in err.value.body


def test_writes_into_missing_namespace_are_404(core: kubernetes.client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("nowhere", {"metadata": {"name": "cm"}})
    assert err.value.status == 404 and 'namespaces \\"nowhere\\" not found' in err.value.body


def test_resource_version_bumps_on_every_write_and_not_on_noops(core: kubernetes.client.CoreV1Api) -> None:
    rv0 = int(core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}, "data": {"a": "1"}})
              .metadata.resource_version)
    rv1 = int(core.patch_namespaced_config_map("cm", "default", {"data": {"a": "2"}}).metadata.resource_version)
    rv2 = int(core.patch_namespaced_config_map("cm", "default", {"metadata": {"labels": {"x": "y"}}})
              .metadata.resource_version)
    assert rv0 < rv1 < rv2
    same = core.patch_namespaced_config_map("cm", "default", {"data": {"a": "2"}})
    assert int(same.metadata.resource_version) == rv2


def test_generation_bumps_on_spec_changes_only(apps: kubernetes.client.AppsV1Api) -> None:
    created = apps.create_namespaced_deployment("default", deployment("web"))
    assert created.metadata.generation == 1
    labelled = apps.patch_namespaced_deployment("web", "default", {"metadata": {"labels": {"tier": "x"}}})
    assert labelled.metadata.generation == 1
    scaled = apps.patch_namespaced_deployment("web", "default", {"spec": {"replicas": 3}})
    assert scaled.metadata.generation == 2


def test_put_replaces_and_a_stale_resource_version_gets_409(core: kubernetes.client.CoreV1Api) -> None:
    cm = core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}, "data": {"a": "1", "b": "2"}})
    cm.data = {"a": "9"}
    replaced = core.replace_namespaced_config_map("cm", "default", cm)
    assert replaced.data == {"a": "9"}  # a replace, not a merge
    cm.data = {"a": "stale"}  # cm still carries the old resourceVersion
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_config_map("cm", "default", cm)
    assert err.value.status == 409
    assert "the object has been modified" in err.value.body


def test_merge_patch_carrying_a_stale_resource_version_gets_409(custom: kubernetes.client.CustomObjectsApi) -> None:
    obj = custom.create_namespaced_custom_object(toy_crd.GROUP, toy_crd.VERSION, "default", toy_crd.PLURAL,
                                                 toy_crd.widget("w"))
    rv = obj["metadata"]["resourceVersion"]
    custom.patch_namespaced_custom_object(toy_crd.GROUP, toy_crd.VERSION, "default", toy_crd.PLURAL, "w",
                                          {"metadata": {"resourceVersion": rv}, "spec": {"size": 4}})
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object(toy_crd.GROUP, toy_crd.VERSION, "default", toy_crd.PLURAL, "w",
                                              {"metadata": {"resourceVersion": rv}, "spec": {"size": 5}})
    assert err.value.status == 409


def test_custom_resource_put_requires_a_resource_version(custom: kubernetes.client.CustomObjectsApi) -> None:
    custom.create_namespaced_custom_object(toy_crd.GROUP, toy_crd.VERSION, "default", toy_crd.PLURAL,
                                           toy_crd.widget("w"))
    with pytest.raises(ApiException) as err:
        custom.replace_namespaced_custom_object(toy_crd.GROUP, toy_crd.VERSION, "default", toy_crd.PLURAL, "w",
                                                toy_crd.widget("w", size=2))
    assert err.value.status == 422 and "must be specified for an update" in err.value.body


def test_json_patch_test_operation_guards_the_resource_version(core: kubernetes.client.CoreV1Api) -> None:
    cm = core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}})
    rv = cm.metadata.resource_version
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
           {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/x"]}]
    patched = core.patch_namespaced_config_map("cm", "default", ops)
    assert patched.metadata.finalizers == ["example.com/x"]
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map("cm", "default", ops)
    assert err.value.status == 422


def test_strategic_merge_patch_merges_containers_by_name(apps: kubernetes.client.AppsV1Api) -> None:
    body = deployment("web")
    body["spec"]["template"]["spec"]["containers"].append({"name": "side", "image": "sidecar:1"})
    apps.create_namespaced_deployment("default", body)
    patched = apps.patch_namespaced_deployment("web", "default", {"spec": {"template": {"spec": {
        "containers": [{"name": "side", "image": "sidecar:2"}]}}}})
    images = {c.name: c.image for c in patched.spec.template.spec.containers}
    assert images == {"c": "busybox", "side": "sidecar:2"}


def test_two_writers_racing_on_one_object_exactly_one_wins(core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespaced_config_map("default", {"metadata": {"name": "race"}, "data": {"winner": "none"}})
    start = core.read_namespaced_config_map("race", "default")
    barrier = threading.Barrier(2)
    outcomes: dict[str, int] = {}

    def write(who: str) -> None:
        body = kubernetes.client.V1ConfigMap(metadata=kubernetes.client.V1ObjectMeta(
            name="race", resource_version=start.metadata.resource_version), data={"winner": who})
        barrier.wait()
        try:
            core.replace_namespaced_config_map("race", "default", body)
            outcomes[who] = 200
        except ApiException as exc:
            outcomes[who] = exc.status

    threads = [threading.Thread(target=write, args=(who,)) for who in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(outcomes.values()) == [200, 409]
    winner = next(who for who, status in outcomes.items() if status == 200)
    assert core.read_namespaced_config_map("race", "default").data == {"winner": winner}
