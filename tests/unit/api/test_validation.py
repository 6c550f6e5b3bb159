"""Examples are valid and bad specs are refused — identically by the CRD (schema + CEL) and by pydantic.

The API server validates with the CRD; `vllm-operator plan` validates offline with pydantic. Each case below runs
through both so they cannot drift apart.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support.cel import rules_in, violations
from tests.support.paths import EXAMPLE_FILES
from vllm_operator.api import crdgen
from vllm_operator.api.errors import SpecError
from vllm_operator.api.resource import parse_resource

SCHEMA = crdgen.openapi_schema()
BASE: dict[str, Any] = yaml.safe_load((EXAMPLE_FILES[0].parent / "long-doc.yaml").read_text())


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def strict(schema: Any) -> Any:
    """The schema as `fieldValidation=Strict` applies it: undeclared fields are errors, not pruned."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    return [strict(v) for v in schema] if isinstance(schema, list) else schema


STRICT_SCHEMA = strict(SCHEMA)


def schema_errors(obj: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft4Validator(STRICT_SCHEMA)  # OpenAPI v3 bounds are draft-4 style
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]


def test_all_required_examples_exist() -> None:
    names = {p.name for p in EXAMPLE_FILES}
    assert {"chat.yaml", "multi-turn.yaml", "rag.yaml", "long-doc.yaml", "cpu-dev.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_example_is_valid_everywhere(path: Path) -> None:
    obj = load(path)
    assert schema_errors(obj) == []
    assert violations(SCHEMA, obj) == []
    parsed = parse_resource(obj)
    assert parsed.spec.accelerator.type != "auto", "examples name concrete accelerators so they plan offline"


def test_issue_example_is_accepted() -> None:
    """The exact object from the contract issue, with everything under pools and routing optional."""
    obj = copy.deepcopy(BASE)
    obj["spec"].pop("remediation")
    assert schema_errors(obj) == [] and violations(SCHEMA, obj) == []
    parse_resource(obj)
    del obj["spec"]["pools"], obj["spec"]["routing"]
    assert schema_errors(obj) == [] and violations(SCHEMA, obj) == []
    parse_resource(obj)


PVC_ADAPTER = {"pvc": {"claimName": "adapters", "path": "a"}}


def with_spec(**patch: Any) -> dict[str, Any]:
    obj = copy.deepcopy(BASE)
    for dotted, value in patch.items():
        node = obj["spec"]
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return obj


# (id, object, where the CRD refuses it: "schema" | "cel", text pydantic's message must contain)
BAD: list[tuple[str, dict[str, Any], str, str]] = [
    ("negative-replicas", with_spec(pools__short__replicas=-1), "schema", "spec.pools.short.replicas"),
    ("zero-max-tokens", with_spec(pools__long__maxTokens=0), "schema", "spec.pools.long.maxTokens"),
    ("zero-max-model-len", with_spec(pools__long__maxModelLen=0), "schema", "spec.pools.long.maxModelLen"),
    ("zero-accelerator-count", with_spec(accelerator={"type": "nvidia-h100-80gb", "count": 0}), "schema",
     "spec.accelerator.count"),
    ("utilization-zero", with_spec(pools__long__gpuMemoryUtilization=0), "schema", "gpuMemoryUtilization"),
    ("utilization-above-one", with_spec(pools__long__gpuMemoryUtilization=1.2), "schema", "gpuMemoryUtilization"),
    ("zero-max-num-seqs", with_spec(pools__short__maxNumSeqs=0), "schema", "maxNumSeqs"),
    ("zero-batched-tokens", with_spec(pools__short__maxNumBatchedTokens=0), "schema", "maxNumBatchedTokens"),
    ("unknown-field", with_spec(pools__short__maxModelLength=4096), "schema", "unknown field"),
    ("bad-class-name", with_spec(workloadClass="Batch_1"), "schema", "spec.workloadClass"),
    ("unknown-gpu", with_spec(accelerator={"type": "nvidia-v100"}), "schema", "spec.accelerator.type"),
    ("unknown-kv-dtype", with_spec(pools__long__kvCacheDtype="int8"), "schema", "kvCacheDtype"),
    ("tokens-not-below-len", with_spec(pools__long={"maxModelLen": 4096, "maxTokens": 4096}), "cel",
     "maxTokens (4096) must be below maxModelLen (4096)"),
    ("short-longer-than-long", with_spec(pools={"short": {"maxModelLen": 65536}, "long": {"maxModelLen": 32768}}),
     "cel", "short.maxModelLen (65536) must not exceed long.maxModelLen (32768)"),
    ("tier-default-above-cap", with_spec(routing={"tiers": [{"name": "a", "defaultMaxTokens": 600, "maxTokens": 500}]}),
     "cel", "defaultMaxTokens (600) exceeds maxTokens (500)"),
    ("duplicate-tiers", with_spec(routing={"tiers": [{"name": "a", "maxTokens": 5}, {"name": "a", "maxTokens": 6}]}),
     "cel", "repeated: a"),
    ("cpu-without-memory", with_spec(accelerator={"type": "cpu"}), "cel", "memoryGiB is required"),
    ("cpu-with-two-devices", with_spec(accelerator={"type": "cpu", "memoryGiB": 8, "count": 2}), "cel",
     "count must be 1 for cpu"),
    ("facts-without-weights", with_spec(model={"name": "x/y", "facts": {
        "numLayers": 2, "numKVHeads": 2, "headDim": 64, "maxContextLength": 4096}}), "cel", "give weightsGiB"),
    ("mla-rank-without-rope", with_spec(model={"name": "x/y", "facts": {
        "numLayers": 2, "numKVHeads": 2, "headDim": 64, "maxContextLength": 4096, "weightsGiB": 1,
        "kvLoraRank": 512}}), "cel", "kvLoraRank and qkRopeHeadDim together"),
    ("sliding-layers-without-window", with_spec(model={"name": "x/y", "facts": {
        "numLayers": 2, "numKVHeads": 2, "headDim": 64, "maxContextLength": 4096, "weightsGiB": 1,
        "slidingWindowLayers": 1}}), "cel", "slidingWindowLayers needs slidingWindow"),
    ("more-sliding-layers-than-layers", with_spec(model={"name": "x/y", "facts": {
        "numLayers": 2, "numKVHeads": 2, "headDim": 64, "maxContextLength": 4096, "weightsGiB": 1,
        "slidingWindow": 1024, "slidingWindowLayers": 3}}), "cel", "cannot be more than numLayers"),
    ("two-model-sources", with_spec(model={"name": "x/y", "source": {"huggingFace": {}, "pvc": {"claimName": "m"}}}),
     "cel", "only one of huggingFace and pvc"),
    ("cache-claim-but-off", with_spec(model={"name": "x/y", "cache": {"enabled": False, "claim": {"size": "100Gi"}}}),
     "cel", "cache.claim is set but cache.enabled is false: drop one"),
    ("cache-for-pvc-source", with_spec(model={"name": "x/y", "source": {"pvc": {"claimName": "m"}},
                                              "cache": {"enabled": False}}),
     "cel", "model.cache is for Hugging Face sources; source.pvc is read from its own claim"),
    ("cache-claim-bad-size", with_spec(model={"name": "x/y", "cache": {"claim": {"size": "lots"}}}), "schema",
     "spec.model.cache.claim.size"),
    ("cache-claim-bad-mode", with_spec(model={"name": "x/y", "cache": {"claim": {"size": "1Gi",
                                                                                "accessMode": "ReadOnlyMany"}}}),
     "schema", "accessMode"),
    ("two-tokenizer-sources", with_spec(model={"name": "x/y", "tokenizer": {
        "huggingFace": {}, "configMap": {"name": "t"}}}), "cel", "only one of huggingFace and configMap"),
    ("env-value-and-secret", with_spec(pools__short__env=[{"name": "A", "value": "1", "secretKeyRef": {
        "name": "s", "key": "k"}}]), "cel", "exactly one of value and secretKeyRef"),
    ("env-neither", with_spec(pools__short__env=[{"name": "A"}]), "cel", "exactly one of value and secretKeyRef"),
    ("bad-tier-name", with_spec(routing={"tiers": [{"name": "Gold Tier", "maxTokens": 5}]}), "schema",
     "spec.routing.tiers[0].name"),
    ("too-many-extra-args", with_spec(pools__short__extraArgs=["--x"] * 65), "schema", "extraArgs"),
    ("adapter-rank-unsupported", with_spec(adapters=[{"name": "a", "source": PVC_ADAPTER, "maxRank": 24}]), "cel",
     "maxRank 24 of adapter a is not a LoRA rank vLLM supports (1, 8, 16, 32, 64, 128, 256, 320, 512); use 32"),
    ("lora-rank-unsupported", with_spec(lora={"maxRank": 100}), "cel", "use 128"),
    ("adapter-names-repeat", with_spec(adapters=[{"name": "a", "source": PVC_ADAPTER}] * 2), "cel",
     "adapter names must be unique (repeated: a)"),
    ("adapter-two-sources", with_spec(adapters=[{"name": "a", "source": {**PVC_ADAPTER, "huggingFace": {
        "repo": "o/r"}}}]), "cel", "set exactly one of huggingFace and pvc"),
    ("adapter-no-source", with_spec(adapters=[{"name": "a", "source": {}}]), "cel",
     "set exactly one of huggingFace and pvc"),
    ("adapter-pools-repeat", with_spec(adapters=[{"name": "a", "source": PVC_ADAPTER, "pools": ["short", "short"]}]),
     "cel", "pools of adapter a repeat a pool"),
    ("adapter-unknown-pool", with_spec(adapters=[{"name": "a", "source": PVC_ADAPTER, "pools": ["medium"]}]),
     "schema", "spec.adapters[0].pools[0]: Input should be 'short' or 'long'"),
    ("adapter-bad-name", with_spec(adapters=[{"name": "my adapter", "source": PVC_ADAPTER}]), "schema",
     "spec.adapters[0].name"),
    ("replicas-and-autoscaling", with_spec(pools__long={"replicas": 2, "autoscaling": {"maxReplicas": 3}}), "cel",
     "set replicas (2) or autoscaling, not both"),
    ("autoscaling-and-external", with_spec(pools__long={"externalAutoscaler": True, "autoscaling": {
        "maxReplicas": 3}}), "cel", "set autoscaling or externalAutoscaler, not both"),
    ("autoscaling-min-above-max", with_spec(pools__long={"autoscaling": {"minReplicas": 4, "maxReplicas": 3}}),
     "cel", "minReplicas (4) must not exceed maxReplicas (3)"),
    ("autoscaling-kv-target-above-one", with_spec(pools__long={"autoscaling": {
        "maxReplicas": 3, "metric": "kv-cache-usage", "target": 80}}), "cel", "kv-cache-usage is a fraction"),
    ("autoscaling-short-at-zero", with_spec(pools__short={"autoscaling": {"minReplicas": 0, "maxReplicas": 3}}),
     "cel", "short.autoscaling.minReplicas must be at least 1"),
    ("long-sleeps-short-disabled", with_spec(pools={"short": {"enabled": False}, "long": {"autoscaling": {
        "minReplicas": 0, "maxReplicas": 3}}}), "cel", "needs a running short pool (short is disabled)"),
    ("long-sleeps-short-at-zero", with_spec(pools={"short": {"replicas": 0}, "long": {"autoscaling": {
        "minReplicas": 0, "maxReplicas": 3}}}), "cel", "needs a running short pool (short is at replicas 0)"),
    ("autoscaling-unknown-metric", with_spec(pools__long={"autoscaling": {"maxReplicas": 3, "metric": "gpu"}}),
     "schema", "metric"),
    ("autoscaling-without-max", with_spec(pools__long={"autoscaling": {"minReplicas": 0}}), "schema",
     "maxReplicas"),
]


@pytest.mark.parametrize(("obj", "where", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_spec_is_refused_by_crd_and_pydantic(obj: dict[str, Any], where: str, message: str) -> None:
    structural = schema_errors(obj)
    cel = violations(SCHEMA, obj) if not structural else []
    if where == "schema":
        assert structural, "the CRD schema should refuse this"
    else:
        assert not structural, f"expected only CEL to refuse this, schema said {structural}"
        assert cel, "a CEL rule should refuse this"
    with pytest.raises(SpecError) as err:
        parse_resource(obj)
    assert message in str(err.value)


def test_every_cel_rule_has_a_violating_case() -> None:
    refused = set()
    for _, obj, where, _ in BAD:
        if where == "cel":
            refused |= {msg for _, msg in violations(SCHEMA, obj)}
    declared = {rule["message"] for _, rule in rules_in(SCHEMA)}
    assert declared - refused == set(), "add a violating case for each CEL rule"


@pytest.mark.parametrize(
    ("obj", "field"),
    [({"kind": "Deployment", "apiVersion": "apps/v1", "spec": {}}, "kind"),
     ({"kind": "VLLMDeployment", "apiVersion": "vllm-operator.dev/v2", "spec": {}}, "apiVersion"),
     ({"kind": "VLLMDeployment", "apiVersion": "vllm-operator.dev/v1alpha1"}, "spec"),
     ({"kind": "VLLMDeployment", "apiVersion": "vllm-operator.dev/v1alpha1", "spec": "x"}, "spec")],
    ids=["wrong-kind", "wrong-version", "no-spec", "spec-not-mapping"],
)
def test_wrong_shapes_name_the_field(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_resource(obj)
    assert err.value.field == field


def test_several_problems_are_all_reported() -> None:
    obj = with_spec(pools__short__replicas=-1, workloadClass="Batch_1")
    with pytest.raises(SpecError) as err:
        parse_resource(obj)
    assert "spec.pools.short.replicas" in str(err.value) and "spec.workloadClass" in str(err.value)


@pytest.mark.parametrize(("patch", "text"), [
    ({"pools": {"short": {"maxTokens": 5000, "maxModelLen": 4096}}},
     "spec.pools.short: maxTokens (5000) must be below maxModelLen (4096): the prompt needs room"),
    ({"model": {"name": "x/y", "source": {"huggingFace": {}, "pvc": {"claimName": "m"}}}},
     "spec.model.source: set only one of huggingFace and pvc"),
    ({"model": {"name": "x/y", "tokenizer": {"huggingFace": {}, "configMap": {"name": "t"}}}},
     "spec.model.tokenizer: set only one of huggingFace and configMap"),
    ({"routing": {"tiers": [{"name": "a", "defaultMaxTokens": 9, "maxTokens": 5}]}},
     "spec.routing.tiers[0]: defaultMaxTokens (9) exceeds maxTokens (5) of tier a"),
    ({"routing": {"tiers": [{"name": "a", "maxTokens": 5}, {"name": "a", "maxTokens": 6}]}},
     "spec.routing: tier names must be unique (repeated: a)"),
    ({"pools": {"short": {"env": [{"name": "A"}]}}},
     "spec.pools.short.env[0]: set exactly one of value and secretKeyRef (for A)"),
    ({"accelerator": {"type": "cpu"}}, "spec.accelerator: memoryGiB is required when type is cpu"),
    ({"pools": {"short": {"maxModelLen": 8192}, "long": {"maxModelLen": 4096}}},
     "spec.pools: short.maxModelLen (8192) must not exceed long.maxModelLen (4096)"),
    ({"model": {"name": "x/y", "facts": {"numLayers": 2, "numKVHeads": 2, "headDim": 64, "maxContextLength": 1}}},
     "spec.model.facts: give weightsGiB, or paramsBillions with weightsDtype"),
], ids=["tokens", "source", "tokenizer", "tier-default", "tier-names", "env", "cpu-memory", "pool-lengths", "facts"])
def test_pydantic_messages_name_their_path_once(patch: dict[str, Any], text: str) -> None:
    # issue 21: "spec.pools.short: spec.pools.short: maxTokens (5000) ..."
    with pytest.raises(SpecError) as err:
        parse_resource(with_spec(**patch))
    assert str(err.value) == text
