"""The EndpointSlice controller: one slice per Service, listing the pods its selector matches, with readiness.

The router discovers engines from these slices (label `kubernetes.io/service-name`), so the conditions matter:
`ready` follows the pod's Ready condition, `serving` too, `terminating` once a pod has a deletionTimestamp.
Headless Services (clusterIP None) get slices like any other. Not modelled: slices split at 100 endpoints,
topology hints, dual-stack.
"""

from __future__ import annotations

from typing import Any

from vllm_operator.sim.client import ENDPOINT_SLICES, PODS, SERVICES, SimClient
from vllm_operator.sim.controllers.base import Controller, Key, own_key
from vllm_operator.sim.controllers.workloads import owner_ref, pod_ready

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGER = "endpointslice-controller.k8s.io"


class EndpointSliceController(Controller):
    name = "endpointslice-controller"

    def __init__(self, client: SimClient) -> None:
        super().__init__(client)
        self.watches = [(SERVICES, self._service_changed), (PODS, self._services_of_pod)]
        # Like the real controller's informer cache: every Service's selector, and the Services each pod was last
        # matched to (a pod whose labels changed must still leave the slices it was in).
        self._selectors: dict[Key, dict[str, str]] = {}
        self._pod_services: dict[Key, set[Key]] = {}
        # Services by (namespace, one label pair of their selector): a pod's candidates are the Services indexed
        # under one of its own labels, so a pod event looks at a handful of Services, not all of them.
        self._by_label: dict[tuple[str, str, str], set[Key]] = {}

    def _service_changed(self, kind: str, svc: dict[str, Any]) -> list[Key]:
        keys = own_key(kind, svc)
        key = keys[0]
        previous = self._selectors.pop(key, None)
        if previous:
            self._by_label.get((key[0], *min(previous.items())), set()).discard(key)
        selector = dict(svc.get("spec", {}).get("selector") or {})
        if kind != "DELETED" and selector:
            self._selectors[key] = selector
            self._by_label.setdefault((key[0], *min(selector.items())), set()).add(key)
        return keys

    def _services_of_pod(self, kind: str, pod: dict[str, Any]) -> list[Key]:
        """The Services whose selector matches the pod now or did before (from cached selectors, not a LIST of
        every Service per pod event: that made a 500-VLLMDeployment run quadratic)."""
        meta = pod["metadata"]
        namespace, labels = meta["namespace"], meta.get("labels") or {}
        pod_key = (namespace, meta["name"])
        candidates = set().union(*(self._by_label.get((namespace, k, v), ()) for k, v in labels.items()))
        # every indexed Service has its selector cached (both are updated together in _service_changed)
        now = {key for key in candidates if all(labels.get(k) == v for k, v in self._selectors[key].items())}
        before = self._pod_services.pop(pod_key, set())
        if kind != "DELETED":
            self._pod_services[pod_key] = now
        return sorted(now | before)

    async def reconcile(self, key: Key) -> None:
        namespace, name = key
        found = await self.client.get(SERVICES, namespace, name)
        if found is not None:
            await self._sync(found)

    async def _sync(self, svc: dict[str, Any]) -> None:
        selector = svc.get("spec", {}).get("selector")
        if not selector:
            return  # Services without selectors have hand-managed endpoints
        namespace, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        pods, _ = await self.client.list(PODS, namespace, label_selector)
        endpoints = []
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            ip = pod.get("status", {}).get("podIP")
            if not ip:
                continue
            terminating = bool(pod["metadata"].get("deletionTimestamp"))
            ready = pod_ready(pod)
            endpoints.append({
                "addresses": [ip],
                "conditions": {"ready": ready and not terminating, "serving": ready, "terminating": terminating},
                "nodeName": pod["spec"].get("nodeName"),
                "targetRef": {"kind": "Pod", "name": pod["metadata"]["name"], "namespace": namespace,
                              "uid": pod["metadata"]["uid"]},
            })
        ports = [{"name": p.get("name", ""), "port": _target_port(p, pods), "protocol": p.get("protocol", "TCP")}
                 for p in svc.get("spec", {}).get("ports", [])]
        slice_name = f"{name}-sim"[:63]
        body = {"addressType": "IPv4", "endpoints": endpoints, "ports": ports}
        existing = await self.client.get(ENDPOINT_SLICES, namespace, slice_name)
        if existing is None:
            await self.client.create(ENDPOINT_SLICES, namespace, {
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": slice_name, "namespace": namespace,
                             "labels": {SERVICE_NAME_LABEL: name, MANAGED_BY_LABEL: MANAGER},
                             "ownerReferences": [owner_ref(svc)]},
                **body})
        elif any(existing.get(k) != v for k, v in body.items()):
            await self.client.patch(ENDPOINT_SLICES, namespace, slice_name, body)


def _target_port(port: dict[str, Any], pods: list[dict[str, Any]]) -> int:
    """A Service port's targetPort: a number, or a container port name resolved on the selected pods."""
    target = port.get("targetPort", port["port"])
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    for pod in pods:
        for container in pod["spec"].get("containers", []):
            for cport in container.get("ports", []) or []:
                if cport.get("name") == target:
                    return int(cport["containerPort"])
    return int(port["port"])
