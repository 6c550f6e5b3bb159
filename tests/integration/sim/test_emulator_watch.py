"""Watches: no lost events (namespace-less bodies, list-then-watch), selectors, 410, timeouts, bookmarks."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kubernetes.client
import kubernetes.watch
import pytest

from tests.support.cluster import SimApi

pytestmark = pytest.mark.integration
CMS = "/api/v1/namespaces/default/configmaps"


class Watcher:
    """A raw watch stream read on the test's loop into a queue."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.ended = asyncio.Event()

    async def start(self) -> Watcher:
        self.task = asyncio.create_task(self._read())
        await asyncio.sleep(0.1)
        return self

    async def _read(self) -> None:
        try:
            async with self.session.get(self.url) as resp:
                assert resp.status == 200
                async for line in resp.content:
                    if line.strip():
                        await self.events.put(json.loads(line))
        finally:
            self.ended.set()

    async def next(self, timeout: float = 5.0) -> dict[str, Any]:
        return await asyncio.wait_for(self.events.get(), timeout)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(url, json=body) as resp:
        assert resp.status == 201, await resp.text()
        return dict(await resp.json())


async def test_watch_sees_objects_created_without_a_namespace_in_the_body(
        sim_api: SimApi, session: aiohttp.ClientSession) -> None:
    watcher = await Watcher(session, f"{sim_api.url}{CMS}?watch=true").start()
    await _post(session, sim_api.url + CMS, {"metadata": {"name": "no-ns-in-body"}})
    event = await watcher.next()
    assert event["type"] == "ADDED" and event["object"]["metadata"]["namespace"] == "default"
    await watcher.stop()


async def test_list_then_watch_replays_writes_made_in_between(
        sim_api: SimApi, session: aiohttp.ClientSession) -> None:
    await _post(session, sim_api.url + CMS, {"metadata": {"name": "before"}})
    async with session.get(sim_api.url + CMS) as resp:
        listed = await resp.json()
    rv = listed["metadata"]["resourceVersion"]
    await _post(session, sim_api.url + CMS, {"metadata": {"name": "between"}})  # the informer's blind spot
    watcher = await Watcher(session, f"{sim_api.url}{CMS}?watch=true&resourceVersion={rv}").start()
    first = await watcher.next()
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "between")
    await _post(session, sim_api.url + CMS, {"metadata": {"name": "after"}})
    assert (await watcher.next())["object"]["metadata"]["name"] == "after"
    await watcher.stop()


async def test_watch_without_resource_version_starts_with_the_current_state(
        sim_api: SimApi, session: aiohttp.ClientSession) -> None:
    await _post(session, sim_api.url + CMS, {"metadata": {"name": "existing"}})
    watcher = await Watcher(session, f"{sim_api.url}{CMS}?watch=true").start()
    event = await watcher.next()
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "existing")
    await watcher.stop()


async def test_label_selector_watch_turns_transitions_into_added_and_deleted(
        sim_api: SimApi, session: aiohttp.ClientSession) -> None:
    watcher = await Watcher(session, f"{sim_api.url}{CMS}?watch=true&labelSelector=app%3Dweb").start()
    await _post(session, sim_api.url + CMS, {"metadata": {"name": "other", "labels": {"app": "db"}}})
    await _post(session, sim_api.url + CMS, {"metadata": {"name": "web", "labels": {"app": "web"}}})
    event = await watcher.next()
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "web")
    headers = {"Content-Type": "application/merge-patch+json"}
    async with session.patch(f"{sim_api.url}{CMS}/web", json={"metadata": {"labels": {"app": "gone"}}},
                             headers=headers) as resp:
        assert resp.status == 200
    assert (await watcher.next())["type"] == "DELETED"
    async with session.patch(f"{sim_api.url}{CMS}/other", json={"metadata": {"labels": {"app": "web"}}},
                             headers=headers) as resp:
        assert resp.status == 200
    event = await watcher.next()
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "other")
    await watcher.stop()


async def test_too_old_resource_version_gets_410_expired(
        make_sim_api: Any, session: aiohttp.ClientSession) -> None:
    sim = make_sim_api(history_size=4)
    rv0 = None
    for i in range(10):
        created = await _post(session, sim.url + CMS, {"metadata": {"name": f"c{i}"}})
        rv0 = rv0 or created["metadata"]["resourceVersion"]
    watcher = await Watcher(session, f"{sim.url}{CMS}?watch=true&resourceVersion={rv0}").start()
    event = await watcher.next()
    assert event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")
    await watcher.stop()


async def test_timeout_seconds_ends_the_stream_and_bookmarks_arrive(
        make_sim_api: Any, session: aiohttp.ClientSession) -> None:
    sim = make_sim_api(bookmark_interval=0.2)
    watcher = await Watcher(session, f"{sim.url}{CMS}?watch=true&resourceVersion=1&allowWatchBookmarks=true"
                                     "&timeoutSeconds=1").start()
    event = await watcher.next()
    assert event["type"] == "BOOKMARK" and int(event["object"]["metadata"]["resourceVersion"]) >= 1
    await asyncio.wait_for(watcher.ended.wait(), 5)


def test_official_client_watch_streams_events(sim_api: SimApi) -> None:
    core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(sim_api.client_configuration()))
    core.create_namespaced_config_map("default", {"metadata": {"name": "one"}})
    core.delete_namespaced_config_map("one", "default")
    core.create_namespaced_config_map("default", {"metadata": {"name": "two"}})
    seen = []
    for event in kubernetes.watch.Watch().stream(core.list_namespaced_config_map, "default", timeout_seconds=1,
                                                 resource_version="1"):
        seen.append((event["type"], event["object"].metadata.name))
    assert seen == [("ADDED", "one"), ("DELETED", "one"), ("ADDED", "two")]
