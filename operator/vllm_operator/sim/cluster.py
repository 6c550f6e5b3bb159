"""The simulated cluster: API server + the controllers and nodes a real cluster has, in one object.

    async with SimCluster(nodes=[gpu_node("gpu-h100-0", product="NVIDIA-H100-80GB-HBM3", ...)]) as cluster:
        cluster.url, cluster.kubeconfig, cluster.kubelet.set_state(...)

Every controller is optional (`controllers=` picks), so a test can run the API server alone. Nodes are registered
over the API like a kubelet registers its Node, with GPU feature discovery labels and allocatable GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from vllm_operator import constants
from vllm_operator.k8s import CRDS
from vllm_operator.sim.apiserver import ApiServer, serve
from vllm_operator.sim.client import NODES, SimClient
from vllm_operator.sim.controllers.base import Controller
from vllm_operator.sim.controllers.endpoints import EndpointSliceController
from vllm_operator.sim.controllers.scheduling import FakeRuntime, Kubelet, PodRuntime, Scheduler
from vllm_operator.sim.controllers.workloads import DeploymentController, ReplicaSetController
from vllm_operator.sim.kubeconfig import write_kubeconfig

ALL_CONTROLLERS = ("deployments", "replicasets", "scheduler", "kubelet", "endpointslices")
REPO_CRD = Path(__file__).resolve().parents[3] / "crds" / "vllm-operator.dev_vllmdeployments.yaml"


def gpu_node(name: str, *, product: str, memory_mib: int, gpus: int, compute: tuple[int, int],
             labels: dict[str, str] | None = None, cpu: str = "32", memory: str = "256Gi",
             taints: Sequence[dict[str, str]] = ()) -> dict[str, Any]:
    """A Node as a GPU node registers itself, with the GPU feature discovery labels real clusters carry."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            constants.GFD_PRODUCT: product, constants.GFD_MEMORY: str(memory_mib),
            constants.GFD_COUNT: str(gpus), constants.GFD_COMPUTE_MAJOR: str(compute[0]),
            constants.GFD_COMPUTE_MINOR: str(compute[1]), **(labels or {})}},
        "spec": {"taints": list(taints)} if taints else {},
        "status": {
            "capacity": {"cpu": cpu, "memory": memory, constants.GPU_RESOURCE: str(gpus), "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": memory, constants.GPU_RESOURCE: str(gpus), "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def cpu_node(name: str, *, cpu: str = "2", memory: str = "24Gi", labels: dict[str, str] | None = None
             ) -> dict[str, Any]:
    """A Node without GPUs."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                              **(labels or {})}},
        "status": {"capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
                   "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    }


class ControllerSet:
    """The simulated controllers and nodes of a cluster, against an API server at `url`; an async context manager.

    `SimCluster` runs them next to its own API server. On their own (`python -m vllm_operator.sim.cluster --url`)
    they are a separate process like kube-controller-manager, the scheduler and the kubelets are, so a large
    benchmark spreads the simulation over two cores instead of queueing it behind the API server on one.
    """

    def __init__(self, url: str, *, nodes: Iterable[dict[str, Any]] = (),
                 runtimes: dict[str, PodRuntime] | None = None, controllers: Sequence[str] = ALL_CONTROLLERS,
                 ready_after: float = 0.0) -> None:
        self.url = url
        self._nodes = list(nodes)
        default_runtime = FakeRuntime(ready_after=ready_after)
        self._runtimes: dict[str, PodRuntime] = {n["metadata"]["name"]: default_runtime for n in self._nodes}
        self._runtimes.update(runtimes or {})
        self._controller_names = tuple(controllers)
        self._stack = contextlib.AsyncExitStack()
        self.client: SimClient | None = None
        self.controllers: dict[str, Controller] = {}

    async def __aenter__(self) -> ControllerSet:
        self.client = await self._stack.enter_async_context(SimClient(self.url, user_agent="sim-cluster"))
        for node in self._nodes:
            await self.add_node(node)
        for name in self._controller_names:
            client = await self._stack.enter_async_context(SimClient(self.url, user_agent=f"sim-{name}"))
            controller = self._make_controller(name, client)
            controller.start()
            self.controllers[name] = controller
        return self

    def _make_controller(self, name: str, client: SimClient) -> Controller:
        if name == "kubelet":
            return Kubelet(client, self._runtimes)
        kinds: dict[str, type[Controller]] = {
            "deployments": DeploymentController, "replicasets": ReplicaSetController, "scheduler": Scheduler,
            "endpointslices": EndpointSliceController}
        return kinds[name](client)

    async def add_node(self, node: dict[str, Any], runtime: PodRuntime | None = None) -> None:
        assert self.client is not None
        name = node["metadata"]["name"]
        if runtime is not None:
            self._runtimes[name] = runtime
        elif name not in self._runtimes:
            self._runtimes[name] = FakeRuntime()
        await self.client.create(NODES, None, node)

    @property
    def errors(self) -> list[BaseException]:
        return [e for c in self.controllers.values() for e in c.errors]

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        for controller in self.controllers.values():
            await controller.stop()
        await self._stack.aclose()


class SimCluster:
    """An API server on 127.0.0.1 plus controllers and nodes; an async context manager."""

    def __init__(self, *, nodes: Iterable[dict[str, Any]] = (), runtimes: dict[str, PodRuntime] | None = None,
                 controllers: Sequence[str] = ALL_CONTROLLERS, crds: Sequence[Path] = (REPO_CRD,),
                 api: ApiServer | None = None, port: int | None = None, ready_after: float = 0.0) -> None:
        self.api = api if api is not None else ApiServer()
        self._nodes = list(nodes)
        self._runtimes = runtimes
        self._controller_names = tuple(controllers)
        self._ready_after = ready_after
        self._crds = tuple(crds)
        self._port = port
        self._stack = contextlib.AsyncExitStack()
        self._tmp = tempfile.TemporaryDirectory(prefix="vllm-operator-sim-")
        self.url = ""
        self.kubeconfig = Path(self._tmp.name) / "kubeconfig"
        self.client: SimClient | None = None
        self._set: ControllerSet | None = None

    @property
    def controllers(self) -> dict[str, Controller]:
        return self._set.controllers if self._set is not None else {}

    @property
    def kubelet(self) -> Kubelet:
        kubelet = self.controllers["kubelet"]
        assert isinstance(kubelet, Kubelet)
        return kubelet

    async def __aenter__(self) -> SimCluster:
        _, self.url = await self._stack.enter_async_context(serve(self.api, port=self._port))
        write_kubeconfig(str(self.kubeconfig), self.url)
        self.client = await self._stack.enter_async_context(SimClient(self.url, user_agent="sim-cluster"))
        for path in self._crds:
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    await self.client.create(CRDS, None, doc)
        self._set = await self._stack.enter_async_context(ControllerSet(
            self.url, nodes=self._nodes, runtimes=self._runtimes, controllers=self._controller_names,
            ready_after=self._ready_after))
        return self

    async def add_node(self, node: dict[str, Any], runtime: PodRuntime | None = None) -> None:
        assert self._set is not None
        await self._set.add_node(node, runtime)

    @property
    def controller_errors(self) -> list[BaseException]:
        return self._set.errors if self._set is not None else []

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._stack.aclose()
        self._tmp.cleanup()


async def _run_controllers(url: str, nodes: list[dict[str, Any]]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with ControllerSet(url, nodes=nodes) as controllers:
        print(f"controllers {', '.join(controllers.controllers)} running against {url}", flush=True)
        await stop.wait()
        errors = controllers.errors
    if errors:
        raise SystemExit(f"simulated controllers failed: {errors[:3]!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m vllm_operator.sim.cluster --url URL [--nodes nodes.json]`: the controllers as their own process."""
    parser = argparse.ArgumentParser(prog="python -m vllm_operator.sim.cluster", description=main.__doc__)
    parser.add_argument("--url", required=True, help="the simulated API server's base URL")
    parser.add_argument("--nodes", type=Path, help="JSON list of Node objects to register (with fake runtimes)")
    args = parser.parse_args(argv)
    nodes = json.loads(args.nodes.read_text()) if args.nodes else []
    asyncio.run(_run_controllers(args.url, nodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
