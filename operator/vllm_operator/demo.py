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

import yaml

from vllm_operator import constants
from vllm_operator.api.resource import parse_resource
from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.run import OperatorThread
from vllm_operator.k8s import DEPLOYMENTS, PODS, VLLM_DEPLOYMENTS, ClientKubeApi, Resource
from vllm_operator.planning import RemediationState, plan
from vllm_operator.sim.cluster import SimCluster, cpu_node, gpu_node

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
GPUS_PER_NODE = 8


def load_examples(directory: Path) -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted(directory.glob("*.yaml"))]


def nodes_for(examples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One 8-GPU node per GPU type the examples plan for, labelled from the catalog's facts, plus a CPU node."""
    nodes: dict[str, dict[str, Any]] = {"cpu-0": cpu_node("cpu-0", cpu="64", memory="256Gi")}
    for obj in examples:
        resource = parse_resource(obj)
        facts = plan(resource.spec, None, RemediationState.from_status(None), name=resource.metadata.name,
                     namespace=resource.metadata.namespace).accelerator
        if not facts.is_gpu or facts.type in nodes:
            continue
        nodes[facts.type] = gpu_node(
            f"{facts.type}-0", product=facts.product or facts.type, memory_mib=facts.memory_bytes // 2**20,
            gpus=GPUS_PER_NODE, compute=facts.compute_capability or (0, 0))
    return list(nodes.values())


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


async def wait_ready(kube: ClientKubeApi, objs: Sequence[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        current = [await kube.get(VLLM_DEPLOYMENTS, o["metadata"]["namespace"], o["metadata"]["name"]) or {}
                   for o in objs]
        if all(condition(c, constants.COND_READY).get("status") == "True" for c in current):
            return current
        if time.monotonic() > deadline:
            late = [f"{c.get('metadata', {}).get('name')}: {condition(c, constants.COND_READY).get('message')}"
                    for c in current if condition(c, constants.COND_READY).get("status") != "True"]
            raise TimeoutError("not Ready in time: " + "; ".join(late))
        await asyncio.sleep(0.1)


async def demo(examples_dir: Path, timeout: float) -> int:
    examples = load_examples(examples_dir)
    started = time.monotonic()
    async with SimCluster(nodes=nodes_for(examples)) as cluster:
        kubeconfig = str(cluster.kubeconfig)
        kube = ClientKubeApi.from_environment(kubeconfig=kubeconfig)
        operator = OperatorThread(OperatorConfig(http_port=0, api_server=cluster.url),
                                  lambda: ClientKubeApi.from_environment(kubeconfig=kubeconfig))
        await asyncio.to_thread(operator.start, timeout)
        try:
            print(f"Simulated cluster at {cluster.url} with nodes: "
                  + ", ".join(n["metadata"]["name"] for n in nodes_for(examples)))
            for ns in sorted({o["metadata"]["namespace"] for o in examples}):
                await kube.create(NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": ns}})
            for obj in examples:
                await kube.create(VLLM_DEPLOYMENTS, obj["metadata"]["namespace"], obj)
                print(f"Applied {obj['kind']} {obj['metadata']['namespace']}/{obj['metadata']['name']} "
                      f"({obj['spec']['workloadClass']} on {obj['spec']['accelerator']['type']})")
            current = await wait_ready(kube, examples, timeout)
            print(f"\nAll {len(current)} VLLMDeployments Ready {time.monotonic() - started:.1f} s after start.\n")
            print(table(current) + "\n")
            for obj in current:
                deps = await kube.list(DEPLOYMENTS, obj["metadata"]["namespace"],
                                       f"{constants.LABEL_DEPLOYMENT}={obj['metadata']['name']}")
                print(describe_pools(obj, deps) + "\n")
            await show_refusal(kube, current[0])
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
    parser = argparse.ArgumentParser(prog="vllm-operator demo", description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=Path, default=EXAMPLES, help="directory of VLLMDeployment YAML files")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for Ready")
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(list(argv))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(demo(args.examples, args.timeout))
    except (TimeoutError, RuntimeError) as err:
        print(f"demo failed: {err}", file=sys.stderr)
        return 1
