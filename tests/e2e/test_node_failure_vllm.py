"""Node failure, end to end: the real node running the short pool's engine dies (its kubelet, kube-proxy,
containerd, shims and containers SIGKILLed by PID, all at once: testcluster.node.Node.crash), and the cluster, the
router and the operator follow on their own.

The stack (tests/support/e2e_stack.py) runs the chart's operator, the router and the long pool on the real node
`cpu-0`; the short pool selects the label `LABEL`, which only the further real nodes carry: `cpu-a` is started once
the router and the long pool are bound to `cpu-0` (so only the short engine lands on it), `cpu-b` once the stack is
Ready. Killing cpu-a is what a node failure is to the control plane: the Lease stops being renewed and the pod's
processes are gone.

Then, with short prompts flowing through the router: the engine stops answering, the router ejects it, the
node-lifecycle controller marks `cpu-a` NotReady and taints it unreachable (NoExecute), the operator's status counts
the short pool down to 0 ready, the taint-eviction controller evicts the pod once the API server's default
toleration (`HEARTBEATS.toleration_s`, 10 s) runs out, the ReplicaSet's replacement is bound to `cpu-b` and starts
vLLM cold, the router admits it and serves the short pool from it, and the operator's status is back to 1 ready and
Ready. Each step's time after the kill is printed (`pytest -s`). The allowances: NotReady after the node-monitor
grace (`HEARTBEATS`: 20 s, 5 missed renewals) and a 5 s monitor period; the eviction 10 s after the taint; a cold
vLLM start 60-120 s measured on 2 cores, up to `READY_TIMEOUT_S` allowed on a loaded machine.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.e2e_stack import (
    EXAMPLE,
    HEARTBEATS,
    NODE,
    READY_TIMEOUT_S,
    Stack,
    Traffic,
    cond,
    http_status,
    router_metric,
)
from vllm_operator import constants

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
LABEL = "vllm-operator.dev/e2e-engine-node"
NODE_A, NODE_B = "cpu-a", "cpu-b"
NOT_READY_S = HEARTBEATS.monitor_grace_s + 60.0
"""Kill -> NotReady: the node-monitor grace after the last renewal, a 5 s monitor period, a loaded machine."""
EVICTION_S = HEARTBEATS.toleration_s + 60.0
"""Taint -> the pod evicted: the API server's default unreachable toleration and the taint manager's pass."""


def _example() -> dict[str, Any]:
    doc = copy.deepcopy(EXAMPLE)
    doc["spec"]["pools"]["short"]["nodeSelector"] = {LABEL: "true"}
    doc["spec"]["pools"]["long"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    return doc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("e2e-nodefail"), tiny_model_dir, _example(), nodes=[(NODE, {})])
    try:
        s.start()
        with s.inside():  # for the module, as running_stack does

            def bound_to_cpu0() -> bool:
                pods = s.pods("long") + s.pods(component=constants.COMPONENT_ROUTER)
                return len(pods) == 2 and all(p["spec"].get("nodeName") == NODE for p in pods)

            s.wait(bound_to_cpu0, 120, what="the long pool and the router bound to cpu-0")
            s.start_node(NODE_A, {LABEL: "true"})
            s.wait_ready()
            s.start_node(NODE_B, {LABEL: "true"})  # returns with the Node Ready
            yield s
    finally:
        s.stop()


def _short_ready(stack: Stack) -> int | None:
    pools = stack.obj().get("status", {}).get("pools") or {}
    short = pools.get("short") or {}
    ready = short.get("readyReplicas")
    return None if ready is None else int(ready)


def _unreachable_taint(stack: Stack, name: str) -> bool:
    assert stack.kube_cluster is not None
    node = json.loads(stack.kube_cluster.kubectl("get", "node", name, "-o", "json").stdout)
    return any(t["key"] == "node.kubernetes.io/unreachable" and t["effect"] == "NoExecute"
               for t in node["spec"].get("taints") or [])


def test_a_killed_node_gets_its_engine_rescheduled_and_the_router_and_operator_follow(stack: Stack) -> None:
    (first,) = stack.pods("short")
    assert first["spec"]["nodeName"] == NODE_A, first["spec"].get("nodeName")
    old_name, old_ip = first["metadata"]["name"], first["status"]["podIP"]
    old_health = f"http://{old_ip}:{constants.ENGINE_PORT}/health"
    assert http_status(old_health) == 200
    assert _short_ready(stack) == 1
    unreachable = [t for t in first["spec"].get("tolerations") or [] if t["key"] == "node.kubernetes.io/unreachable"]
    assert [t.get("tolerationSeconds") for t in unreachable] == [HEARTBEATS.toleration_s], \
        "the API server's DefaultTolerationSeconds gave the pod the cluster's toleration"
    (node_a,) = [n for n in stack.nodes if n.name == NODE_A]

    with Traffic(stack, timeout=10) as traffic:
        stack.wait(lambda: traffic.first(0, "short"), 60, what="traffic answered by the short pool")
        killed = time.monotonic()
        crashed = node_a.crash()
        assert crashed["kubelet"] and crashed["containerd"] and crashed["containers"], crashed
        seen: dict[str, float] = {}

        def replacement() -> dict[str, Any] | None:
            pods = [p for p in stack.pods("short") if p["metadata"]["name"] != old_name]
            return pods[0] if pods else None

        def old_evicted() -> bool:
            """The old pod has a deletion timestamp (it stays Terminating: no kubelet is left to finish it)."""
            return old_name not in {p["metadata"]["name"] for p in stack.pods("short")}

        steps: list[tuple[str, Callable[[], object]]] = [
            ("engine on cpu-a unreachable", lambda: http_status(old_health, timeout=1.0) is None),
            ("router ejected it", lambda: router_metric(stack, "vllm_operator_router_endpoints", pool="short",
                                                        state="healthy") == 0),
            ("cpu-a NotReady", lambda: stack.node_ready(NODE_A) is False),
            ("cpu-a tainted unreachable:NoExecute", lambda: _unreachable_taint(stack, NODE_A)),
            ("status: short 0 ready", lambda: _short_ready(stack) == 0),
            ("old pod evicted", old_evicted),
            ("replacement bound to cpu-b", lambda: (p := replacement()) is not None
             and p["spec"].get("nodeName") == NODE_B),
            ("replacement Ready", lambda: (p := replacement()) is not None
             and cond(p, "Ready").get("status") == "True"),
            ("router serving the short pool again", lambda: "engine on cpu-a unreachable" in seen
             and traffic.first(killed + seen["engine on cpu-a unreachable"], "short") is not None),
            ("status: short 1 ready, Ready", lambda: "status: short 0 ready" in seen and _short_ready(stack) == 1
             and cond(stack.obj(), constants.COND_READY).get("status") == "True"),
        ]
        deadline = killed + NOT_READY_S + EVICTION_S + READY_TIMEOUT_S
        while len(seen) < len(steps) and time.monotonic() < deadline:
            for what, check in steps:
                if what not in seen and check():
                    seen[what] = time.monotonic() - killed
            time.sleep(0.25)
        report = ", ".join(f"{what} {seen[what]:.1f} s" for what, _ in steps if what in seen)
        print(f"\nnode failure (times after the SIGKILL of {NODE_A}'s kubelet, containerd and containers): {report}")
        missing = [what for what, _ in steps if what not in seen]
        assert not missing, f"not seen within {deadline - killed:.0f} s: {missing}; seen: {report}; " \
                            f"{stack.diagnostics()}"

    assert seen["cpu-a NotReady"] <= NOT_READY_S and seen["old pod evicted"] - seen[
        "cpu-a tainted unreachable:NoExecute"] <= EVICTION_S, report
    new = replacement()
    assert new is not None and new["status"]["podIP"] != old_ip
    assert router_metric(stack, "vllm_operator_router_endpoints", pool="short", state="healthy") == 1
    answered_short = [a for a in traffic.results if a.pool == "short" and a.status == 200]
    assert answered_short, "the short pool answered before and after the failure"
