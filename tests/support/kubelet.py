"""What a kubelet reports about a kwok pod's containers, written by the test through the pods/status subresource.

kwok reports every pod it runs Running and Ready (its pod-ready stage; testcluster's pod-ready-again stage after a
NotReady) and never restarts a container or writes a termination message. A test that needs what a kubelet writes
when a container dies — restartCount, lastState.terminated with the engine wrapper's termination message,
CrashLoopBackOff, not ready — labels the pod `HOLD_LABEL` (testcluster's stage then leaves it alone) and patches the
status itself as admin, in the shape the kubelet writes it.

The shape is checked against kubelet v1.37 over containerd (tests/integration/node/test_real_node.py compares the
two). What that found the earlier shape lacked: `lastState: {}` on a container that never terminated, containerID
and imageID (on `lastState.terminated` too), the back-off `message` beside `CrashLoopBackOff`, the window between a
container's death and its restart (`state.terminated`, the termination numbered restartCount+1), the
PodReadyToStartContainers condition, `reason: ContainersNotReady` with the unready containers named on Ready and
ContainersReady when False, `lastProbeTime: null` and `observedGeneration` on every condition and on the status.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_operator.health.snapshot import format_time
from vllm_operator.k8s import PODS, KubeApi

HOLD_LABEL = "vllm-operator.dev/kwok-hold"
"""testcluster/stages/pod-ready-again.yaml leaves pods with this label as the test wrote them."""


@dataclass(frozen=True)
class ContainerReport:
    """The first container's state as a kubelet would report it."""

    ready: bool = True
    restart_count: int = 0
    waiting_reason: str | None = None
    """e.g. CrashLoopBackOff; the container is then not running."""
    last_terminated: Mapping[str, Any] | None = None
    """lastState.terminated: {"exitCode": ..., "reason": ..., "message": ...} (finishedAt is added)."""
    terminated: Mapping[str, Any] | None = None
    """state.terminated, as last_terminated: the container has died and the kubelet has not restarted it yet."""


def _container_id(pod_uid: str, name: str, attempt: int) -> str:
    return f"containerd://{hashlib.sha256(f'{pod_uid}/{name}/{attempt}'.encode()).hexdigest()}"


def _image_id(image: str) -> str:
    return f"sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def _resources(container: Mapping[str, Any]) -> dict[str, Any]:
    given = container.get("resources") or {}
    return {k: dict(given[k]) for k in ("limits", "requests") if given.get(k)}


def _volume_mounts(container: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"name": m["name"], "mountPath": m["mountPath"], "readOnly": bool(m.get("readOnly")),
             "recursiveReadOnly": "Disabled"} for m in container.get("volumeMounts") or []]


def pod_status(pod: Mapping[str, Any], report: ContainerReport, now: float) -> dict[str, Any]:
    """The status a kubelet writes for `report` (other containers running and ready; IPs and start time kept)."""
    stamp = format_time(now)
    meta = pod.get("metadata") or {}
    uid, generation = str(meta.get("uid", "")), meta.get("generation", 1)
    old = {c.get("name"): c for c in (pod.get("status") or {}).get("containerStatuses") or []}
    statuses = []
    for i, container in enumerate(pod["spec"]["containers"]):
        name, image = container["name"], container.get("image", "")
        started = ((old.get(name) or {}).get("state") or {}).get("running", {}).get("startedAt") or stamp
        restarts = report.restart_count if i == 0 else 0
        entry: dict[str, Any] = {
            "containerID": _container_id(uid, name, restarts), "image": image, "imageID": _image_id(image),
            "lastState": {}, "name": name, "ready": True, "resources": _resources(container), "restartCount": restarts,
            "started": True, "state": {"running": {"startedAt": started}},
            "volumeMounts": _volume_mounts(container)}
        if (container.get("resources") or {}).get("requests"):
            entry["allocatedResources"] = dict(container["resources"]["requests"])
        if i == 0:
            entry["ready"] = report.ready and report.waiting_reason is None and report.terminated is None
            if report.terminated:
                entry["started"] = False
                entry["state"] = {"terminated": {"containerID": entry["containerID"], "finishedAt": stamp,
                                                 "startedAt": started, **report.terminated}}
            elif report.waiting_reason:
                entry["started"] = False
                waiting: dict[str, Any] = {"reason": report.waiting_reason}
                if report.waiting_reason == "CrashLoopBackOff":
                    back_off = min(10 * 2 ** max(restarts - 1, 0), 300)
                    waiting["message"] = (f"back-off {back_off}s restarting failed container={name} "
                                          f"pod={meta.get('name')}_{meta.get('namespace')}({uid})")
                entry["state"] = {"waiting": waiting}
            elif restarts:
                entry["state"] = {"running": {"startedAt": stamp}}  # the restarted container
            if report.last_terminated:
                entry["lastState"] = {"terminated": {
                    "containerID": _container_id(uid, name, max(restarts - 1, 0)), "finishedAt": stamp,
                    "startedAt": started, **report.last_terminated}}
        statuses.append(entry)
    unready = [s["name"] for s in statuses if not s["ready"]]
    ready = "False" if unready else "True"
    conditions: list[dict[str, Any]] = [
        {"type": "PodReadyToStartContainers", "status": "True"}, {"type": "Initialized", "status": "True"},
        {"type": "Ready", "status": ready}, {"type": "ContainersReady", "status": ready},
        {"type": "PodScheduled", "status": "True"}]
    previous = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
    for c in conditions:
        same = previous.get(c["type"], {}).get("status") == c["status"]
        c["lastProbeTime"] = None
        c["lastTransitionTime"] = (previous[c["type"]].get("lastTransitionTime") if same else None) or stamp
        c["observedGeneration"] = generation
        if c["status"] == "False":
            c["reason"] = "ContainersNotReady"
            c["message"] = f"containers with unready status: [{' '.join(unready)}]"
    return {"containerStatuses": statuses, "conditions": conditions, "observedGeneration": generation}


async def report(api: KubeApi, namespace: str, name: str, state: ContainerReport) -> dict[str, Any]:
    """Hold the pod from kwok's stages and write `state` as its kubelet would; returns the updated pod."""
    await api.patch(PODS, namespace, name, {"metadata": {"labels": {HOLD_LABEL: "true"}}})
    pod = await api.get(PODS, namespace, name)
    if pod is None:
        raise LookupError(f"pod {namespace}/{name} is gone")
    return await api.patch_status(PODS, namespace, name, {"status": pod_status(pod, state, time.time())})
