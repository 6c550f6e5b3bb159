"""Requests and writes per VLLMDeployment on the real control plane, this checkout against a baseline, in one run.

One kube-apiserver (testcluster), the CRD applied once; then for each operator source (this checkout, and
`--baseline DIR`, another checkout such as the release before server-side apply) a child process imports that
source's `reconcile`, creates examples/chat.yaml in a namespace of its own, and counts the KubeApi calls of the first
reconcile and of the resync once the controllers have settled (writes = create, patch, patch_status, apply,
json_patch, delete). Usage:

    .venv/bin/python benchmarks/controller/ssa_requests.py --baseline /path/to/old/checkout
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CHILD = r'''
import asyncio, collections, inspect, json, sys, yaml
from vllm_operator.handlers.reconcile import reconcile
from vllm_operator.k8s import VLLM_DEPLOYMENTS, ClientKubeApi, Resource
WRITES = {"create", "patch", "patch_status", "apply", "json_patch", "delete"}

class Recording:
    def __init__(self, inner):
        self.inner, self.calls = inner, collections.Counter()
    def __getattr__(self, verb):
        target = getattr(self.inner, verb)
        async def call(*a, **k):
            self.calls[verb] += 1
            return await target(*a, **k)
        return call

async def main(kubeconfig, namespace, example):
    api = ClientKubeApi.from_environment(kubeconfig=kubeconfig)
    if inspect.isawaitable(api):  # async since kubernetes_asyncio; a baseline before it is synchronous
        api = await api
    await api.create(Resource("", "v1", "namespaces", "Namespace", namespaced=False), None,
                     {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    obj = yaml.safe_load(open(example))
    obj["metadata"] = {"name": "chat", "namespace": namespace}
    obj = await api.create(VLLM_DEPLOYMENTS, namespace, obj)
    first = Recording(api)
    await reconcile(first, obj)
    for _ in range(30):
        again = Recording(api)
        await reconcile(again, await api.get(VLLM_DEPLOYMENTS, namespace, "chat"))
        if not sum(n for v, n in again.calls.items() if v in WRITES):
            break
        await asyncio.sleep(1)
    closed = api.close()
    if inspect.isawaitable(closed):
        await closed
    out = {name: {"calls": dict(r.calls), "requests": sum(r.calls.values()),
                  "writes": sum(n for v, n in r.calls.items() if v in WRITES)}
           for name, r in (("first", first), ("resync", again))}
    print(json.dumps(out))

asyncio.run(main(*sys.argv[1:]))
'''


def measure(source: Path, kubeconfig: Path, namespace: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(source / "operator")}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(kubeconfig), namespace, str(ROOT / "examples/chat.yaml")],
                          capture_output=True, text=True, env=env, check=True, timeout=300)
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout's root")
    args = parser.parse_args()
    from testcluster import cluster

    with tempfile.TemporaryDirectory() as tmp, cluster.running(Path(tmp)) as kube:
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        kube.wait_established("vllmdeployments.vllm-operator.dev")
        results = {"baseline": measure(args.baseline.resolve(), kube.kubeconfig, "bench-baseline"),
                   "this": measure(ROOT, kube.kubeconfig, "bench-this")}
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
