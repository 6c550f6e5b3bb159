"""The reconcile routine against the in-memory API server (tests/support/fakekube): what needs a server to misbehave
on cue (a failing write, a status write that loses a race), the requests of a create and a resync, and status.

What server-side apply does with the children's fields (a dropped field removed, another manager's kept, a contested
one named in an event) only the real kube-apiserver decides: test_children_ssa proves it there; the fake keeps no
field ownership. The VLLMDeployment is created through the API first, as on the real server, so that it has a uid
the children's owner references name. Requests are counted by the fake itself (`FakeKubeApi.calls`, per verb, like
test_children_ssa's Recording wrapper).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from tests.support.fakekube import WRITE_VERBS, FakeKubeApi
from tests.support.paths import EXAMPLES
from vllm_operator.handlers import childplan
from vllm_operator.handlers.reconcile import child_selector, reconcile, refresh_status
from vllm_operator.health import loop
from vllm_operator.k8s import CHILD_RESOURCES, DEPLOYMENTS, VLLM_DEPLOYMENTS, KubeError

NS = "ml"
TOLERATION = {"key": "team", "operator": "Exists", "effect": "NoSchedule"}


def chat(**pools: Any) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((EXAMPLES / "chat.yaml").read_text())
    obj["metadata"] = {"name": "chat", "namespace": NS}
    for pool, fields in pools.items():
        obj["spec"]["pools"][pool].update(fields)
    return obj


async def create(api: FakeKubeApi, obj: Mapping[str, Any]) -> dict[str, Any]:
    return await api.create(VLLM_DEPLOYMENTS, NS, obj)


async def edit(api: FakeKubeApi, patch: Mapping[str, Any]) -> dict[str, Any]:
    return await api.patch(VLLM_DEPLOYMENTS, NS, "chat", patch)


async def fresh(api: FakeKubeApi) -> dict[str, Any]:
    got = await api.get(VLLM_DEPLOYMENTS, NS, "chat")
    assert got is not None
    return got


async def deployment(api: FakeKubeApi, name: str) -> dict[str, Any]:
    got = await api.get(DEPLOYMENTS, NS, name)
    assert got is not None
    return got


async def children(api: FakeKubeApi) -> list[dict[str, Any]]:
    out = []
    for res in CHILD_RESOURCES.values():
        if await api.has_resource(res.group, res.version, res.plural):
            out += await api.list(res, NS, child_selector("chat"))
    return out


async def test_children_are_applied_owned_by_the_vllmdeployment_and_a_resync_writes_nothing() -> None:
    api = FakeKubeApi()
    obj = await create(api, chat())
    api.calls.clear()
    outcome = await reconcile(api, obj)
    assert outcome.spec_error is None and not outcome.updated and not outcome.deleted
    assert Counter(label.split()[0] for label in outcome.created) == Counter({
        "Deployment": 3, "Service": 3, "PodDisruptionBudget": 3, "ConfigMap": 1, "ServiceAccount": 1, "Role": 1,
        "RoleBinding": 1, "NetworkPolicy": 1}), "PodMonitor and PrometheusRule: not served, so not rendered"
    assert api.calls["apply"] == 14 and api.calls["create"] == 0 and api.calls["patch_status"] == 1, api.calls
    listed = await children(api)
    assert len(listed) == 14
    for child in listed:
        assert child["metadata"]["ownerReferences"] == [childplan.owner_reference(obj)], child["kind"]
    status = (await fresh(api))["status"]
    assert status["observedGeneration"] == 1
    api.calls.clear()
    resync = await reconcile(api, await fresh(api))
    assert not resync.changed and not resync.status_patched
    assert api.writes == 0 and api.calls["emit_event"] == 0, api.calls


async def test_a_failed_write_fails_the_reconcile_and_the_next_one_converges() -> None:
    api = FakeKubeApi()
    obj = await create(api, chat())
    api.fail("apply", KubeError(500, "InternalError", "etcdserver: request timed out"), res=DEPLOYMENTS)
    with pytest.raises(KubeError, match="request timed out"):
        await reconcile(api, obj)
    # The first wave (what the pods refer to) is there; of the Deployments, the two the fault did not hit.
    assert len(await api.list(DEPLOYMENTS, NS, child_selector("chat"))) == 2
    outcome = await reconcile(api, await fresh(api))
    assert [label.split()[0] for label in outcome.created] == ["Deployment"]
    assert len(await children(api)) == 14


async def test_a_status_write_that_lost_a_race_is_made_again_from_a_fresh_read() -> None:
    api = FakeKubeApi()
    stale = await create(api, chat())
    await api.patch(VLLM_DEPLOYMENTS, NS, "chat", {"metadata": {"labels": {"a": "b"}}})  # someone else's write
    api.calls.clear()
    outcome = await reconcile(api, stale)
    assert outcome.status_patched and api.calls["patch_status"] == 2 and api.calls["get"] == 1, api.calls
    assert (await fresh(api))["status"]["observedGeneration"] == 1


async def test_disabling_a_pool_removes_its_status() -> None:
    """The one status writer diffs against the object read, with nulls: a merge patch of the whole new status (what
    the reconcile and the refresh wrote before) cannot delete `status.pools.long` or `status.plan.long`."""
    api = FakeKubeApi()
    await reconcile(api, await create(api, chat()))
    before = (await fresh(api))["status"]
    assert "long" in before["pools"] and "long" in before["plan"]
    await reconcile(api, await edit(api, {"spec": {"pools": {"long": {"enabled": False}}}}))
    after = (await fresh(api))["status"]
    assert after["observedGeneration"] == 2
    assert "long" not in after["pools"] and "long" not in after["plan"], after
    assert after["longReplicas"] == "-" and "short" in after["pools"]
    await refresh_status(api, await fresh(api))
    assert "long" not in (await fresh(api))["status"]["pools"]


async def test_a_health_check_that_finds_what_status_says_writes_nothing_and_posts_no_event() -> None:
    """A settled operator sends nothing: the first check's conditions are news (a status write, and an event for the
    MetricsAvailable=False that no Prometheus means); the next check, finding the same, neither writes nor posts."""
    api = FakeKubeApi()
    await reconcile(api, await create(api, chat()))

    async def check_once() -> dict[str, int]:
        obj = await fresh(api)
        result = await loop.check(api, None, obj)
        assert result is not None
        before = Counter(api.calls)
        await loop.execute(api, obj, result, reconcile=reconcile, recheck=functools.partial(loop.check, api, None))
        return {verb: n - before[verb] for verb, n in api.calls.items()
                if n > before[verb] and (verb in WRITE_VERBS or verb == "emit_event")}

    assert await check_once() == {"patch_status": 1, "emit_event": 1}
    assert await check_once() == {}
    assert await check_once() == {}
