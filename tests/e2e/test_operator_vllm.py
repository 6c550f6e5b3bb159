"""The whole loop with real engines on the real control plane: `examples/cpu-dev.yaml` applied to kube-apiserver
becomes real vLLM servers (the operator's rendered pods from the engine-cpu image, bound by kube-scheduler to real
nodes whose kubelet and containerd run them: tests/support/e2e_stack.py), a real router from the router image that
discovers them through the EndpointSlices kube-controller-manager publishes, a real Prometheus that discovers them
from the API server, and the operator's health loop (the chart's pod, from the operator image) acting on what it
sees.

The system is the session's `cpu_dev` (tests/e2e/conftest.py: two engines and the router, ~1-2 min on 2 cores, shared
with test_router_vllm and test_self_healing_vllm, whose faults run after both). Tests take it through `healthy`,
which waits for it Ready.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any

import openai
import pytest
import tokenizers

from tests.support import images
from tests.support.e2e_stack import (
    Stack,
    cond,
    counter,
    engine_url,
    metrics_text,
    model_name,
    process_argv,
    prompt_of,
    the_plan,
)
from vllm_operator import constants
from vllm_operator.rendering import engine as engine_rendering

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # start-up and healing of real engines on 2 cores
SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.router_url() + "/v1", api_key="unused", max_retries=0, timeout=120)


def engine_counter(stack: Stack, pool: str, name: str) -> float:
    return counter(metrics_text(engine_url(stack, pool)), name)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


# -- 8: the planner's argv runs --------------------------------------------------------------------------------------


def test_engine_processes_run_exactly_the_planned_argv(healthy: Stack) -> None:
    """In each engine container (its processes read from its cgroup on the real node), one vLLM API server runs
    exactly the planner's arguments, with the kubelet's $(POD_IP) substitution and the pod's IP in its env."""
    planned = the_plan()
    for pool in ("short", "long"):
        container = healthy.engine(pool)
        ip = container.ip
        servers = [pid for pid in container.pids() if SERVER_MODULE in process_argv(pid)]
        assert len(servers) == 1, f"one vLLM API server in the engine container of {container.pod}"
        argv = process_argv(servers[0])
        model = rendered_model_path()
        expected_args = [a.replace("$(POD_IP)", ip) for a in planned.pools[pool].engine_args]
        assert argv[1:] == ["-m", SERVER_MODULE, "--model", model, *expected_args]
        assert f"--host={ip}" in argv
        assert ipaddress.ip_address(ip) in ipaddress.ip_network(container.node().pod_cidr)
        assert container.env().get("POD_IP") == ip


def test_each_engine_runs_on_its_own_nodes_core_with_vllms_own_binding(healthy: Stack) -> None:
    """The stack's nodes have a core each (testcluster.node.cpus_of, as two machines would): an engine container may
    run on its node's one core under a 1-CPU quota, which covers it, so the wrapper (engine/cpubind.py) keeps vLLM's
    own OpenMP binding, and vLLM binds its worker's thread to that core; the two engines, on different nodes, never
    share a core. (Where a container may run on more cores than its quota, the wrapper sets `nobind`:
    tests/integration/node/test_weights_cache_node.py, on a real kubelet, and tests/unit/engine/test_cpubind.py.
    Read from the log, not from /proc/PID/environ: vLLM retitles its processes, which overwrites that area.)"""
    cores: dict[str, int] = {}
    for pool in ("short", "long"):
        container = healthy.engine(pool)
        log = container.log(tail=-1)
        assert "VLLM_CPU_OMP_THREADS_BIND='auto'" in log, f"vLLM's binding report in {container.pod}"
        assert "This CPU engine may run on" not in log, f"the wrapper changed vLLM's binding in {container.pod}"
        allowed = os.sched_getaffinity(container.main_pid())
        assert len(allowed) == 1, f"the node's one core, not the machine's: {allowed}"
        (core,) = allowed
        assert re.search(rf"local_rank=0, core ids=\[{core}\]", log), f"vLLM bound its worker to core {core}"
        cores[pool] = core
    if len(os.sched_getaffinity(0)) > 1:
        assert cores["short"] != cores["long"], cores


