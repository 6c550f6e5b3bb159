"""The adapters ConfigMap and the engine pods' LoRA mounts, from real plans of cpu-dev.yaml with adapters (#24)."""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml

from tests.support.paths import EXAMPLES
from vllm_operator import constants, names
from vllm_operator.api.resource import parse_spec
from vllm_operator.planning import RemediationState, plan
from vllm_operator.rendering import render
from vllm_operator.rendering.adapters import lora_enabled

CPU_DEV = yaml.safe_load((EXAMPLES / "cpu-dev.yaml").read_text())["spec"]


def rendered(adapters: list[dict[str, Any]] | None, **extra: Any) -> dict[tuple[str, str], dict[str, Any]]:
    data = copy.deepcopy(CPU_DEV)
    if adapters is not None:
        data["adapters"] = adapters
    data.update(extra)
    spec = parse_spec(data)
    objs = render(plan(spec, None, RemediationState(pools={}), name="cpu-dev", namespace="dev"))
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def pvc(name: str, claim: str = "models") -> dict[str, Any]:
    return {"name": name, "source": {"pvc": {"claimName": claim, "path": f"lora/{name}"}}}


def hub(name: str) -> dict[str, Any]:
    return {"name": name, "source": {"huggingFace": {"repo": f"org/{name}", "revision": "v1"}}}


def engine_pod(objs: dict[tuple[str, str], dict[str, Any]], pool: str) -> dict[str, Any]:
    spec: dict[str, Any] = objs[("Deployment", names.pool("cpu-dev", pool))]["spec"]["template"]["spec"]
    return spec


def test_no_adapters_no_configmap_and_no_lora_mounts() -> None:
    objs = rendered(None)
    assert ("ConfigMap", names.adapters("cpu-dev")) not in objs
    pod = engine_pod(objs, "short")
    assert [v["name"] for v in pod["volumes"]] == ["dshm", "models"]
    assert pod["containers"][0]["command"][:3] == ["vllm-operator", "engine", "--"]


def test_configmap_lists_each_pools_adapters_with_container_paths() -> None:
    objs = rendered([pvc("a"), hub("b"), {**pvc("c", "other"), "pools": ["long"]}])
    data = objs[("ConfigMap", names.adapters("cpu-dev"))]["data"]
    assert json.loads(data["short.json"]) == {"adapters": [
        {"name": "a", "path": "/adapters/models/lora/a"}, {"name": "b", "hfRepo": "org/b", "hfRevision": "v1"}]}
    assert [a["name"] for a in json.loads(data["long.json"])["adapters"]] == ["a", "b", "c"]
    long_pod = engine_pod(objs, "long")
    container = long_pod["containers"][0]
    assert container["command"][:5] == ["vllm-operator", "engine",
                                        f"--adapters-file={constants.ADAPTERS_MOUNT}/long.json",
                                        f"--adapters-hub-cache={constants.ADAPTERS_HUB_CACHE}", "--"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[constants.ADAPTERS_MOUNT]["readOnly"] and "subPath" not in mounts[constants.ADAPTERS_MOUNT]
    assert {"/adapters/models", "/adapters/other"} <= set(mounts)
    volumes = {v["name"]: v for v in long_pod["volumes"]}
    assert volumes["adapters"] == {"name": "adapters", "configMap": {"name": names.adapters("cpu-dev")}}
    assert volumes["adapter-other"]["persistentVolumeClaim"] == {"claimName": "other", "readOnly": True}
    assert volumes["adapter-hub"] == {"name": "adapter-hub", "emptyDir": {}}  # /models may be a read-only PVC
    assert "readOnly" not in mounts[constants.ADAPTERS_HUB_CACHE]
    assert "adapter-other" not in {v["name"] for v in engine_pod(objs, "short")["volumes"]}


def test_adding_or_removing_an_adapter_changes_the_configmap_and_router_not_the_engines() -> None:
    one = rendered([pvc("a")])
    two = rendered([pvc("a"), pvc("b"), hub("c")])
    none_kept = rendered([], lora={"enabled": True})
    for pool in constants.POOLS:
        key = ("Deployment", names.pool("cpu-dev", pool))
        assert one[key] == two[key], f"the {pool} engines would roll"
        # spec.lora.enabled keeps the capacity when the list empties (the claim's volume goes with its last adapter)
        kept, was = none_kept[key]["spec"]["template"]["spec"], one[key]["spec"]["template"]["spec"]
        assert kept["containers"][0]["args"] == was["containers"][0]["args"]
        assert kept["containers"][0]["command"] == was["containers"][0]["command"]
    cm = ("ConfigMap", names.adapters("cpu-dev"))
    assert one[cm] != two[cm]
    router = ("ConfigMap", names.router("cpu-dev"))
    assert json.loads(two[router]["data"][constants.ROUTER_CONFIG_KEY])["adapters"] == {
        "a": ["short", "long"], "b": ["short", "long"], "c": ["short", "long"]}


def test_an_adapter_on_a_new_claim_is_a_new_volume() -> None:
    one, two = rendered([pvc("a")]), rendered([pvc("a"), pvc("b", "fresh")])
    key = ("Deployment", names.pool("cpu-dev", "short"))
    assert one[key] != two[key]  # documented: a claim not mounted yet rolls the engines


def test_lora_is_read_from_the_plan_not_parsed_back_out_of_argv() -> None:
    """Issue 39's "plan once": the renderer asks the plan whether a pool has adapter slots; an engine argument list
    without --enable-lora (or with it, on a pool the plan gave none) changes nothing."""
    spec = parse_spec({**copy.deepcopy(CPU_DEV), "adapters": [pvc("a")]})
    pool = plan(spec, None, RemediationState(pools={}), name="cpu-dev", namespace="dev").pools["short"]
    assert pool.lora_slots > 0 and "--enable-lora" in pool.engine_args
    assert lora_enabled(pool.model_copy(update={"engine_args": [
        a for a in pool.engine_args if a != "--enable-lora"]}))
    assert not lora_enabled(pool.model_copy(update={"lora_slots": 0}))
