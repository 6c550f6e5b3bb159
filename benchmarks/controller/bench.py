"""Controller benchmark: CR → children latency, N CRs → all Ready, writes per CR, operator peak RSS.

The operator runs as its own process (`vllm-operator run`) against the simulated cluster, so its RSS is its own and
the API server sees it as a separate client. Every figure is stated next to the emulator's own cost for the same
requests measured in the same run (the machine is shared and noisy): the bare cost of creating a CR's children is
measured by posting the very objects the operator would create, from a plain HTTP client.

    .venv/bin/python benchmarks/controller/bench.py [--latency-crs 20] [--bulk-crs 500] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

from vllm_operator import constants
from vllm_operator.api.resource import parse_resource
from vllm_operator.k8s import VLLM_DEPLOYMENTS, resource_of
from vllm_operator.planning import RemediationState, plan
from vllm_operator.rendering import render
from vllm_operator.sim.client import NODES, SimClient
from vllm_operator.sim.cluster import ALL_CONTROLLERS, SimCluster, cpu_node

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = yaml.safe_load((ROOT / "examples" / "cpu-dev.yaml").read_text())
NAMESPACES_PATH = "/api/v1/namespaces"


def cr(name: str, namespace: str) -> dict[str, Any]:
    obj: dict[str, Any] = copy.deepcopy(TEMPLATE)
    obj["metadata"] = {"name": name, "namespace": namespace}
    return obj


def children_of(obj: dict[str, Any]) -> list[dict[str, Any]]:
    resource = parse_resource(obj)
    the_plan = plan(resource.spec, None, RemediationState.from_status(None), name=resource.metadata.name,
                    namespace=resource.metadata.namespace)
    return [m for m in render(the_plan, resource.spec) if "monitoring.coreos.com" not in m["apiVersion"]]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def start_operator(env: dict[str, str], log: Any, extra: list[str]) -> subprocess.Popen[str]:
    """`vllm-operator run` as its own process (health loop off: no Prometheus in this benchmark)."""
    return subprocess.Popen([str(ROOT / ".venv/bin/vllm-operator"), "run", "--no-health", "--port", "0", *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (from /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_seconds() -> float:
    """This process's CPU: the emulator and the simulated controllers all run in it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def is_operator(user_agent: str) -> bool:
    """Requests of the operator process: ours (vllm-operator/...) and kopf's own (annotations, watches)."""
    return not user_agent.startswith("sim-")


def start_controllers(url: str, node: dict[str, Any], workdir: Path) -> subprocess.Popen[str]:
    """The simulated controllers (Deployments, ReplicaSets, scheduler, kubelet, EndpointSlices) as their own
    process, like a real cluster's controller manager, scheduler and kubelets: the API server keeps this one."""
    nodes = workdir / "bench-nodes.json"
    nodes.write_text(json.dumps([node]))
    return subprocess.Popen([sys.executable, "-m", "vllm_operator.sim.cluster", "--url", url, "--nodes", str(nodes)],
                            stdout=subprocess.DEVNULL, text=True)


def resynced_crs(records: list[Any]) -> set[str]:
    """VLLMDeployments the operator has reconciled since `records` began: each reconcile lists its Deployments by
    the child selector (deployment label = the CR's name)."""
    done = set()
    for r in records:
        if is_operator(r.user_agent) and r.verb == "list" and r.resource == "deployments" and r.query:
            query = urllib.parse.parse_qs(r.query).get("labelSelector", [""])[0]
            for term in query.split(","):
                key, _, value = term.partition("=")
                if key == constants.LABEL_DEPLOYMENT:
                    done.add(value)
    return done


def vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


