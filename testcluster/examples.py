"""What the demo (and tests that apply the examples) need from a directory of VLLMDeployment files.

`load_examples` reads a user's directory the way the API would see it: each file that cannot be read, is not YAML or
is not a valid VLLMDeployment is skipped with one line naming the file, so one bad file never stops the rest.
`nodes_for` gives the kwok nodes those examples need (one 8-GPU node per GPU type they name, labelled as GPU feature
discovery labels real nodes, plus a CPU node); `describe_pools` prints what the operator made of each one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testcluster import nodes
from vllm_operator import constants
from vllm_operator.api.errors import SpecError
from vllm_operator.api.plan import AcceleratorFacts
from vllm_operator.api.resource import parse_resource
from vllm_operator.api.spec import AcceleratorType
from vllm_operator.planning import catalog
from vllm_operator.planning.cli_inputs import load_documents
from vllm_operator.planning.planner import resolve_accelerator

PROG = "python -m testcluster.demo"
GPUS_PER_NODE = 8
DEFAULT_GPU = "nvidia-l4-24gb"  # the node `accelerator.type: auto` examples get when no other example names a GPU
CPU_NODE = "cpu-0"


class ExamplesError(Exception):
    """The examples directory as a whole cannot be used (missing, or no usable file): one line, exit 2."""


def load_examples(directory: Path) -> list[dict[str, Any]]:
    """Every VLLMDeployment document in `directory/*.yaml` that the API would accept, in file order.

    Objects without a namespace get the `default` one the API would give them. ExamplesError when the directory is
    missing or nothing in it is usable; each skipped file was named on stderr first.
    """
    if not directory.is_dir():
        raise ExamplesError(f"examples directory {directory} does not exist" if not directory.exists()
                            else f"{directory} is not a directory")
    files = sorted(directory.glob("*.yaml"))
    if not files:
        raise ExamplesError(f"examples directory {directory} has no *.yaml files")
    out: list[dict[str, Any]] = []
    for path in files:
        try:
            docs = load_documents(str(path))
            resources = [(doc, parse_resource(doc)) for doc in docs]
        except SpecError as err:
            print(f"{PROG}: skipped {path}: {err}".replace("\n", " "), file=sys.stderr)
            continue
        for doc, resource in resources:
            out.append({**doc, "metadata": {**doc["metadata"], "namespace": resource.metadata.namespace}})
    if not out:
        raise ExamplesError(f"no usable VLLMDeployment in {directory} (each file's problem is above)")
    return out


def _accelerator(obj: dict[str, Any]) -> AcceleratorFacts | None:
    """The accelerator an example names (None for `auto`, or a type the catalog does not know: the operator
    reports that as SpecValid=False)."""
    try:
        return resolve_accelerator(parse_resource(obj).spec, None)
    except SpecError:
        return None


def _gpu_node(facts: AcceleratorFacts) -> dict[str, Any]:
    node = nodes.node(f"{facts.type}-0", gpus=GPUS_PER_NODE, gpu_product=facts.product or facts.type,
                      gpu_memory_mib=facts.memory_bytes // 2**20)
    major, minor = facts.compute_capability or (0, 0)
    node["metadata"]["labels"].update({constants.GFD_COMPUTE_MAJOR: str(major),
                                       constants.GFD_COMPUTE_MINOR: str(minor)})
    return node


def nodes_for(examples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """kwok Nodes for the examples: one per GPU type they name plus a CPU node; examples with
    `accelerator.type: auto` are resolved by the operator from these nodes (an L4 node is added when no example
    names a GPU, so auto has something to resolve to)."""
    out: dict[str, dict[str, Any]] = {CPU_NODE: nodes.node(CPU_NODE, cpu="64", memory="256Gi")}
    auto = False
    for obj in examples:
        facts = _accelerator(obj)
        auto = auto or parse_resource(obj).spec.accelerator.type is AcceleratorType.AUTO
        if facts is not None and facts.is_gpu and facts.type not in out:
            out[facts.type] = _gpu_node(facts)
    if auto and not any(name != CPU_NODE for name in out):
        out[DEFAULT_GPU] = _gpu_node(catalog.gpu_facts(catalog.gpu_type(DEFAULT_GPU), 1))
    return list(out.values())


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((dict(c) for c in obj.get("status", {}).get("conditions") or [] if c.get("type") == type_), {})


def settled(obj: dict[str, Any]) -> bool:
    """Ready, or refused by the planner (SpecValid=False): either way the operator has said what it does."""
    return (condition(obj, constants.COND_READY).get("status") == "True"
            or condition(obj, constants.COND_SPEC_VALID).get("status") == "False")


def describe_pools(obj: dict[str, Any], deployments: Sequence[dict[str, Any]]) -> str:
    """Each pool's Deployment, replicas, plan figures and engine command line, then the plan's warnings."""
    lines = [f"{obj['metadata']['namespace']}/{obj['metadata']['name']}:"]
    summary = obj.get("status", {}).get("plan", {})
    for dep in sorted(deployments, key=lambda d: d["metadata"]["name"]):
        pool = dep["metadata"].get("labels", {}).get(constants.LABEL_POOL)
        if not pool:
            continue
        container = dep["spec"]["template"]["spec"]["containers"][0]
        p = summary.get(pool, {})
        lines.append(f"  {pool} pool  ({dep['metadata']['name']}, {dep['spec'].get('replicas')} replicas): "
                     f"maxModelLen {p.get('maxModelLen')}, maxTokens {p.get('maxTokens')}, KV {p.get('kvTokens'):,} "
                     f"tokens ({p.get('kvCacheDtype')}), {p.get('concurrencyAtFullLength')} sequences at full length")
        lines.append("    " + " ".join([*container.get("command", []), *container.get("args", [])]))
    for warning in summary.get("warnings", []):
        lines.append(f"  warning: {warning}")
    return "\n".join(lines)
