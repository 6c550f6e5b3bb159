"""Fixtures for controller tests: a simulated cluster with nodes for every example, and example objects."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml

from tests.support.paths import EXAMPLE_FILES
from vllm_operator.demo import nodes_for
from vllm_operator.k8s import Resource
from vllm_operator.sim.cluster import SimCluster

NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
EXAMPLES: dict[str, dict[str, Any]] = {p.stem: yaml.safe_load(p.read_text()) for p in EXAMPLE_FILES}


def example(name: str) -> dict[str, Any]:
    return copy.deepcopy(EXAMPLES[name])


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    async with SimCluster(nodes=nodes_for(list(EXAMPLES.values()))) as sim:
        assert sim.client is not None
        for ns in sorted({o["metadata"]["namespace"] for o in EXAMPLES.values()}):
            await sim.client.create(NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": ns}})
        yield sim
    assert sim.controller_errors == []
    assert sim.api.internal_errors == []
