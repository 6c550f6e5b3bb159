"""kopf (the operator framework the project uses) runs a toy operator against the emulator, end to end.

create → owned child via kopf.adopt → status → update → delete (finalizer) → GC of the child; a status field the
CRD does not declare vanishes, exactly as on a real API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import kopf
import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

from tests.support import toy_crd
from tests.support.cluster import SimApi

pytestmark = pytest.mark.integration
ARGS = (toy_crd.GROUP, toy_crd.VERSION, "default", toy_crd.PLURAL)


def toy_operator(url: str, seen: list[str]) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=url, token="sim-token", default_namespace="default")

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 10
        settings.persistence.finalizer = "toys.example.com/toy-operator"

    @kopf.on.create(toy_crd.GROUP, toy_crd.VERSION, toy_crd.PLURAL, registry=registry)
    async def create(body: kopf.Body, name: str, patch: kopf.Patch, **_: Any) -> dict[str, Any]:
        child: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-child"},
                                 "data": {"size": str(body["spec"]["size"])}}
        kopf.adopt(child, owner=body)
        async with aiohttp.ClientSession() as session, session.post(
                f"{url}/api/v1/namespaces/default/configmaps", json=child) as resp:
            assert resp.status == 201, await resp.text()
        patch.status["phase"] = "Ready"
        seen.append(f"created {name}")
        return {"undeclared": "kopf stores handler results in status; this CRD does not declare it"}

    @kopf.on.update(toy_crd.GROUP, toy_crd.VERSION, toy_crd.PLURAL, field="spec.size", registry=registry)
    async def resize(name: str, new: int, **_: Any) -> None:
        async with aiohttp.ClientSession() as session, session.patch(
                f"{url}/api/v1/namespaces/default/configmaps/{name}-child", json={"data": {"size": str(new)}},
                headers={"Content-Type": "application/merge-patch+json"}) as resp:
            assert resp.status == 200, await resp.text()
        seen.append(f"resized {name} to {new}")

    @kopf.on.delete(toy_crd.GROUP, toy_crd.VERSION, toy_crd.PLURAL, registry=registry)
    def delete(name: str, **_: Any) -> None:
        seen.append(f"deleted {name}")

    return registry


@pytest.fixture
async def operator(sim_api: SimApi) -> AsyncIterator[list[str]]:
    sim_api.load_crd(toy_crd.toy_crd())
    seen: list[str] = []
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(kopf.operator(registry=toy_operator(sim_api.url, seen), standalone=True,
                                             namespaces=["default"], stop_flag=stop, ready_flag=ready))
    await asyncio.wait_for(ready.wait(), 30)
    yield seen
    stop.set()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)


async def eventually(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            result = await asyncio.to_thread(check)
            if result:
                return result
        except (AssertionError, ApiException):
            if asyncio.get_running_loop().time() > deadline:
                raise
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.1)


async def test_kopf_operator_lifecycle_with_adopted_child_status_and_gc(sim_api: SimApi, operator: list[str]) -> None:
    client = kubernetes.client.ApiClient(sim_api.client_configuration())
    custom, core = kubernetes.client.CustomObjectsApi(client), kubernetes.client.CoreV1Api(client)
    await asyncio.to_thread(custom.create_namespaced_custom_object, *ARGS, toy_crd.widget("w", size=2))

    child = await eventually(lambda: core.read_namespaced_config_map("w-child", "default"))
    owner = await asyncio.to_thread(custom.get_namespaced_custom_object, *ARGS, "w")
    [ref] = child.metadata.owner_references
    assert (ref.uid, ref.kind, ref.controller) == (owner["metadata"]["uid"], "Widget", True)
    assert "toys.example.com/toy-operator" in owner["metadata"]["finalizers"]

    def ready() -> dict[str, Any] | None:
        obj = custom.get_namespaced_custom_object(*ARGS, "w")
        return obj if (obj.get("status") or {}).get("phase") == "Ready" else None
    obj = await eventually(ready)
    assert set(obj["status"]) <= {"phase", "observedGeneration", "conditions"}  # kopf's extra status: pruned
    assert "create" not in obj["status"] and "kopf" not in obj["status"]

    await asyncio.to_thread(custom.patch_namespaced_custom_object, *ARGS, "w", {"spec": {"size": 4}})
    await eventually(lambda: core.read_namespaced_config_map("w-child", "default").data == {"size": "4"})

    await asyncio.to_thread(custom.delete_namespaced_custom_object, *ARGS, "w")

    def gone() -> bool:
        try:
            core.read_namespaced_config_map("w-child", "default")
        except ApiException as exc:
            if exc.status != 404:
                raise
            try:
                custom.get_namespaced_custom_object(*ARGS, "w")
            except ApiException as exc2:
                return exc2.status == 404
        return False
    await eventually(gone)
    assert operator == ["created w", "resized w to 4", "deleted w"]
    patches = sim_api.request_log.filter(verb="patch", resource="widgets", user_agent="kopf")
    assert patches, "kopf's writes are in the request log with its user agent"
