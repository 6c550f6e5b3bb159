"""kwok nodes under the real node-lifecycle controller: pods go Ready, and Ready again after being marked not ready.

On a loaded machine a node can miss its Lease renewal; the node-lifecycle controller then marks every pod on it
NotReady, and kwok's own stages only ever make Pending pods Ready. testcluster/stages/pod-ready-again.yaml makes
them Ready again (as a kubelet would once its node is back) unless a test holds them not ready on purpose.
"""

from __future__ import annotations

import json
import time

import pytest

from testcluster.cluster import Cluster
from tests.support.kube import add_gpu_nodes, apply, unique, wait_for

pytestmark = pytest.mark.integration


def _pod(name: str, namespace: str, node_label: dict[str, str], labels: dict[str, str]) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"nodeSelector": node_label, "containers": [{"name": "c", "image": "busybox"}]}}


def _ready(kube: Cluster, namespace: str, name: str) -> str:
    pod = json.loads(kube.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)
    return next((c["status"] for c in pod["status"].get("conditions", []) if c["type"] == "Ready"), "")


def _mark_not_ready(kube: Cluster, namespace: str, name: str) -> None:
    # what the node-lifecycle controller writes when a node's Lease lapses
    kube.kubectl("patch", "pod", name, "-n", namespace, "--subresource=status", "-p",
                 json.dumps({"status": {"conditions": [{"type": "Ready", "status": "False",
                                                         "reason": "NodeNotReady"}]}}))


def test_pods_become_ready_again_unless_held(kube: Cluster) -> None:
    ns = unique("kwok")
    label = {"vllm-operator.dev/test-node": ns}
    kube.kubectl("create", "namespace", ns)
    node = add_gpu_nodes(kube, ns, 1, label=label)[0]
    wait_for(f"node {node} Ready", lambda: "True" in kube.kubectl(
        "get", "node", node, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}").stdout)
    apply(kube, _pod("free", ns, label, {}), _pod("held", ns, label, {"vllm-operator.dev/kwok-hold": "true"}),
          namespace=ns)
    for name in ("free", "held"):
        wait_for(f"pod {name} Ready", lambda name=name: _ready(kube, ns, name) == "True")
    for name in ("free", "held"):
        _mark_not_ready(kube, ns, name)
    wait_for("the free pod Ready again", lambda: _ready(kube, ns, "free") == "True", timeout=30)
    time.sleep(3)  # longer than the stage's delay: the held pod would have been flipped by now
    assert _ready(kube, ns, "held") == "False"
    kube.kubectl("delete", "namespace", ns, "--wait=false")
    kube.kubectl("delete", "node", node, "--wait=false")
