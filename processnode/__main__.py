"""`python -m processnode --kubeconfig K --name N --node-ip IP --pod-cidr CIDR --cluster-pod-cidr CIDR --work-dir D`:
one process node agent, run inside the cluster's network namespace (`ip netns exec <ns> python -m processnode ...`).
SIGTERM stops its pods and exits; SIGKILL is a node failure (its sandboxes and containers die with it, its Lease
lapses)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import signal
import sys
from pathlib import Path

from processnode.agent import NodeAgent, NodeConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m processnode", description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--node-ip", required=True, help="the cluster namespace's address (InternalIP)")
    parser.add_argument("--api-port", type=int, default=6443)
    parser.add_argument("--pod-cidr", required=True, help="this node's pod range (a /24 of the cluster's)")
    parser.add_argument("--cluster-pod-cidr", required=True)
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--label", action="append", default=[], help="KEY=VALUE node label (repeatable)")
    parser.add_argument("--taint", action="append", default=[], help="KEY=VALUE:EFFECT node taint (repeatable)")
    parser.add_argument("--reachable", action="append", default=[], help="address pods may reach (repeatable)")
    parser.add_argument("--cpu", default="8")
    parser.add_argument("--memory", default="64Gi")
    parser.add_argument("--pvc", action="append", default=[], help="CLAIM=DIR host directory of a PVC")
    parser.add_argument("--lease-seconds", type=int, default=40, help="the node Lease's duration")
    parser.add_argument("--renew-seconds", type=float, default=10.0, help="how often the agent renews it")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        labels = dict(item.split("=", 1) for item in args.label)
        pvcs = {k: Path(v) for k, v in (item.split("=", 1) for item in args.pvc)}
        taints = []
        for item in args.taint:
            key_value, effect = item.rsplit(":", 1)
            key, value = key_value.split("=", 1)
            taints.append({"key": key, "value": value, "effect": effect})
    except ValueError:
        parser.error("--label and --pvc take KEY=VALUE, --taint KEY=VALUE:EFFECT")
    config = NodeConfig(name=args.name, node_ip=args.node_ip, pod_cidr=args.pod_cidr,
                        cluster_pod_cidr=args.cluster_pod_cidr, work_dir=args.work_dir,
                        run_id=secrets.token_hex(2), api_host=args.node_ip, api_port=args.api_port,
                        capacity={"cpu": args.cpu, "memory": args.memory, "pods": "110"}, labels=labels, taints=taints,
                        reachable=args.reachable, runtime={"pvcs": pvcs}, lease_s=args.lease_seconds,
                        renew_s=args.renew_seconds)

    async def serve() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
        await NodeAgent(config, args.kubeconfig).run(stop)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
