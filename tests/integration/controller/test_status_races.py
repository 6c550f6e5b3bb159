"""Status writers race (the reconcile, the Deployment-watch refresh, the health loop); the last word must be true.

A slow API server — the answers to the operator's server-side apply of Deployments held 2 s after the write
committed (tests/support/apiproxy.py in front of the real API server) — lets the real controllers and kwok make
pods ready while the reconcile is still writing children. Before the fix, the reconcile then wrote the stale
"0 ready" status last and Ready=False stuck although every Deployment was ready.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.controller.conftest import Tenant, running_operator
from tests.support.apiproxy import ApiProxy, Fault, ProxiedRequest
from tests.support.waiting import eventually
from vllm_operator import constants
from vllm_operator.k8s import DEPLOYMENTS, VLLM_DEPLOYMENTS


def slow_deployment_applies(request: ProxiedRequest) -> Fault | None:
    """The operator creates (and updates) children by apply PATCH, so the slow "create" is that PATCH."""
    if (request.method == "PATCH" and request.plural == "deployments" and not request.subresource
            and "fieldManager" in request.query and request.user_agent.startswith(f"{constants.APP_NAME}/")):
        return Fault(delay=2.0, after_commit=True)
    return None


async def test_ready_is_not_lost_when_pods_get_ready_during_the_reconcile(examples_tenant: Tenant,
                                                                         tmp_path: Path) -> None:
    tenant = examples_tenant
    obj = tenant.example("chat")
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    token = tenant.kube.kubectl("create", "token", tenant.account.name, "-n", tenant.account.namespace,
                                "--duration=1h").stdout.strip()
    with ApiProxy(tenant.kube, tmp_path / "proxy", faults=slow_deployment_applies) as proxy:
        kubeconfig = proxy.kubeconfig(tmp_path / "proxied.kubeconfig", token, ns)
        async with running_operator(tenant, kubeconfig=kubeconfig) as kube:
            await kube.create(VLLM_DEPLOYMENTS, ns, obj)

            async def all_ready() -> bool:
                deps = await kube.list(DEPLOYMENTS, ns, f"{constants.LABEL_DEPLOYMENT}={name}")
                return len(deps) == 3 and all(d.get("status", {}).get("readyReplicas") == d["spec"]["replicas"]
                                              for d in deps)

            await eventually(all_ready, timeout=60)

            async def ready_condition() -> dict[str, Any] | None:
                current = await kube.get(VLLM_DEPLOYMENTS, ns, name) or {}
                conds = {c["type"]: c for c in current.get("status", {}).get("conditions", [])}
                reconciled = current.get("status", {}).get("observedGeneration") == current["metadata"]["generation"]
                return current if reconciled and conds.get(constants.COND_READY, {}).get("status") == "True" else None

            current = await eventually(ready_condition, timeout=30)
            assert current["status"]["ready"] == "3/3"  # engine pods: 2 short + 1 long
    assert len(proxy.injected) >= 3, "every Deployment apply was slowed"
