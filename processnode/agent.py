"""The process node agent: a Node of the real control plane whose pods run as local processes (ours: kwok runs none).

What it does, as a kubelet would:

* **Registers its Node** with capacity, labels, taints and `spec.podCIDR`, reports `Ready` with the cluster
  namespace's address as `InternalIP`, and renews its Lease in `kube-node-lease` every `renew_s` (so the real
  node-lifecycle controller sees it alive; when the agent dies the Lease lapses, the node goes NotReady and is
  tainted, and the taint-eviction controller evicts its pods).
* **Watches the pods the real kube-scheduler binds to it** (`spec.nodeName`) and runs each through
  `processnode.processes.ProcessRuntime` in a network namespace of its own (`processnode.network.PodNetwork`).
* **Writes pod status through `pods/status`** (phase, pod IP, container states, restart counts, last termination
  with its message, the Ready condition from the readiness probe), so the real endpointslice controller publishes
  the pod IPs that the router and Prometheus use.
* **Finishes graceful deletions**: a pod with a deletion timestamp is stopped (SIGTERM, the grace period, SIGKILL)
  and then deleted with grace period 0 and its UID as precondition, as the kubelet does.

It authenticates with the kubeconfig it is given (the tests give it admin's; a kubelet's `system:node` identity and
the Node authorizer are not what this tests). It runs inside the cluster's network namespace: `python -m
processnode` under `ip netns exec`, or in a test process that entered it (`processnode.netns.entered`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from processnode.network import PodNetwork
from processnode.processes import ContainerState, ProcessRuntime
from vllm_operator.k8s import PODS, ClientKubeApi, KubeError, Resource

log = logging.getLogger(__name__)

NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
LEASE_NAMESPACE = "kube-node-lease"
KUBELET_VERSION = "v1.37.2-processnode"


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class NodeConfig:
    """One node: its name, address, pod range, what it offers and where it keeps its pods' files."""

    name: str
    node_ip: str
    pod_cidr: str
    cluster_pod_cidr: str
    work_dir: Path
    run_id: str
    api_host: str
    api_port: int
    capacity: dict[str, str] = field(default_factory=lambda: {"cpu": "8", "memory": "64Gi", "pods": "110"})
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    reachable: list[str] = field(default_factory=list)
    """Addresses outside the pod range that pods may reach (the API server's; Prometheus' host)."""
    lease_s: int = 40
    renew_s: float = 10.0
    status_s: float = 20.0
    runtime: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for ProcessRuntime (pvcs, max_grace_s, back-off, vllm_python)."""


class NodeAgent:
    """Run `await agent.run(stop)` in the cluster's network namespace; `runtime.containers` shows what runs."""

    def __init__(self, config: NodeConfig, kubeconfig: Path) -> None:
        self.config = config
        self.kubeconfig = kubeconfig
        self._kube: ClientKubeApi | None = None  # made in run(): its connections belong to run()'s event loop
        self.network = PodNetwork(node=config.name, run_id=config.run_id, pod_cidr=config.pod_cidr,
                                  cluster_pod_cidr=config.cluster_pod_cidr,
                                  reachable=[config.node_ip, *config.reachable])
        self.runtime = ProcessRuntime(
            config.work_dir, network=self.network, host_ip=config.node_ip,
            api_env={"KUBERNETES_SERVICE_HOST": config.api_host, "KUBERNETES_SERVICE_PORT": str(config.api_port)},
            **config.runtime)
        self.runtime.connect(self, kubeconfig)
        self._states: dict[tuple[str, str], ContainerState] = {}
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._running: set[tuple[str, str]] = set()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._dirty: dict[tuple[str, str], asyncio.Event] = {}
        self._writers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.errors: list[BaseException] = []
        self._syncs: set[asyncio.Task[None]] = set()
        """Pod syncs in flight: stopping the agent lets them finish before it closes its API client."""

    @property
    def kube(self) -> ClientKubeApi:
        if self._kube is None:
            raise RuntimeError(f"the node agent of {self.config.name} is not running")
        return self._kube

    # -- PodApi (what the runtime reads for volumes) ------------------------------------------------------------

    async def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        return await self.kube.get(res, namespace, name)

    async def token(self, namespace: str, service_account: str, pod: str, uid: str, expiration_s: int) -> str:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": [], "expirationSeconds": max(expiration_s, 600),
                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}}}
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
        data = await self.kube._request("POST", path, body=body, content_type="application/json")
        return str(data["status"]["token"])

    # -- the node ----------------------------------------------------------------------------------------------

    def node_object(self) -> dict[str, Any]:
        c = self.config
        labels = {"kubernetes.io/hostname": c.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "type": "processnode", **c.labels}
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": c.name, "labels": labels},
                "spec": {"podCIDR": c.pod_cidr, "podCIDRs": [c.pod_cidr], "taints": list(c.taints)}}

    def node_status(self) -> dict[str, Any]:
        c, stamp = self.config, now()
        conditions = [
            {"type": kind, "status": "False", "reason": f"KubeletHas{reason}", "message": message,
             "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
            for kind, reason, message in (("MemoryPressure", "SufficientMemory", "no memory pressure"),
                                          ("DiskPressure", "NoDiskPressure", "no disk pressure"),
                                          ("PIDPressure", "SufficientPID", "no PID pressure"))]
        conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                           "message": "the process node agent is posting ready status",
                           "lastHeartbeatTime": stamp, "lastTransitionTime": stamp})
        return {"capacity": dict(c.capacity), "allocatable": dict(c.capacity), "conditions": conditions,
                "addresses": [{"type": "InternalIP", "address": c.node_ip}, {"type": "Hostname", "address": c.name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
                "nodeInfo": {"machineID": c.name, "systemUUID": c.name, "bootID": c.run_id, "kernelVersion": "",
                             "osImage": "processnode", "containerRuntimeVersion": "processnode://1",
                             "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
                             "architecture": "amd64"}}

    async def register(self) -> None:
        body = self.node_object()
        try:
            node = await self.kube.create(NODES, None, body)
        except KubeError as err:
            if not err.conflict and err.status != 409:
                raise
            node = await self.kube.patch(NODES, None, self.config.name,
                                         {"metadata": {"labels": body["metadata"]["labels"]},
                                          "spec": {"taints": body["spec"]["taints"]}})
        await self.kube.patch_status(NODES, None, self.config.name, {"status": self.node_status()})
        self._node_uid = str(node["metadata"]["uid"])
        log.info("Registered node %s (%s, pods %s)", self.config.name, self.config.node_ip, self.config.pod_cidr)

    async def _renew_lease(self) -> None:
        c = self.config
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": c.name, "namespace": LEASE_NAMESPACE,
                              "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": c.name,
                                                   "uid": self._node_uid}]},
                 "spec": {"holderIdentity": c.name, "leaseDurationSeconds": c.lease_s, "renewTime": micro_now()}}
        while True:
            try:
                if await self.kube.get(LEASES, LEASE_NAMESPACE, c.name) is None:
                    await self.kube.create(LEASES, LEASE_NAMESPACE, lease)
                else:
                    await self.kube.patch(LEASES, LEASE_NAMESPACE, c.name, {"spec": {"renewTime": micro_now(),
                                                                                     "holderIdentity": c.name}})
            except (KubeError, OSError) as err:  # a missed renewal is what the grace period is for
                log.info("Renewing the Lease of node %s failed: %s", c.name, err)
            await asyncio.sleep(c.renew_s)

    async def _post_status(self) -> None:
        while True:
            await asyncio.sleep(self.config.status_s)
            try:
                await self.kube.patch_status(NODES, None, self.config.name, {"status": self.node_status()})
            except (KubeError, OSError) as err:
                log.info("Posting the status of node %s failed: %s", self.config.name, err)

    # -- pods --------------------------------------------------------------------------------------------------

    async def _watch(self, queue: asyncio.Queue[tuple[str, dict[str, Any]]]) -> None:
        """The pods bound to this node: listed (each one SYNCed), then watched; a watch the server ends resumes from
        the last version seen (bookmarks included), a 410 or any other error lists again after a second."""
        selector = f"spec.nodeName={self.config.name}"
        while True:
            try:
                pods, version = await self.kube.list_versioned(PODS, None, field_selector=selector)
                for pod in pods:
                    queue.put_nowait(("SYNC", pod))
                while True:
                    async for event in self.kube.watch(PODS, None, resource_version=version, field_selector=selector,
                                                       timeout_seconds=30):
                        version = event.resource_version or version
                        if event.type != "BOOKMARK":
                            queue.put_nowait((event.type, event.object))
            except Exception as err:  # an expired or dropped watch, a refused list: list again
                log.info("The pod watch of node %s ended (%s); listing again", self.config.name, err)
                await asyncio.sleep(1.0)

    async def _dispatch(self, queue: asyncio.Queue[tuple[str, dict[str, Any]]]) -> None:
        while True:
            kind, pod = await queue.get()
            if kind == "ERROR" or "metadata" not in pod:
                continue
            task = asyncio.create_task(self._sync(kind, pod))
            self._syncs.add(task)
            task.add_done_callback(self._syncs.discard)

    async def _sync(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        async with self._locks.setdefault(key, asyncio.Lock()):
            try:
                await self._sync_locked(kind, key, pod)
            except Exception as err:
                log.exception("Syncing pod %s/%s on node %s failed", *key, self.config.name)
                self.errors.append(err)

    async def _sync_locked(self, kind: str, key: tuple[str, str], pod: dict[str, Any]) -> None:
        if kind == "DELETED":
            await self._stop_pod(key)
            return
        known = self._pods.get(key)
        if known is not None and known["metadata"].get("uid") != pod["metadata"].get("uid"):
            await self._stop_pod(key)  # a new pod of the same name
        self._pods[key] = pod
        if pod["metadata"].get("deletionTimestamp"):
            await self._stop_pod(key)
            try:
                await self.kube._request(
                    "DELETE", PODS.path(*key), content_type="application/json",
                    body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                          "preconditions": {"uid": pod["metadata"]["uid"]}})
            except KubeError as err:
                if not (err.not_found or err.conflict):  # already gone, or a new pod of that name
                    raise
            log.info("Deleted pod %s/%s after stopping it on node %s", *key, self.config.name)
            return
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or key in self._running:
            return
        self._running.add(key)
        self._dirty[key] = asyncio.Event()
        self._writers[key] = asyncio.create_task(self._status_writer(key))

        def report(state: ContainerState, key: tuple[str, str] = key) -> None:
            self._states[key] = state
            if key in self._dirty:
                self._dirty[key].set()

        try:
            await self.runtime.start(pod, report)
        except Exception as err:  # no sandbox (the network failed closed): the pod fails to be created
            report(ContainerState(ready=False, running=False, waiting_reason="CreatePodSandboxError",
                                  waiting_message=f"{type(err).__name__}: {err}"))
            log.info("Pod %s/%s could not get a sandbox on node %s: %s", *key, self.config.name, err)

    async def _stop_pod(self, key: tuple[str, str]) -> None:
        if key in self._running:
            self._running.discard(key)
            await self.runtime.stop(*key)
        writer = self._writers.pop(key, None)
        self._dirty.pop(key, None)
        if writer is not None:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
        self._states.pop(key, None)
        self._pods.pop(key, None)

    async def _status_writer(self, key: tuple[str, str]) -> None:
        """Patch pods/status whenever the runtime reported a change (coalesced; retried on errors)."""
        dirty = self._dirty[key]
        written: dict[str, Any] | None = None
        while True:
            await dirty.wait()
            dirty.clear()
            pod = self._pods.get(key)
            state = self._states.get(key)
            if pod is None or state is None:
                continue
            container = self.runtime.containers.get(key)
            status = pod_status(pod, state, container.ip if container else "", self.config.node_ip, written)
            if written is not None and _comparable(status) == _comparable(written):
                continue
            try:
                await self.kube.patch_status(PODS, *key, {"status": status})
                written = status
            except KubeError as err:
                if err.not_found:
                    return
                log.info("Writing the status of pod %s/%s failed: %s; retrying", *key, err)
                await asyncio.sleep(1.0)
                dirty.set()

    # -- running -----------------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, ready: threading.Event | None = None) -> None:
        """Register, then serve until `stop` is set; stops every pod it runs on the way out."""
        self._kube = await ClientKubeApi.from_environment(kubeconfig=str(self.kubeconfig))
        await asyncio.to_thread(self.network.prepare)
        await self.register()
        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        tasks = [asyncio.create_task(self._renew_lease()), asyncio.create_task(self._post_status()),
                 asyncio.create_task(self._watch(queue)), asyncio.create_task(self._dispatch(queue))]
        if ready is not None:
            ready.set()
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # A sync stopping a terminating pod (its grace, then the DELETE) ends before the client closes: cut off,
            # its DELETE failed on the closed client ("cannot schedule new futures after shutdown").
            if self._syncs:
                _, pending = await asyncio.wait(set(self._syncs), timeout=self.runtime.max_grace_s + 20.0)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            # All at once, as a kubelet kills a node's pods: one after the other, each engine's drain added up
            await asyncio.gather(*(self._stop_pod(key) for key in list(self._running)))
            await self.runtime.close()
            await self.network.close()
            await self.kube.close()


