"""CRDs: registration, schema validation with the real 422 shape, CEL, pruning, defaulting, fieldValidation."""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes.client
import pytest
import yaml
from kubernetes.client.rest import ApiException

from tests.support import toy_crd
from tests.support.cluster import SimApi
from tests.support.paths import CRD_FILE, EXAMPLE_FILES
from vllm_operator.sim.runner import SimApiError

pytestmark = pytest.mark.integration
ARGS = (toy_crd.GROUP, toy_crd.VERSION, "default", toy_crd.PLURAL)


@pytest.fixture
def custom(sim_api: SimApi) -> kubernetes.client.CustomObjectsApi:
    sim_api.load_crd(toy_crd.toy_crd())
    return kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(sim_api.client_configuration()))


def refusal(err: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(err.value.body)
    return body


def test_crd_becomes_established_and_registers_names(sim_api: SimApi) -> None:
    created = sim_api.load_crd(toy_crd.toy_crd())[0]
    assert "customresourcecleanup.apiextensions.k8s.io" in created["metadata"]["finalizers"]
    crd = sim_api.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{toy_crd.PLURAL}."
                                 f"{toy_crd.GROUP}")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    resources = sim_api.request("GET", f"/apis/{toy_crd.GROUP}/{toy_crd.VERSION}")["resources"]
    by_name = {r["name"]: r for r in resources}
    assert by_name["widgets"]["shortNames"] == ["wdg"] and by_name["widgets"]["kind"] == "Widget"
    assert by_name["widgets"]["categories"] == ["toys"] and by_name["widgets"]["namespaced"] is True
    assert {"widgets/status", "widgets/scale"} <= set(by_name)


@pytest.mark.parametrize(("spec", "field", "reason", "message"), [
    ({"size": "3"}, "spec.size", "FieldValueTypeInvalid",
     'Invalid value: "string": spec.size in body must be of type integer: "string"'),
    ({"size": 0}, "spec.size", "FieldValueInvalid",
     "Invalid value: 0: spec.size in body should be greater than or equal to 1"),
    ({"size": 11}, "spec.size", "FieldValueInvalid",
     "Invalid value: 11: spec.size in body should be less than or equal to 10"),
    ({"size": 2, "ratio": 0}, "spec.ratio", "FieldValueInvalid",
     "Invalid value: 0: spec.ratio in body should be greater than 0"),
    ({"size": 2, "mode": "turbo"}, "spec.mode", "FieldValueNotSupported",
     'Unsupported value: "turbo": supported values: "fast", "safe"'),
    ({}, "spec.size", "FieldValueRequired", "Required value"),
    ({"size": 2, "label": "waytoolong"}, "spec.label", "FieldValueTooLong",
     "Too long: may not be more than 8 bytes"),
    ({"size": 2, "label": "UPPER"}, "spec.label", "FieldValueInvalid",
     "Invalid value: \"UPPER\": spec.label in body should match '^[a-z]+$'"),
    ({"size": 2, "tags": ["a", "b", "c", "d"]}, "spec.tags", "FieldValueTooMany",
     "Too many: 4: must have at most 3 items"),
    ({"size": 2, "tags": ["a", "a"]}, "spec.tags[1]", "FieldValueDuplicate", 'Duplicate value: "a"'),
    ({"size": 2, "label": None}, "spec.label", "FieldValueTypeInvalid",
     'Invalid value: "null": spec.label in body must be of type string: "null"'),
    ({"size": 2, "limits": {"cpu": "x"}}, "spec.limits.cpu", "FieldValueTypeInvalid",
     'Invalid value: "string": spec.limits.cpu in body must be of type integer: "string"'),
    ({"size": 9, "mode": "fast"}, "spec", "FieldValueInvalid",
     'Invalid value: "object": big widgets must be safe'),
], ids=["type", "minimum", "maximum", "exclusive-minimum", "enum", "required", "max-length", "pattern",
        "max-items", "list-set-duplicate", "null-not-nullable", "additional-properties", "cel"])
def test_invalid_objects_get_422_with_field_causes(custom: kubernetes.client.CustomObjectsApi, spec: dict[str, Any],
                                                   field: str, reason: str, message: str) -> None:
    body = toy_crd.widget("bad")
    body["spec"] = spec
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object(*ARGS, body)
    status = refusal(err)
    assert (err.value.status, status["kind"], status["reason"], status["code"]) == (422, "Status", "Invalid", 422)
    assert status["details"]["kind"] == "Widget" and status["details"]["group"] == toy_crd.GROUP
    assert status["details"]["name"] == "bad"
    assert {"field": field, "reason": reason, "message": message} in status["details"]["causes"]
    assert status["message"].startswith(f'Widget.{toy_crd.GROUP} "bad" is invalid: ')
    assert f"{field}: {message}" in status["message"]


def test_several_errors_are_listed_in_brackets(custom: kubernetes.client.CustomObjectsApi) -> None:
    body = toy_crd.widget("bad", size=0, mode="x")
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object(*ARGS, body)
    status = refusal(err)
    assert len(status["details"]["causes"]) == 2
    assert status["message"].split("is invalid: ", 1)[1].startswith("[")


def test_nullable_field_accepts_null(custom: kubernetes.client.CustomObjectsApi) -> None:
    created = custom.create_namespaced_custom_object(*ARGS, toy_crd.widget("ok", note=None))
    assert created["spec"]["note"] is None


def test_transition_rule_with_old_self(custom: kubernetes.client.CustomObjectsApi) -> None:
    custom.create_namespaced_custom_object(*ARGS, toy_crd.widget("w", immutable="first"))  # no oldSelf on create
    custom.patch_namespaced_custom_object(*ARGS, "w", {"spec": {"size": 4}})
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object(*ARGS, "w", {"spec": {"immutable": "second"}})
    assert {"field": "spec.immutable", "reason": "FieldValueInvalid",
            "message": 'Invalid value: "string": immutable is immutable'} in refusal(err)["details"]["causes"]


