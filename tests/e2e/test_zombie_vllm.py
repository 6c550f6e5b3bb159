"""A zombie engine found without user traffic, on the session's `cpu_dev` system (tests/e2e/conftest.py): the long
pool's EngineCore is stopped (SIGSTOP) while nothing is sent to it, so vLLM's /health keeps answering 200 and no
request runs for the Stalled rule to see. The engine wrapper's idle probe (cpu-dev.yaml: 10 s idle, 5 s timeout, 2
failures) flags it, Prometheus scrapes the flag, the health loop diagnoses EngineUnresponsive, deletes the pod
within the restart budget and posts RestartedUnresponsivePod, and the ReplicaSet's replacement starts and serves.

After the other fault modules (pytest runs modules in name order), on the long pool, which they leave alone; it
waits only for the long pool, not for the short pool's replacement the stall test left starting.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

import pytest

from tests.support.e2e_stack import (
    EXAMPLE,
    NS,
    RESTART_READY_TIMEOUT_S,
    Stack,
    engine_core_pid,
    engine_url,
    http_status,
)
from vllm_operator import constants

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

POOL = "long"


@pytest.fixture
def inside(cpu_dev: Stack) -> Iterator[Stack]:
    with cpu_dev.inside():
        yield cpu_dev


def ready_engine(stack: Stack) -> str | None:
    """The long pool's single engine pod, once Ready (None before)."""
    pods = stack.pods(POOL)
    if len(pods) != 1:
        return None
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in pods[0].get("status", {}).get("conditions", []))
    return str(pods[0]["metadata"]["name"]) if ready else None


def probe_env() -> dict[str, float]:
    env = {e["name"]: float(e["value"]) for e in EXAMPLE["spec"]["pools"][POOL]["env"]}
    return {"after": env["VLLM_OPERATOR_IDLE_PROBE_AFTER"], "timeout": env["VLLM_OPERATOR_IDLE_PROBE_TIMEOUT"]}


def test_an_idle_zombie_engine_is_diagnosed_and_its_pod_replaced(inside: Stack) -> None:
    stack = inside
    pod = stack.wait(lambda: ready_engine(stack), RESTART_READY_TIMEOUT_S, what=f"a Ready {POOL} engine")
    old_ip = stack.container(pod).ip  # read now: the pod is gone once replaced
    probe = probe_env()
    # Detection bound: a probe is due at most `after` after the last work, then 2 failures of `timeout` each, a
    # scrape and a health check (intervalSeconds 2); 30 s of slack for a loaded 2-core machine.
    bound = probe["after"] + 2 * probe["timeout"] + 30
    core = engine_core_pid(stack, POOL)
    os.kill(core, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        assert http_status(engine_url(stack, POOL) + "/health") == 200, "a zombie answers /health"

        def gone() -> bool:
            return pod not in {p["metadata"]["name"] for p in stack.pods(POOL)}

        stack.wait(gone, bound + 60, interval=0.25, what=f"EngineUnresponsive pod {pod} deleted")
        deleted = time.monotonic()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(core, signal.SIGCONT)
    assert deleted - stopped <= bound, f"deleted after {deleted - stopped:.1f} s, bound {bound:.0f} s"
    stack.wait(lambda: any(e.get("reason") == "RestartedUnresponsivePod" and pod in e.get("message", "")
                           for e in stack.events()), 30, interval=0.25,
               what=f"the RestartedUnresponsivePod event naming {pod}")
    status = stack.obj()["status"]["pools"][POOL]
    assert status["restartBudget"]["used"] >= 1
    new = stack.wait(lambda: (name := ready_engine(stack)) != pod and name, RESTART_READY_TIMEOUT_S, interval=0.5,
                     what=f"the {POOL} pool's replacement Ready")
    serving = time.monotonic()
    assert new != pod and stack.container(str(new)).ip != old_ip
    print(f"idle engine core SIGSTOP: pod_deleted_s {deleted - stopped:.1f}, replacement_ready_s "
          f"{serving - stopped:.1f} (probe {probe}, {NS}, {constants.REASON_ENGINE_UNRESPONSIVE})")
