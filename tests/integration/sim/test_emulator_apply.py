"""Server-side apply (approximated): create, merge, removal of dropped fields, conflicts between managers, force."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.support.cluster import SimApi
from vllm_operator.sim.runner import SimApiError

pytestmark = pytest.mark.integration
APPLY = "application/apply-patch+yaml"
CM = "/api/v1/namespaces/default/configmaps/settings"


def apply(sim: SimApi, body: dict[str, Any], manager: str, force: bool = False) -> Any:
    query = f"?fieldManager={manager}" + ("&force=true" if force else "")
    return sim.request("PATCH", CM + query, body, content_type=APPLY)


def config(**data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": data}


def test_apply_creates_merges_and_removes_what_the_manager_dropped(sim_api: SimApi) -> None:
    created = apply(sim_api, config(a="1", b="2"), "alice")
    assert created["data"] == {"a": "1", "b": "2"} and created["metadata"]["uid"]
    apply(sim_api, config(c="3"), "bob")
    after = apply(sim_api, config(a="1"), "alice")  # alice no longer applies b
    assert after["data"] == {"a": "1", "c": "3"}


def test_conflicting_managers_get_409_unless_forced(sim_api: SimApi) -> None:
    apply(sim_api, config(level="1"), "alice")
    with pytest.raises(SimApiError) as err:
        apply(sim_api, config(level="2"), "bob")
    body = json.loads(err.value.body)
    assert err.value.status == 409 and body["reason"] == "Conflict"
    assert body["message"] == 'Apply failed with 1 conflict: conflict with "alice": .data.level'
    assert body["details"]["causes"] == [{"reason": "FieldManagerConflict", "message": 'conflict with "alice"',
                                          "field": ".data.level"}]
    assert apply(sim_api, config(level="2"), "bob", force=True)["data"] == {"level": "2"}
    apply(sim_api, config(), "alice")  # alice lost the field to bob: dropping it removes nothing
    assert sim_api.request("GET", CM)["data"] == {"level": "2"}


def test_apply_requires_a_field_manager(sim_api: SimApi) -> None:
    with pytest.raises(SimApiError) as err:
        sim_api.request("PATCH", CM, config(a="1"), content_type=APPLY)
    assert err.value.status == 422 and "fieldManager" in err.value.body


async def test_kubectl_server_side_apply(sim_api: SimApi) -> None:
    manifest = yaml.safe_dump(config(a="1"))
    _, out, _ = await sim_api.kubectl("apply", "--server-side", "--validate=false", "-f", "-", stdin=manifest)
    assert "serverside-applied" in out
    await sim_api.kubectl("apply", "--server-side", "--validate=false", "-f", "-",
                          stdin=yaml.safe_dump(config(b="2")))
    assert sim_api.request("GET", CM)["data"] == {"b": "2"}
    [first, *_] = sim_api.request_log.filter(verb="patch", resource="configmaps")
    assert first.content_type == APPLY and first.field_manager == "kubectl"
