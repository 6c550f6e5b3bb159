"""LoRA adapters end to end on real vLLM (CPU) through the real router, with the official `openai` client (#24).

cpu-dev.yaml plus one adapter made with peft for the tiny model (on the `models` PVC): both pools start with
`--enable-lora`, the engine wrapper loads the adapter from the adapters ConfigMap through vLLM's runtime endpoint, and
the router answers `/v1/models` with the base model and the adapter and routes `model: <adapter>` like the base model.
Then an adapter is added and the first one removed by editing the VLLMDeployment: the operator rewrites the adapters
ConfigMap, the wrappers load and unload in the running engines — same pods, restart counts unchanged — and the
removed adapter is gone from `/v1/models` (router and engines) and answered 404 model_not_found.

The engines run on real nodes (tests/support/e2e_stack.py): the kubelet refreshes the mounted adapters ConfigMap's
files itself when the ConfigMap changes (its `..data` swap, on the pod's next sync: testcluster.node sets the
kubelet's syncFrequency to 15 s), which the process node never did and a helper here used to imitate.
"""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support import vllm_cpu
from tests.support.e2e_stack import (
    EXAMPLE,
    NAME,
    NS,
    Stack,
    engine_url,
    http_status,
    model_name,
    running_stack,
    the_plan,
)
from vllm_operator import constants, names
from vllm_operator.api.resource import parse_spec
from vllm_operator.k8s import CONFIGMAPS, VLLM_DEPLOYMENTS
from vllm_operator.planning import RemediationState, plan

pytestmark = pytest.mark.e2e

PVC_DIR = "lora"
"""Where the adapters live on the `models` PVC (beside the model directory)."""
FIRST, SECOND = "sql-lora", "chat-lora"
CHANGE_TIMEOUT_S = 180.0
"""Spec edit -> ConfigMap -> wrapper load/unload (2 s passes) -> router rolled and Ready; the router roll dominates
(a new pod, its EndpointSlice watch and health checks) on a busy 2-core machine."""


def adapter(name: str) -> dict[str, Any]:
    return {"name": name, "source": {"pvc": {"claimName": "models", "path": f"{PVC_DIR}/{name}"}}, "maxRank": 8}


def example() -> dict[str, Any]:
    obj = copy.deepcopy(EXAMPLE)
    obj["spec"]["adapters"] = [adapter(FIRST)]
    return obj


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Stack]:
    for seed, name in enumerate((FIRST, SECOND), start=1):
        vllm_cpu.make_adapter(tiny_model_dir, tiny_model_dir.parent / PVC_DIR / name, rank=8, seed=seed)
    with running_stack(tmp_path_factory.mktemp("lora"), tiny_model_dir, example()) as s:
        yield s


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.router_url() + "/v1", api_key="unused", max_retries=0, timeout=120)


