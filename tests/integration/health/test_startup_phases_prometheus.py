"""Start-up phases through a real Prometheus: the engine wrapper's status endpoint (`engine.status.serve`, the code
that runs in the pod) is scraped, and the health loop's reading half (`source.read_metrics` -> `diagnose` ->
`decide`) must report where the start is — phase, since when, progress — and a start stuck in one phase as
StartupStalled, from the wrapper's series and the label contract alone."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import pytest

from testcluster import binaries
from tests.support.health_harness import DEPLOYMENT, NAMESPACE, pod_json
from tests.support.net import free_port
from tests.support.prometheus import Prometheus, Target, running_prometheus
from vllm_operator.api.remediation import HealthSettings
from vllm_operator.engine import phases, status
from vllm_operator.health.diagnose import Diagnosis, State, diagnose
from vllm_operator.health.policy import decide
from vllm_operator.health.snapshot import PoolFacts, Snapshot, pod_facts
from vllm_operator.health.source import PrometheusSource, read_metrics

pytestmark = pytest.mark.integration
SETTINGS = HealthSettings(interval_s=1, stall_s=3, window_s=6)
POD = "chat-short-a"


@pytest.fixture
def prom() -> Iterator[Prometheus]:
    with running_prometheus(executable=str(binaries.prometheus())) as p:
        yield p


@contextlib.contextmanager
def scraped(prom: Prometheus, monitor: status.Monitor) -> Iterator[PrometheusSource]:
    """`monitor` served on its status port, as the engine pod's, scraped by `prom`; the health loop's source."""
    server = status.serve(monitor, "127.0.0.1", free_port())
    try:
        prom.set_targets([Target(f"127.0.0.1:{server.server_address[1]}", {
            "namespace": NAMESPACE, "vllmdeployment": DEPLOYMENT, "pod": POD, "pool": "short",
            "component": "engine"})])
        yield PrometheusSource(prom.url)
    finally:
        server.shutdown()
        server.server_close()


async def check(source: PrometheusSource) -> Diagnosis:
    metrics = await read_metrics(source, NAMESPACE, DEPLOYMENT, SETTINGS)
    pods = (pod_facts(pod_json(POD, "short", ready=False, started_ago=30)),)
    snap = Snapshot(namespace=NAMESPACE, deployment=DEPLOYMENT, taken_at=time.time(),
                    pools={"short": PoolFacts("short", 1)}, pods=pods, metrics=metrics)
    return diagnose(snap, SETTINGS)


async def until(source: PrometheusSource, predicate: object, timeout: float = 40.0) -> Diagnosis:
    started = time.monotonic()
    last = None
    while time.monotonic() - started < timeout:
        last = await check(source)
        if predicate(last):  # type: ignore[operator]
            return last
        await asyncio.sleep(0.5)
    raise AssertionError(f"not reached within {timeout}s: {last.pools['short'].message if last else None}")


async def test_phase_since_and_progress_then_a_stuck_phase(prom: Prometheus) -> None:
    monitor = status.Monitor(phases.Tracker(started_at=time.time(), limits={
        **phases.DEFAULT_LIMITS_S, phases.Phase.PROFILING_MEMORY: 4.0}))
    with scraped(prom, monitor) as source:
        monitor.feed("(Worker pid=3) INFO [cpu_model_runner.py:68] Starting to load model /models/m...")
        monitor.feed("Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:03<00:03,  3.10s/it]")
        diag = await until(source, lambda d: d.pools["short"].startup is not None
                           and d.pools["short"].startup.phase == "LoadingWeights")
        pool = diag.pools["short"]
        assert pool.state is State.STARTING and pool.startup_pod == POD
        assert "phase LoadingWeights for" in pool.message and "limit 1200s" in pool.message
        entry = decide(diag, None, SETTINGS, {}).status.pools
        assert entry is not None and entry.short is not None and entry.short.startup_phase == "LoadingWeights"
        assert entry.short.startup_phase_since is not None

        monitor.feed("(Worker pid=3) INFO [cpu_worker.py:260] Explicitly set (0.06/23.54) GiB for KV cache on node 0.")
        for _ in range(60):  # the wrapper's watchdog: check the limit as the wrapper does, every 0.2 s
            if monitor.check():
                break
            await asyncio.sleep(0.2)
        diag = await until(source, lambda d: d.pools["short"].state is State.STARTUP_STALLED)
        pool = diag.pools["short"]
        assert pool.startup is not None and pool.startup.phase == "ProfilingMemory" and pool.startup.stalled
        decision = decide(diag, None, SETTINGS, {})
        degraded = next(c for c in decision.status.conditions if c.type == "Degraded")
        assert degraded.status.value == "True" and degraded.reason == "StartupStalled"
        assert "start stuck in phase ProfilingMemory" in degraded.message
        assert decision.deletions == []


async def test_a_weights_fetchs_counts_and_eta_reach_pool_status(prom: Prometheus) -> None:
    """The fetch-weights init container's status port (the monitor `engine/fetch.py` serves, phase Downloading)
    scraped by Prometheus: files done of total, bytes and the ETA become `startupProgress` and `startupDownload`."""
    monitor = status.Monitor(phases.Tracker(started_at=time.time(), phase=phases.Phase.DOWNLOADING))
    monitor.observe_download(0, total=100 << 20, files=(0, 4))
    with scraped(prom, monitor) as source:
        monitor.observe_download(60 << 20, total=100 << 20, files=(2, 4), eta_s=3600.0)

        def counted(d: Diagnosis) -> bool:
            start = d.pools["short"].startup
            return start is not None and start.download is not None and start.download.files_done == 2

        diag = await until(source, counted)
        pool = diag.pools["short"]
        assert pool.state is State.STARTING and pool.startup is not None
        assert "60.0 MiB of 100.0 MiB downloaded, 2 of 4 files, ETA " in pool.startup.progress
        entry = decide(diag, None, SETTINGS, {}).status.pools
        assert entry is not None and entry.short is not None and entry.short.startup_download is not None
        got = entry.short.startup_download
        assert (got.bytes_done, got.bytes_total, got.files_done, got.files_total) == (60 << 20, 100 << 20, 2, 4)
        assert got.eta_seconds is not None and 3000 < got.eta_seconds <= 3600, "counted down from the sample"
