"""`make demo` on a real control plane: upstream kube-apiserver, controller manager, scheduler and kwok nodes.

Starts the cluster (testcluster.cluster, in its own network namespace), registers one kwok GPU node per GPU type the
examples use (labelled as GPU feature discovery labels real nodes) plus a CPU node, installs the chart with `helm
install`, runs the operator as the chart's ServiceAccount (a TokenRequest token, so only the chart's RBAC applies),
applies every file in examples/ with kubectl, waits until each VLLMDeployment is Ready and prints the real
`kubectl get vllmd -A`. Then two bad edits: one the API server refuses itself (a CEL rule of the CRD), one the
operator refuses (a long pool the GPU cannot hold: SpecValid=False with the numbers, running pods untouched).
Everything it started is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from testcluster import binaries, cluster
from testcluster.binaries import MissingBinaries
from testcluster.netns import NetnsError
from testcluster.nodes import KWOK_ANNOTATION
from vllm_operator import constants
from vllm_operator.demo import EXAMPLES, describe_pools, load_examples, nodes_for

RELEASE, OPERATOR_NAMESPACE = "vllm-operator", "vllm-system"


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((dict(c) for c in obj.get("status", {}).get("conditions") or [] if c.get("type") == type_), {})


def _get_json(kube: cluster.Cluster, *args: str) -> Any:
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


def _wait_ready(kube: cluster.Cluster, examples: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        current = [_get_json(kube, "vllmd", o["metadata"]["name"], "-n", o["metadata"]["namespace"])
                   for o in examples]
        late = [c for c in current if _condition(c, constants.COND_READY).get("status") != "True"]
        if not late:
            return current
        if time.monotonic() > deadline:
            raise TimeoutError("not Ready in time: " + "; ".join(
                f"{c['metadata']['name']}: {_condition(c, constants.COND_READY).get('message')}" for c in late))
        time.sleep(0.5)


def _show_refusals(kube: cluster.Cluster, obj: dict[str, Any]) -> None:
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    print(f"Bad edit refused by the API server (a CEL rule of the CRD): {ns}/{name} short.maxModelLen 65536 > "
          "long.maxModelLen 2048")
    bad = kube.kubectl("patch", "vllmd", name, "-n", ns, "--type=merge", "-p", json.dumps(
        {"spec": {"pools": {"short": {"maxModelLen": 65536}, "long": {"maxModelLen": 2048}}}}), check=False)
    if bad.returncode == 0:
        raise RuntimeError("the API server accepted a short pool longer than the long pool")
    print("  " + bad.stderr.strip().replace("\n", "\n  "))
    selector = f"{constants.LABEL_DEPLOYMENT}={name}"
    pods_before = kube.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "name").stdout.split()
    print(f"Bad edit refused by the operator: {ns}/{name} spec.pools.long.maxModelLen -> 131072, maxTokens -> 4096")
    kube.kubectl("patch", "vllmd", name, "-n", ns, "--type=merge", "-p", json.dumps(
        {"spec": {"pools": {"long": {"maxModelLen": 131072, "maxTokens": 4096}}}}))
    deadline = time.monotonic() + 30
    while True:
        current = _get_json(kube, "vllmd", name, "-n", ns)
        cond = _condition(current, constants.COND_SPEC_VALID)
        if cond.get("status") == "False":
            break
        if time.monotonic() > deadline:
            raise TimeoutError("the operator did not refuse the bad edit in 30 s")
        time.sleep(0.25)
    pods_after = kube.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "name").stdout.split()
    print(f"  SpecValid=False ({cond.get('reason')}): {cond.get('message')}")
    print(f"  Ready stays {_condition(current, constants.COND_READY).get('status')}; pods before and after: "
          f"{'identical' if sorted(pods_before) == sorted(pods_after) else 'CHANGED'} ({len(pods_after)} pods)")
    if sorted(pods_before) != sorted(pods_after):
        raise RuntimeError("the refused edit changed the running pods")


def model_volumes(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A PersistentVolume and a claim bound to it for every PVC an example loads its model from: the real
    scheduler does not place a pod whose claim is unbound (the persistentvolume-binder controller binds them)."""
    objs: list[dict[str, Any]] = []
    for obj in examples:
        claim = ((obj["spec"]["model"].get("source") or {}).get("pvc") or {}).get("claimName")
        if not claim:
            continue
        ns = obj["metadata"]["namespace"]
        pv = f"demo-{ns}-{claim}"
        objs.append({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
                     "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadOnlyMany"],
                              "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                              "hostPath": {"path": f"/models/{claim}"}}})
        objs.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim, "namespace": ns},
                     "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv,
                              "resources": {"requests": {"storage": "100Gi"}}}})
    return objs


