"""What one VLLMDeployment costs the API server from create to Ready: each child written once, one event per verb,
and status refreshes served from the operator's watch caches (no GET of the parent or LIST of its Deployments per
Deployment event — at 500 VLLMDeployments those reads were what kept the operator from converging)."""

from __future__ import annotations

import asyncio
from collections import Counter

from tests.integration.controller.conftest import example
from tests.support.operator import running_operator
from tests.support.waiting import eventually
from vllm_operator import constants
from vllm_operator.k8s import APPLY_PATCH, FIELD_MANAGER, VLLM_DEPLOYMENTS
from vllm_operator.sim.cluster import SimCluster


async def test_create_to_ready_writes_each_child_once_and_refreshes_status_without_reads(cluster: SimCluster
                                                                                        ) -> None:
    obj = example("long-doc")  # 2 + 1 engine pods and 2 router pods: a dozen Deployment status events
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    client = cluster.client  # the test's own requests go out as "sim-cluster", not with the operator's agent
    assert client is not None
    async with running_operator(cluster):
        start = cluster.api.request_log.next_seq
        await client.create(VLLM_DEPLOYMENTS, ns, obj)

        async def ready() -> bool:
            current = await client.get(VLLM_DEPLOYMENTS, ns, name) or {}
            return any(c["type"] == constants.COND_READY and c["status"] == "True"
                       for c in current.get("status", {}).get("conditions", []))

        await eventually(ready, timeout=90)
        await asyncio.sleep(3)  # a last coalesced refresh, if any, lands
        ours = [r for r in cluster.api.request_log.since(start) if constants.APP_NAME in r.user_agent]
    # Children are created by server-side apply: one apply PATCH each, as the operator's field manager.
    applies = Counter(r.resource for r in ours if r.verb == "patch" and r.content_type == APPLY_PATCH)
    assert applies == Counter({"deployments": 3, "services": 3, "poddisruptionbudgets": 3, "configmaps": 1,
                               "serviceaccounts": 1, "roles": 1, "rolebindings": 1, "networkpolicies": 1}), applies
    assert {r.field_manager for r in ours if r.content_type == APPLY_PATCH} == {FIELD_MANAGER}
    assert not [r for r in ours if r.verb in ("create", "patch", "update") and r.resource
                not in (constants.PLURAL, "events") and r.content_type != APPLY_PATCH]
    assert len([r for r in ours if r.verb == "create" and r.resource == "events"]) == 1, "one 'Created' event"
    parent_gets = [r for r in ours if r.verb == "get" and r.resource == constants.PLURAL]
    deployment_lists = [r for r in ours if r.verb == "list" and r.resource == "deployments"]
    status_patches = [r for r in ours if r.resource == constants.PLURAL and r.subresource == "status"]
    deployment_events = len([r for r in cluster.api.request_log.since(start)
                             if r.resource == "deployments" and r.subresource == "status" and r.is_write])
    assert deployment_events >= 5, "the simulated controllers reported the rollout"
    # reconcile: one LIST of Deployments to converge and one for its status (+1 if its status write met a 409);
    # status refreshes read nothing (a re-read after a 409 is the only GET)
    assert len(deployment_lists) <= 3, [r.query for r in deployment_lists]
    assert len(parent_gets) <= 2
    assert 1 <= len(status_patches) <= 6, f"{len(status_patches)} status writes for {deployment_events} events"