def rendered_model_path() -> str:
    """The model path in the engine's command, as the operator renders it (the models PVC's mount)."""
    _, container = images.rendered_pod("cpu-dev", engine_rendering.CONTAINER)
    return str(container["command"][5])


# -- 1: routing by length, through the real router, with the official client --------------------------------------


def test_short_and_long_prompts_land_on_their_pools(healthy: Stack, tokenizer: tokenizers.Tokenizer) -> None:
    oai = client(healthy)
    threshold = the_plan().router.prompt_length_threshold
    before = {p: engine_counter(healthy, p, "vllm:prompt_tokens_total") for p in ("short", "long")}

    raw = oai.completions.with_raw_response.create(model=model_name(), prompt=prompt_of(tokenizer, 20), max_tokens=4)
    short = raw.parse()
    assert raw.headers["x-vllm-operator-pool"] == "short"
    assert short.usage is not None and short.usage.prompt_tokens == 20 and short.choices[0].text is not None
    mid = {p: engine_counter(healthy, p, "vllm:prompt_tokens_total") for p in ("short", "long")}
    assert (mid["short"] - before["short"], mid["long"] - before["long"]) == (20, 0)

    n_long = threshold + 100
    raw = oai.completions.with_raw_response.create(model=model_name(), prompt=prompt_of(tokenizer, n_long),
                                                   max_tokens=4)
    long = raw.parse()
    assert raw.headers["x-vllm-operator-pool"] == "long"
    assert long.usage is not None and long.usage.prompt_tokens == n_long
    after = {p: engine_counter(healthy, p, "vllm:prompt_tokens_total") for p in ("short", "long")}
    assert (after["short"] - mid["short"], after["long"] - mid["long"]) == (0, n_long)

    chat = oai.chat.completions.with_raw_response.create(
        model=model_name(), messages=[{"role": "user", "content": "Hello there"}], max_tokens=3)
    assert chat.headers["x-vllm-operator-pool"] == "short" and chat.parse().choices[0].message is not None


# -- 7: planned vs observed KV tokens ---------------------------------------------------------------------------------


def test_planned_and_observed_kv_tokens_agree(healthy: Stack) -> None:
    def both() -> dict[str, Any] | None:
        pools = healthy.obj().get("status", {}).get("pools", {})
        ok = all(pools.get(p, {}).get("observedKVTokens") and pools.get(p, {}).get("plannedKVTokens")
                 for p in ("short", "long"))
        return pools if ok else None

    pools = healthy.wait(both, 90, what="observedKVTokens and plannedKVTokens in status for both pools")
    for pool in ("short", "long"):
        planned, observed = pools[pool]["plannedKVTokens"], pools[pool]["observedKVTokens"]
        print(f"KV tokens {pool}: planned {planned}, observed {observed} ({(observed - planned) / planned:+.2%})")
        assert abs(observed - planned) <= 0.05 * planned, (pool, planned, observed)
        text = metrics_text(engine_url(healthy, pool))
        info = next(line for line in text.splitlines() if re.match(r"^vllm[:_]cache_config_info\{", line))
        assert f'kv_cache_size_tokens="{observed}"' in info, "status carries what the engine reports"


# -- 2: the runaway fuse ----------------------------------------------------------------------------------------------


