"""Every gap of vanilla kmock we found, as a check that our emulator passes and the
vanilla `kmock.KubernetesEmulator` fails — so each fix is pinned and each check is shown able to fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import kmock
import pytest

from tests.support import toy_crd
from vllm_operator.sim.apiserver import ApiServer, serve

pytestmark = pytest.mark.integration
CMS = "/api/v1/namespaces/default/configmaps"
MERGE = {"Content-Type": "application/merge-patch+json"}
Check = Callable[[aiohttp.ClientSession, str], Awaitable[None]]


async def _json(resp: aiohttp.ClientResponse) -> Any:
    return json.loads(await resp.read())


async def _create(s: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any]) -> aiohttp.ClientResponse:
    async with s.post(url + path, json=body) as resp:
        await resp.read()
        return resp


async def server_set_metadata(s: aiohttp.ClientSession, url: str) -> None:
    async with s.post(url + CMS, json={"metadata": {"name": "cm"}}) as resp:
        obj = await _json(resp)
    meta = obj["metadata"]
    assert meta.get("uid") and meta.get("resourceVersion") and meta.get("creationTimestamp")
    assert meta.get("namespace") == "default"


async def create_answers_201(s: aiohttp.ClientSession, url: str) -> None:
    assert (await _create(s, url, CMS, {"metadata": {"name": "cm"}})).status == 201


async def put_replaces_with_409_on_stale(s: aiohttp.ClientSession, url: str) -> None:
    async with s.post(url + CMS, json={"metadata": {"name": "cm"}, "data": {"a": "1"}}) as resp:
        obj = await _json(resp)
    obj["data"] = {"a": "2"}
    async with s.put(f"{url}{CMS}/cm", json=obj) as resp:
        assert resp.status == 200
    async with s.put(f"{url}{CMS}/cm", json=obj) as resp:  # same (now stale) resourceVersion
        assert resp.status == 409


async def delete_collection(s: aiohttp.ClientSession, url: str) -> None:
    await _create(s, url, CMS, {"metadata": {"name": "cm"}})
    async with s.delete(url + CMS) as resp:
        assert resp.status == 200
    async with s.get(url + CMS) as resp:
        assert (await _json(resp))["items"] == []


async def status_isolation(s: aiohttp.ClientSession, url: str) -> None:
    await _load_toy_crd(s, url)
    await _create(s, url, toy_crd.path(), toy_crd.widget("w", size=2))
    async with s.patch(
        url + toy_crd.path(name="w", sub="status"), json={"spec": {"size": 9}, "status": {"phase": "A"}}, headers=MERGE
    ) as resp:
        assert resp.status == 200
    async with s.patch(url + toy_crd.path(name="w"), json={"status": {"phase": "B"}}, headers=MERGE) as resp:
        assert resp.status == 200
    async with s.get(url + toy_crd.path(name="w")) as resp:
        obj = await _json(resp)
    assert obj["spec"]["size"] == 2 and obj["status"]["phase"] == "A"


async def label_selector(s: aiohttp.ClientSession, url: str) -> None:
    await _create(s, url, CMS, {"metadata": {"name": "a", "labels": {"app": "x"}}})
    await _create(s, url, CMS, {"metadata": {"name": "b", "labels": {"app": "y"}}})
    async with s.get(url + CMS, params={"labelSelector": "app=x"}) as resp:
        assert [i["metadata"]["name"] for i in (await _json(resp))["items"]] == ["a"]


async def owner_gc(s: aiohttp.ClientSession, url: str) -> None:
    async with s.post(url + CMS, json={"metadata": {"name": "owner"}}) as resp:
        owner = await _json(resp)
    await _create(
        s,
        url,
        CMS,
        {
            "metadata": {
                "name": "kid",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
                ],
            }
        },
    )
    async with s.delete(f"{url}{CMS}/owner") as resp:
        await resp.read()
    for _ in range(100):
        async with s.get(f"{url}{CMS}/kid") as resp:
            if resp.status == 404:
                return
        await asyncio.sleep(0.02)
    raise AssertionError("the dependent survived its owner")


async def _load_toy_crd(s: aiohttp.ClientSession, url: str) -> None:
    async with s.post(url + "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=toy_crd.toy_crd()) as r:
        assert r.status == 201


async def crd_registers_its_resource(s: aiohttp.ClientSession, url: str) -> None:
    await _load_toy_crd(s, url)
    async with s.get(f"{url}/apis/{toy_crd.GROUP}/{toy_crd.VERSION}") as resp:
        names = [r["name"] for r in (await _json(resp))["resources"]]
    assert "widgets" in names and "widgets/status" in names


async def crd_objects_are_validated_and_pruned(s: aiohttp.ClientSession, url: str) -> None:
    await _load_toy_crd(s, url)
    async with s.post(url + toy_crd.path(), json=toy_crd.widget("bad", size=99)) as resp:
        assert resp.status == 422
    async with s.post(url + toy_crd.path(), json=toy_crd.widget("ok", undeclared=1)) as resp:
        assert "undeclared" not in (await _json(resp))["spec"]


async def watch_keeps_namespace_less_bodies(s: aiohttp.ClientSession, url: str) -> None:
    async with s.get(url + CMS, params={"watch": "true"}, timeout=aiohttp.ClientTimeout(total=5)) as watch:
        await asyncio.sleep(0.1)
        await _create(s, url, CMS, {"metadata": {"name": "no-ns"}})
        line = await asyncio.wait_for(watch.content.readline(), 3)
    assert json.loads(line)["object"]["metadata"]["name"] == "no-ns"


async def watch_410_for_expired_versions(s: aiohttp.ClientSession, url: str) -> None:
    async with s.get(
        url + CMS, params={"watch": "true", "resourceVersion": "1"}, timeout=aiohttp.ClientTimeout(total=5)
    ) as watch:
        line = await asyncio.wait_for(watch.content.readline(), 3)
    event = json.loads(line)
    assert event["type"] == "ERROR" and event["object"]["code"] == 410


async def core_discovery_group_version(s: aiohttp.ClientSession, url: str) -> None:
    async with s.get(url + "/api/v1") as resp:
        assert (await _json(resp))["groupVersion"] == "v1"


async def version_with_trailing_slash(s: aiohttp.ClientSession, url: str) -> None:
    async with s.get(url + "/version/") as resp:
        assert resp.status == 200 and "gitVersion" in await _json(resp)


async def delete_returns_status(s: aiohttp.ClientSession, url: str) -> None:
    await _create(s, url, CMS, {"metadata": {"name": "cm"}})
    async with s.delete(f"{url}{CMS}/cm") as resp:
        body = await _json(resp)
    assert body["kind"] == "Status" and body["status"] == "Success"


CHECKS: dict[str, Check] = {
    "server-set-metadata": server_set_metadata,
    "create-201": create_answers_201,
    "put-and-409": put_replaces_with_409_on_stale,
    "delete-collection": delete_collection,
    "status-isolation": status_isolation,
    "label-selector": label_selector,
    "owner-gc": owner_gc,
    "crd-registers": crd_registers_its_resource,
    "crd-validation-pruning": crd_objects_are_validated_and_pruned,
    "watch-namespace-less-body": watch_keeps_namespace_less_bodies,
    "watch-410": watch_410_for_expired_versions,
    "core-discovery": core_discovery_group_version,
    "version-slash": version_with_trailing_slash,
    "delete-status": delete_returns_status,
}


@contextlib.asynccontextmanager
async def running(flavour: str) -> AsyncIterator[str]:
    if flavour == "ours":
        async with serve(ApiServer(history_size=2)) as (_, url):
            yield url
        return
    vanilla = kmock.KubernetesEmulator()
    vanilla.resources.load_bundled()
    async with vanilla, kmock.Server(vanilla) as server:
        yield str(server.url).rstrip("/")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("flavour", ["ours", "vanilla-kmock"])
@pytest.mark.parametrize("check", list(CHECKS), ids=list(CHECKS))
async def test_gap(check: str, flavour: str) -> None:
    async with running(flavour) as url, aiohttp.ClientSession() as session:
        if check == "watch-410":  # make resourceVersion 1 fall out of the (tiny) history first
            for i in range(6):
                await _create(session, url, CMS, {"metadata": {"name": f"filler-{i}"}})
        if flavour == "ours":
            await CHECKS[check](session, url)
            return
        try:
            await asyncio.wait_for(CHECKS[check](session, url), 10)
        except (AssertionError, KeyError, TypeError, ValueError, TimeoutError, aiohttp.ClientError):
            return
        pytest.fail(f"vanilla kmock passed the {check!r} check: the gap it pins is not a gap")
