"""`vllm-operator demo` (the README's `make demo`): the operator on a simulated cluster, end to end, in seconds.

Starts the simulated cluster in-process with one node per GPU type the examples ask for (labelled as GPU feature
discovery labels real nodes) plus a CPU node, runs the real operator against it over HTTP, applies every file in
`examples/`, waits until each VLLMDeployment is Ready, prints a `kubectl get vllmd`-like table and each pool's
engine arguments and KV plan, then applies a bad edit and shows that it is refused while the running pods stay.
This is demo/test wiring: the only non-test code allowed to import the simulation.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_operator import constants
from vllm_operator.api.errors import SpecError
from vllm_operator.api.plan import AcceleratorFacts
from vllm_operator.api.resource import parse_resource
from vllm_operator.api.spec import AcceleratorType
from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.run import OperatorThread
from vllm_operator.k8s import DEPLOYMENTS, PODS, VLLM_DEPLOYMENTS, ClientKubeApi, KubeError, Resource
from vllm_operator.planning import catalog
from vllm_operator.planning.cli_inputs import load_documents
from vllm_operator.planning.planner import resolve_accelerator
from vllm_operator.sim.cluster import SimCluster, cpu_node, gpu_node

PROG = "vllm-operator demo"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
GPUS_PER_NODE = 8


DEFAULT_GPU = "nvidia-l4-24gb"  # the node `accelerator.type: auto` examples get when no other example names a GPU


class DemoInputError(Exception):
    """The examples directory as a whole cannot be demonstrated (missing, or no usable file): one line, exit 2."""


def load_examples(directory: Path) -> list[dict[str, Any]]:
    """Every VLLMDeployment document in `directory/*.yaml` that the API would accept, in file order.

    A file that cannot be read, is not YAML, or holds something that is not a valid VLLMDeployment is skipped with
    one line on stderr naming the file and the problem; DemoInputError when the directory is missing or nothing in
    it is usable. Objects without a namespace get the `default` one the API would give them.
    """
    if not directory.is_dir():
        raise DemoInputError(f"examples directory {directory} does not exist" if not directory.exists()
                             else f"{directory} is not a directory")
    files = sorted(directory.glob("*.yaml"))
    if not files:
        raise DemoInputError(f"examples directory {directory} has no *.yaml files")
    out: list[dict[str, Any]] = []
    for path in files:
        try:
            docs = load_documents(str(path))
            resources = [(doc, parse_resource(doc)) for doc in docs]
        except SpecError as err:
            print(f"{PROG}: skipped {path}: {err}".replace("\n", " "), file=sys.stderr)
            continue
        for doc, resource in resources:
            obj = dict(doc)
            obj["metadata"] = {**doc["metadata"], "namespace": resource.metadata.namespace}
            out.append(obj)
    if not out:
        raise DemoInputError(f"no usable VLLMDeployment in {directory} (each file's problem is above)")
    return out


def _accelerator(obj: dict[str, Any]) -> AcceleratorFacts | None:
    """The accelerator an example names (None for `auto`, or a type the catalog does not know: the operator
    reports that as SpecValid=False)."""
    try:
        return resolve_accelerator(parse_resource(obj).spec, None)
    except SpecError:
        return None


def nodes_for(examples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One 8-GPU node per GPU type the examples name, labelled from the catalog's facts, plus a CPU node; examples
    with `accelerator.type: auto` are resolved by the operator from these nodes (an L4 node is added when no
    example names a GPU)."""
    nodes: dict[str, dict[str, Any]] = {"cpu-0": cpu_node("cpu-0", cpu="64", memory="256Gi")}
    auto = False
    for obj in examples:
        facts = _accelerator(obj)
        auto = auto or parse_resource(obj).spec.accelerator.type is AcceleratorType.AUTO
        if facts is not None and facts.is_gpu and facts.type not in nodes:
            nodes[facts.type] = _gpu_node(facts)
    if auto and not any(name != "cpu-0" for name in nodes):
        nodes[DEFAULT_GPU] = _gpu_node(catalog.gpu_facts(catalog.gpu_type(DEFAULT_GPU), 1))
    return list(nodes.values())


def _gpu_node(facts: AcceleratorFacts) -> dict[str, Any]:
    return gpu_node(f"{facts.type}-0", product=facts.product or facts.type, memory_mib=facts.memory_bytes // 2**20,
                    gpus=GPUS_PER_NODE, compute=facts.compute_capability or (0, 0))


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for cond in obj.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == type_:
            return dict(cond)
    return {}


