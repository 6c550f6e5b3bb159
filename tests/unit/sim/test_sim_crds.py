"""CRD admission in the emulator refuses what kube-apiserver refuses (here: a root metadata schema)."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_operator.api import crdgen
from vllm_operator.sim.crds import parse_crd
from vllm_operator.sim.errors import ApiError


def crd_with_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    body = crdgen.crd()
    body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["metadata"] = metadata
    return body


@pytest.mark.parametrize("metadata", [
    {"type": "object", "description": "Standard object metadata."},
    {"type": "object", "properties": {"labels": {"type": "object"}}},
], ids=["description", "labels"])
def test_root_metadata_beyond_name_and_generate_name_is_refused(metadata: dict[str, Any]) -> None:
    with pytest.raises(ApiError) as refused:
        parse_crd(crd_with_metadata(metadata))
    assert "must not specify anything other than name and generateName" in str(refused.value.body())


@pytest.mark.parametrize("metadata", [
    {"type": "object"},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}}},
], ids=["plain", "name-constrained"])
def test_root_metadata_type_object_or_name_constraints_are_accepted(metadata: dict[str, Any]) -> None:
    parse_crd(crd_with_metadata(metadata))


def test_project_crd_is_accepted() -> None:
    parse_crd(crdgen.crd())
