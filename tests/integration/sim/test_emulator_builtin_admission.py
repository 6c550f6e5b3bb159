"""Defaulting and validation of the built-in kinds the operator writes (official client)."""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

from tests.support import toy_crd
from tests.support.cluster import SimApi

pytestmark = pytest.mark.integration


@pytest.fixture
def client(sim_api: SimApi) -> kubernetes.client.ApiClient:
    return kubernetes.client.ApiClient(sim_api.client_configuration())


def deployment(labels: dict[str, str] | None = None, selector: dict[str, str] | None = None,
               image: str = "engine:1.2") -> dict[str, Any]:
    labels = labels or {"app": "web"}
    return {"metadata": {"name": "web"},
            "spec": {"selector": {"matchLabels": selector or labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "engine", "image": image,
                                                           "ports": [{"containerPort": 8000}]}]}}}}


def causes(err: pytest.ExceptionInfo[ApiException]) -> list[tuple[str, str]]:
    body = json.loads(err.value.body)
    assert err.value.status == 422 and body["reason"] == "Invalid"
    return [(c["field"], c["reason"]) for c in body["details"]["causes"]]


def test_deployment_defaults(client: kubernetes.client.ApiClient) -> None:
    apps = kubernetes.client.AppsV1Api(client)
    created = apps.create_namespaced_deployment("default", deployment(image="engine:latest"))
    assert created.spec.replicas == 1 and created.spec.revision_history_limit == 10
    assert created.spec.strategy.rolling_update.max_surge == "25%"
    pod = created.spec.template.spec
    assert (pod.restart_policy, pod.dns_policy, pod.termination_grace_period_seconds) == ("Always", "ClusterFirst", 30)
    container = pod.containers[0]
    assert container.image_pull_policy == "Always" and container.ports[0].protocol == "TCP"


@pytest.mark.parametrize(("body", "expected"), [
    (deployment(labels={"app": "web"}, selector={"app": "other"}),
     ("spec.template.metadata.labels", "FieldValueInvalid")),
    (deployment(labels={"model": "meta-llama/Llama-3.1-8B"}), ("metadata.labels", "FieldValueInvalid")),
    (deployment(image=""), ("spec.template.spec.containers[0].image", "FieldValueRequired")),
], ids=["selector-does-not-match-template", "label-value-with-slash", "missing-image"])
def test_invalid_deployments_are_refused(client: kubernetes.client.ApiClient, body: dict[str, Any],
                                         expected: tuple[str, str]) -> None:
    if expected[0] == "metadata.labels":
        body["metadata"]["labels"] = body["spec"]["template"]["metadata"]["labels"]
    with pytest.raises(ApiException) as err:
        kubernetes.client.AppsV1Api(client).create_namespaced_deployment("default", body)
    assert expected in causes(err)


def test_deployment_selector_is_immutable(client: kubernetes.client.ApiClient) -> None:
    apps = kubernetes.client.AppsV1Api(client)
    apps.create_namespaced_deployment("default", deployment())
    with pytest.raises(ApiException) as err:
        apps.patch_namespaced_deployment("web", "default", {"spec": {
            "selector": {"matchLabels": {"app": "web", "v": "2"}},
            "template": {"metadata": {"labels": {"app": "web", "v": "2"}}}}})
    assert ("spec.selector", "FieldValueInvalid") in causes(err)


def test_service_gets_a_cluster_ip_and_port_defaults(client: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(client)
    first = core.create_namespaced_service("default", {"metadata": {"name": "a"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"port": 80}]}})
    second = core.create_namespaced_service("default", {"metadata": {"name": "b"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"port": 80}]}})
    headless = core.create_namespaced_service("default", {"metadata": {"name": "h"}, "spec": {
        "clusterIP": "None", "selector": {"app": "web"}}})
    assert first.spec.cluster_ip.startswith("10.96.") and first.spec.cluster_ip != second.spec.cluster_ip
    assert headless.spec.cluster_ip == "None"
    port = first.spec.ports[0]
    assert (port.protocol, port.target_port, first.spec.type) == ("TCP", 80, "ClusterIP")
    replaced = core.replace_namespaced_service("a", "default", {  # a PUT that omits clusterIP keeps it
        "metadata": {"name": "a", "resourceVersion": first.metadata.resource_version},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 81}]}})
    assert replaced.spec.cluster_ip == first.spec.cluster_ip and replaced.spec.ports[0].port == 81
    with pytest.raises(ApiException) as merged:  # strategic merge keys ports by `port`: now two, so names needed
        core.patch_namespaced_service("b", "default", {"spec": {"ports": [{"port": 81, "name": "x"}]}})
    assert causes(merged) == [("spec.ports[0].name", "FieldValueRequired")]
    with pytest.raises(ApiException) as err:
        core.create_namespaced_service("default", {"metadata": {"name": "c"}, "spec": {
            "ports": [{"port": 80}, {"port": 81}]}})
    assert ("spec.ports[0].name", "FieldValueRequired") in causes(err)


def test_pod_container_names_must_be_dns_labels(client: kubernetes.client.ApiClient) -> None:
    with pytest.raises(ApiException) as err:
        kubernetes.client.CoreV1Api(client).create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {
            "containers": [{"name": "Engine_1", "image": "x"}]}})
    assert ("spec.containers[0].name", "FieldValueInvalid") in causes(err)


def test_immutable_config_map(client: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(client)
    core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}, "immutable": True, "data": {"a": "1"}})
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map("cm", "default", {"data": {"a": "2"}})
    assert ("data", "FieldValueForbidden") in causes(err)


def test_custom_resource_labels_are_validated_too(sim_api: SimApi, client: kubernetes.client.ApiClient) -> None:
    sim_api.load_crd(toy_crd.toy_crd())
    body = toy_crd.widget("w")
    body["metadata"]["labels"] = {"bad key": "x"}
    with pytest.raises(ApiException) as err:
        kubernetes.client.CustomObjectsApi(client).create_namespaced_custom_object(
            toy_crd.GROUP, toy_crd.VERSION, "default", toy_crd.PLURAL, body)
    assert ("metadata.labels", "FieldValueInvalid") in causes(err)