def table(objs: Sequence[dict[str, Any]]) -> str:
    rows = [("NAMESPACE", "NAME", "CLASS", "READY", "SHORT", "LONG", "STEPDOWN", "ACCELERATOR")]
    for obj in objs:
        st = obj.get("status", {})
        rows.append((obj["metadata"]["namespace"], obj["metadata"]["name"], obj["spec"]["workloadClass"],
                     st.get("ready", "-"), st.get("shortReplicas", "-"), st.get("longReplicas", "-"),
                     str(st.get("stepDownLevel", 0)), st.get("accelerator", {}).get("type", "-")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def describe_pools(obj: dict[str, Any], deployments: Sequence[dict[str, Any]]) -> str:
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


def settled(obj: dict[str, Any]) -> bool:
    """Ready, or refused by the planner (SpecValid=False): either way the operator has said what it does."""
    return (condition(obj, constants.COND_READY).get("status") == "True"
            or condition(obj, constants.COND_SPEC_VALID).get("status") == "False")


async def wait_settled(kube: ClientKubeApi, objs: Sequence[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    """Each object once it is Ready or refused; TimeoutError naming the ones that are neither."""
    deadline = time.monotonic() + timeout
    while True:
        current = [await kube.get(VLLM_DEPLOYMENTS, o["metadata"]["namespace"], o["metadata"]["name"]) or {}
                   for o in objs]
        if all(settled(c) for c in current):
            return current
        if time.monotonic() > deadline:
            late = [f"{c.get('metadata', {}).get('name')}: {condition(c, constants.COND_READY).get('message')}"
                    for c in current if not settled(c)]
            raise TimeoutError("not Ready in time: " + "; ".join(late))
        await asyncio.sleep(0.1)


async def apply(kube: ClientKubeApi, examples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Create each example's namespace and the object; an object the API server refuses (a duplicate name, say)
    is reported in one line and left out."""
    applied: list[dict[str, Any]] = []
    for ns in sorted({o["metadata"]["namespace"] for o in examples}):
        await kube.create(NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for obj in examples:
        who = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        try:
            await kube.create(VLLM_DEPLOYMENTS, obj["metadata"]["namespace"], obj)
        except KubeError as err:
            print(f"{PROG}: could not apply {who}: {err}".replace("\n", " "), file=sys.stderr)
            continue
        print(f"Applied {obj['kind']} {who} ({obj['spec'].get('workloadClass')} on "
              f"{obj['spec']['accelerator']['type']})")
        applied.append(obj)
    return applied


async def demo(examples_dir: Path, timeout: float) -> int:
    examples = load_examples(examples_dir)
    nodes = nodes_for(examples)
    started = time.monotonic()
    async with SimCluster(nodes=nodes) as cluster:
        kubeconfig = str(cluster.kubeconfig)
        kube = ClientKubeApi.from_environment(kubeconfig=kubeconfig)
        operator = OperatorThread(OperatorConfig(http_port=0, api_server=cluster.url),
                                  lambda: ClientKubeApi.from_environment(kubeconfig=kubeconfig))
        await asyncio.to_thread(operator.start, timeout)
        try:
            print(f"Simulated cluster at {cluster.url} with nodes: " + ", ".join(n["metadata"]["name"] for n in nodes))
            applied = await apply(kube, examples)
            if not applied:
                raise DemoInputError("the API server refused every example (see above)")
            current = await wait_settled(kube, applied, timeout)
            ready = [c for c in current if condition(c, constants.COND_READY).get("status") == "True"]
            refused = [c for c in current if c not in ready]
            elapsed = time.monotonic() - started
            print(f"\n{'All ' if not refused else ''}{len(ready)} VLLMDeployments Ready {elapsed:.1f} s after start"
                  + (f"; {len(refused)} refused by the planner:" if refused else "."))
            for obj in refused:
                cond = condition(obj, constants.COND_SPEC_VALID)
                print(f"  {obj['metadata']['namespace']}/{obj['metadata']['name']}: SpecValid=False "
                      f"({cond.get('reason')}): {cond.get('message')}")
            print("\n" + table(current) + "\n")
            for obj in ready:
                deps = await kube.list(DEPLOYMENTS, obj["metadata"]["namespace"],
                                       f"{constants.LABEL_DEPLOYMENT}={obj['metadata']['name']}")
                print(describe_pools(obj, deps) + "\n")
            if ready:
                await show_refusal(kube, ready[0])
        finally:
            kube.close()
            await asyncio.to_thread(operator.stop)
    return 0


async def show_refusal(kube: ClientKubeApi, obj: dict[str, Any]) -> None:
    """A bad edit: a long pool far beyond what the GPU can hold. Refused; the running pods are untouched."""
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    pods_before = sorted(p["metadata"]["name"] for p in await kube.list(
        PODS, ns, f"{constants.LABEL_DEPLOYMENT}={name}"))
    print(f"Bad edit: {ns}/{name} spec.pools.long.maxModelLen -> 131072, maxTokens -> 4096")
    await kube.patch(VLLM_DEPLOYMENTS, ns, name, {"spec": {"pools": {"long": {"maxModelLen": 131072,
                                                                               "maxTokens": 4096}}}})
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        current = await kube.get(VLLM_DEPLOYMENTS, ns, name) or {}
        cond = condition(current, constants.COND_SPEC_VALID)
        if cond.get("status") == "False":
            break
        await asyncio.sleep(0.1)
    else:
        raise TimeoutError("the bad edit was not refused")
    pods_after = sorted(p["metadata"]["name"] for p in await kube.list(
        PODS, ns, f"{constants.LABEL_DEPLOYMENT}={name}"))
    print(f"  SpecValid=False ({cond.get('reason')}): {cond.get('message')}")
    print(f"  Ready stays {condition(current, constants.COND_READY).get('status')}; pods before and after: "
          f"{'identical' if pods_before == pods_after else 'CHANGED'} ({len(pods_after)} pods)")
    if pods_before != pods_after:
        raise RuntimeError("the refused edit changed the running pods")


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=Path, default=EXAMPLES, help="directory of VLLMDeployment YAML files")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for Ready")
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(list(argv))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(demo(args.examples, args.timeout))
    except DemoInputError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    except (TimeoutError, RuntimeError) as err:
        print(f"demo failed: {err}", file=sys.stderr)
        return 1
