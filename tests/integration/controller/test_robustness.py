"""Convergence under operator restarts and API faults, and a no-op resync that writes nothing — on the real control
plane. The faults come from tests/support/apiproxy.py, a proxy between the operator and the real API server:
each fault kind (409 Conflict, 500, 503, a hang past the client's timeout, a dropped connection, and the last two
kinds after the write committed) strikes every third write of the operator's client, four times."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.integration.controller.conftest import Tenant, running_operator
from tests.integration.controller.test_lifecycle import children, cond, converge
from tests.support.apiproxy import ApiProxy, Fault, ProxiedRequest
from tests.support.waiting import eventually
from vllm_operator import constants
from vllm_operator.k8s import VLLM_DEPLOYMENTS, ClientKubeApi

EXPECTED_KINDS = Counter({"Deployment": 3, "Service": 3, "ConfigMap": 1, "ServiceAccount": 1, "Role": 1,
                          "RoleBinding": 1, "PodDisruptionBudget": 3, "NetworkPolicy": 1})
CLIENT_TIMEOUT = 2.0  # the operator's request timeout here; a hang lasts longer
WRITES = {"create", "update", "patch", "delete", "deletecollection"}


async def assert_converged(kube: ClientKubeApi, ns: str, name: str) -> None:
    obj = await converge(kube, ns, name, 1)
    kids = await children(kube, ns, name)
    counts = Counter(kind for kind, _ in kids)
    assert counts == EXPECTED_KINDS, f"duplicate or missing children: {counts}"
    uid = obj["metadata"]["uid"]
    for kid in kids.values():
        refs = kid["metadata"].get("ownerReferences", [])
        assert [r["uid"] for r in refs] == [uid], f"{kid['kind']} {kid['metadata']['name']} is orphaned or doubly owned"


# Eight stop points inside the first reconcile (each run is ~8 s on the real control plane; twenty took 159 s of the
# integration tier's time for stop points the first eight already spread over the 0-0.25 s window).
@pytest.mark.parametrize("seed", range(8), ids=[f"seed{s}" for s in range(8)])
async def test_restart_at_random_points_converges(examples_tenant: Tenant, seed: int) -> None:
    rng = random.Random(seed)
    obj = examples_tenant.example("long-doc")
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    async with running_operator(examples_tenant) as kube:
        await kube.create(VLLM_DEPLOYMENTS, ns, obj)
        await asyncio.sleep(rng.uniform(0.0, 0.25))  # stopped somewhere inside the first reconcile
    async with running_operator(examples_tenant) as kube:
        await assert_converged(kube, ns, name)


class EveryThirdWrite:
    """`fault` on every third write of the operator's own client (not kopf's), `limit` times in all."""

    def __init__(self, fault: Fault, limit: int = 4) -> None:
        self.fault = fault
        self.limit = limit
        self.seen = 0
        self.struck = 0

    def __call__(self, request: ProxiedRequest) -> Fault | None:
        if not request.is_write or not request.user_agent.startswith(f"{constants.APP_NAME}/"):
            return None
        self.seen += 1
        if self.seen % 3 or self.struck >= self.limit:
            return None
        self.struck += 1
        return self.fault


FAULTS = {
    "409": Fault(status=409),
    "500": Fault(status=500),
    "503": Fault(status=503),
    "hang": Fault(delay=CLIENT_TIMEOUT + 3),
    "drop": Fault(drop=True),
    "500-after-commit": Fault(status=500, after_commit=True),
    "hang-after-commit": Fault(delay=CLIENT_TIMEOUT + 3, after_commit=True),
}


@pytest.mark.parametrize("kind", sorted(FAULTS), ids=sorted(FAULTS))
async def test_api_faults_converge(examples_tenant: Tenant, tmp_path: Path, kind: str) -> None:
    tenant = examples_tenant
    hook = EveryThirdWrite(FAULTS[kind])
    obj = tenant.example("long-doc")
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    token = tenant.kube.kubectl("create", "token", tenant.account.name, "-n", tenant.account.namespace,
                                "--duration=1h").stdout.strip()
    with ApiProxy(tenant.kube, tmp_path / "proxy", faults=hook) as proxy:
        kubeconfig = proxy.kubeconfig(tmp_path / "proxied.kubeconfig", token, ns)
        async with running_operator(tenant, kubeconfig=kubeconfig, timeout=CLIENT_TIMEOUT) as kube:
            await kube.create(VLLM_DEPLOYMENTS, ns, obj)
            await assert_converged(kube, ns, name)
    assert hook.struck >= 2, f"the test must actually have injected faults ({hook.struck} of {hook.seen} writes)"
    assert [f for _, f in proxy.injected] == [FAULTS[kind]] * hook.struck


def received(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))


async def test_no_op_resync_makes_zero_writes(examples_tenant: Tenant) -> None:
    tenant = examples_tenant
    objs = [tenant.example("chat"), tenant.example("long-doc")]
    async with running_operator(tenant) as kube:
        for obj in objs:
            await kube.create(VLLM_DEPLOYMENTS, obj["metadata"]["namespace"], obj)
        for obj in objs:
            await converge(kube, obj["metadata"]["namespace"], obj["metadata"]["name"], 1)
        await asyncio.sleep(3.0)  # let trailing Deployment-status refreshes land (2 s coalescing)
    start = datetime.now(UTC)

    def operators() -> list[dict[str, Any]]:
        """The operator's requests (kopf's and its client's: one ServiceAccount) since the restart."""
        return [e for e in tenant.kube.audit_events() if e["user"]["username"] == tenant.account.user
                and received(e) >= start]

    async with running_operator(tenant) as kube:
        async def resynced() -> bool:
            return any(e["verb"] in ("list", "watch") and (e.get("objectRef") or {}).get("resource")
                       == constants.PLURAL for e in operators())

        await eventually(resynced)
        await asyncio.sleep(3.0)  # resume handlers and watch-driven refreshes have run
        for obj in objs:
            current = await kube.get(VLLM_DEPLOYMENTS, obj["metadata"]["namespace"], obj["metadata"]["name"])
            assert cond(current, constants.COND_READY)["status"] == "True"
    writes = [e for e in operators() if e["verb"] in WRITES]
    assert writes == [], [f"{e['verb']} {e['requestURI']} ({e.get('userAgent')})" for e in writes]
