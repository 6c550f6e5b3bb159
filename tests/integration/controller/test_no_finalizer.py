"""No finalizer on VLLMDeployments: the health loop is an operator-level scheduler, not a kopf timer (which made kopf
finalize every object), so deletion never waits for the operator. On the real control plane, namespaced mode, with
the health loop on.

- deleted while the operator is stopped: gone at once (up to 2d3eb9d it stayed Terminating until an operator ran);
- the watched namespace deleted: the namespace finishes (up to 2d3eb9d its deletion could take the operator's Role
  first and strand the finalizer behind a 403);
- an object as 2d3eb9d's operator left it (its finalizer and kopf's annotations in place): the new operator takes
  the finalizer off on its first sight, keeps reconciling it, and a deletion after that needs no operator.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from tests.integration.controller.conftest import Tenant, running_operator
from tests.support.waiting import eventually
from vllm_operator import constants
from vllm_operator.k8s import VLLM_DEPLOYMENTS, ClientKubeApi

HEALTH = {"health_enabled": True, "health_interval_override": 1.0}
FINALIZER = f"{constants.GROUP}/finalizer"  # kopf's, put on by 2d3eb9d's health timer


def cond(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return dict(next((c for c in (obj or {}).get("status", {}).get("conditions", []) if c["type"] == type_), {}))


async def checked(kube: ClientKubeApi, ns: str, name: str) -> dict[str, Any] | None:
    """The object once reconciled, Ready and checked by the health loop (it wrote MetricsAvailable)."""
    obj = await kube.get(VLLM_DEPLOYMENTS, ns, name)
    if obj is None or cond(obj, constants.COND_READY).get("status") != "True":
        return None
    return obj if cond(obj, constants.COND_METRICS_AVAILABLE) else None


async def create_checked_without_finalizer(kube: ClientKubeApi, tenant: Tenant) -> None:
    """Create the chat example, wait for its first health check, and see that nothing put a finalizer on it."""
    obj = tenant.example("chat")
    ns, name = tenant.namespace, obj["metadata"]["name"]
    await kube.create(VLLM_DEPLOYMENTS, ns, obj)
    seen = await eventually(lambda: checked(kube, ns, name), timeout=90)
    assert not seen["metadata"].get("finalizers"), seen["metadata"]


async def test_a_vllmdeployment_deleted_while_the_operator_is_stopped_is_gone_at_once(examples_tenant: Tenant
                                                                                      ) -> None:
    tenant = examples_tenant
    ns, name = tenant.namespace, tenant.example("chat")["metadata"]["name"]
    async with running_operator(tenant, **HEALTH) as kube:
        await create_checked_without_finalizer(kube, tenant)
    admin = await ClientKubeApi.from_environment(kubeconfig=str(tenant.kube.kubeconfig))
    try:
        await admin.delete(VLLM_DEPLOYMENTS, ns, name)
        assert await admin.get(VLLM_DEPLOYMENTS, ns, name) is None, "nothing holds the object"
    finally:
        await admin.close()


async def test_the_watched_namespace_deleted_in_namespaced_mode_finishes(examples_tenant: Tenant) -> None:
    """The operator runs (as the chart's namespaced ServiceAccount, its Role inside the namespace) while the
    namespace goes; the namespace controller deletes the Role and the VLLMDeployment in no particular order, and
    nothing of the operator's needs the Role to let the namespace finish."""
    tenant = examples_tenant
    ns = tenant.namespace
    async with running_operator(tenant, **HEALTH) as kube:
        await create_checked_without_finalizer(kube, tenant)
        tenant.kube.kubectl("delete", "namespace", ns, "--wait=false")

        async def namespace_gone() -> bool:
            found = await asyncio.to_thread(tenant.kube.kubectl, "get", "namespace", ns, check=False)
            return found.returncode != 0 and "NotFound" in found.stderr

        await eventually(namespace_gone, timeout=90)


def as_2d3eb9d_left_it(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as 2d3eb9d's operator left a reconciled VLLMDeployment, read off one it had reconciled on this
    control plane (`operator_process(..., source=<2d3eb9d's operator/>)`, health loop on): kopf's finalizer (the
    health timer's), kopf's marker and its diff-base annotation (the last handled spec); no `status.kopf`. The new
    operator's kopf still reads and writes the two annotations (the same storage settings), so only the finalizer is
    no longer used."""
    out = copy.deepcopy(obj)
    out["metadata"]["finalizers"] = [FINALIZER]
    out["metadata"].setdefault("annotations", {}).update({
        f"{constants.GROUP}/kopf-managed": "yes",
        f"{constants.GROUP}/last-handled-configuration": json.dumps({"spec": out["spec"]}, separators=(",", ":"))})
    return out


async def test_an_object_finalized_by_2d3eb9d_loses_the_finalizer_when_the_new_operator_starts(
        examples_tenant: Tenant) -> None:
    tenant = examples_tenant
    obj = tenant.example("chat")
    ns, name = tenant.namespace, obj["metadata"]["name"]
    admin = await ClientKubeApi.from_environment(kubeconfig=str(tenant.kube.kubeconfig))
    try:
        await admin.create(VLLM_DEPLOYMENTS, ns, as_2d3eb9d_left_it(obj))
        before = await admin.get(VLLM_DEPLOYMENTS, ns, name)
        assert before is not None and before["metadata"]["finalizers"] == [FINALIZER]
        async with running_operator(tenant, **HEALTH) as kube:

            async def unfinalized() -> dict[str, Any] | None:
                got = await checked(kube, ns, name)
                return got if got is not None and not got["metadata"].get("finalizers") else None

            await eventually(unfinalized, timeout=90)
            await asyncio.sleep(2)  # more events and checks: kopf puts nothing back
            after = await kube.get(VLLM_DEPLOYMENTS, ns, name)
            assert after is not None and not after["metadata"].get("finalizers"), after["metadata"]
            assert "kopf" not in after.get("status", {}), after["status"]
            assert after["status"]["observedGeneration"] == 1, "resumed and reconciled like any other"
        await admin.delete(VLLM_DEPLOYMENTS, ns, name)
        assert await admin.get(VLLM_DEPLOYMENTS, ns, name) is None, "gone at once with the operator stopped"
    finally:
        await admin.close()
