"""A real node (testcluster.node: kubelet, containerd, kube-proxy) on the session's control plane for one test
module: `running_node`.

Each module that needs pods which really run starts its own: a node name of its own, a node index no other module of
the tier uses (the index picks the node's addresses and the /24 of the cluster's pod range), the test's label and a
taint, so the scheduler sends it only the pods that select and tolerate it. Its images are the built ones it names
(tests/support/images.py: `make images`), from the shared store. The Node object is deleted when the block ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from testcluster import images as node_images
from testcluster import node
from testcluster.cluster import Cluster
from tests.support import images

NODE_LABEL = "vllm-operator.dev/test-node"


@contextlib.contextmanager
def running_node(kube: Cluster, work_dir: Path, *, name: str, index: int, taint: Mapping[str, str],
                 built: Sequence[str] = ()) -> Iterator[node.Node]:
    """Node `name` labelled `NODE_LABEL: name` and tainted `taint`, with the built images `built` (by name:
    "operator", "router", "engine-cpu") and the busybox test image."""
    archives = [node_images.busybox(),
                *(node_images.Archive(images.image(n).ref, images.image(n).archive) for n in built)]
    started = node.start(kube, name, index=index, directory=work_dir, archives=archives,
                         labels={NODE_LABEL: name}, taints=[dict(taint)])
    try:
        yield started
    finally:
        started.stop()
        kube.kubectl("delete", "node", name, "--wait=false", check=False)