async def wait_children(cluster: SimCluster, name: str, want: int, since_seq: int, timeout: float = 60) -> float:
    """Seconds from the CR's create to the operator's last child create (request log timestamps)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = cluster.api.request_log.since(since_seq)
        start = next((r.started for r in records if r.resource == constants.PLURAL and r.verb == "create"
                      and r.name in ("", name)), None)
        # one CR in flight at a time: every child create the operator sends now is this CR's
        creates = [r for r in records if r.verb == "create" and constants.APP_NAME in r.user_agent
                   and r.resource != "events" and r.status < 300 and r.namespace == "bench"]
        if start is not None and len(creates) >= want:
            return max(r.started for r in creates) - start
        await asyncio.sleep(0.01)
    raise TimeoutError(f"{name}: children not created within {timeout}s ({len(creates)} of {want} seen)")


async def bare_cost(client: SimClient, objects: list[dict[str, Any]], namespace: str) -> float:
    """The emulator's own time for the same creates, sent back to back by a plain client."""
    t0 = time.perf_counter()
    for obj in objects:
        body = copy.deepcopy(obj)
        body["metadata"]["namespace"] = namespace
        await client.create(resource_of(obj), namespace, body)
    return time.perf_counter() - t0


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"load_average_start": os.getloadavg()}
    node = cpu_node("cpu-0", cpu="4000", memory="100000Gi")
    split = args.controllers == "process"
    results["controllers"] = args.controllers
    async with SimCluster(nodes=[] if split else [node], controllers=() if split else ALL_CONTROLLERS) as cluster:
        client = cluster.client
        assert client is not None
        controllers = start_controllers(cluster.url, node, Path(args.operator_log).parent) if split else None
        for ns in ("bench", "bare"):
            await client.request("POST", NAMESPACES_PATH, body={"apiVersion": "v1", "kind": "Namespace",
                                                                "metadata": {"name": ns}})
        if controllers is not None:
            # the controllers process registers its node: the cluster is complete once it exists
            for _ in range(600):
                if await client.get(NODES, None, node["metadata"]["name"]) is not None:
                    break
                await asyncio.sleep(0.1)
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        if args.operator_source:
            # another checkout's operator (its `operator/` directory first on the path) against this substrate
            env["PYTHONPATH"] = f"{args.operator_source}/operator"
            results["operator_source"] = args.operator_source
        log = Path(args.operator_log).open("w")  # noqa: SIM115, ASYNC230 - closed at the end of the run
        operator = start_operator(env, log, args.operator_arg)
        try:
            await asyncio.sleep(3.0)  # operator start-up (kopf login, discovery, watches)
            want = len(children_of(cr("x", "bench")))
            # 1. latency, one CR at a time; bare emulator cost for the same objects in the same run
            latencies, bare = [], []
            for i in range(args.latency_crs):
                name = f"lat-{i:03d}"
                seq = cluster.api.request_log.next_seq
                await client.create(VLLM_DEPLOYMENTS, "bench", cr(name, "bench"))
                latencies.append(await wait_children(cluster, name, want, seq))
                bare.append(await bare_cost(client, children_of(cr(f"bare-{i:03d}", "bare")), "bare"))
            results["cr_to_children_s"] = {"p50": statistics.median(latencies), "p95": pct(latencies, 95),
                                           "children": want}
            results["emulator_bare_same_creates_s"] = {"p50": statistics.median(bare), "p95": pct(bare, 95)}
            results["overhead_ratio_p50"] = statistics.median(latencies) / statistics.median(bare)
            # 2. bulk: N CRs at once -> all Ready
            seq = cluster.api.request_log.next_seq
            cpu0 = (cpu_seconds(operator.pid), self_cpu_seconds(),
                    cpu_seconds(controllers.pid) if controllers else 0.0)
            t0 = time.monotonic()
            names = [f"bulk-{i:04d}" for i in range(args.bulk_crs)]
            await asyncio.gather(*(client.create(VLLM_DEPLOYMENTS, "bench", cr(n, "bench")) for n in names))
            applied = time.monotonic() - t0
            pending = set(names)
            next_report = t0 + 30
            while pending and time.monotonic() - t0 < args.bulk_timeout:
                if time.monotonic() >= next_report:
                    next_report += 30
                    print(f"{time.monotonic() - t0:6.0f} s: {len(names) - len(pending)}/{len(names)} Ready, load "
                          f"{os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
                items, _ = await client.list(VLLM_DEPLOYMENTS, "bench")
                for item in items:
                    conds = {c["type"]: c["status"] for c in item.get("status", {}).get("conditions", [])}
                    if conds.get(constants.COND_READY) == "True":
                        pending.discard(item["metadata"]["name"])
                # Every poll is a LIST of every VLLMDeployment (large statuses) served by the emulator in this
                # process: at 0.5 s it was ~14 % of the emulator's CPU in a 500-CR run. 5 s costs little.
                await asyncio.sleep(args.poll_seconds)
            elapsed = time.monotonic() - t0
            cpu1 = (cpu_seconds(operator.pid), self_cpu_seconds(),
                    cpu_seconds(controllers.pid) if controllers else 0.0)
            records = [r for r in cluster.api.request_log.since(seq) if is_operator(r.user_agent)]
            writes = [r for r in records if r.is_write]
            by_kind: dict[str, int] = {}
            for r in writes:
                who = "ours" if constants.APP_NAME in r.user_agent else "kopf"
                key = f"{who}: {r.verb} {r.resource}{'/' + r.subresource if r.subresource else ''}"
                by_kind[key] = by_kind.get(key, 0) + 1
            results["bulk"] = {"crs": args.bulk_crs, "applied_s": applied, "all_ready_s": elapsed,
                               "not_ready": len(pending), "operator_writes_per_cr": len(writes) / args.bulk_crs,
                               "operator_requests_per_cr": len(records) / args.bulk_crs,
                               "writes_by_kind": dict(sorted(by_kind.items())),
                               "operator_cpu_s": cpu1[0] - cpu0[0],
                               # in-process controllers count here; a controllers process has its own figure
                               "emulator_cpu_s": cpu1[1] - cpu0[1],
                               "controllers_process_cpu_s": cpu1[2] - cpu0[2]}
            # 3. no-op resync: restart the operator, count its writes
            peak_rss_mib = vm_hwm_kib(operator.pid) / 1024
            operator.terminate()
            await asyncio.to_thread(operator.wait, 60)
            results["operator_peak_rss_mib"] = peak_rss_mib
            seq = cluster.api.request_log.next_seq
            operator = start_operator(env, log, args.operator_arg)
            t_resync = time.monotonic()
            everyone = args.latency_crs + args.bulk_crs
            resynced = 0
            while time.monotonic() - t_resync < args.resync_wait:
                await asyncio.sleep(1.0)
                resynced = len(resynced_crs(cluster.api.request_log.since(seq)))
                if resynced >= everyone:
                    break
            await asyncio.sleep(3.0)  # anything the last reconciles would write
            results["resync_crs_reconciled"] = resynced
            results["resync_s"] = time.monotonic() - t_resync
            results["resync_writes"] = len([r for r in cluster.api.request_log.since(seq)
                                            if r.is_write and is_operator(r.user_agent)])
            results["operator_peak_rss_mib_after_resync"] = vm_hwm_kib(operator.pid) / 1024
        finally:
            # Wait off the event loop: the API server runs on it, and a stopping operator finishes its in-flight
            # requests first (a blocking wait here deadlocked them until the timeout, which an earlier run
            # recorded as "the operator took > 30 s to stop").
            t_stop = time.monotonic()
            operator.terminate()
            try:
                await asyncio.to_thread(operator.wait, 60)
            except subprocess.TimeoutExpired:
                operator.kill()  # recorded: a graceful stop that outlasts 60 s is a finding, not a crash
                results["operator_stop_timed_out"] = True
                await asyncio.to_thread(operator.wait, 10)
            results["operator_stop_s"] = time.monotonic() - t_stop
            log.close()
            if controllers is not None:
                controllers.terminate()
                controllers.wait(30)
    results["load_average_end"] = os.getloadavg()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-crs", type=int, default=20)
    parser.add_argument("--bulk-crs", type=int, default=500)
    parser.add_argument("--bulk-timeout", type=float, default=900)
    parser.add_argument("--resync-wait", type=float, default=300,
                        help="longest wait for the restarted operator to reconcile every CR again")
    parser.add_argument("--controllers", choices=("process", "inprocess"), default="process",
                        help="simulated controllers in their own process (default) or in the API server's")
    parser.add_argument("--poll-seconds", type=float, default=5.0,
                        help="how often the bulk phase lists the VLLMDeployments to count Ready ones")
    parser.add_argument("--operator-arg", action="append", default=[],
                        help="extra argument for `vllm-operator run` (repeatable), e.g. --status-refresh-delay=2")
    parser.add_argument("--operator-source", default=None, metavar="CHECKOUT",
                        help="run the operator from another checkout (e.g. a git worktree of an older commit) "
                        "against this checkout's simulated cluster: a baseline in the same run")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--operator-log", default="/tmp/vllm-operator-bench.log")
    args = parser.parse_args()
    if args.operator_source:
        args.operator_source = str(Path(args.operator_source).resolve())
    results = asyncio.run(run(args))
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
