"""EngineUnresponsive through the whole reading path: the real engine wrapper over the fake vLLM, a real Prometheus
scraping both of the pod's endpoints (vLLM's and the wrapper's, as the PodMonitor does), and the health loop's own
code (`source.read_metrics` -> `diagnose` -> `decide`).

The zombie is the fake's `fail_mode: hang` while the pool is idle (no traffic at all): `/health` 200, model requests
never answered, vLLM's numbers still. Nothing but the wrapper's probe can see it; the diagnosis must name it, the
policy must delete the pod within the restart budget and post `RestartedUnresponsivePod`, and a neighbour that
serves must be left alone. Fault-to-diagnosis time is recorded (a measurement, not an assertion).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from testcluster import binaries
from tests.integration.engine.test_startup_phases import Wrapped, follow, wrapped
from tests.support.health_harness import DEPLOYMENT, NAMESPACE, pod_json, record_timing
from tests.support.prometheus import Prometheus, Target, running_prometheus
from vllm_operator import constants
from vllm_operator.api.remediation import HealthSettings
from vllm_operator.health.diagnose import Diagnosis, State, diagnose
from vllm_operator.health.policy import decide
from vllm_operator.health.snapshot import PoolFacts, Snapshot, pod_facts
from vllm_operator.health.source import PrometheusSource, read_metrics

pytestmark = pytest.mark.integration

SETTINGS = HealthSettings(interval_s=1, stall_s=3, window_s=6, min_finished=5)
PODS = [("chat-short-a", "short"), ("chat-short-b", "short")]
PROBE = ["--idle-probe-after=2", "--idle-probe-timeout=1", "--idle-probe-failures=2", "--idle-probe-tick=0.2"]


@pytest.fixture
def prom() -> Iterator[Prometheus]:
    with running_prometheus(executable=str(binaries.prometheus())) as p:
        yield p


def targets(pod: str, pool: str, w: Wrapped) -> list[Target]:
    labels = {"namespace": NAMESPACE, "vllmdeployment": DEPLOYMENT, "pool": pool, "pod": pod}
    return [Target(f"127.0.0.1:{w.engine_port}", labels), Target(f"127.0.0.1:{w.status_port}", labels)]


async def check(source: PrometheusSource) -> Diagnosis:
    metrics = await read_metrics(source, NAMESPACE, DEPLOYMENT, SETTINGS)
    pods = tuple(pod_facts(pod_json(name, pool)) for name, pool in PODS)
    snap = Snapshot(namespace=NAMESPACE, deployment=DEPLOYMENT, taken_at=time.time(),
                    pools={"short": PoolFacts("short", 2)}, pods=pods, metrics=metrics)
    return diagnose(snap, SETTINGS)


def states(diag: Diagnosis) -> dict[str, State]:
    return {p.pod: p.state for pool in diag.pools.values() for p in pool.pods}


async def until(source: PrometheusSource, want: dict[str, State], timeout: float = 60.0) -> tuple[Diagnosis, float]:
    started = time.monotonic()
    last: Diagnosis | None = None
    while time.monotonic() - started < timeout:
        last = await check(source)
        if states(last) == want:
            return last, time.monotonic() - started
        await asyncio.sleep(0.5)
    raise AssertionError(f"not {want} within {timeout}s: {states(last) if last else None}, "
                         f"{[p.message for pool in (last.pools.values() if last else []) for p in pool.pods]}")


def hang(w: Wrapped, mode: str) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{w.engine_port}/_control",
                                     data=json.dumps({"fail_mode": mode}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        resp.read()


async def test_an_idle_zombie_is_diagnosed_and_deleted_its_neighbour_left_alone(prom: Prometheus,
                                                                                tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fake = ["--startup-step-s=0.05", "--startup-steps=1"]
    with wrapped(tmp_path / "a", fake, PROBE) as a, wrapped(tmp_path / "b", fake, PROBE) as b:
        for w in (a, b):
            assert (follow(w)[1] or {}).get("phase") == "Serving", w.log.read_text()[-3000:]
        prom.set_targets([*targets("chat-short-a", "short", a), *targets("chat-short-b", "short", b)])
        source = PrometheusSource(prom.url)
        await until(source, {"chat-short-a": State.HEALTHY, "chat-short-b": State.HEALTHY})

        hang(a, "hang")
        diag, took = await until(source, {"chat-short-a": State.ENGINE_UNRESPONSIVE,
                                          "chat-short-b": State.HEALTHY})
        record_timing("idle engine hung -> EngineUnresponsive", took, tier="wrapper+prometheus+diagnose",
                      scrape_interval_s=1, idle_probe_after_s=2, idle_probe_timeout_s=1, idle_probe_failures=2)
        assert a.health() == 200
        pool = diag.pools["short"]
        assert pool.state is State.ENGINE_UNRESPONSIVE and pool.available == 1
        decision = decide(diag, None, SETTINGS, {})
        assert [d.pod for d in decision.deletions] == ["chat-short-a"]
        assert [e.reason for e in decision.events if e.reason.startswith("Restarted")] == ["RestartedUnresponsivePod"]
        assert decision.status.pools is not None and decision.status.pools.short is not None
        assert decision.status.pools.short.diagnosis == constants.REASON_ENGINE_UNRESPONSIVE
        assert decision.status.pools.short.restart_budget.used == 1

        hang(a, "none")
        await until(source, {"chat-short-a": State.HEALTHY, "chat-short-b": State.HEALTHY})