def complete(stack: Stack, model: str) -> str:
    out = client(stack).completions.create(model=model, prompt="the model of", max_tokens=6, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert out.model == model
    return out.choices[0].text


def router_models(stack: Stack) -> list[str]:
    return sorted(m.id for m in client(stack).models.list().data)


def engine_models(stack: Stack, pool: str) -> list[str]:
    with urllib.request.urlopen(engine_url(stack, pool) + "/v1/models", timeout=10) as resp:
        return sorted(m["id"] for m in json.loads(resp.read())["data"])


def engines(stack: Stack) -> dict[str, tuple[str, int]]:
    """Per pool: the engine pod's name and its container's restart count."""
    out = {}
    for pool in constants.POOLS:
        pods = stack.pods(pool)
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        out[pool] = (pods[0]["metadata"]["name"], stack.container(pods[0]["metadata"]["name"]).restart_count)
    return out


def status_adapters(stack: Stack) -> dict[str, list[tuple[str, int]]]:
    """status.pools.<pool>.adapters as (name, loadedReplicas), written by the health loop from the wrappers'
    metrics in Prometheus."""
    pools = (stack.obj().get("status") or {}).get("pools") or {}
    return {p: [(a["name"], a["loadedReplicas"]) for a in (pools.get(p) or {}).get("adapters") or []]
            for p in constants.POOLS}


def set_adapters(stack: Stack, adapters: list[dict[str, Any]]) -> None:
    stack.call(lambda k: k.patch(VLLM_DEPLOYMENTS, NS, NAME, {"spec": {"adapters": adapters}}))

    def configmap_lists() -> bool:
        cm = stack.call(lambda k: k.get(CONFIGMAPS, NS, names.adapters(NAME)))
        listed = [[a["name"] for a in json.loads(v)["adapters"]] for v in (cm or {}).get("data", {}).values()]
        return listed == [[a["name"] for a in adapters]] * 2

    stack.wait(configmap_lists, 60, what="the adapters ConfigMap lists " + ", ".join(a["name"] for a in adapters))


def test_base_model_and_adapter_are_served_through_the_router(stack: Stack) -> None:
    base = model_name()
    assert router_models(stack) == sorted([base, FIRST])
    stack.wait(lambda: all(engine_models(stack, p) == sorted([base, FIRST]) for p in constants.POOLS), 60,
               what="both engines loaded the adapter")
    base_text, lora_text = complete(stack, base), complete(stack, FIRST)
    assert base_text and lora_text
    assert lora_text != base_text, "the adapter's weights changed nothing: was it applied?"
    want = {p: [(FIRST, 1)] for p in constants.POOLS}
    stack.wait(lambda: status_adapters(stack) == want, 90, what=f"status.pools.*.adapters == {want}")
    # the adapter goes through the same length routing and caps: a long prompt lands in the long pool
    raw = client(stack).completions.with_raw_response.create(
        model=FIRST, prompt="word " * 700, max_tokens=4, extra_body={"ignore_eos": True})
    assert raw.headers["x-vllm-operator-pool"] == "long"
    raw = client(stack).completions.with_raw_response.create(
        model=FIRST, prompt="short", max_tokens=4, extra_body={"ignore_eos": True})
    assert raw.headers["x-vllm-operator-pool"] == "short"


def test_lora_slots_come_out_of_the_planned_kv_and_vllm_reports_that_kv(stack: Stack) -> None:
    """On CPU the planner passes --kv-cache-memory-bytes with the LoRA slots already taken off the pod's memory, and
    vLLM's CPU KV cache is exactly that many bytes: the tokens it reports are the plan's."""
    with_lora = plan(parse_spec(example()["spec"]), None, RemediationState(pools={}), name=NAME, namespace=NS)
    without = the_plan()
    for pool in constants.POOLS:
        p = with_lora.pools[pool]
        assert p.kv.breakdown.lora_bytes > 0 and p.kv.planned_tokens < without.pools[pool].kv.planned_tokens

    def observed() -> dict[str, int | None]:
        pools = (stack.obj().get("status") or {}).get("pools") or {}
        return {p: (pools.get(p) or {}).get("observedKVTokens") for p in constants.POOLS}

    want = {p: with_lora.pools[p].kv.planned_tokens for p in constants.POOLS}
    stack.wait(lambda: observed() == want, 90, what=f"observedKVTokens == planned {want}")


def test_the_router_never_forwards_the_adapter_endpoints(stack: Stack) -> None:
    url = stack.router_url()
    for path in constants.LORA_ENDPOINTS:
        req = urllib.request.Request(url + path, method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"lora_name": "evil", "lora_path": "/tmp"}).encode())
        try:
            urllib.request.urlopen(req, timeout=10)
            status = 200
        except urllib.error.HTTPError as err:
            status = err.code
        assert status == 404, path
    assert all("evil" not in engine_models(stack, p) for p in constants.POOLS)


def test_added_adapter_is_served_without_restarting_the_engines(stack: Stack) -> None:
    before = engines(stack)
    set_adapters(stack, [adapter(FIRST), adapter(SECOND)])
    base = model_name()
    stack.wait(lambda: all(engine_models(stack, p) == sorted([base, FIRST, SECOND]) for p in constants.POOLS),
               CHANGE_TIMEOUT_S, what=f"both engines loaded {SECOND}")
    stack.wait(lambda: len(stack.pods(component=constants.COMPONENT_ROUTER)) == 1 and stack.ready()
               and SECOND in router_models(stack), CHANGE_TIMEOUT_S, what=f"the router lists {SECOND}")
    assert complete(stack, SECOND)
    want = {p: sorted([(FIRST, 1), (SECOND, 1)]) for p in constants.POOLS}
    stack.wait(lambda: status_adapters(stack) == want, 90, what=f"status.pools.*.adapters == {want}")
    assert engines(stack) == before, "adding an adapter restarted or replaced an engine"


def test_removed_adapter_disappears_and_gets_404(stack: Stack) -> None:
    before = engines(stack)
    set_adapters(stack, [adapter(SECOND)])
    base = model_name()
    stack.wait(lambda: all(engine_models(stack, p) == sorted([base, SECOND]) for p in constants.POOLS),
               CHANGE_TIMEOUT_S, what=f"both engines unloaded {FIRST}")
    stack.wait(lambda: len(stack.pods(component=constants.COMPONENT_ROUTER)) == 1 and stack.ready()
               and router_models(stack) == sorted([base, SECOND]), CHANGE_TIMEOUT_S,
               what=f"the router no longer lists {FIRST}")
    with pytest.raises(openai.NotFoundError) as err:
        complete(stack, FIRST)
    assert err.value.code == "model_not_found"
    assert isinstance(err.value.body, dict) and err.value.body.get("type") == "invalid_request_error"
    assert complete(stack, SECOND) and complete(stack, base)
    want = {p: [(SECOND, 1)] for p in constants.POOLS}
    stack.wait(lambda: status_adapters(stack) == want, 90, what=f"status.pools.*.adapters == {want}")
    assert engines(stack) == before, "removing an adapter restarted or replaced an engine"
    assert http_status(stack.router_url() + "/health") == 200
