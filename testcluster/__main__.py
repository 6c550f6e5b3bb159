"""`python -m testcluster up|down|status [--dir DIR]`: a real control plane for people (tests use the API)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from testcluster import cluster
from testcluster.binaries import MissingBinaries
from testcluster.netns import NetnsError

DEFAULT_DIR = Path("/tmp/vllm-operator-testcluster")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testcluster", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"state directory (default {DEFAULT_DIR})")
    parser.add_argument("--no-kwok", action="store_true", help="do not start kwok (no fake nodes)")
    args = parser.parse_args(argv)
    state_file = args.dir / "state.json"
    if args.command == "up":
        if state_file.exists() and cluster.load(args.dir).state.pids:
            print(f"testcluster: a cluster is already running from {args.dir} (run `down` first)", file=sys.stderr)
            return 1
        try:
            kube = cluster.start(args.dir, kwok=not args.no_kwok)
        except (NetnsError, MissingBinaries, cluster.ClusterError) as err:
            print(f"testcluster: {err}", file=sys.stderr)
            return 1
        print(f"testcluster: up in network namespace {kube.netns.name}, API server {kube.server}")
        print(f"export KUBECONFIG={kube.kubeconfig}")
        return 0
    if not state_file.exists():
        print(f"testcluster: no cluster state in {args.dir}", file=sys.stderr)
        return 1 if args.command == "status" else 0
    kube = cluster.load(args.dir)
    if args.command == "down":
        kube.stop()
        print(f"testcluster: stopped {args.dir} (network namespace {kube.netns.name} removed)")
        return 0
    for name, pid in kube.state.pids.items():
        print(f"{name:24} pid {pid}")
    print(f"server {kube.server}\nkubeconfig {kube.kubeconfig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
