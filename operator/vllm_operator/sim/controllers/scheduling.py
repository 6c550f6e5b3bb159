"""The scheduler and the kubelet of the simulated cluster.

Scheduler: binds Pending pods to a node whose labels match the pod's nodeSelector and required node affinity
(matchExpressions), whose NoSchedule taints the pod tolerates, and with enough unallocated `nvidia.com/gpu` for the
pod's limits; a pod that fits nowhere stays Pending with `PodScheduled=False, reason=Unschedulable` and the real
scheduler's style of message.

Kubelet: runs the pods bound to its nodes through a pluggable `PodRuntime` — the default `FakeRuntime` reports
containers running and ready after a delay and lets tests drive any container state (not ready, terminated with
OOMKilled and a termination message, CrashLoopBackOff, restart counts); the end-to-end tests plug in a runtime that
starts real processes. Pod IPs come from the runtime, so a process-backed node can hand out loopback addresses.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from vllm_operator import constants
from vllm_operator.sim.client import NODES, PODS, ApiStatusError, SimClient
from vllm_operator.sim.controllers.base import Controller, Key, own_key

log = logging.getLogger(__name__)


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu_request(pod: dict[str, Any]) -> int:
    total = 0
    for container in pod["spec"].get("containers", []):
        limits = (container.get("resources", {}) or {}).get("limits", {}) or {}
        total += int(limits.get(constants.GPU_RESOURCE, 0) or 0)
    return total


def tolerates(pod: dict[str, Any], taint: dict[str, Any]) -> bool:
    for tol in pod["spec"].get("tolerations", []) or []:
        if tol.get("effect") not in (None, "", taint.get("effect")):
            continue
        if tol.get("operator") == "Exists" and tol.get("key") in (None, "", taint.get("key")):
            return True
        if tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def _expression_matches(expr: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator"), list(expr.get("values") or [])
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and len(values) == 1:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def node_affinity_matches(pod: dict[str, Any], labels: dict[str, str]) -> bool:
    """requiredDuringSchedulingIgnoredDuringExecution as the scheduler reads it: terms are ORed, the expressions of
    a term ANDed (matchFields is not simulated: no test selects on node fields)."""
    affinity = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    return any(all(_expression_matches(e, labels) for e in term.get("matchExpressions") or [])
               for term in required.get("nodeSelectorTerms") or [])


def fits(pod: dict[str, Any], node: dict[str, Any], used_gpus: int) -> str | None:
    """None when the pod fits the node, else the reason it does not (scheduler message style)."""
    labels = node["metadata"].get("labels", {}) or {}
    selector = pod["spec"].get("nodeSelector", {}) or {}
    if any(labels.get(k) != v for k, v in selector.items()) or not node_affinity_matches(pod, labels):
        return "node(s) didn't match Pod's node affinity/selector"
    for taint in node.get("spec", {}).get("taints", []) or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(pod, taint):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    allocatable = int((node.get("status", {}).get("allocatable", {}) or {}).get(constants.GPU_RESOURCE, 0) or 0)
    if gpu_request(pod) > allocatable - used_gpus:
        return f"Insufficient {constants.GPU_RESOURCE}"
    return None


class Scheduler(Controller):
    """Binds pending pods; retries unschedulable pods every `retry_seconds` (capacity frees up as pods go)."""

    name = "scheduler"
    resync_seconds = 0.5

    def __init__(self, client: SimClient) -> None:
        super().__init__(client)
        self.watches = [(PODS, self._pod_changed)]
        # GPUs held per pod, from the pod watch plus the scheduler's own binds ("assumed" pods, as in the real
        # scheduler's cache: a bind shows up in the watch a moment later, and a second pod must not take the same
        # GPU meanwhile). Listing every pod per scheduling decision made a 500-VLLMDeployment run quadratic.
        self._placed: dict[Key, tuple[str, int]] = {}

    def _pod_changed(self, kind: str, pod: dict[str, Any]) -> list[Key]:
        key = own_key(kind, pod)[0]
        node = pod["spec"].get("nodeName")
        if kind == "DELETED" or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            self._placed.pop(key, None)
        elif node:
            self._placed[key] = (node, gpu_request(pod))
        return [key]

    async def resync(self) -> list[Key]:
        pods, _ = await self.client.list(PODS, None, field_selector="spec.nodeName=")
        return [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods]

    async def reconcile(self, key: Key) -> None:
        namespace, name = key
        pod = await self.client.get(PODS, namespace, name)
        if pod is None or pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
            return
        nodes, _ = await self.client.list(NODES)
        for attempt in range(2):
            used: dict[str, int] = {}
            for node_name, gpus in self._placed.values():
                used[node_name] = used.get(node_name, 0) + gpus
            reasons: dict[str, int] = {}
            for node in sorted(nodes, key=lambda n: (used.get(n["metadata"]["name"], 0), n["metadata"]["name"])):
                why = fits(pod, node, used.get(node["metadata"]["name"], 0))
                if why is None:
                    await self._bind(namespace, name, node["metadata"]["name"])
                    self._placed[key] = (node["metadata"]["name"], gpu_request(pod))
                    log.debug("Bound Pod %s/%s to Node %s", namespace, name, node["metadata"]["name"])
                    return
                reasons[why] = reasons.get(why, 0) + 1
            if attempt or not any(constants.GPU_RESOURCE in why for why in reasons):
                break
            await self._rebuild_placed()  # before refusing for want of GPUs, make sure the cache is not stale
        message = f"0/{len(nodes)} nodes are available: " + ", ".join(
            f"{count} {why}" for why, count in sorted(reasons.items())) + "."
        conditions = pod.get("status", {}).get("conditions", []) or []
        current = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
        if current is None or current.get("message") != message:
            await self.client.patch(PODS, namespace, name, {"status": {"conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                 "lastTransitionTime": now()}]}}, subresource="status")


    async def _rebuild_placed(self) -> None:
        """The cache from a full LIST (a watch that relisted after 410 Gone never saw the deletions in between)."""
        pods, _ = await self.client.list(PODS)
        self._placed = {}
        for pod in pods:
            self._pod_changed("ADDED", pod)

    async def _bind(self, namespace: str, name: str, node: str) -> None:
        """POST pods/binding as the real scheduler does; where the emulator lacks that subresource, set
        spec.nodeName by patch (only the scheduler ever does this, so clients cannot tell the difference)."""
        try:
            await self.client.request("POST", PODS.path(namespace, name, "binding"), body={
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": namespace},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
        except ApiStatusError as err:
            if err.status not in (404, 405):
                raise
            await self.client.patch(PODS, namespace, name, {"spec": {"nodeName": node}})


@dataclass
class ContainerState:
    """What a test wants a pod's (single main) container to look like."""

    ready: bool = True
    running: bool = True
    restart_count: int = 0
    waiting_reason: str | None = None  # e.g. CrashLoopBackOff
    last_terminated: dict[str, Any] | None = None  # {"reason": "OOMKilled", "exitCode": 137, "message": ...}


