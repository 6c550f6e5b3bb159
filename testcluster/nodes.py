"""kwok-managed Node manifests with the labels GPU feature discovery puts on real GPU nodes.

kwok manages a Node only when it carries the annotation the launcher selects on (`kwok.x-k8s.io/node: fake`);
it then reports it Ready, renews its Lease and runs the pods bound to it through kwok's pod stages. Each test gives
its nodes labels of its own (and a taint if it wants) so the scheduler keeps tests apart on a shared cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

KWOK_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}


def node(name: str, *, labels: Mapping[str, str] | None = None, gpus: int = 0, gpu_product: str = "",
         gpu_memory_mib: int = 0, cpu: str = "32", memory: str = "256Gi", pods: int = 110,
         taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A Node object; with `gpus`, the nvidia.com/gpu capacity and the feature-discovery labels of that GPU."""
    all_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "type": "kwok", **(labels or {})}
    capacity = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
        all_labels.update({"nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.present": "true"})
        if gpu_product:
            all_labels["nvidia.com/gpu.product"] = gpu_product
        if gpu_memory_mib:
            all_labels["nvidia.com/gpu.memory"] = str(gpu_memory_mib)
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": all_labels, "annotations": dict(KWOK_ANNOTATION)},
        "spec": {"taints": taints or []},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }
    return body


def node_yaml(name: str, **kwargs: Any) -> str:
    return yaml.safe_dump(node(name, **kwargs), sort_keys=False)
