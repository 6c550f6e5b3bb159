"""Self-healing with real engines on the real control plane, on the session's `cpu_dev` system (tests/e2e/conftest.py,
tests/support/e2e_stack.py): an engine core killed under traffic (/health 503, the router ejects the engine and
serves short prompts from the long pool, vLLM exits, the wrapper reports EngineDead through terminationMessagePath,
the real kubelet restarts the container, the router readmits it, the operator observes it), an engine container
taken past its memory limit (the kernel OOM-kills a vLLM process, the kubelet reports OOMKilled, the health loop
steps the pool down a rung and the pod at that rung serves), and an engine core frozen mid-step (the health loop
diagnoses Stalled and deletes the pod, the ReplicaSet's replacement starts).

These are the `cpu_dev` modules' only faults, in a module of their own so that they run after the others
(test_operator_vllm, test_router_vllm: pytest runs modules in name order) and nobody waits for their healing: the
stall test leaves the replacement starting, for the session's teardown to stop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import vllm_cpu
from tests.support.e2e_stack import (
    EXAMPLE,
    NAME,
    NS,
    RESTART_READY_TIMEOUT_S,
    PodContainer,
    Stack,
    Termination,
    Traffic,
    cond,
    engine_core_pid,
    engine_url,
    exceed_memory_limit,
    kill_engine_core,
    metrics_text,
    router_metric,
)
from vllm_operator import constants
from vllm_operator.k8s import VLLM_DEPLOYMENTS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # start-up and healing of real engines on 2 cores


def test_engine_core_death_ejects_restarts_and_readmits(healthy: Stack) -> None:
    pool = "short"
    container = healthy.engine(pool)
    pod = container.pod
    restarts = container.restart_count
    with Traffic(healthy) as traffic:
        healthy.wait(lambda: traffic.first(0, pool), 60, what="traffic on the short pool")
        kill = kill_engine_core(healthy, pool)
        killed, unhealthy, ejected = kill.killed, kill.unhealthy, kill.ejected
        errors_at_ejection = router_metric(healthy, "vllm_operator_router_upstream_errors_total", pool=pool)
        # the kubelet saw the container exit and started it again (restartCount is written with the new one)
        healthy.wait(lambda: container.restart_count > restarts, 60, interval=0.2, what="vLLM exited")
        phases_seen: list[str] = []  # the pool's status.startupPhase as the health loop writes it (every 2 s)
        readiness: list[float] = []  # when the restarted container was first seen ready (the kubelet's probe)

        def ready_again() -> float | None:
            phase = ((healthy.obj().get("status", {}).get("pools", {}) or {}).get(pool) or {}).get("startupPhase")
            if phase and (not phases_seen or phases_seen[-1] != phase):
                phases_seen.append(phase)
            if not readiness:
                status = container.status()
                if status.get("ready") and status.get("restartCount", 0) > restarts:
                    readiness.append(time.monotonic())
            return readiness[0] if readiness else None

        ready = healthy.wait(ready_again, RESTART_READY_TIMEOUT_S, interval=0.5, what="restarted container ready")
        serving = healthy.wait(lambda: traffic.first(killed, pool), 120, interval=0.2, what="short pool serving again")
    answers = list(traffic.results)
    in_flight_at_ejection = [a for a in answers if a.sent < ejected < a.answered]
    errors = router_metric(healthy, "vllm_operator_router_upstream_errors_total", pool=pool) - errors_at_ejection
    assert errors <= len(in_flight_at_ejection), \
        "a request was sent to the engine between its ejection and its readiness"
    # The ejected window ends when the engine is back: the kubelet's Ready as the test reads it, or the router's own
    # readmission (its health check sees /health 200 first when the restart fell between two readiness probes,
    # and the pod never left the EndpointSlice), whichever came first.
    back = min(ready, serving)
    between = [a for a in answers if ejected < a.sent and a.answered < back]
    assert between and all(a.status == 200 and a.pool == "long" for a in between), \
        f"while ejected, short prompts are served by the long pool: {between}"
    failed = [(round(a.sent - killed, 2), a.status) for a in answers if a.sent > ejected and a.status != 200]
    assert failed == [], f"requests sent after the ejection failed: {failed}"

    exited = container.last_terminated or {}
    assert exited.get("exitCode") == 88 and '"reason":"EngineDead"' in exited.get("message", ""), exited
    status = next(p for p in healthy.pods(pool) if p["metadata"]["name"] == pod)["status"]["containerStatuses"][0]
    assert status["restartCount"] == restarts + 1
    assert status["lastState"]["terminated"]["exitCode"] == 88
    assert "EngineDead" in status["lastState"]["terminated"]["message"]
    healthy.wait(lambda: "ObservedEngineDead" in {e.get("reason") for e in healthy.events()}, 60,
                 what="the operator observed the EngineDead termination")
    healthy.wait(lambda: ready_again() and phases_seen[-1] == "Serving", 60, what="startupPhase Serving again")
    restart = phases_seen[1:] if phases_seen[0] == "Serving" else phases_seen  # the old process's Serving first
    order = [p.value for p in constants.STARTUP_PHASES]
    assert "Launching" in restart and restart[-1] == "Serving", phases_seen
    assert [order.index(p) for p in restart] == sorted(order.index(p) for p in restart), \
        f"the restart's phases in status, in vLLM's order: {phases_seen}"
    entry = healthy.obj()["status"]["pools"][pool]
    assert entry["startupPod"] == pod and entry["startupPhaseSince"], entry
    record("engine core SIGKILL", {"health_503_s": unhealthy - killed, "router_ejected_s": ejected - killed,
                                   "ready_again_s": ready - killed, "serving_again_s": serving - killed})
    print(f"startupPhase in status during the restart: {phases_seen}")


def test_engine_oomkilled_by_the_kernel_steps_the_pool_down_and_the_next_rung_serves(healthy: Stack) -> None:
    """The short engine's container goes past its memory limit (tests/support/e2e_stack.exceed_memory_limit): the
    kernel kills one of vLLM's processes, the kubelet reports the container OOMKilled with the wrapper's exit code
    and message, the health loop diagnoses HostOOMKilled (on CPU the engine's own memory) and takes the memory
    ladder's next rung (oomCount 1 here: one OOM is enough), and the pool's pod at that rung (less KV memory) serves
    through the router. The OOMKilled pod is replaced, not surged beside: on these two 2-CPU nodes the next rung's
    pod found no room when the router (rolled with the rung) landed beside the OOMKilled engine. Runs before the
    stall test, which leaves its replacement starting."""
    pool = "short"
    pools = healthy.obj().get("status", {}).get("pools", {})
    level = ((pools.get(pool) or {}).get("stepDown") or {}).get("level", 0)
    container = healthy.engine(pool)
    pod = container.pod
    kv_bytes = engine_flag(container.obj(), "--kv-cache-memory-bytes")
    thresholds = EXAMPLE["spec"]["remediation"]["thresholds"]
    healthy.call(lambda k: k.patch(VLLM_DEPLOYMENTS, NS, NAME,
                                   {"spec": {"remediation": {"thresholds": {"oomCount": 1}}}}))
    try:
        with Traffic(healthy) as traffic, Termination(container, "OOMKilled") as termination:
            healthy.wait(lambda: traffic.first(0, pool), 60, what="traffic on the short pool")
            oom = exceed_memory_limit(healthy, pool)
            exited = healthy.wait(lambda: termination.found, 60, interval=0.2,
                                  what=f"{pod}'s engine container reported OOMKilled")
            healthy.wait(lambda: any(e.get("reason") == "ObservedHostOOMKilled" and pod in e.get("message", "")
                                     for e in healthy.events()), 60, interval=0.5,
                         what=f"the operator observed {pod} HostOOMKilled")
            healthy.wait(
                lambda: (healthy.obj()["status"]["pools"][pool].get("stepDown") or {}).get("level", 0) == level + 1,
                60, interval=0.5, what="the pool stepped down one rung")
            healthy.wait(lambda: any(e.get("reason") == "SteppedDown" for e in healthy.events()), 30,
                         interval=0.5, what="the SteppedDown event")

            live_pods: list[int] = []  # pods of the pool not being deleted, at each look

            def next_rung_ready() -> float | None:
                pods = healthy.pods(pool, terminating=True)
                live_pods.append(sum(not p["metadata"].get("deletionTimestamp") for p in pods))
                if len(pods) != 1 or pods[0]["metadata"]["name"] == pod:
                    return None
                return time.monotonic() if cond(pods[0], "Ready").get("status") == "True" else None

            ready = healthy.wait(next_rung_ready, RESTART_READY_TIMEOUT_S, interval=0.5,
                                 what="the next rung's pod Ready and the OOMKilled pod gone")
            assert max(live_pods) == 1, f"a pod surged beside the OOMKilled one (pods alive at each look: {live_pods})"
        # The rung is in the router's pool table too, so the router pod is replaced with it (a new address): the
        # system Ready, then traffic through the router of now.
        healthy.wait_ready()
        with Traffic(healthy) as after:
            serving = healthy.wait(lambda: after.first(0, pool), 120, interval=0.2,
                                   what="the short pool served by the next rung's pod")
        new = healthy.engine(pool)
        assert engine_flag(new.obj(), "--kv-cache-memory-bytes") < kv_bytes, "the next rung has less KV memory"
        # the wrapper's exit code and termination message stay beside the kubelet's reason
        assert exited["exitCode"] != 0 and exited.get("message"), exited
    finally:  # back to the example's thresholds (a merge patch deletes a key set to null)
        healthy.call(lambda k: k.patch(VLLM_DEPLOYMENTS, NS, NAME,
                                       {"spec": {"remediation": {"thresholds": {"oomCount": None}}}}))
        assert healthy.obj()["spec"]["remediation"]["thresholds"] == thresholds
    record("engine OOMKilled by the kernel", {"allocation_to_kill_s": oom.killed - oom.started,
                                              "next_rung_ready_s": ready - oom.killed,
                                              "next_rung_serving_s": serving - oom.killed})
    print(f"OOM victim: {oom.victim_title} (pid {oom.victim}); {exited.get('message', '')[:200]}")


def engine_flag(pod: dict[str, Any], flag: str) -> int:
    """An integer engine argument `--flag=N` of a pod's engine container."""
    args = next(c for c in pod["spec"]["containers"] if c["name"] == "engine")["args"]
    return int(next(a for a in args if a.startswith(flag + "=")).split("=", 1)[1])


def test_stalled_engine_core_is_diagnosed_and_its_pod_replaced(healthy: Stack) -> None:
    """Runs last: the replacement is left starting (the session's teardown stops it)."""
    pool = "short"
    thresholds = EXAMPLE["spec"]["remediation"]["thresholds"]
    window = thresholds["stallSeconds"] + thresholds["windowSeconds"]
    container = healthy.engine(pool)
    pod, ip, grace = container.pod, container.ip, container.grace_s
    with Traffic(healthy, max_tokens=120, threads=2, timeout=30):
        url = engine_url(healthy, pool)
        core, stopped = vllm_cpu.stop_engine_core_mid_step(lambda: metrics_text(url),
                                                           lambda: engine_core_pid(healthy, pool),
                                                           what=f"the {pool} engine")
        try:
            def gone() -> bool:
                return pod not in {p["metadata"]["name"] for p in healthy.pods(pool)}

            # The bound is the window (asserted below); waiting 60 s past it tells a slow deletion (its figure)
            # from none (the stack's status, events and log tails).
            healthy.wait(gone, window + 60, interval=0.25, what=f"Stalled pod {pod} deleted")
            deleted = time.monotonic()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(core, signal.SIGCONT)
        assert deleted - stopped <= window, f"deleted after {deleted - stopped:.1f} s, window {window} s"
        # The health loop deletes the pod, then posts the event (health/loop.execute): wait for it, not read once.
        healthy.wait(lambda: any(e.get("reason") == "RestartedStalledPod" and pod in e.get("message", "")
                                 for e in healthy.events()), 30, interval=0.25,
                     what=f"the RestartedStalledPod event naming {pod}")

        def replacement() -> PodContainer | None:
            pods = healthy.pods(pool)
            if len(pods) != 1 or pods[0]["metadata"]["name"] == pod:
                return None
            new = healthy.container(pods[0]["metadata"]["name"])
            return new if "running" in (new.status().get("state") or {}) else None

        # The deleted pod has its termination grace to go (its CPU request holds a node until then, so the
        # replacement may wait for it): the replacement's engine runs within that.
        limit = window + grace
        new = healthy.wait(replacement, limit + 30, interval=0.25, what="replacement pod's engine started")
        replaced = time.monotonic()
    assert replaced - stopped <= limit, f"replacement started after {replaced - stopped:.1f} s (limit {limit} s)"
    assert new.pod != pod and new.ip != ip
    # The deleted pod's container is stopped by its kubelet (SIGTERM, then SIGKILL after the grace): gone from the API
    healthy.wait(lambda: pod not in {p["metadata"]["name"] for p in healthy.pods(pool, terminating=True)},
                 grace + 15, interval=0.2, what="the stalled pod's container stopped and the pod gone")
    healthy.wait(lambda: not Path(f"/proc/{core}").exists(), 15, interval=0.2, what="the stopped engine core gone")
    obj = healthy.obj()
    assert obj["status"]["pools"][pool]["restartBudget"]["used"] >= 1
    # Ready and serving again takes a fresh vLLM start-up (1-4 min here): measured by benchmarks/e2e/faults.py.
    record("engine core SIGSTOP", {"pod_deleted_s": deleted - stopped, "replacement_started_s": replaced - stopped})


def record(fault: str, seconds: dict[str, float]) -> None:
    """Print fault timings (the figures in benchmarks/e2e/README.md come from benchmarks/e2e/faults.py)."""
    print(f"{fault}: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
