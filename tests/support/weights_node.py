"""A real node for the weights cache's tests (tests/integration/node/test_weights_cache_node.py, and vLLM serving
from the cache in tests/e2e/test_weights_cache_vllm.py): the real control plane (testcluster), one real kubelet
(testcluster.node) with the engine-cpu image imported, the namespace and the pods' token Secret, and the loopback Hub
(tests/support/hubserver.py) listening in the cluster's network namespace, which the pods reach as they reach the API
server (no route out anywhere). The cache is a directory of the test's own, never the default host path."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testcluster import cluster, images, node
from testcluster.cluster import PROCESS_NODE_HEARTBEATS, Cluster
from testcluster.node import Node
from tests.support import images as built_images
from tests.support.hubserver import HubServer, HubState
from vllm_operator.planning import cli_inputs
from vllm_operator.planning.weights_cache import NodeCache
from vllm_operator.rendering import cli

NS = "weights"
TOKEN = "token-of-weights-ns"
HUB_PORT = 18080
CLONE_NEWNET = 0x40000000


@dataclass
class Stack:
    kube: Cluster
    node: Node
    hub: HubServer
    cache: Path
    root: Path


@contextlib.contextmanager
def hub_in(netns_path: str, state: HubState) -> Iterator[HubServer]:
    """The Hub server with its listening socket in the cluster's network namespace (entered by one thread: setns
    changes only the calling thread's namespace, and a bound socket keeps its own)."""
    libc = ctypes.CDLL(None, use_errno=True)
    box: dict[str, Any] = {}

    def bind() -> None:
        fd = os.open(netns_path, os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                box["error"] = OSError(ctypes.get_errno(), f"setns {netns_path}")
                return
            box["hub"] = HubServer(state, host="0.0.0.0", port=HUB_PORT)
        except OSError as err:
            box["error"] = err
        finally:
            os.close(fd)

    thread = threading.Thread(target=bind)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    with box["hub"] as hub:
        yield hub


@contextlib.contextmanager
def running(root: Path, state: HubState) -> Iterator[Stack]:
    """The stack of the module docstring under `root`; the node's cache directory is `root/node-cache`."""
    engine = built_images.image("engine-cpu")
    with cluster.running(root / "kube", kwok=False, heartbeats=PROCESS_NODE_HEARTBEATS) as kube:
        a = node.start(kube, "node-a", index=0, directory=root / "node-a",
                       archives=[images.Archive(engine.ref, engine.archive)])
        try:
            kube.kubectl("create", "namespace", NS)
            kube.kubectl("create", "secret", "generic", "hf-token", "-n", NS, f"--from-literal=token={TOKEN}")
            with hub_in(kube.netns.path, state) as hub:
                yield Stack(kube, a, hub, root / "node-cache", root)
        finally:
            a.stop()


def rendered(s: Stack, doc: dict[str, Any], max_bytes: int = 1 << 30) -> list[dict[str, Any]]:
    """The operator's objects for `doc` (`{address}` in it: the cluster's address, where the Hub listens), planned
    with the node cache at the stack's directory."""
    text = json.dumps(doc).replace("{address}", s.kube.netns.address)
    planned = cli_inputs.plan_documents([json.loads(text)], node_cache=NodeCache(str(s.cache), max_bytes))
    objects, _ = cli.render_planned(planned, None)
    return objects


def get_pod(s: Stack, name: str) -> dict[str, Any]:
    proc = s.kube.kubectl("get", "pod", name, "-n", NS, "-o", "json", check=False)
    return dict(json.loads(proc.stdout)) if proc.returncode == 0 else {}
