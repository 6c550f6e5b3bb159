"""What a new user hits first (issue 21), with the real operator on the simulated cluster: a refused spec is a
Warning and a condition (not an operator ERROR) and shows in `kubectl get -o wide`; `accelerator.type: auto` keeps
its explanation through status refreshes and refuses time-sliced GPUs with the reason."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml

from tests.integration.controller.conftest import NAMESPACES, example
from tests.support.cluster import KUBECTL
from tests.support.operator import running_operator
from tests.support.paths import CRD_FILE
from tests.support.waiting import eventually
from vllm_operator import constants
from vllm_operator.k8s import EVENTS, VLLM_DEPLOYMENTS, ClientKubeApi
from vllm_operator.sim.cluster import SimCluster, gpu_node

L4 = {"product": "NVIDIA-L4", "memory_mib": 23034, "compute": (8, 9)}
H100 = {"product": "NVIDIA-H100-80GB-HBM3", "memory_mib": 81559, "compute": (9, 0)}


def cond(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in (obj or {}).get("status", {}).get("conditions", []) or []:
        if c["type"] == type_:
            return dict(c)
    return {}


async def gpu_cluster(*nodes: dict[str, Any]) -> AsyncIterator[SimCluster]:
    async with SimCluster(nodes=nodes) as sim:
        assert sim.client is not None
        await sim.client.create(NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": "ml"}})
        yield sim
    assert sim.controller_errors == []
    assert sim.api.internal_errors == []


@pytest.fixture
async def mixed() -> AsyncIterator[SimCluster]:
    async for sim in gpu_cluster(gpu_node("l4-0", gpus=4, **L4), gpu_node("h100-0", gpus=4, **H100)):  # type: ignore[arg-type]
        yield sim


@pytest.fixture
async def time_sliced() -> AsyncIterator[SimCluster]:
    shared = {**L4, "product": "NVIDIA-L4-SHARED"}
    async for sim in gpu_cluster(gpu_node("l4-shared-0", gpus=16, labels={constants.GFD_REPLICAS: "4"},  # type: ignore[arg-type]
                                          **shared)):
        yield sim


async def printer_columns(sim: SimCluster, ns: str, name: str) -> dict[str, str]:
    """The CRD's printer columns (priority 1 included, as `-o wide` shows them) evaluated by the real kubectl's
    JSONPath (the emulator serves no Table, so kubectl's custom-columns reads the same paths)."""
    import asyncio

    crd = yaml.safe_load(CRD_FILE.read_text())
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    spec = ",".join(f"{c['name'].upper()}:{c['jsonPath']}" for c in columns)
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL), "--kubeconfig", str(sim.kubeconfig), "get", "vllmd", "-n", ns, name, "-o",
        f"custom-columns={spec}", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    head, row = out.decode().splitlines()
    return dict(zip(head.split(), row.split(), strict=True))


async def spec_valid_false(kube: ClientKubeApi, ns: str, name: str) -> dict[str, Any] | None:
    obj = await kube.get(VLLM_DEPLOYMENTS, ns, name)
    return obj if cond(obj, constants.COND_SPEC_VALID).get("status") == "False" else None


async def test_a_refused_spec_is_a_warning_and_a_column_not_an_operator_error(
        mixed: SimCluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    obj = example("chat")
    obj["spec"]["pools"]["long"]["maxModelLen"] = 131072
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    async with running_operator(mixed) as kube:
        await kube.create(VLLM_DEPLOYMENTS, ns, obj)
        current = await eventually(lambda: spec_valid_false(kube, ns, name), timeout=30)
        message = cond(current, constants.COND_SPEC_VALID)["message"]
        assert "what fits: maxModelLen 26352 (52720 with kvCacheDtype fp8), or accelerator.count 2" in message
        events = [e for e in await kube.list(EVENTS, ns) if e["involvedObject"]["name"] == name]
        assert [e["reason"] for e in events if e["type"] == "Warning"] == ["SpecInvalid"]
        assert not [e for e in events if e["type"] == "Error"], events
        columns = await printer_columns(mixed, ns, name)
    assert columns["SPEC"] == "SpecInvalid" and columns["MODEL"] == "meta-llama/Llama-3.1-8B-Instruct"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert not any("failed permanently" in r.getMessage() for r in caplog.records)
    assert any(r.levelno == logging.WARNING and r.getMessage().startswith(f"Refused VLLMDeployment {ns}/{name}")
               for r in caplog.records)


async def test_auto_keeps_its_explanation_through_status_refreshes(mixed: SimCluster) -> None:
    obj = example("chat")
    obj["spec"]["accelerator"] = {"type": "auto"}
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    note = "accelerator auto matched nvidia-h100-80gb, nvidia-l4-24gb; planned for nvidia-l4-24gb, the smallest"

    async def ready() -> dict[str, Any] | None:
        current = await kube.get(VLLM_DEPLOYMENTS, ns, name)
        return current if cond(current, constants.COND_READY).get("status") == "True" else None

    async with running_operator(mixed) as kube:
        await kube.create(VLLM_DEPLOYMENTS, ns, obj)
        # Ready=True is written by a status refresh (pods become ready after the reconcile), which dropped the note.
        current = await eventually(ready, timeout=60)
        assert note in current["status"]["plan"]["warnings"]
        columns = await printer_columns(mixed, ns, name)
    assert columns["SPEC"] == "Planned" and columns["ACCELERATOR"] == "nvidia-l4-24gb"


async def test_auto_refuses_time_sliced_gpus_with_the_reason(time_sliced: SimCluster) -> None:
    obj = example("chat")
    obj["spec"]["accelerator"] = {"type": "auto"}
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    async with running_operator(time_sliced) as kube:
        await kube.create(VLLM_DEPLOYMENTS, ns, obj)
        current = await eventually(lambda: spec_valid_false(kube, ns, name), timeout=30)
    assert cond(current, constants.COND_SPEC_VALID)["message"] == (
        "spec.accelerator.type: auto: the GPU node(s) are time-sliced: l4-shared-0 (nvidia.com/gpu.product="
        "NVIDIA-L4-SHARED, nvidia.com/gpu.replicas=4); pods there share one card's memory and a pod planned for the "
        "whole card runs the next one out of memory; the operator does not plan for shared GPUs: use nodes without "
        "time-slicing")