def demo(examples_dir: Path, timeout: float, workdir: Path) -> int:
    started = time.monotonic()
    examples = load_examples(examples_dir)
    with cluster.running(workdir / "cluster") as kube:
        print(f"Control plane up in {time.monotonic() - started:.1f} s: {kube.server} (network namespace "
              f"{kube.netns.name}, no route off the machine)")
        node_objs = nodes_for(examples)
        for node in node_objs:
            node["metadata"].setdefault("annotations", {}).update(KWOK_ANNOTATION)
            node["status"].pop("conditions", None)  # kwok reports them, as a kubelet would
        kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(node_objs))
        print("kwok nodes: " + ", ".join(n["metadata"]["name"] for n in node_objs))
        helm = subprocess.run(
            [binaries.helm(), f"--kubeconfig={kube.kubeconfig}", "install", RELEASE,
             str(binaries.ROOT / "charts" / "vllm-operator"), "--namespace", OPERATOR_NAMESPACE,
             "--create-namespace"], capture_output=True, text=True, check=False)
        if helm.returncode != 0:
            raise RuntimeError(f"helm install failed: {helm.stderr.strip()}")
        print(f"helm install {RELEASE}: {helm.stdout.splitlines()[3] if len(helm.stdout.splitlines()) > 3 else ''}")
        token = kube.token_kubeconfig(OPERATOR_NAMESPACE, RELEASE, workdir / "operator.kubeconfig")
        log_path = workdir / "operator.log"
        with log_path.open("w") as log:
            operator = subprocess.Popen(
                [sys.executable, "-m", "vllm_operator.cli", "run", "--port=0", "--no-health"],
                env={**kube.env(), "KUBECONFIG": str(token), "PYTHONUNBUFFERED": "1"},
                stdout=log, stderr=subprocess.STDOUT)
        try:
            for ns in sorted({o["metadata"]["namespace"] for o in examples}):
                kube.kubectl("create", "namespace", ns)
            volumes = model_volumes(examples)
            if volumes:
                kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(volumes))
            applied = kube.kubectl("apply", "-f", str(examples_dir)).stdout
            print(applied.strip())
            current = _wait_ready(kube, examples, timeout)
            print(f"\nAll {len(current)} VLLMDeployments Ready {time.monotonic() - started:.1f} s after start "
                  "(operator as the chart's ServiceAccount).\n")
            print("$ kubectl get vllmd -A")
            print(kube.kubectl("get", "vllmd", "-A").stdout)
            for obj in current:
                deps = _get_json(kube, "deployments", "-n", obj["metadata"]["namespace"], "-l",
                                 f"{constants.LABEL_DEPLOYMENT}={obj['metadata']['name']}")["items"]
                print(describe_pools(obj, deps) + "\n")
            _show_refusals(kube, current[0])
        finally:
            operator.terminate()
            try:
                operator.wait(timeout=20)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait()
        errors = [line for line in log_path.read_text().splitlines() if " ERROR " in line or "Traceback" in line]
        if errors:
            raise RuntimeError("the operator logged errors:\n" + "\n".join(errors[:20]))
    print(f"\nDemo done in {time.monotonic() - started:.1f} s; every process it started is stopped.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testcluster.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=Path, default=EXAMPLES, help="directory of VLLMDeployment YAML files")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for Ready")
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="vllm-operator-demo-") as workdir:
            return demo(args.examples, args.timeout, Path(workdir))
    except (TimeoutError, RuntimeError, NetnsError, MissingBinaries, cluster.ClusterError) as err:
        print(f"demo failed: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
