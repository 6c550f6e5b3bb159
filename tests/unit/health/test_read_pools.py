"""read_pools: both pools' Deployments and PodDisruptionBudgets in two LISTs, however many pools are enabled."""

from __future__ import annotations

import asyncio
from typing import Any

from vllm_operator import constants
from vllm_operator.health.snapshot import PoolFacts
from vllm_operator.health.source import read_pools
from vllm_operator.k8s import DEPLOYMENTS, PDBS, Resource


class Listing:
    """The one verb read_pools may use, recorded."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]]) -> None:
        self.objects = objects
        self.calls: list[tuple[str, str | None, str | None]] = []

    async def list(self, res: Resource, namespace: str | None, label_selector: str | None = None
                   ) -> list[dict[str, Any]]:
        self.calls.append((res.plural, namespace, label_selector))
        return self.objects.get(res.plural, [])


def named(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


def test_two_lists_give_each_pool_its_replicas_and_disruption_budget() -> None:
    kube = Listing({
        DEPLOYMENTS.plural: [named("chat-short", {"replicas": 4}), named("chat-long", {"replicas": 1}),
                             named("chat-router", {"replicas": 2})],
        PDBS.plural: [named("chat-short", {"maxUnavailable": 2}), named("chat-long", {"maxUnavailable": "50%"})],
    })
    pools = asyncio.run(read_pools(kube, "ml", "chat", {"short": 2, "long": 1}))  # type: ignore[arg-type]
    assert pools == {"short": PoolFacts(name="short", desired_replicas=4, max_unavailable=2),
                     "long": PoolFacts(name="long", desired_replicas=1, max_unavailable=1)}
    selector = f"{constants.LABEL_NAME}={constants.APP_NAME},{constants.LABEL_DEPLOYMENT}=chat"
    assert sorted(kube.calls) == sorted([(DEPLOYMENTS.plural, "ml", selector), (PDBS.plural, "ml", selector)])


def test_a_pool_without_its_objects_falls_back_to_the_plan() -> None:
    kube = Listing({})
    pools = asyncio.run(read_pools(kube, "ml", "chat", {"short": 3}))  # type: ignore[arg-type]
    assert pools == {"short": PoolFacts(name="short", desired_replicas=3, max_unavailable=1)}
    assert len(kube.calls) == 2