def _comparable(status: Mapping[str, Any]) -> Any:
    """A status without its timestamps (so an unchanged one is not written again)."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if not k.endswith(("Time", "At"))}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return strip(dict(status))


def pod_status(pod: Mapping[str, Any], state: ContainerState, ip: str, host_ip: str,
               previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """pods/status for a pod whose first container is `state` (the others are reported running and ready).

    Condition transition times carry over from `previous` while a condition keeps its status.
    """
    stamp = now()
    containers = pod["spec"].get("containers", [])
    statuses = []
    for i, container in enumerate(containers):
        main = i == 0
        ready = state.ready and state.running if main else True
        entry: dict[str, Any] = {
            "name": container["name"], "image": container.get("image", ""), "imageID": "",
            "ready": ready, "restartCount": state.restart_count if main else 0,
            "started": state.running if main else True,
        }
        if main and state.waiting_reason:
            waiting = {"reason": state.waiting_reason}
            if state.waiting_message:
                waiting["message"] = state.waiting_message
            entry["state"] = {"waiting": waiting}
            entry["ready"] = False
        elif main and not state.running:
            entry["state"] = {"waiting": {"reason": "ContainerCreating"}}
        else:
            entry["state"] = {"running": {"startedAt": stamp}}
        if main and state.last_terminated:
            entry["lastState"] = {"terminated": {"finishedAt": stamp, **state.last_terminated}}
        statuses.append(entry)
    all_ready = all(s["ready"] for s in statuses)
    before = {c["type"]: c for c in (previous or {}).get("conditions", []) or []}

    def condition(kind: str, ok: bool) -> dict[str, Any]:
        value = "True" if ok else "False"
        old = before.get(kind)
        since = old["lastTransitionTime"] if old and old.get("status") == value else stamp
        return {"type": kind, "status": value, "lastTransitionTime": since}

    started_ever = state.running or state.restart_count > 0
    return {
        "phase": "Running" if started_ever else "Pending",
        "podIP": ip, "podIPs": [{"ip": ip}] if ip else [], "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "startTime": (pod.get("status") or {}).get("startTime") or stamp,
        "containerStatuses": statuses,
        "conditions": [condition("PodScheduled", True), condition("Initialized", True),
                       condition("ContainersReady", all_ready), condition("Ready", all_ready)],
    }


def node_pod_cidr(cluster_pod_cidr: str, index: int) -> str:
    """Node `index`'s /24 inside the cluster's pod range; the first /24 holds the bridge's address."""
    subnets = list(ipaddress.ip_network(cluster_pod_cidr).subnets(new_prefix=24))
    if index + 1 >= len(subnets):
        raise ValueError(f"{cluster_pod_cidr} has no /24 left for node {index}")
    return str(subnets[index + 1])


