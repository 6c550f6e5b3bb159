"""The health loop's reading half against a real Prometheus scraping fake vLLM engines under traffic.

Faults are injected through the engines (a stuck engine core, runaway lengths, a full KV cache), Prometheus
scrapes every second, and the loop's own code (`source.read_metrics` -> `diagnose` -> `decide`) must name the
fault — and must not delete anything while Prometheus or a scrape target is away. Fault-to-detection times are
logged (and appended as JSON lines to $HEALTH_TIMINGS when set); they are measurements, not assertions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import web

from testcluster import binaries
from tests.support.health_harness import DEPLOYMENT, NAMESPACE, Engine, engines, pod_json, record_timing
from tests.support.net import free_port
from tests.support.prometheus import Prometheus, Target, running_prometheus
from vllm_operator import constants
from vllm_operator.api.remediation import HealthSettings
from vllm_operator.health.diagnose import Diagnosis, State, diagnose
from vllm_operator.health.policy import LadderView, decide
from vllm_operator.health.snapshot import PoolFacts, Snapshot, pod_facts
from vllm_operator.health.source import PrometheusSource, read_metrics

pytestmark = pytest.mark.integration

SETTINGS = HealthSettings(interval_s=1, stall_s=3, window_s=6, min_finished=5)
PODS = [("chat-short-a", "short"), ("chat-short-b", "short"), ("chat-long-a", "long")]


def record(kind: str, seconds: float) -> None:
    record_timing(kind, seconds, tier="prometheus+diagnose", scrape_interval_s=1, stall_s=SETTINGS.stall_s,
                  window_s=SETTINGS.window_s, check_every_s=0.5)


@pytest.fixture
def prom() -> Iterator[Prometheus]:
    with running_prometheus(executable=str(binaries.prometheus())) as p:
        yield p


@pytest.fixture
async def fleet(prom: Prometheus) -> AsyncIterator[list[Engine]]:
    async with engines(PODS, prom) as started:
        yield started


async def check(source: PrometheusSource, settings: HealthSettings = SETTINGS) -> Diagnosis:
    metrics = await read_metrics(source, NAMESPACE, DEPLOYMENT, settings)
    pods = tuple(pod_facts(pod_json(name, pool)) for name, pool in PODS)
    snap = Snapshot(namespace=NAMESPACE, deployment=DEPLOYMENT, taken_at=time.time(),
                    pools={"short": PoolFacts("short", 2), "long": PoolFacts("long", 1)}, pods=pods, metrics=metrics)
    return diagnose(snap, settings)


def pod_state(diag: Diagnosis, pod: str) -> State:
    return next(p.state for pool in diag.pools.values() for p in pool.pods if p.pod == pod)


async def until(source: PrometheusSource, predicate: object, timeout: float = 40.0) -> tuple[Diagnosis, float]:
    """Check every 0.5 s until predicate(diagnosis); returns it and the seconds it took."""
    started = time.monotonic()
    last: Diagnosis | None = None
    while time.monotonic() - started < timeout:
        last = await check(source)
        if predicate(last):  # type: ignore[operator]
            return last, time.monotonic() - started
        await asyncio.sleep(0.5)
    states = {p.pod: (p.state.value, p.message) for pool in (last.pools.values() if last else []) for p in pool.pods}
    raise AssertionError(f"not reached within {timeout}s; last pod states {states}; "
                         f"metrics {last.metrics_reason if last else None}")


def all_healthy(diag: Diagnosis) -> bool:
    return diag.metrics_available and all(pod_state(diag, pod) is State.HEALTHY for pod, _ in PODS)


async def test_stalled_engine_is_detected_and_only_it_is_deleted(prom: Prometheus, fleet: list[Engine]) -> None:
    source = PrometheusSource(prom.url)
    await until(source, all_healthy)
    fleet[0].fake.configure(stall=True)
    diag, took = await until(source, lambda d: pod_state(d, "chat-short-a") is State.STALLED)
    record("Stalled", took)
    decision = decide(diag, None, SETTINGS, {})
    assert [d.pod for d in decision.deletions] == ["chat-short-a"]
    assert pod_state(diag, "chat-short-b") is State.HEALTHY and pod_state(diag, "chat-long-a") is State.HEALTHY
    fleet[0].fake.configure(stall=False)
    _, recovered = await until(source, lambda d: pod_state(d, "chat-short-a") is State.HEALTHY)
    record("Stalled->Healthy after unstall", recovered)


async def test_nothing_destructive_while_prometheus_is_down(prom: Prometheus, fleet: list[Engine]) -> None:
    source = PrometheusSource(prom.url, timeout=2)
    await until(source, all_healthy)
    fleet[0].fake.configure(stall=True)
    await until(source, lambda d: pod_state(d, "chat-short-a") is State.STALLED)
    prom.stop()
    started = time.monotonic()
    diag = await check(source)
    record("PrometheusDown->MetricsUnavailable", time.monotonic() - started)
    assert not diag.metrics_available and diag.metrics_reason == "PrometheusUnreachable"
    assert diag.pools["short"].state is State.METRICS_UNAVAILABLE
    decision = decide(diag, None, SETTINGS, {"short": LadderView(next_memory=(1, "x"))})
    assert decision.deletions == [] and decision.rung_changes == []
    metrics_cond = next(c for c in decision.status.conditions if c.type == constants.COND_METRICS_AVAILABLE)
    assert metrics_cond.status.value == "False" and "Prometheus query failed" in metrics_cond.message
    prom.start()
    _, took = await until(source, lambda d: pod_state(d, "chat-short-a") is State.STALLED)
    record("PrometheusBack->Stalled again", took)


async def test_scrape_target_down_is_not_stalled(prom: Prometheus, fleet: list[Engine]) -> None:
    source = PrometheusSource(prom.url)
    await until(source, all_healthy)
    fleet[1].fake.configure(stall=True)
    await until(source, lambda d: pod_state(d, "chat-short-b") is State.STALLED)
    # The pod stops answering scrapes: its target now points at a port nobody listens on.
    prom.set_targets([e.target() if e is not fleet[1] else Target(f"127.0.0.1:{free_port()}", e.target().labels)
                      for e in fleet])
    diag, took = await until(source, lambda d: pod_state(d, "chat-short-b") is State.METRICS_UNAVAILABLE)
    record("TargetDown->MetricsUnavailable", took)
    assert decide(diag, None, SETTINGS, {}).deletions == []
    assert diag.metrics_reason == "TargetsDown"


async def test_runaway_generation_on_the_long_pool(prom: Prometheus, fleet: list[Engine]) -> None:
    source = PrometheusSource(prom.url)
    await until(source, all_healthy)
    fleet[2].fake.configure(natural_tokens=200)  # every request now ends at its max_tokens (8): finish "length"
    diag, took = await until(source, lambda d: State.RUNAWAY_GENERATION in d.pools["long"].states)
    record("RunawayGeneration", took)
    assert State.RUNAWAY_GENERATION not in diag.pools["short"].states
    decision = decide(diag, None, SETTINGS, {})
    runaway = next(c for c in decision.status.conditions if c.type == constants.COND_RUNAWAY)
    assert runaway.status.value == "True" and "pool long" in runaway.message
    assert decision.deletions == [] and decision.rung_changes == []


async def test_kv_pressure_and_observed_kv_tokens(prom: Prometheus, fleet: list[Engine]) -> None:
    source = PrometheusSource(prom.url)
    diag, _ = await until(source, all_healthy)
    assert diag.pools["short"].observed_kv_tokens == 32768
    fleet[2].fake.set_metric("vllm:kv_cache_usage_perc", 0.99)
    diag, took = await until(source, lambda d: State.KV_PRESSURE in d.pools["long"].states)
    record("KVPressure", took)
    decision = decide(diag, None, SETTINGS, {})
    assert decision.deletions == []
    assert any(e.reason == "KVPressureTrue" for e in decision.events)


async def _underscore_exporter(engine: Engine) -> web.AppRunner:
    """Serves the engine's /metrics with `vllm_` names, as Prometheus stores them after OpenMetrics escaping."""
    async def metrics(_: web.Request) -> web.Response:
        text = "\n".join(engine.fake._metric_lines()) + "\n"
        return web.Response(text=text.replace("vllm:", "vllm_"), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner


async def test_queries_accept_the_underscore_spelling(prom: Prometheus, fleet: list[Engine]) -> None:
    runner = await _underscore_exporter(fleet[0])
    try:
        port = runner.addresses[0][1]
        prom.set_targets([Target(f"127.0.0.1:{port}", fleet[0].target().labels),
                          *(e.target() for e in fleet[1:])])
        source = PrometheusSource(prom.url)
        await until(source, all_healthy)
        assert prom.query('count({__name__="vllm_generation_tokens_total", pod="chat-short-a"})')
        fleet[0].fake.configure(stall=True)
        await until(source, lambda d: pod_state(d, "chat-short-a") is State.STALLED)
    finally:
        await runner.cleanup()
