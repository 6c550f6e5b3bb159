"""Deployments -> ReplicaSets -> Pods, as kube-controller-manager does it.

Faithful in what the operator and the router can observe: ReplicaSets named `<deployment>-<pod-template-hash>`
with controller ownerReferences, pods named `<replicaset>-<5 chars>`, rolling updates that honour maxSurge and
maxUnavailable (so `maxSurge: 0` replaces pods one at a time on nodes without a spare GPU), Recreate, replacement of
deleted pods, and the status counters and conditions of both kinds. Not modelled: minReadySeconds,
progressDeadlineSeconds, revision history limits, rollback, paused rollouts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import random
from typing import Any

from vllm_operator.sim.client import DEPLOYMENTS, PODS, REPLICA_SETS, SimClient
from vllm_operator.sim.controllers.base import Controller, Key, own_key, owner_keys

HASH_LABEL = "pod-template-hash"
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def template_hash(template: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
    return "".join(_ALPHABET[int(digest[i:i + 2], 16) % len(_ALPHABET)] for i in range(0, 20, 2))


def owner_ref(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(r.get("uid") == uid and r.get("controller") for r in obj["metadata"].get("ownerReferences", []) or [])


def selector_string(match_labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


def pod_ready(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions", []) or [])


def resolve_int_or_percent(value: Any, total: int, *, round_up: bool) -> int:
    if value is None:
        value = "25%"
    if isinstance(value, str) and value.endswith("%"):
        scaled = total * int(value[:-1]) / 100
        return math.ceil(scaled) if round_up else math.floor(scaled)
    return int(value)


class ReplicaSetController(Controller):
    """Keeps `spec.replicas` pods per ReplicaSet; deletes not-ready pods first when scaling down."""

    name = "replicaset-controller"

    def __init__(self, client: SimClient) -> None:
        super().__init__(client)
        self.watches = [(REPLICA_SETS, own_key), (PODS, owner_keys("ReplicaSet"))]

    async def reconcile(self, key: Key) -> None:
        namespace, name = key
        rs = await self.client.get(REPLICA_SETS, namespace, name)
        if rs is None or rs["metadata"].get("deletionTimestamp"):
            return
        uid = rs["metadata"]["uid"]
        selector = selector_string(rs["spec"]["selector"].get("matchLabels", {}))
        pods, _ = await self.client.list(PODS, namespace, selector)
        pods = [p for p in pods if owned_by(p, uid) and not p["metadata"].get("deletionTimestamp")]
        want = int(rs["spec"].get("replicas", 1))
        if len(pods) < want:
            for _ in range(want - len(pods)):
                template = rs["spec"]["template"]
                suffix = "".join(random.choices(_ALPHABET, k=5))
                await self.client.create(PODS, namespace, {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"{name}-{suffix}", "namespace": namespace,
                                 "labels": dict(template["metadata"].get("labels", {})),
                                 "annotations": dict(template["metadata"].get("annotations", {})),
                                 "ownerReferences": [owner_ref(rs)]},
                    "spec": template["spec"],
                })
        elif len(pods) > want:
            # Not yet scheduled, then not ready, then newest first — the real controller's ranking, simplified.
            ranked = sorted(pods, key=lambda p: (bool(p["spec"].get("nodeName")), pod_ready(p),
                                                 p["metadata"].get("creationTimestamp", "")), reverse=False)
            for pod in ranked[: len(pods) - want]:
                await self.client.delete(PODS, namespace, pod["metadata"]["name"])
        pods, _ = await self.client.list(PODS, namespace, selector)
        pods = [p for p in pods if owned_by(p, uid) and not p["metadata"].get("deletionTimestamp")]
        ready = sum(pod_ready(p) for p in pods)
        status = {"replicas": len(pods), "fullyLabeledReplicas": len(pods), "readyReplicas": ready,
                  "availableReplicas": ready, "observedGeneration": rs["metadata"].get("generation", 1)}
        if {k: rs.get("status", {}).get(k) for k in status} != status:
            await self.client.patch(REPLICA_SETS, namespace, name, {"status": status}, subresource="status")


class DeploymentController(Controller):
    """Rolls Deployments through ReplicaSets, honouring RollingUpdate (maxSurge/maxUnavailable) and Recreate."""

    name = "deployment-controller"

    def __init__(self, client: SimClient) -> None:
        super().__init__(client)
        self.watches = [(DEPLOYMENTS, own_key), (REPLICA_SETS, owner_keys("Deployment"))]

    async def reconcile(self, key: Key) -> None:
        namespace, name = key
        dep = await self.client.get(DEPLOYMENTS, namespace, name)
        if dep is None or dep["metadata"].get("deletionTimestamp"):
            return
        uid = dep["metadata"]["uid"]
        spec = dep["spec"]
        desired = int(spec.get("replicas", 1))
        template = spec["template"]
        hash_ = template_hash(template)
        # The Deployment's selector narrows the LIST to its own ReplicaSets (listing the namespace's every
        # ReplicaSet per reconcile made large runs quadratic); ownership still decides.
        match_labels = (spec.get("selector") or {}).get("matchLabels") or {}
        all_rs, _ = await self.client.list(REPLICA_SETS, namespace, selector_string(match_labels) or None)
        owned = [rs for rs in all_rs if owned_by(rs, uid)]
        new = next((rs for rs in owned if rs["metadata"].get("labels", {}).get(HASH_LABEL) == hash_), None)
        old = [rs for rs in owned if rs is not new]
        if new is None:
            labels = {**template["metadata"].get("labels", {}), HASH_LABEL: hash_}
            new = await self.client.create(REPLICA_SETS, namespace, {
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": f"{name}-{hash_}", "namespace": namespace, "labels": labels,
                             "ownerReferences": [owner_ref(dep)]},
                "spec": {"replicas": 0,
                         "selector": {"matchLabels": {**spec["selector"]["matchLabels"], HASH_LABEL: hash_}},
                         "template": {**template, "metadata": {**template["metadata"], "labels": labels}}},
            })
        strategy = spec.get("strategy", {}) or {}
        if strategy.get("type") == "Recreate":
            await self._recreate(new, old, desired)
        else:
            rolling = strategy.get("rollingUpdate", {}) or {}
            surge = resolve_int_or_percent(rolling.get("maxSurge"), desired, round_up=True)
            unavailable = resolve_int_or_percent(rolling.get("maxUnavailable"), desired, round_up=False)
            if surge == 0 and unavailable == 0:
                unavailable = 1  # the API server refuses both zero; keep the rollout moving as it would
            await self._roll(new, old, desired, surge, unavailable)
        await self._write_status(dep, new, old, desired)

    async def _scale(self, rs: dict[str, Any], replicas: int) -> None:
        if int(rs["spec"].get("replicas", 0)) != replicas:
            rs["spec"]["replicas"] = replicas
            await self.client.patch(REPLICA_SETS, rs["metadata"]["namespace"], rs["metadata"]["name"],
                                    {"spec": {"replicas": replicas}})

    async def _recreate(self, new: dict[str, Any], old: list[dict[str, Any]], desired: int) -> None:
        for rs in old:
            await self._scale(rs, 0)
        if all(int(rs.get("status", {}).get("replicas", 0)) == 0 for rs in old):
            await self._scale(new, desired)

    async def _roll(self, new: dict[str, Any], old: list[dict[str, Any]], desired: int, surge: int,
                    unavailable: int) -> None:
        def count(rs: dict[str, Any], field: str) -> int:
            return int(rs.get("status", {}).get(field, 0) or 0)

        total = sum(max(int(rs["spec"].get("replicas", 0)), count(rs, "replicas")) for rs in [new, *old])
        new_spec = int(new["spec"].get("replicas", 0))
        if new_spec < desired:
            grow = max(0, desired + surge - total)
            await self._scale(new, min(desired, new_spec + grow))
        elif new_spec > desired:
            await self._scale(new, desired)
        available = sum(count(rs, "availableReplicas") for rs in [new, *old])
        can_remove = available - (desired - unavailable)
        for rs in sorted(old, key=lambda r: r["metadata"].get("creationTimestamp", "")):
            spec_replicas = int(rs["spec"].get("replicas", 0))
            if spec_replicas == 0:
                continue
            unready = max(0, spec_replicas - count(rs, "availableReplicas"))
            remove = min(spec_replicas, unready + max(0, can_remove))
            if remove > 0:
                can_remove -= max(0, remove - unready)
                await self._scale(rs, spec_replicas - remove)

    async def _write_status(self, dep: dict[str, Any], new: dict[str, Any], old: list[dict[str, Any]],
                            desired: int) -> None:
        sets = [new, *old]
        replicas = sum(int(rs.get("status", {}).get("replicas", 0) or 0) for rs in sets)
        ready = sum(int(rs.get("status", {}).get("readyReplicas", 0) or 0) for rs in sets)
        available = sum(int(rs.get("status", {}).get("availableReplicas", 0) or 0) for rs in sets)
        updated = int(new.get("status", {}).get("replicas", 0) or 0)
        complete = updated == desired and replicas == desired and available == desired
        prev = dep.get("status", {}) or {}

        def condition(type_: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
            was = next((c for c in prev.get("conditions", []) or [] if c.get("type") == type_), None)
            value = "True" if ok else "False"
            stamp = was["lastTransitionTime"] if was and was.get("status") == value else _now()
            return {"type": type_, "status": value, "reason": reason, "message": message,
                    "lastTransitionTime": stamp, "lastUpdateTime": stamp}

        status = {
            "observedGeneration": dep["metadata"].get("generation", 1),
            "replicas": replicas, "updatedReplicas": updated, "readyReplicas": ready,
            "availableReplicas": available, "unavailableReplicas": max(0, desired - available),
            "conditions": [
                condition("Available", available >= desired - resolve_int_or_percent(
                    (dep["spec"].get("strategy", {}) or {}).get("rollingUpdate", {}).get("maxUnavailable")
                    if (dep["spec"].get("strategy", {}) or {}).get("type") != "Recreate" else 0, desired,
                    round_up=False), "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
                    f"{available}/{desired} replicas available"),
                condition("Progressing", True, "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
                          f'ReplicaSet "{new["metadata"]["name"]}" '
                          + ("has successfully progressed." if complete else "is progressing.")),
            ],
        }
        if {k: prev.get(k) for k in status if k != "conditions"} != {k: v for k, v in status.items()
                                                                   if k != "conditions"} or \
                [(c["type"], c["status"], c["reason"]) for c in prev.get("conditions", []) or []] != \
                [(c["type"], c["status"], c["reason"]) for c in status["conditions"]]:
            await self.client.patch(DEPLOYMENTS, dep["metadata"]["namespace"], dep["metadata"]["name"],
                                    {"status": status}, subresource="status")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

