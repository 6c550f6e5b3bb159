"""What one VLLMDeployment costs the API server from create to Ready: each child written once, one event per verb,
and status refreshes served from the operator's watch caches (no GET of the parent or LIST of its Deployments per
Deployment event — at 500 VLLMDeployments those reads were what kept the operator from converging).

The requests are the real API server's audit log (Metadata level, one event per request): the operator's own are
those of its ServiceAccount with the operator's client's user agent (kopf's watches and its annotation patches go
out as `kopf/…`), in the tenant's namespace, received after the VLLMDeployment was created.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from tests.integration.controller.conftest import Tenant, running_operator
from tests.support.waiting import eventually
from vllm_operator import constants
from vllm_operator.k8s import FIELD_MANAGER, VLLM_DEPLOYMENTS

DEPLOYMENT_CONTROLLER = "system:serviceaccount:kube-system:deployment-controller"


def received(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))


def field_manager(event: dict[str, Any]) -> str | None:
    """The fieldManager query parameter: only the operator's server-side apply sends one (its merge patches and
    creates do not), so it is how an apply PATCH shows in a Metadata-level audit event (no content type there)."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(event["requestURI"]).query)
    return query.get("fieldManager", [None])[0]


async def test_create_to_ready_writes_each_child_once_and_refreshes_status_without_reads(
        examples_tenant: Tenant) -> None:
    tenant = examples_tenant
    obj = tenant.example("long-doc")  # 2 + 1 engine pods and 2 router pods: a dozen Deployment status events
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    async with running_operator(tenant) as client:  # the test's own requests go out as admin
        start = datetime.now(UTC)
        await client.create(VLLM_DEPLOYMENTS, ns, obj)

        async def ready() -> bool:
            current = await client.get(VLLM_DEPLOYMENTS, ns, name) or {}
            return any(c["type"] == constants.COND_READY and c["status"] == "True"
                       for c in current.get("status", {}).get("conditions", []))

        await eventually(ready, timeout=90)
        await asyncio.sleep(3)  # a last coalesced refresh, if any, lands
    events = [e for e in tenant.kube.audit_events() if (e.get("objectRef") or {}).get("namespace") == ns
              and received(e) >= start]
    ours = [e for e in events if e["user"]["username"] == tenant.account.user
            and e.get("userAgent", "").startswith(f"{constants.APP_NAME}/")]
    assert ours, "no request of the operator's client in the audit log"

    def resource(e: dict[str, Any]) -> str:
        return str(e["objectRef"].get("resource", ""))

    def subresource(e: dict[str, Any]) -> str:
        return str(e["objectRef"].get("subresource", ""))

    applies = [e for e in ours if e["verb"] == "patch" and field_manager(e) is not None]
    # Children are created by server-side apply: one apply PATCH each, as the operator's field manager.
    assert Counter(resource(e) for e in applies) == Counter({
        "deployments": 3, "services": 3, "poddisruptionbudgets": 3, "configmaps": 1, "serviceaccounts": 1,
        "roles": 1, "rolebindings": 1, "networkpolicies": 1}), Counter(resource(e) for e in applies)
    assert {field_manager(e) for e in applies} == {FIELD_MANAGER}
    other_writes = [f"{e['verb']} {resource(e)}" for e in ours if e["verb"] in ("create", "patch", "update")
                    and resource(e) not in (constants.PLURAL, "events") and field_manager(e) is None]
    assert not other_writes, other_writes
    assert len([e for e in ours if e["verb"] == "create" and resource(e) == "events"]) == 1, "one 'Created' event"
    parent_gets = [e for e in ours if e["verb"] == "get" and resource(e) == constants.PLURAL]
    deployment_lists = [e for e in ours if e["verb"] == "list" and resource(e) == "deployments"]
    status_patches = [e for e in ours if resource(e) == constants.PLURAL and subresource(e) == "status"]
    deployment_events = len([e for e in events if e["user"]["username"] == DEPLOYMENT_CONTROLLER
                             and resource(e) == "deployments" and subresource(e) == "status"
                             and e["verb"] in ("update", "patch") and e["responseStatus"]["code"] < 400])
    assert deployment_events >= 5, "the real deployment controller reported the rollout"
    # reconcile: one LIST of Deployments to converge and one for its status (+1 if its status write met a 409);
    # status refreshes read nothing (a re-read after a 409 is the only GET)
    assert len(deployment_lists) <= 3, [e["requestURI"] for e in deployment_lists]
    assert len(parent_gets) <= 2, [e["requestURI"] for e in parent_gets]
    assert 1 <= len(status_patches) <= 6, f"{len(status_patches)} status writes for {deployment_events} events"
