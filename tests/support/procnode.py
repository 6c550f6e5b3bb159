"""A process node (processnode/) on the session's control plane for one test module: `running_node`.

Each test module that needs pods which really run starts its own agent: a node name of its own, a pod CIDR index no
other module of the tier uses (the index picks a /24 of the cluster's pod range), the test's label and a taint, so
the scheduler sends it only the pods that select and tolerate it. The Node object is deleted when the block ends.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from processnode.agent import AgentThread, NodeConfig, node_pod_cidr
from testcluster.cluster import Cluster
from tests.support.kube import unique

NODE_LABEL = "vllm-operator.dev/test-node"


@contextlib.contextmanager
def running_node(kube: Cluster, work_dir: Path, *, prefix: str, cidr_index: int, taint: Mapping[str, str],
                 runtime: Mapping[str, Any] | None = None, name: str | None = None) -> Iterator[AgentThread]:
    """An agent thread registered as node `name` (default `unique(prefix)`), labelled `NODE_LABEL: name`."""
    name = name or unique(prefix)
    config = NodeConfig(name=name, node_ip=kube.netns.address,
                        pod_cidr=node_pod_cidr(kube.netns.pod_cidr, cidr_index),
                        cluster_pod_cidr=kube.netns.pod_cidr, work_dir=work_dir,
                        run_id=secrets.token_hex(2), api_host=kube.netns.address, api_port=6443,
                        labels={NODE_LABEL: name}, taints=[dict(taint)],
                        runtime=dict(runtime or {"max_grace_s": 5.0}))
    agent = AgentThread(config, kube.kubeconfig, kube.netns.pin_name).start()
    try:
        yield agent
    finally:
        agent.stop()
        kube.kubectl("delete", "node", name, "--wait=false", check=False)