__all__ = ["AgentThread", "NodeAgent", "NodeConfig", "node_pod_cidr", "pod_status"]


class AgentThread:
    """A NodeAgent in a thread of its own that first enters the cluster's network namespace, so the agent, its
    probes, its sandboxes and its containers all live there while the calling test stays on the host."""

    def __init__(self, config: NodeConfig, kubeconfig: Path, netns_name: str) -> None:
        self.config = config
        self.kubeconfig = kubeconfig
        self.netns_name = netns_name
        self.agent: NodeAgent | None = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name=f"node-{config.name}", daemon=True)

    def _main(self) -> None:
        from processnode.netns import entered

        try:
            with entered(self.netns_name):
                asyncio.run(self._serve())
        except BaseException as err:
            self.error = err
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.agent = NodeAgent(self.config, self.kubeconfig)
        await self.agent.run(self._stop, self._ready)

    def start(self, timeout: float = 60.0) -> AgentThread:
        self._thread.start()
        if not self._ready.wait(timeout) or self.error is not None:
            raise RuntimeError(f"node agent {self.config.name} did not start: {self.error!r}")
        return self

    def stop(self, timeout: float = 120.0) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"node agent {self.config.name} did not stop within {timeout:.0f} s")
        if self.error is not None:
            raise RuntimeError(f"node agent {self.config.name} failed: {self.error!r}") from self.error

    def call(self, fn: Any, timeout: float = 30.0) -> Any:
        """Run coroutine function `fn()` on the agent's loop (tests read the runtime's state there)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(timeout)
