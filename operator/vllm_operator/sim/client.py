"""A small async HTTP client the simulated cluster's controllers use to talk to the API server.

Controllers in a real cluster are API clients like any other: they list, watch, create and patch over HTTP and see
conflicts and lag. The simulation's controllers do the same through this client (not by touching the emulator's
store), so the operator under test sees exactly the write pattern a real cluster would produce.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp

from vllm_operator.k8s import Resource

log = logging.getLogger(__name__)

REPLICA_SETS = Resource("apps", "v1", "replicasets", "ReplicaSet")
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
PODS = Resource("", "v1", "pods", "Pod")
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
SERVICES = Resource("", "v1", "services", "Service")
ENDPOINT_SLICES = Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")


class ApiStatusError(Exception):
    """A non-2xx answer; `status` is the HTTP status."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:300]}")
        self.status = status


class SimClient:
    """JSON over HTTP against one API server base URL."""

    def __init__(self, base_url: str, *, user_agent: str = "sim-controller") -> None:
        self.base_url = base_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self._user_agent = user_agent

    async def __aenter__(self) -> SimClient:
        self._session = aiohttp.ClientSession(headers={"User-Agent": self._user_agent},
                                              timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("SimClient used outside `async with`")
        return self._session

    async def request(self, method: str, path: str, *, body: Any = None, params: Mapping[str, str] | None = None,
                      content_type: str = "application/json") -> Any:
        data = json.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self.session.request(method, self.base_url + path, data=data, params=params,
                                        headers=headers) as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise ApiStatusError(resp.status, text)
            return json.loads(text) if text else None

    async def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self.request("GET", res.path(namespace, name))
        except ApiStatusError as err:
            if err.status == 404:
                return None
            raise
        return result

    async def list(self, res: Resource, namespace: str | None = None, label_selector: str | None = None,
                   field_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        params = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        data = await self.request("GET", res.path(namespace), params=params)
        return list(data.get("items", [])), str(data.get("metadata", {}).get("resourceVersion", "0"))

    async def create(self, res: Resource, namespace: str | None, body: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("POST", res.path(namespace), body=dict(body))
        return result

    async def patch(self, res: Resource, namespace: str | None, name: str, patch: Mapping[str, Any], *,
                    subresource: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = await self.request(
            "PATCH", res.path(namespace, name, subresource), body=dict(patch),
            content_type="application/merge-patch+json")
        return result

    async def delete(self, res: Resource, namespace: str | None, name: str, *,
                     grace_period_seconds: int | None = None) -> None:
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        try:
            await self.request("DELETE", res.path(namespace, name), body=body)
        except ApiStatusError as err:
            if err.status != 404:
                raise

    async def watch(self, res: Resource, namespace: str | None = None) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """List then watch forever: yields ('ADDED'|'MODIFIED'|'DELETED', obj), relisting after 410 Gone."""
        while True:
            items, rv = await self.list(res, namespace)
            for item in items:
                yield "ADDED", item
            try:
                async with self.session.get(self.base_url + res.path(namespace),
                                            params={"watch": "true", "resourceVersion": rv}) as resp:
                    if resp.status >= 400:
                        raise ApiStatusError(resp.status, await resp.text())
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            break  # 410 Gone and friends: relist
                        if event["type"] in {"ADDED", "MODIFIED", "DELETED"}:
                            yield event["type"], event["object"]
            except (TimeoutError, aiohttp.ClientError) as err:
                log.debug("Watch on %s ended (%s); relisted", res.plural, err)
                await asyncio.sleep(0.2)