class PodRuntime(Protocol):
    """Where a node's pods run. `start` returns the pod IP; state changes are reported through `report`."""

    async def start(self, pod: dict[str, Any], report: Callable[[ContainerState], None]) -> str: ...

    async def stop(self, namespace: str, name: str) -> None: ...


class FakeRuntime:
    """Containers that become ready after `ready_after` seconds; tests drive states with `Kubelet.set_state`."""

    def __init__(self, ready_after: float = 0.0, subnet: str = "10.244") -> None:
        self.ready_after = ready_after
        self._ips = (f"{subnet}.{i // 250}.{i % 250 + 2}" for i in itertools.count())

    async def start(self, pod: dict[str, Any], report: Callable[[ContainerState], None]) -> str:
        report(ContainerState(ready=False))
        if self.ready_after:
            asyncio.get_running_loop().call_later(self.ready_after, report, ContainerState(ready=True))
        else:
            report(ContainerState(ready=True))
        return next(self._ips)

    async def stop(self, namespace: str, name: str) -> None:
        return None


class Kubelet(Controller):
    """Runs pods bound to its nodes and writes their status (phase, podIP, containerStatuses, conditions)."""

    name = "kubelet"

    def __init__(self, client: SimClient, runtimes: dict[str, PodRuntime]) -> None:
        super().__init__(client)
        self.watches = [(PODS, own_key)]
        self.runtimes = runtimes  # node name -> runtime
        self._running: dict[Key, str] = {}  # pod key -> node
        self._ips: dict[Key, str] = {}
        self._states: dict[Key, ContainerState] = {}

    def set_state(self, namespace: str, name: str, state: ContainerState) -> None:
        """Drive a pod's container state (tests, demo, runtimes)."""
        self._states[(namespace, name)] = state
        self.enqueue((namespace, name))

    def state(self, namespace: str, name: str) -> ContainerState | None:
        return self._states.get((namespace, name))

    async def reconcile(self, key: Key) -> None:
        namespace, name = key
        pod = await self.client.get(PODS, namespace, name)
        node = pod["spec"].get("nodeName") if pod else None
        if pod is None or node not in self.runtimes:
            if key in self._running:
                await self.runtimes[self._running.pop(key)].stop(namespace, name)
                self._states.pop(key, None)
                self._ips.pop(key, None)
            return
        if pod["metadata"].get("deletionTimestamp"):
            if key in self._running:
                await self.runtimes[self._running.pop(key)].stop(namespace, name)
            await self.client.delete(PODS, namespace, name, grace_period_seconds=0)
            return
        if key not in self._running:
            self._running[key] = node

            def report(state: ContainerState, key: Key = key) -> None:
                self.set_state(key[0], key[1], state)

            self._ips[key] = await self.runtimes[node].start(pod, report)
        state = self._states.get(key, ContainerState(ready=False))
        status = self._pod_status(pod, state, self._ips.get(key, ""))
        current = pod.get("status", {}) or {}
        if any(current.get(k) != v for k, v in status.items() if k != "conditions") or \
                [(c["type"], c["status"]) for c in current.get("conditions", []) or []] != \
                [(c["type"], c["status"]) for c in status["conditions"]]:
            await self.client.patch(PODS, namespace, name, {"status": status}, subresource="status")

    @staticmethod
    def _pod_status(pod: dict[str, Any], state: ContainerState, ip: str) -> dict[str, Any]:
        containers = pod["spec"].get("containers", [])
        statuses = []
        for i, container in enumerate(containers):
            main = i == 0
            ready = state.ready and state.running if main else True
            entry: dict[str, Any] = {
                "name": container["name"], "image": container.get("image", ""), "ready": ready,
                "restartCount": state.restart_count if main else 0, "started": state.running if main else True,
            }
            if main and state.waiting_reason:
                entry["state"] = {"waiting": {"reason": state.waiting_reason}}
                entry["ready"] = False
            elif main and not state.running:
                entry["state"] = {"waiting": {"reason": "ContainerCreating"}}
            else:
                entry["state"] = {"running": {"startedAt": now()}}
            if main and state.last_terminated:
                entry["lastState"] = {"terminated": {"finishedAt": now(), **state.last_terminated}}
            statuses.append(entry)
        all_ready = all(s["ready"] for s in statuses)
        stamp = now()
        return {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}] if ip else [], "hostIP": "10.0.0.1",
            "startTime": pod.get("status", {}).get("startTime") or stamp,
            "containerStatuses": statuses,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp},
                {"type": "Initialized", "status": "True", "lastTransitionTime": stamp},
                {"type": "ContainersReady", "status": "True" if all_ready else "False", "lastTransitionTime": stamp},
                {"type": "Ready", "status": "True" if all_ready else "False", "lastTransitionTime": stamp},
            ],
        }
