"""What a kubelet reports about a kwok pod's containers, written by the test through the pods/status subresource.

kwok reports every pod it runs Running and Ready (its pod-ready stage; testcluster's pod-ready-again stage after a
NotReady) and never restarts a container or writes a termination message. A test that needs what a kubelet writes
when a container dies — restartCount, lastState.terminated with the engine wrapper's termination message,
CrashLoopBackOff, not ready — labels the pod `HOLD_LABEL` (testcluster's stage then leaves it alone) and patches the
status itself as admin, in the shape the kubelet writes it.
"""

from __future__ import annotations

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


def pod_status(pod: Mapping[str, Any], report: ContainerReport, now: float) -> dict[str, Any]:
    """The status a kubelet writes for `report` (other containers running and ready; IPs and start time kept)."""
    stamp = format_time(now)
    old = {c.get("name"): c for c in (pod.get("status") or {}).get("containerStatuses") or []}
    statuses = []
    for i, container in enumerate(pod["spec"]["containers"]):
        name = container["name"]
        started = ((old.get(name) or {}).get("state") or {}).get("running", {}).get("startedAt") or stamp
        entry: dict[str, Any] = {"name": name, "image": container.get("image", ""), "ready": True,
                                 "restartCount": 0, "started": True, "state": {"running": {"startedAt": started}}}
        if i == 0:
            entry["restartCount"] = report.restart_count
            entry["ready"] = report.ready and report.waiting_reason is None
            if report.waiting_reason:
                entry["started"] = False
                entry["state"] = {"waiting": {"reason": report.waiting_reason}}
            elif report.restart_count:
                entry["state"] = {"running": {"startedAt": stamp}}  # the restarted container
            if report.last_terminated:
                entry["lastState"] = {"terminated": {"finishedAt": stamp, "startedAt": started,
                                                     **report.last_terminated}}
        statuses.append(entry)
    ready = "True" if all(s["ready"] for s in statuses) else "False"
    conditions = [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"},
                  {"type": "ContainersReady", "status": ready}, {"type": "Ready", "status": ready}]
    previous = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
    for c in conditions:
        same = previous.get(c["type"], {}).get("status") == c["status"]
        c["lastTransitionTime"] = (previous[c["type"]].get("lastTransitionTime") if same else None) or stamp
    return {"containerStatuses": statuses, "conditions": conditions}


async def report(api: KubeApi, namespace: str, name: str, state: ContainerReport) -> dict[str, Any]:
    """Hold the pod from kwok's stages and write `state` as its kubelet would; returns the updated pod."""
    await api.patch(PODS, namespace, name, {"metadata": {"labels": {HOLD_LABEL: "true"}}})
    pod = await api.get(PODS, namespace, name)
    if pod is None:
        raise LookupError(f"pod {namespace}/{name} is gone")
    return await api.patch_status(PODS, namespace, name, {"status": pod_status(pod, state, time.time())})
