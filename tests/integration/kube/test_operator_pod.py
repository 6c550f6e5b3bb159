"""The chart's own operator as a pod: `helm install` alone brings it up on a real node, and it does the job.

No operator process is started by the test. The chart's Deployment is scheduled by the real scheduler onto a real
node (tests/support/realnode.py: kubelet + containerd), which runs the operator image `make images` built, with the
ServiceAccount token the kubelet projects into the pod, so every request it makes is authorized by the chart's RBAC
alone and reaches the API server through the `kubernetes` Service (the node's kube-proxy). The pod must turn Ready
through its own /healthz probe, answer the API server's admission calls on its webhook Service (the pod's IP), reconcile
examples/chat.yaml to Ready on kwok GPU nodes, and stop when the release is uninstalled.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testcluster.cluster import Cluster
from testcluster.node import Node
from tests.support.helm import CHART_DIR
from tests.support.kube import add_gpu_nodes, apply, helm, unique, wait_for
from tests.support.paths import ROOT
from tests.support.realnode import NODE_LABEL, running_node

pytestmark = pytest.mark.integration
TAINT = {"key": "vllm-operator.dev/real-node", "value": "operator", "effect": "NoSchedule"}
NODE_INDEX = 0  # test_prometheus_operator's real node takes 1


@pytest.fixture(scope="module")
def node(kube: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    with running_node(kube, tmp_path_factory.mktemp("opnode"), name=unique("opnode"), index=NODE_INDEX, taint=TAINT,
                      built=["operator"]) as started:
        yield started


def _get(kube: Cluster, *args: str) -> dict[str, Any]:
    return dict(json.loads(kube.kubectl("get", *args, "-o", "json").stdout))


def _chat(namespace: str, node_label: dict[str, str], **long: Any) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((ROOT / "examples" / "chat.yaml").read_text()) if d]
    doc["metadata"]["namespace"] = namespace
    for pool in doc["spec"]["pools"].values():
        pool["nodeSelector"] = dict(node_label)
    doc["spec"]["pools"]["long"].update(long)
    return dict(doc)


def _operator_pod(kube: Cluster, namespace: str) -> dict[str, Any] | None:
    pods = _get(kube, "pods", "-n", namespace, "-l", "app.kubernetes.io/name=vllm-operator")["items"]
    return pods[0] if len(pods) == 1 else None


def _ready(pod: dict[str, Any] | None) -> bool:
    return pod is not None and any(c["type"] == "Ready" and c["status"] == "True"
                                   for c in pod.get("status", {}).get("conditions", []) or [])


def test_helm_install_alone_runs_the_operator_as_a_pod_that_reconciles(kube: Cluster, node: Node,
                                                                        tmp_path: Path) -> None:
    release, system, team = unique("vo"), unique("vo-sys"), unique("team")
    label = {"vllm-operator.dev/test-node": team}
    kube.kubectl("create", "namespace", team)
    gpu_nodes = add_gpu_nodes(kube, team, 2, label=label)
    values = {"watch": {"mode": "namespaced", "namespaces": [team]},
              "nodeSelector": {NODE_LABEL: node.name},
              "tolerations": [{**TAINT, "operator": "Equal"}],
              "operator": {"health": False}}
    values_file = tmp_path / f"{release}-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    helm(kube, "install", release, str(CHART_DIR), "--namespace", system, "--create-namespace", "-f", str(values_file))
    try:
        def ready_pod() -> dict[str, Any] | None:
            pod = _operator_pod(kube, system)
            return pod if _ready(pod) else None

        try:
            pod = wait_for("the operator pod Ready on the real node", ready_pod, timeout=180)
        except AssertionError as err:
            found = _operator_pod(kube, system) or {}
            logs = kube.kubectl("logs", "-n", system, "-l", "app.kubernetes.io/name=vllm-operator", "--tail=60",
                                check=False)
            events = kube.kubectl("get", "events", "-n", system, check=False).stdout
            raise AssertionError(f"{err}\nstatus: {json.dumps(found.get('status'))}\nevents:\n{events}\n"
                                 f"log:\n{logs.stdout}{logs.stderr}") from None
        name = pod["metadata"]["name"]
        assert pod["spec"]["nodeName"] == node.name
        # the image's entrypoint script (run by its venv's python) with the chart's args, as its process 1 (read
        # through `kubectl exec`)
        argv = kube.kubectl("exec", "-n", system, name, "--", "cat", "/proc/1/cmdline").stdout.split("\0")
        assert argv[1] == "/opt/vllm-operator/bin/vllm-operator" and argv[2:4] == ["run", "--standalone"], argv

        # The API server calls the pod's webhook (Service -> pod IP in its own network namespace) and the planner
        # in the pod refuses a long pool no L4 can hold; Ignore would let it through if the call failed.
        def refusal() -> subprocess.CompletedProcess[str] | None:
            proc = kube.kubectl("apply", "--dry-run=server", "-f", "-", check=False,
                                input=yaml.safe_dump(_chat(team, label, maxModelLen=131072, maxTokens=4096)))
            return proc if proc.returncode != 0 else None

        refused = wait_for("the webhook answering", refusal, timeout=60)
        assert "denied the request" in refused.stderr and "spec.pools.long.maxModelLen" in refused.stderr, \
            refused.stderr

        apply(kube, _chat(team, label))
        wait_for("chat Ready 3/3 reconciled by the operator pod", lambda: kube.kubectl(
            "get", "vllmd", "chat", "-n", team, "-o", "jsonpath={.status.ready}", check=False).stdout == "3/3",
            timeout=120)
        log = kube.kubectl("logs", "-n", system, name).stdout
        # The pod starts within seconds of `helm install`, while the API server is still initializing the storage of
        # the CRDs that install created: kopf's start-up activities may be answered 429 once and retried (logged
        # with their traceback). Anything else is an error.
        retried = [ln for ln in log.splitlines() if " ERROR " in ln and "failed temporarily" in ln
                   and "storage is (re)initializing" in ln]
        errors = [ln for ln in log.splitlines() if " ERROR " in ln and ln not in retried]
        assert errors == [] and log.count("Traceback") <= len(retried), log[-3000:]
        assert _get(kube, "pod", "-n", system, name)["status"]["containerStatuses"][0]["restartCount"] == 0
    finally:
        kube.kubectl("delete", "vllmd", "--all", "-n", team, "--wait=true", "--timeout=60s", check=False)
        helm(kube, "uninstall", release, "--namespace", system, check=False)
        kube.kubectl("delete", "node", *gpu_nodes, "--wait=false", check=False)
    # a pod object goes only once its kubelet has reported its containers stopped (graceful deletion)
    wait_for("the operator pod gone after helm uninstall (its container stopped by the kubelet)",
             lambda: _operator_pod(kube, system) is None, timeout=90)
    kube.kubectl("delete", "namespace", team, system, "--wait=false", check=False)
