"""What a new user hits first (issue 21), with the real operator on the real control plane: a refused spec is a
Warning and a condition (not an operator ERROR) and shows in `kubectl get -o wide`; `accelerator.type: auto` keeps
its explanation through status refreshes and refuses time-sliced GPUs with the reason."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import yaml

from tests.integration.controller.conftest import NODE_LABEL, Tenant, gpu_node, running_operator
from tests.support.paths import CRD_FILE
from tests.support.waiting import eventually
from vllm_operator import constants
from vllm_operator.k8s import EVENTS, VLLM_DEPLOYMENTS, ClientKubeApi


def cond(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in (obj or {}).get("status", {}).get("conditions", []) or []:
        if c["type"] == type_:
            return dict(c)
    return {}


@pytest.fixture
def mixed(tenant: Tenant) -> Tenant:
    """An L4 node and an H100 node (four GPUs each), with the tenant's label."""
    tenant.add_nodes(gpu_node(f"{tenant.namespace}-l4", "nvidia-l4-24gb", tenant.label, gpus=4),
                     gpu_node(f"{tenant.namespace}-h100", "nvidia-h100-80gb", tenant.label, gpus=4))
    return tenant


@pytest.fixture
def time_sliced(tenant: Tenant) -> Tenant:
    """One L4 node whose GPUs GPU feature discovery reports time-sliced four ways."""
    tenant.add_nodes(gpu_node(f"{tenant.namespace}-l4-shared", "nvidia-l4-24gb", tenant.label, gpus=16,
                              extra={constants.GFD_REPLICAS: "4"}, product="NVIDIA-L4-SHARED"))
    return tenant


def printer_columns(tenant: Tenant, name: str) -> dict[str, str]:
    """`kubectl get vllmd -o wide` as the real kubectl prints the Table the API server builds from the CRD's printer
    columns (priority 1 included), cut into cells at the header's column starts."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    names = ["NAME", *(c["name"].upper() for c in crd["spec"]["versions"][0]["additionalPrinterColumns"])]
    out = tenant.kube.kubectl("get", "vllmd", "-n", tenant.namespace, name, "-o", "wide").stdout
    head, row = out.splitlines()
    assert head.split() == names, head
    starts: list[int] = []
    for column in names:
        starts.append(head.index(column, starts[-1] + 1 if starts else 0))
    cells = [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    return dict(zip(names, cells, strict=True))


async def spec_valid_false(kube: ClientKubeApi, ns: str, name: str) -> dict[str, Any] | None:
    obj = await kube.get(VLLM_DEPLOYMENTS, ns, name)
    return obj if cond(obj, constants.COND_SPEC_VALID).get("status") == "False" else None


async def test_a_refused_spec_is_a_warning_and_a_column_not_an_operator_error(
        mixed: Tenant, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    obj = mixed.example("chat")
    obj["spec"]["pools"]["long"]["maxModelLen"] = 131072
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    async with running_operator(mixed) as kube:
        await kube.create(VLLM_DEPLOYMENTS, ns, obj)
        current = await eventually(lambda: spec_valid_false(kube, ns, name), timeout=30)
        message = cond(current, constants.COND_SPEC_VALID)["message"]
        assert "what fits: maxModelLen 27696 (55408 with kvCacheDtype fp8), or accelerator.count 2" in message
        events = [e for e in await kube.list(EVENTS, ns) if e["involvedObject"]["name"] == name]
        assert [e["reason"] for e in events if e["type"] == "Warning"] == ["SpecInvalid"]
        assert not [e for e in events if e["type"] == "Error"], events
        columns = await asyncio.to_thread(printer_columns, mixed, name)
    assert columns["SPEC"] == "SpecInvalid" and columns["MODEL"] == "meta-llama/Llama-3.1-8B-Instruct"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert not any("failed permanently" in r.getMessage() for r in caplog.records)
    assert any(r.levelno == logging.WARNING and r.getMessage().startswith(f"Refused VLLMDeployment {ns}/{name}")
               for r in caplog.records)


async def test_auto_keeps_its_explanation_through_status_refreshes(mixed: Tenant) -> None:
    obj = mixed.example("chat")
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
        columns = await asyncio.to_thread(printer_columns, mixed, name)
    assert columns["SPEC"] == "Planned" and columns["ACCELERATOR"] == "nvidia-l4-24gb"


async def test_auto_refuses_time_sliced_gpus_with_the_reason(time_sliced: Tenant) -> None:
    obj = time_sliced.example("chat")
    obj["spec"]["accelerator"] = {"type": "auto"}
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    async with running_operator(time_sliced) as kube:
        await kube.create(VLLM_DEPLOYMENTS, ns, obj)
        current = await eventually(lambda: spec_valid_false(kube, ns, name), timeout=30)
    # The pools select the tenant's nodes (the cluster is shared), so the message names that selector.
    assert cond(current, constants.COND_SPEC_VALID)["message"] == (
        f"spec.accelerator.type: auto: the GPU node(s) matching nodeSelector {NODE_LABEL}={ns} are time-sliced: "
        f"{ns}-l4-shared (nvidia.com/gpu.product="
        "NVIDIA-L4-SHARED, nvidia.com/gpu.replicas=4); pods there share one card's memory and a pod planned for the "
        "whole card runs the next one out of memory; the operator does not plan for shared GPUs: use nodes without "
        "time-slicing")
