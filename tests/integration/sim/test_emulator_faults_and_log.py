"""Fault injection, the request log, discovery details, and the standalone process with its kubeconfig."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import aiohttp
import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

from tests.support.cluster import KUBECTL, SimApi
from tests.support.paths import ROOT
from vllm_operator.sim.faults import Fault, RandomFaults
from vllm_operator.sim.requestlog import RequestRecord

pytestmark = pytest.mark.integration


def core_api(sim: SimApi) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(sim.client_configuration()))


def test_scripted_fault_hook_answers_before_the_write(make_sim_api: object) -> None:
    calls: list[str] = []

    def hook(record: RequestRecord) -> Fault | None:
        if record.verb == "patch" and record.resource == "configmaps":
            calls.append(record.name)
            return Fault(status=500) if len(calls) == 1 else None
        return None

    sim = make_sim_api(faults=hook)  # type: ignore[operator]
    core = core_api(sim)
    core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map("cm", "default", {"data": {"a": "2"}})
    assert err.value.status == 500 and json.loads(err.value.body)["reason"] == "InternalError"
    assert core.read_namespaced_config_map("cm", "default").data == {"a": "1"}  # not applied
    core.patch_namespaced_config_map("cm", "default", {"data": {"a": "2"}})
    assert core.read_namespaced_config_map("cm", "default").data == {"a": "2"}
    [faulted] = [r for r in sim.request_log if r.fault]
    assert (faulted.fault, faulted.status) == ("status=500", 500)


def test_after_commit_fault_loses_the_response_but_keeps_the_write(make_sim_api: object) -> None:
    def hook(record: RequestRecord) -> Fault | None:
        return Fault(status=504, after_commit=True) if record.verb == "create" else None

    sim = make_sim_api(faults=hook)  # type: ignore[operator]
    core = core_api(sim)
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}})
    assert err.value.status == 504
    assert core.read_namespaced_config_map("cm", "default").metadata.uid  # it was created nonetheless


def test_injected_delay_times_out_the_client(make_sim_api: object) -> None:
    sim = make_sim_api(faults=lambda r: Fault(delay=2.0) if r.verb == "get" else None)  # type: ignore[operator]
    core = core_api(sim)
    core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}})
    started = time.monotonic()
    with pytest.raises(Exception, match=r"(?i)timed? ?out"):
        core.read_namespaced_config_map("cm", "default", _request_timeout=0.3)
    assert time.monotonic() - started < 1.9  # gave up before the 2 s the server hung


def test_random_faults_hit_about_the_requested_fraction_of_writes(make_sim_api: object) -> None:
    faults = RandomFaults(0.1, seed=7, faults=[Fault(status=409), Fault(status=500)])
    sim = make_sim_api(faults=faults)  # type: ignore[operator]
    core = core_api(sim)
    failures = 0
    for i in range(200):
        try:
            core.create_namespaced_config_map("default", {"metadata": {"name": f"cm-{i}"}})
        except ApiException as exc:
            assert exc.status in (409, 500)
            failures += 1
    assert failures == len(faults.injected)
    assert 8 <= failures <= 35  # 10 % of 200 with a fixed seed, loose bounds
    core.list_namespaced_config_map("default")  # reads are not faulted by default
    with pytest.raises(ValueError, match=r"within \[0, 1\]"):
        RandomFaults(1.5)


def test_request_log_records_rbac_verbs_resources_and_user_agents(sim_api: SimApi) -> None:
    core = core_api(sim_api)
    mark = sim_api.request_log.next_seq
    core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}})
    core.read_namespaced_config_map("cm", "default")
    core.list_namespaced_config_map("default", label_selector="a=b")
    core.patch_namespaced_config_map("cm", "default", {"data": {"x": "y"}})
    core.delete_namespaced_config_map("cm", "default")
    core.delete_collection_namespaced_config_map("default")
    core.read_namespace_status("default")
    records = sim_api.request_log.since(mark)
    assert [(r.verb, r.resource, r.subresource, r.namespace) for r in records] == [
        ("create", "configmaps", "", "default"),
        ("get", "configmaps", "", "default"),
        ("list", "configmaps", "", "default"),
        ("patch", "configmaps", "", "default"),
        ("delete", "configmaps", "", "default"),
        ("deletecollection", "configmaps", "", "default"),
        ("get", "namespaces", "status", "default"),
    ]
    assert all("OpenAPI-Generator" in r.user_agent for r in records)
    assert [r.status for r in records] == [201, 200, 200, 200, 200, 200, 200]
    assert len(sim_api.request_log.writes(resource="configmaps")) == 4


def test_discovery_documents(sim_api: SimApi) -> None:
    core_list = sim_api.request("GET", "/api/v1")
    assert core_list["groupVersion"] == "v1"
    names = {r["name"] for r in core_list["resources"]}
    assert {"namespaces", "events", "pods", "pods/status", "configmaps"} <= names
    groups = {g["name"]: g for g in sim_api.request("GET", "/apis")["groups"]}
    assert groups["apps"]["preferredVersion"] == {"groupVersion": "apps/v1", "version": "v1"}
    assert "gateway.networking.k8s.io" not in groups  # not built in
    assert sim_api.request("GET", "/apis/apps")["kind"] == "APIGroup"
    assert sim_api.request("GET", "/version")["major"] == "1"
    assert sim_api.request("GET", "/version/")["major"] == "1"


async def test_standalone_process_writes_a_kubeconfig_kubectl_can_use(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "vllm_operator.sim.apiserver",
        "--port",
        "0",
        "--kubeconfig",
        str(kubeconfig),
        "--crd",
        str(ROOT / "crds" / "vllm-operator.dev_vllmdeployments.yaml"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ},
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert "listening on http://127.0.0.1:" in line
        kubectl = await asyncio.create_subprocess_exec(
            str(KUBECTL),
            "--kubeconfig",
            str(kubeconfig),
            "get",
            "crd",
            "-o",
            "name",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await kubectl.communicate()
        assert kubectl.returncode == 0, err.decode()
        crd_name = "customresourcedefinition.apiextensions.k8s.io/vllmdeployments.vllm-operator.dev"
        assert out.decode().split() == [crd_name]
        url = line.rsplit(" ", 1)[1].strip()
        async with aiohttp.ClientSession() as session, session.get(f"{url}/_sim/requests") as resp:
            log = await resp.json()
        assert any(r["verb"] == "list" and r["resource"] == "customresourcedefinitions" for r in log["records"])
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 30) == 0


def test_kmock_dsl_reactions_still_override_responses(sim_api: SimApi) -> None:
    core = core_api(sim_api)
    core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}})
    sim_api.api["get /api/v1/namespaces/default/configmaps/cm"] << 503  # kmock's own scripting DSL
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("cm", "default")
    assert err.value.status == 503
    assert [c.metadata.name for c in core.list_namespaced_config_map("default").items] == ["cm"]  # others served


def test_fault_statuses_carry_the_real_reasons(make_sim_api: object) -> None:
    def deny(record: RequestRecord) -> Fault | None:
        if record.verb == "list":
            return Fault(status=403, message='configmaps is forbidden: User "x" cannot list resource "configmaps"')
        return Fault(status=429, retry_after=1) if record.verb == "create" else None

    sim = make_sim_api(faults=deny)  # type: ignore[operator]
    core = core_api(sim)
    with pytest.raises(ApiException) as err:
        core.list_namespaced_config_map("default")
    body = json.loads(err.value.body)
    assert (err.value.status, body["reason"], body["message"]) == (
        403,
        "Forbidden",
        'configmaps is forbidden: User "x" cannot list resource "configmaps"',
    )
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}})
    assert (err.value.status, json.loads(err.value.body)["reason"]) == (429, "TooManyRequests")
    assert err.value.headers["Retry-After"] == "1"


def test_a_hung_request_the_client_abandoned_is_not_applied(make_sim_api: object) -> None:
    sim = make_sim_api(faults=lambda r: Fault(delay=0.8) if r.verb == "create" else None)  # type: ignore[operator]
    core = core_api(sim)
    with pytest.raises(Exception, match=r"(?i)timed? ?out"):
        core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}}, _request_timeout=0.2)
    deadline = time.monotonic() + 10
    while [r.status for r in sim.request_log.filter(verb="create")] != [504]:  # the hang ends, then the drop
        assert time.monotonic() < deadline, "the abandoned request was not dropped"
        time.sleep(0.05)
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("cm", "default")
    assert err.value.status == 404