def test_runaway_fuse_router_defaults_caps_and_engine_side_fuse(healthy: Stack) -> None:
    tier = the_plan().router.tiers[0]
    oai = client(healthy)
    no_eos = {"ignore_eos": True}
    chat = oai.chat.completions.create(model=model_name(), messages=[{"role": "user", "content": "Go on forever."}],
                                       extra_body=no_eos)
    assert chat.usage is not None and chat.usage.completion_tokens == tier.default_max_tokens
    assert chat.choices[0].finish_reason == "length"
    comp = oai.completions.create(model=model_name(), prompt="Once upon a time", extra_body=no_eos)
    assert comp.usage is not None and comp.usage.completion_tokens == tier.default_max_tokens, "not vLLM's 16"

    long_before = engine_counter(healthy, "long", "vllm:generation_tokens_total")
    raw = oai.chat.completions.with_raw_response.create(
        model=model_name(), messages=[{"role": "user", "content": "More."}], max_tokens=100_000, extra_body=no_eos)
    clamped = raw.parse()
    assert clamped.usage is not None and clamped.usage.completion_tokens == tier.max_tokens
    assert raw.headers["x-vllm-operator-max-tokens"] == str(tier.max_tokens)
    assert raw.headers["x-vllm-operator-pool"] == "long", "above the short pool's fuse"
    assert engine_counter(healthy, "long", "vllm:generation_tokens_total") - long_before == tier.max_tokens

    # The router bypassed: each engine's own fuse (--override-generation-config max_new_tokens) holds.
    for pool in ("short", "long"):
        fuse = the_plan().pools[pool].max_tokens
        direct = openai.OpenAI(base_url=engine_url(healthy, pool) + "/v1", api_key="unused", max_retries=0,
                               timeout=120)
        unbounded = direct.chat.completions.create(
            model=model_name(), messages=[{"role": "user", "content": "Never stop."}], extra_body=no_eos)
        assert unbounded.usage is not None and unbounded.usage.completion_tokens == fuse, pool
        over = direct.chat.completions.create(
            model=model_name(), messages=[{"role": "user", "content": "Never stop."}], max_tokens=fuse + 500,
            extra_body=no_eos)
        assert over.usage is not None and over.usage.completion_tokens == fuse, pool


# -- 3: over-limit prompts never reach an engine ----------------------------------------------------------------------


def test_over_limit_prompt_gets_the_routers_400_and_no_engine_sees_it(healthy: Stack,
                                                                      tokenizer: tokenizers.Tokenizer) -> None:
    limit = the_plan().router.pools.long.max_model_len
    names_ = ("vllm:prompt_tokens_total", "vllm:request_success_total")
    before = {p: [engine_counter(healthy, p, n) for n in names_] for p in ("short", "long")}
    n_tokens = limit + 10
    with pytest.raises(openai.BadRequestError) as caught:
        client(healthy).completions.create(model=model_name(), prompt=prompt_of(tokenizer, n_tokens), max_tokens=4)
    error = caught.value
    assert error.status_code == 400 and error.code == "context_length_exceeded"
    assert str(n_tokens) in error.message and str(limit) in error.message, error.message
    assert error.response.headers["x-vllm-operator-prompt-tokens"] == str(n_tokens)
    after = {p: [engine_counter(healthy, p, n) for n in names_] for p in ("short", "long")}
    assert after == before, "an engine saw the refused prompt"
    refusals = counter(metrics_text(healthy.router_url()), "vllm_operator_router_refusals_total",
                       reason="prompt_too_long")
    assert refusals >= 1


# -- 6: runaway share -> condition and event --------------------------------------------------------------------------


def test_traffic_hitting_the_cap_raises_runaway_generation(healthy: Stack) -> None:
    oai = client(healthy)
    for i in range(12):
        done = oai.completions.create(model=model_name(), prompt=f"Count to infinity {i}", max_tokens=8,
                                      extra_body={"ignore_eos": True})
        assert done.choices[0].finish_reason == "length"

    def raised() -> dict[str, Any] | None:
        runaway = cond(healthy.obj(), constants.COND_RUNAWAY)
        return runaway if runaway.get("status") == "True" else None

    runaway = healthy.wait(raised, 120, interval=1.0, what="RunawayGeneration=True")
    assert "length" in runaway.get("message", "") or runaway.get("reason"), runaway
    reasons = {e.get("reason") for e in healthy.events()}
    assert f"{constants.COND_RUNAWAY}True" in reasons, sorted(r for r in reasons if r)