def test_defaults_are_applied(custom: kubernetes.client.CustomObjectsApi) -> None:
    assert custom.create_namespaced_custom_object(*ARGS, toy_crd.widget("w"))["spec"]["mode"] == "safe"


def test_undeclared_fields_are_pruned_everywhere_but_preserved_where_declared(
        custom: kubernetes.client.CustomObjectsApi) -> None:
    body = toy_crd.widget("w", extra={"anything": {"goes": [1, 2]}}, unknown="dropped")
    body["metadata"]["bogus"] = "dropped"
    body["toplevel"] = "dropped"
    created = custom.create_namespaced_custom_object(*ARGS, body)
    assert "unknown" not in created["spec"] and "toplevel" not in created and "bogus" not in created["metadata"]
    assert created["spec"]["extra"] == {"anything": {"goes": [1, 2]}}


def test_undeclared_status_fields_disappear_on_status_writes(custom: kubernetes.client.CustomObjectsApi) -> None:
    custom.create_namespaced_custom_object(*ARGS, toy_crd.widget("w"))
    written = custom.patch_namespaced_custom_object_status(
        *ARGS, "w", {"status": {"phase": "Ready", "observedGeneration": 1, "plannedKV": "3 GiB"}})
    assert written["status"] == {"phase": "Ready", "observedGeneration": 1}
    assert "plannedKV" not in custom.get_namespaced_custom_object(*ARGS, "w")["status"]


def test_field_validation_strict_refuses_unknown_fields(custom: kubernetes.client.CustomObjectsApi) -> None:
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object(*ARGS, toy_crd.widget("w", unknown=1), field_validation="Strict")
    assert err.value.status == 400
    assert 'strict decoding error: unknown field "spec.unknown"' in refusal(err)["message"]
    created, _, headers = custom.create_namespaced_custom_object_with_http_info(
        *ARGS, toy_crd.widget("w", unknown=1), field_validation="Warn")
    assert "spec.unknown" in headers["Warning"] and "unknown" not in created["spec"]


def test_strategic_merge_patch_is_refused_for_custom_resources(sim_api: SimApi,
                                                               custom: kubernetes.client.CustomObjectsApi) -> None:
    custom.create_namespaced_custom_object(*ARGS, toy_crd.widget("w"))
    with pytest.raises(SimApiError) as err:
        sim_api.request("PATCH", toy_crd.path(name="w"), {"spec": {"size": 2}},
                        content_type="application/strategic-merge-patch+json")
    assert err.value.status == 415


def test_validation_ratchets_on_untouched_invalid_values(sim_api: SimApi, custom: kubernetes.client.CustomObjectsApi
                                                         ) -> None:
    custom.create_namespaced_custom_object(*ARGS, toy_crd.widget("w", label="ok"))
    tightened = toy_crd.toy_crd()
    tightened["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["label"][
        "maxLength"] = 1
    sim_api.load_crd(tightened)
    patched = custom.patch_namespaced_custom_object(*ARGS, "w", {"spec": {"size": 5}})
    assert patched["spec"]["label"] == "ok"  # existing value kept, as with CRDValidationRatcheting
    with pytest.raises(ApiException):
        custom.patch_namespaced_custom_object(*ARGS, "w", {"spec": {"label": "new"}})


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda c: c["metadata"].update(name="wrong.name"), "metadata.name"),
    (lambda c: c["spec"]["versions"][0].update(storage=False), "spec.versions"),
    (lambda c: c["spec"]["versions"][0].pop("schema"), "spec.versions[0].schema.openAPIV3Schema"),
    (lambda c: c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].update(
        {"x-kubernetes-validations": [{"rule": "self.size <<< 1"}]}),
     "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule"),
], ids=["name", "no-storage-version", "no-schema", "cel-does-not-compile"])
def test_invalid_crds_are_refused(sim_api: SimApi, mutate: Any, field: str) -> None:
    crd = toy_crd.toy_crd()
    mutate(crd)
    with pytest.raises(SimApiError) as err:
        sim_api.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    body = json.loads(err.value.body)
    assert err.value.status == 422
    assert field in [c["field"] for c in body["details"]["causes"]]


def _project_example(path: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return doc


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_project_crd_accepts_every_example(sim_api: SimApi, example: Any) -> None:
    sim_api.load_crd(CRD_FILE)
    doc = _project_example(example)
    namespace = doc["metadata"].get("namespace", "default")
    if namespace != "default":
        sim_api.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    group, version = doc["apiVersion"].split("/")
    custom = kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(sim_api.client_configuration()))
    created = custom.create_namespaced_custom_object(group, version, namespace, "vllmdeployments", doc,
                                                     field_validation="Strict")
    assert created["metadata"]["generation"] == 1


def test_project_crd_refuses_a_bad_example_with_422(sim_api: SimApi) -> None:
    sim_api.load_crd(CRD_FILE)
    doc = copy.deepcopy(_project_example(EXAMPLE_FILES[0]))
    doc["metadata"]["namespace"] = "default"
    short = doc["spec"].setdefault("pools", {}).setdefault("short", {})
    short["maxModelLen"] = 1024
    short["maxTokens"] = 4096  # maxTokens >= maxModelLen: a CEL rule refuses it
    group, version = doc["apiVersion"].split("/")
    custom = kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(sim_api.client_configuration()))
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object(group, version, "default", "vllmdeployments", doc)
    status = refusal(err)
    assert err.value.status == 422 and status["reason"] == "Invalid"
    assert any(c["field"].startswith("spec.pools.short") for c in status["details"]["causes"]), status
