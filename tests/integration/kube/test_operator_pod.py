"""The chart's own operator as a pod: `helm install` alone brings it up on a process node, and it does the job.

No operator process is started by the test. The chart's Deployment is scheduled by the real scheduler onto a process
node (processnode/), whose runtime maps the operator image to the project venv's `vllm-operator run` with the
ServiceAccount token the pod was given (a TokenRequest through the projected volume), so every request it makes is
authorized by the chart's RBAC alone. The pod must turn Ready through its own /healthz probe, answer the API
server's admission calls on its webhook Service (pod IP inside its network namespace), reconcile examples/chat.yaml
to Ready on kwok GPU nodes, and stop with its process when the release is uninstalled.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from processnode.agent import AgentThread
from testcluster.cluster import Cluster
from tests.support.helm import CHART_DIR
from tests.support.kube import add_gpu_nodes, apply, helm, unique, wait_for
from tests.support.paths import ROOT
from tests.support.procnode import running_node

pytestmark = pytest.mark.integration
TAINT = {"key": "vllm-operator.dev/process-node", "value": "operator", "effect": "NoSchedule"}
POD_CIDR_INDEX = 11  # other process nodes of the integration tier take 7, 8 and 9


@pytest.fixture(scope="module")
def node(kube: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentThread]:
    with running_node(kube, tmp_path_factory.mktemp("opnode"), prefix="opnode", cidr_index=POD_CIDR_INDEX,
                      taint=TAINT, runtime={"backoff_initial_s": 1.0, "max_grace_s": 10.0}) as agent:
        yield agent


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


def test_helm_install_alone_runs_the_operator_as_a_pod_that_reconciles(kube: Cluster, node: AgentThread) -> None:
    release, system, team = unique("vo"), unique("vo-sys"), unique("team")
    label = {"vllm-operator.dev/test-node": team}
    kube.kubectl("create", "namespace", team)
    gpu_nodes = add_gpu_nodes(kube, team, 2, label=label)
    values = {"watch": {"mode": "namespaced", "namespaces": [team]},
              "nodeSelector": {"vllm-operator.dev/test-node": node.config.name},
              "tolerations": [{**TAINT, "operator": "Equal"}],
              "operator": {"health": False}}
    values_file = Path(node.config.work_dir) / f"{release}-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    helm(kube, "install", release, str(CHART_DIR), "--namespace", system, "--create-namespace", "-f", str(values_file))
    try:
        def ready_pod() -> dict[str, Any] | None:
            pod = _operator_pod(kube, system)
            return pod if _ready(pod) else None

        pod = wait_for("the operator pod Ready on the process node", ready_pod, timeout=120)
        assert pod["spec"]["nodeName"] == node.config.name
        container = node.agent.runtime.containers[(system, pod["metadata"]["name"])]  # type: ignore[union-attr]
        assert container.argv[1:3] == ["run", "--standalone"], container.argv
        assert container.proc is not None and container.proc.returncode is None

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
        log = container.log_path.read_text()
        assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
        assert _get(kube, "pod", "-n", system, pod["metadata"]["name"])["status"]["containerStatuses"][0][
            "restartCount"] == 0
    finally:
        kube.kubectl("delete", "vllmd", "--all", "-n", team, "--wait=true", "--timeout=60s", check=False)
        helm(kube, "uninstall", release, "--namespace", system, check=False)
        kube.kubectl("delete", "node", *gpu_nodes, "--wait=false", check=False)
    proc = container.proc
    wait_for("the operator's process stopped after helm uninstall",
             lambda: proc is None or proc.returncode is not None, timeout=60)
    kube.kubectl("delete", "namespace", team, system, "--wait=false", check=False)
