"""`make demo` on a real control plane: upstream kube-apiserver, controller manager, scheduler and kwok nodes.

Starts the cluster (testcluster.cluster, in its own network namespace), registers one kwok GPU node per GPU type the
examples use (labelled as GPU feature discovery labels real nodes) plus a CPU node, installs the chart with `helm
install`, runs the operator as the chart's ServiceAccount (a TokenRequest token, so only the chart's RBAC applies),
applies every VLLMDeployment of the examples directory (`--examples DIR`, default `./examples`; a file that is not
a valid VLLMDeployment is skipped with a line naming it, one the API server refuses likewise), waits until each is
Ready or refused by the planner (shown with its SpecValid message) and prints the real `kubectl get vllmd -A`. Then
two bad edits: one the API server refuses itself (a CEL rule of the CRD), one the operator refuses (a long pool the
GPU cannot hold: SpecValid=False with the numbers, running pods untouched). Everything it started is stopped at the
end. Exit 2 when the directory has nothing usable (before any cluster starts), 1 when the demo itself failed.
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
from testcluster.examples import PROG, ExamplesError, describe_pools, load_examples, nodes_for, settled
from testcluster.examples import condition as _condition
from testcluster.netns import NetnsError
from vllm_operator import constants

RELEASE, OPERATOR_NAMESPACE = "vllm-operator", "vllm-system"


def _get_json(kube: cluster.Cluster, *args: str) -> Any:
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


def _wait_settled(kube: cluster.Cluster, examples: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    """Each example once it is Ready or refused by the planner; TimeoutError naming the ones that are neither."""
    deadline = time.monotonic() + timeout
    while True:
        current = [_get_json(kube, "vllmd", o["metadata"]["name"], "-n", o["metadata"]["namespace"])
                   for o in examples]
        late = [c for c in current if not settled(c)]
        if not late:
            return current
        if time.monotonic() > deadline:
            raise TimeoutError("not Ready in time: " + "; ".join(
                f"{c['metadata']['name']}: {_condition(c, constants.COND_READY).get('message')}" for c in late))
        time.sleep(0.5)


def _apply_each(kube: cluster.Cluster, examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """kubectl apply of each example on its own: one the API server refuses (a CEL rule, a duplicate) is one line
    naming it and is left out, the others go on."""
    applied: list[dict[str, Any]] = []
    for obj in examples:
        who = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        res = kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj), check=False)
        if res.returncode != 0:
            print(f"{PROG}: could not apply {who}: {res.stderr.strip()}".replace("\n", " "), file=sys.stderr)
            continue
        print(res.stdout.strip() + f" ({obj['spec'].get('workloadClass')} on {obj['spec']['accelerator']['type']})")
        applied.append(obj)
    return applied


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


def demo(examples: list[dict[str, Any]], timeout: float, workdir: Path) -> int:
    started = time.monotonic()
    with cluster.running(workdir / "cluster") as kube:
        print(f"Control plane up in {time.monotonic() - started:.1f} s: {kube.server} (network namespace "
              f"{kube.netns.name}, no route off the machine)")
        node_objs = nodes_for(examples)
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
            applied = _apply_each(kube, examples)
            if not applied:
                raise RuntimeError("the API server refused every example (see above)")
            current = _wait_settled(kube, applied, timeout)
            ready = [c for c in current if _condition(c, constants.COND_READY).get("status") == "True"]
            refused = [c for c in current if c not in ready]
            print(f"\n{'All ' if not refused else ''}{len(ready)} VLLMDeployments Ready "
                  f"{time.monotonic() - started:.1f} s after start (operator as the chart's ServiceAccount)"
                  + (f"; {len(refused)} refused by the planner:" if refused else "."))
            for obj in refused:
                cond = _condition(obj, constants.COND_SPEC_VALID)
                print(f"  {obj['metadata']['namespace']}/{obj['metadata']['name']}: SpecValid=False "
                      f"({cond.get('reason')}): {cond.get('message')}")
            print("\n$ kubectl get vllmd -A")
            print(kube.kubectl("get", "vllmd", "-A").stdout)
            for obj in ready:
                deps = _get_json(kube, "deployments", "-n", obj["metadata"]["namespace"], "-l",
                                 f"{constants.LABEL_DEPLOYMENT}={obj['metadata']['name']}")["items"]
                print(describe_pools(obj, deps) + "\n")
            if ready:
                _show_refusals(kube, ready[0])
        finally:
            cluster.stop_child(operator)
        errors = [line for line in log_path.read_text().splitlines() if " ERROR " in line or "Traceback" in line]
        if errors:
            raise RuntimeError("the operator logged errors:\n" + "\n".join(errors[:20]))
    print(f"\nDemo done in {time.monotonic() - started:.1f} s; every process it started is stopped.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=Path, default=Path("examples"),
                        help="directory of VLLMDeployment YAML files (default: ./examples)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for Ready")
    args = parser.parse_args(argv)
    try:
        examples = load_examples(args.examples)
    except ExamplesError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    try:
        with tempfile.TemporaryDirectory(prefix="vllm-operator-demo-") as workdir:
            return demo(examples, args.timeout, Path(workdir))
    except (TimeoutError, RuntimeError, NetnsError, MissingBinaries, cluster.ClusterError) as err:
        print(f"demo failed: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
