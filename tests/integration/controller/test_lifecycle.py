"""The controller on the real control plane: lifecycle, edits, refusals, deletion, status that survives pruning.

The operator runs as the chart's ServiceAccount (conftest.running_operator) in a namespace of the test's own; the
real deployment controller, scheduler and kwok make its pods Ready, and the real garbage collector removes the
children when the VLLMDeployment goes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.controller.conftest import EXAMPLES, Tenant, running_operator
from tests.support.waiting import eventually
from vllm_operator import constants, names
from vllm_operator.k8s import (
    CHILD_RESOURCES,
    CONFIGMAPS,
    DEPLOYMENTS,
    EVENTS,
    POD_MONITORS,
    PODS,
    VLLM_DEPLOYMENTS,
    ClientKubeApi,
)

OPTIONAL_GROUPS = {"monitoring.coreos.com", "keda.sh"}


def cond(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in (obj or {}).get("status", {}).get("conditions", []) or []:
        if c["type"] == type_:
            return dict(c)
    return {}


async def children(kube: ClientKubeApi, ns: str, name: str) -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for res in CHILD_RESOURCES.values():
        if res is POD_MONITORS or res.group in OPTIONAL_GROUPS:
            continue  # kinds whose CRDs this cluster does not install (Prometheus Operator, KEDA)
        for item in await kube.list(res, ns, f"{constants.LABEL_DEPLOYMENT}={name}"):
            found[(res.kind, item["metadata"]["name"])] = item
    return found


async def ready(kube: ClientKubeApi, ns: str, name: str) -> dict[str, Any] | None:
    """The object once its current generation is reconciled and Ready."""
    obj = await kube.get(VLLM_DEPLOYMENTS, ns, name)
    if obj is None or obj.get("status", {}).get("observedGeneration") != obj["metadata"].get("generation"):
        return None
    return obj if cond(obj, constants.COND_READY).get("status") == "True" else None


@pytest.mark.parametrize("name", sorted(EXAMPLES), ids=sorted(EXAMPLES))
async def test_example_lifecycle(examples_tenant: Tenant, name: str) -> None:
    obj = examples_tenant.example(name)
    ns, dep_name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    async with running_operator(examples_tenant) as kube:
        await kube.create(VLLM_DEPLOYMENTS, ns, obj)
        current = await eventually(lambda: ready(kube, ns, dep_name), timeout=90)
        kids = await children(kube, ns, dep_name)
        uid = current["metadata"]["uid"]
        assert all(k["metadata"]["ownerReferences"][0]["uid"] == uid for k in kids.values())
        kinds = {k for k, _ in kids}
        assert {"Deployment", "Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding",
                "PodDisruptionBudget", "NetworkPolicy"} <= kinds
        status = current["status"]
        assert status["observedGeneration"] == current["metadata"]["generation"]
        assert cond(current, constants.COND_SPEC_VALID)["status"] == "True"
        # MetricsAvailable is the health loop's alone; the missing Prometheus operator is a plan-summary warning.
        assert any("PodMonitor and PrometheusRule were not created" in w for w in status["plan"]["warnings"])
        for pool in ("short", "long"):
            assert status["pools"][pool]["plannedKVTokens"] > 0, "status written by the operator survived pruning"
            assert status["plan"][pool]["kvTokens"] == status["pools"][pool]["plannedKVTokens"]
        assert status["ready"].split("/")[0] == status["ready"].split("/")[1]
        await kube.delete(VLLM_DEPLOYMENTS, ns, dep_name)

        async def gone() -> bool:
            return not await children(kube, ns, dep_name) and not await kube.list(
                PODS, ns, f"{constants.LABEL_DEPLOYMENT}={dep_name}")

        # The real garbage collector removes the children in the background, and kwok the pods after their grace.
        await eventually(gone, timeout=60)
        assert await kube.get(VLLM_DEPLOYMENTS, ns, dep_name) is None, "no finalizer may hold the object"


def versions(kids: dict[tuple[str, str], dict[str, Any]]) -> dict[tuple[str, str], Any]:
    """What changes when the operator writes a child: its generation (spec) and metadata where it has one, else its
    resourceVersion. (On the real server the controllers write Deployment and PDB status all along, which moves the
    resourceVersion without anyone touching what the operator owns.)"""
    out: dict[tuple[str, str], Any] = {}
    for key, kid in kids.items():
        meta = kid["metadata"]
        if "generation" in meta:
            out[key] = (meta["generation"], meta.get("labels"), meta.get("annotations"))
        else:
            out[key] = meta["resourceVersion"]
    return out


async def converge(kube: ClientKubeApi, ns: str, name: str, generation: int) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        obj = await ready(kube, ns, name)
        return obj if obj and obj["status"].get("observedGeneration") == generation else None
    result: dict[str, Any] = await eventually(done, timeout=90)
    return result


async def test_edits_roll_exactly_the_affected_children(examples_tenant: Tenant) -> None:
    obj = examples_tenant.example("long-doc")
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    async with running_operator(examples_tenant) as kube:
        await kube.create(VLLM_DEPLOYMENTS, ns, obj)
        current = await converge(kube, ns, name, 1)
        before = versions(await children(kube, ns, name))

        # 1. replicas of the short pool: only its Deployment (and PDB if it depends on replicas) change
        await kube.patch(VLLM_DEPLOYMENTS, ns, name, {"spec": {"pools": {"short": {"replicas": 3}}}})
        current = await converge(kube, ns, name, current["metadata"]["generation"] + 1)
        after = versions(await children(kube, ns, name))
        changed = {k for k in after if after[k] != before.get(k)}
        assert ("Deployment", names.pool(name, "short")) in changed
        assert ("Deployment", names.pool(name, "long")) not in changed
        assert ("Deployment", names.router(name)) not in changed
        dep = await kube.get(DEPLOYMENTS, ns, names.pool(name, "short"))
        assert dep is not None and dep["spec"]["replicas"] == 3

        # 2. the long pool's maxTokens: long engines + router config change, the short pool does not
        before = after
        await kube.patch(VLLM_DEPLOYMENTS, ns, name, {"spec": {"pools": {"long": {"maxTokens": 2048}}}})
        current = await converge(kube, ns, name, current["metadata"]["generation"] + 1)
        after = versions(await children(kube, ns, name))
        changed = {k for k in after if after[k] != before.get(k)}
        assert ("Deployment", names.pool(name, "long")) in changed
        assert ("ConfigMap", names.router(name)) in changed
        assert ("Deployment", names.router(name)) in changed, "router pods roll when router.json changes"
        assert ("Deployment", names.pool(name, "short")) not in changed
        long_dep = await kube.get(DEPLOYMENTS, ns, names.pool(name, "long"))
        assert long_dep is not None
        args = long_dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert any("max_new_tokens" in a and "2048" in a for a in args)

        # 3. a class change re-plans both pools
        before = after
        await kube.patch(VLLM_DEPLOYMENTS, ns, name, {"spec": {"workloadClass": "rag"}})
        await converge(kube, ns, name, current["metadata"]["generation"] + 1)
        after = versions(await children(kube, ns, name))
        assert after[("Deployment", names.pool(name, "short"))] != before[("Deployment", names.pool(name, "short"))]
        configmap = await kube.get(CONFIGMAPS, ns, names.router(name))
        assert configmap is not None and constants.ROUTER_CONFIG_KEY in configmap["data"]


async def test_invalid_edit_keeps_children_and_reports_why(examples_tenant: Tenant) -> None:
    obj = examples_tenant.example("chat")
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    async with running_operator(examples_tenant) as kube:
        await kube.create(VLLM_DEPLOYMENTS, ns, obj)
        await converge(kube, ns, name, 1)
        before = versions(await children(kube, ns, name))
        pods_before = sorted(p["metadata"]["name"] for p in await kube.list(
            PODS, ns, f"{constants.LABEL_DEPLOYMENT}={name}"))
        await kube.patch(VLLM_DEPLOYMENTS, ns, name, {"spec": {"pools": {"long": {"maxModelLen": 131072,
                                                                                   "maxTokens": 1024}}}})

        async def refused() -> dict[str, Any] | None:
            current = await kube.get(VLLM_DEPLOYMENTS, ns, name)
            return current if cond(current, constants.COND_SPEC_VALID).get("status") == "False" else None

        current = await eventually(refused, timeout=20)
        message = cond(current, constants.COND_SPEC_VALID)["message"]
        assert "131072" in message and "nvidia-l4-24gb" in message
        assert cond(current, constants.COND_READY)["status"] == "True", "the running deployment stays Ready"
        assert versions(await children(kube, ns, name)) == before, "a refused edit touches no child"
        pods_after = sorted(p["metadata"]["name"] for p in await kube.list(
            PODS, ns, f"{constants.LABEL_DEPLOYMENT}={name}"))
        assert pods_after == pods_before
        events = [e for e in await kube.list(EVENTS, ns) if e["involvedObject"]["name"] == name]
        warnings = [e for e in events if e["type"] == "Warning" and e["reason"] == "SpecInvalid"]
        assert len(warnings) == 1 and "131072" in warnings[0]["message"]


async def test_fields_dropped_from_the_spec_are_removed_from_children(examples_tenant: Tenant) -> None:
    """Removing every toleration and the nodeSelector from a pool removes them from its Deployment: the children are
    server-side applied, and the API server drops what the operator's field manager applied before and no longer
    does (nodeSelector goes as a whole, not as `{}`)."""
    obj = examples_tenant.example("cpu-dev")
    obj["spec"]["pools"]["short"]["tolerations"] = [{"key": "team", "operator": "Exists", "effect": "NoSchedule"}]
    selector = {"kubernetes.io/os": "linux", **examples_tenant.label}
    obj["spec"]["pools"]["short"]["nodeSelector"] = selector
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    dep_name = names.pool(name, "short")
    async with running_operator(examples_tenant) as kube:
        await kube.create(VLLM_DEPLOYMENTS, ns, obj)
        current = await converge(kube, ns, name, 1)
        dep = await kube.get(DEPLOYMENTS, ns, dep_name)
        assert dep is not None
        pod_spec = dep["spec"]["template"]["spec"]
        assert pod_spec["tolerations"][0]["key"] == "team" and pod_spec["nodeSelector"] == selector
        revision = dep["metadata"]["annotations"].get("deployment.kubernetes.io/revision")

        await kube.patch(VLLM_DEPLOYMENTS, ns, name, {"spec": {"pools": {"short": {"tolerations": None,
                                                                                  "nodeSelector": None}}}})
        await converge(kube, ns, name, current["metadata"]["generation"] + 1)
        dep = await kube.get(DEPLOYMENTS, ns, dep_name)
        assert dep is not None
        pod_spec = dep["spec"]["template"]["spec"]
        assert "tolerations" not in pod_spec and "nodeSelector" not in pod_spec
        # fields the operator never set (the Deployment controller's) are left alone
        if revision is not None:
            assert "deployment.kubernetes.io/revision" in dep["metadata"]["annotations"]
