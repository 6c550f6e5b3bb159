"""Real kubectl (from the venv) against the emulator: discovery, get, create -f, apply, patch, delete."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

from tests.support import toy_crd
from tests.support.cluster import KUBECTL, SimApi

pytestmark = pytest.mark.integration

CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"level": "1"}}


async def test_discovery_lists_core_named_and_custom_resources(sim_api: SimApi) -> None:
    sim_api.load_crd(toy_crd.toy_crd())
    _, out, _ = await sim_api.kubectl("api-resources", "--no-headers")
    rows = {line.split()[0]: line.split() for line in out.splitlines()}
    assert rows["pods"][-3:] == ["v1", "true", "Pod"]
    assert rows["namespaces"][-3:] == ["v1", "false", "Namespace"]
    assert rows["events"][-1] == "Event"
    assert rows["deployments"][-3:] == ["apps/v1", "true", "Deployment"]
    assert rows["widgets"] == ["widgets", "wdg", "toys.example.com/v1", "true", "Widget"]


async def test_create_get_patch_delete_a_custom_resource_by_short_name(sim_api: SimApi) -> None:
    sim_api.load_crd(toy_crd.toy_crd())
    await sim_api.kubectl("create", "--validate=false", "-f", "-", stdin=json.dumps(toy_crd.widget("w1")))
    _, out, _ = await sim_api.kubectl("get", "wdg", "-o", "name")
    assert out.split() == ["widget.toys.example.com/w1"]
    await sim_api.kubectl("patch", "wdg", "w1", "--type=merge", "-p", '{"spec":{"size":5}}')
    _, out, _ = await sim_api.kubectl("get", "widgets.toys.example.com", "w1", "-o", "jsonpath={.spec.size}")
    assert out == "5"
    code, _, err = await sim_api.kubectl(
        "patch", "wdg", "w1", "--type=merge", "-p", '{"spec":{"size":50}}', check=False
    )
    assert code != 0 and "spec.size in body should be less than or equal to 10" in err
    await sim_api.kubectl("delete", "wdg", "w1")
    _, out, _ = await sim_api.kubectl("get", "wdg", "-o", "name")
    assert out.strip() == ""


async def test_apply_creates_then_updates(sim_api: SimApi) -> None:
    _, out, _ = await sim_api.kubectl("apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump(CONFIGMAP))
    assert "configmap/settings created" in out
    changed = dict(CONFIGMAP, data={"level": "2"})
    _, out, _ = await sim_api.kubectl("apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump(changed))
    assert "configmap/settings configured" in out
    _, out, _ = await sim_api.kubectl("get", "configmap", "settings", "-o", "json")
    stored = json.loads(out)
    assert stored["data"] == {"level": "2"}
    assert "kubectl.kubernetes.io/last-applied-configuration" in stored["metadata"]["annotations"]
    patches = sim_api.request_log.filter(verb="patch", resource="configmaps", name="settings")
    assert [r.content_type for r in patches] == ["application/strategic-merge-patch+json"]
    assert "kubectl" in patches[0].user_agent


async def test_apply_of_a_custom_resource_uses_merge_patch(sim_api: SimApi) -> None:
    sim_api.load_crd(toy_crd.toy_crd())
    await sim_api.kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(toy_crd.widget("w", size=2)))
    await sim_api.kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(toy_crd.widget("w", size=4)))
    _, out, _ = await sim_api.kubectl("get", "wdg", "w", "-o", "jsonpath={.spec.size}")
    assert out == "4"
    patches = sim_api.request_log.filter(verb="patch", resource="widgets")
    assert [r.content_type for r in patches] == ["application/merge-patch+json"]


async def test_validate_false_sends_field_validation_ignore_and_unknown_fields_are_pruned(sim_api: SimApi) -> None:
    sim_api.load_crd(toy_crd.toy_crd())
    _, _, err = await sim_api.kubectl(
        "create", "--validate=false", "-f", "-", stdin=json.dumps(toy_crd.widget("w", bogus=1))
    )
    assert "bogus" not in err  # Ignore: pruned without a warning
    [create] = sim_api.request_log.filter(verb="create", resource="widgets")
    assert "fieldValidation=Ignore" in create.query
    _, out, _ = await sim_api.kubectl("get", "wdg", "w", "-o", "json")
    assert "bogus" not in json.loads(out)["spec"]


async def test_delete_of_a_missing_object_reports_not_found(sim_api: SimApi) -> None:
    code, _, err = await sim_api.kubectl("delete", "configmap", "nothing", check=False)
    assert code != 0 and 'configmaps "nothing" not found' in err


async def test_get_watch_prints_new_objects(sim_api: SimApi) -> None:
    sim_api.request("POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "first"}})
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL), "--kubeconfig", str(sim_api.kubeconfig), "get", "configmaps", "-w", "--no-headers",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        first = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert first.decode().split()[0] == "first"
        sim_api.request("POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "second"}})
        second = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert second.decode().split()[0] == "second"
    finally:
        proc.terminate()
        await proc.wait()
