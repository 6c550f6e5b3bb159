"""The generated CRD: no drift, structural, described, accepted by kubernetes-validate --strict."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.paths import CHART_CRD_FILE, CRD_FILE, ROOT
from vllm_operator import constants
from vllm_operator.api import crdgen


def test_crds_dir_matches_models() -> None:
    assert CRD_FILE.read_text() == crdgen.crd_yaml(), "crds/ drifted from the models: run `make crds`"


def test_chart_carries_the_same_crd() -> None:
    assert CHART_CRD_FILE.read_text() == CRD_FILE.read_text(), "chart CRD drifted: run `make crds`"


def test_cli_prints_the_crd() -> None:
    out = subprocess.run([sys.executable, "-m", "vllm_operator.cli", "crd"], capture_output=True, text=True, check=True)
    assert out.stdout == crdgen.crd_yaml()


def walk(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path."""
    if not isinstance(node, dict):
        return
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


SCHEMA = crdgen.openapi_schema()
NODES = list(walk(SCHEMA))


@pytest.mark.parametrize(("path", "node"), NODES, ids=[p or "<root>" for p, _ in NODES])
def test_node_is_structural(path: str, node: dict[str, Any]) -> None:
    for forbidden in ("$ref", "$defs", "anyOf", "allOf", "oneOf", "not", "definitions", "prefixItems", "const"):
        assert forbidden not in node, f"{path}: {forbidden} is not allowed in a structural schema"
    assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, f"{path}: needs a type"
    assert not ("properties" in node and "additionalProperties" in node), f"{path}: properties beside additionalProps"
    for bound in ("exclusiveMinimum", "exclusiveMaximum"):
        if bound in node:
            assert node[bound] is True, f"{path}: {bound} must be boolean"
    if node.get("type") == "array":
        assert "maxItems" in node, f"{path}: lists need maxItems (CEL cost)"
    if node.get("type") == "string" and "enum" not in node and path.startswith(".spec"):
        assert "maxLength" in node, f"{path}: strings need maxLength (CEL cost)"
    if node.get("type") == "null" or node.get("nullable") not in (None, True):
        pytest.fail(f"{path}: use nullable: true instead of type null")


@pytest.mark.parametrize(("path", "node"), NODES, ids=[p or "<root>" for p, _ in NODES])
def test_every_field_is_described(path: str, node: dict[str, Any]) -> None:
    if path.endswith("[]") or path.endswith("{}"):
        return  # list items and map values are described by their parent field
    if path == ".metadata":
        return  # the API server describes ObjectMeta itself and refuses a CRD that says anything more about it
    assert node.get("description"), f"{path}: every field needs a description (it is kubectl explain's text)"


def test_root_metadata_is_only_type_object() -> None:
    # kube-apiserver: "metadata: Forbidden: must not specify anything other than name and generateName".
    assert SCHEMA["properties"]["metadata"] == {"type": "object"}


def test_crd_passes_kubernetes_validate_strict() -> None:
    out = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "kubernetes-validate"), "--strict", str(CRD_FILE)],
        capture_output=True, text=True, check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "passed" in out.stdout


def test_crd_names_subresource_and_columns() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    assert crd["metadata"]["name"] == "vllmdeployments.vllm-operator.dev"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("VLLMDeployment", "vllmdeployments", ["vllmd"])
    (version,) = crd["spec"]["versions"]
    assert version["name"] == constants.VERSION and version["subresources"] == {"status": {}}
    columns = [(c["name"], c.get("priority", 0)) for c in version["additionalPrinterColumns"]]
    # issue 21: `kubectl get vllmd` shows whether the last edit was refused; -o wide adds the model and GPU type
    assert columns == [("Class", 0), ("Ready", 0), ("Short", 0), ("Long", 0), ("StepDown", 0), ("Spec", 0),
                       ("Age", 0), ("Model", 1), ("Accelerator", 1)]
    spec = next(c for c in version["additionalPrinterColumns"] if c["name"] == "Spec")
    assert spec["jsonPath"] == '.status.conditions[?(@.type=="SpecValid")].reason'


def test_status_declares_everything_later_work_writes() -> None:
    status = SCHEMA["properties"]["status"]["properties"]
    for field in ("observedGeneration", "conditions", "pools", "plan", "accelerator", "lastResetToken",
                  "stepDownLevel"):
        assert field in status, field
    pool = status["pools"]["properties"]["short"]["properties"]
    for field in ("replicas", "readyReplicas", "plannedKVTokens", "observedKVTokens", "stepDown", "restartBudget",
                  "stableSince"):
        assert field in pool, field
    assert pool["stepDown"]["properties"]["history"]["maxItems"] > 0
