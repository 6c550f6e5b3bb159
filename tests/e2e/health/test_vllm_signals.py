"""The health loop's metric signals against a REAL vLLM on CPU scraped by a real Prometheus.

One engine (the session's plain engine, tests/support/plain_engine.py), labelled with the label contract through a
file_sd target, under traffic from a thread. The loop's own `read_metrics -> diagnose` must see: fresh samples and
vLLM's own KV cache size (`vllm:cache_config_info`), every finished request ending at max_tokens as
RunawayGeneration (vLLM's real `finished_reason="length"`), and an engine core frozen with SIGSTOP while requests
run as Stalled — `/health` stays 200 meanwhile, which is why nothing but the operator catches it. Detection times
are logged.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tests.support import vllm_cpu
from tests.support.health_harness import record_timing
from tests.support.plain_engine import FUSE, MODEL, SharedEngine
from tests.support.prometheus import Prometheus, Target, running_prometheus
from vllm_operator.api.remediation import HealthSettings
from vllm_operator.health.diagnose import Diagnosis, State, diagnose
from vllm_operator.health.snapshot import PoolFacts, Snapshot, format_time, pod_facts
from vllm_operator.health.source import PrometheusSource, read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("venv_vllm_pinned")]  # vLLM from .venv-vllm
NS, DEP, POD = "e2e", "tiny", "tiny-short-0"
SETTINGS = HealthSettings(interval_s=1, stall_s=4, window_s=10, min_finished=5)
SCRAPE_INTERVAL_S = 1


@pytest.fixture(scope="module")
def engine(plain_engine: SharedEngine) -> vllm_cpu.VllmServer:
    return plain_engine.get()


@pytest.fixture(scope="module")
def prom(engine: vllm_cpu.VllmServer) -> Iterator[Prometheus]:
    with running_prometheus(scrape_interval=f"{SCRAPE_INTERVAL_S}s") as p:
        p.set_targets([Target(f"{engine.host}:{engine.port}",
                              {"namespace": NS, "vllmdeployment": DEP, "pool": "short", "pod": POD})])
        yield p


class Traffic:
    """Two client threads sending completions that always end at max_tokens (ignore_eos)."""

    def __init__(self, engine: vllm_cpu.VllmServer) -> None:
        self.url = engine.url
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]

    def _run(self) -> None:
        body = json.dumps({"model": MODEL, "prompt": "hello there", "max_tokens": FUSE, "ignore_eos": True}).encode()
        while not self.stop.is_set():
            req = urllib.request.Request(f"{self.url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=120).read()
            except OSError:
                # An engine that stopped answering must not get a busy loop in this process: it held the GIL
                # against the health check's own Prometheus queries, which then timed out too.
                self.stop.wait(0.5)

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=150)


def pod() -> dict[str, object]:
    now = time.time()
    return {"metadata": {"name": POD, "uid": "u", "namespace": NS, "labels": {"vllm-operator.dev/pool": "short"}},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "engine", "ready": True, "restartCount": 0,
                                              "state": {"running": {"startedAt": format_time(now - 3600)}}}]}}


async def check(source: PrometheusSource) -> Diagnosis:
    metrics = await read_metrics(source, NS, DEP, SETTINGS)
    snap = Snapshot(namespace=NS, deployment=DEP, taken_at=time.time(), pools={"short": PoolFacts("short", 1)},
                    pods=(pod_facts(pod()),), metrics=metrics)
    return diagnose(snap, SETTINGS)


async def until(source: PrometheusSource, engine: vllm_cpu.VllmServer, predicate: object, timeout: float = 90.0,
                ) -> tuple[Diagnosis, float]:
    """Check until `predicate` holds; an engine that exited meanwhile fails at once, with its log."""
    started = time.monotonic()
    last: Diagnosis | None = None
    while time.monotonic() - started < timeout:
        if engine.returncode() is not None:
            raise AssertionError(f"the engine exited with {engine.returncode()}: {engine.log_tail()}")
        last = await check(source)
        if predicate(last):  # type: ignore[operator]
            return last, time.monotonic() - started
        await asyncio.sleep(0.5)
    pool = last.pools["short"] if last else None
    raise AssertionError(f"not reached in {timeout}s: {pool.state if pool else None} {pool.message if pool else ''}")


async def test_real_engine_signals(engine: vllm_cpu.VllmServer, prom: Prometheus) -> None:
    source = PrometheusSource(prom.url)
    with Traffic(engine):
        diag, _ = await until(source, engine, lambda d: d.metrics_available and d.pools["short"].pods[0].metrics_fresh)
        info = next(line for line in engine.metrics_text().splitlines() if line.startswith("vllm:cache_config_info{"))
        tokens = vllm_cpu.metric_labels(info)["kv_cache_size_tokens"]
        assert diag.pools["short"].observed_kv_tokens == int(tokens)

        _, took = await until(source, engine, lambda d: State.RUNAWAY_GENERATION in d.pools["short"].states)
        record_timing("RunawayGeneration (real vLLM, every request ends at max_tokens)", took, tier="real vLLM CPU",
                      window_s=SETTINGS.window_s)

        core, frozen = vllm_cpu.stop_engine_core_mid_step(engine.metrics_text, engine.engine_core_pid,
                                                          what="the engine")
        try:
            diag, took = await until(source, engine, lambda d: d.pools["short"].pods[0].state is State.STALLED)
            stalled_after = time.monotonic() - frozen
            record_timing("Stalled (real vLLM, engine core SIGSTOP)", took, tier="real vLLM CPU",
                          stall_s=SETTINGS.stall_s)
            assert engine.health_status() == 200, "a frozen engine core still answers /health: only the loop sees it"
            assert "requests running" in diag.pools["short"].pods[0].message
        finally:
            os.kill(core, signal.SIGCONT)
        _, took = await until(source, engine, lambda d: d.pools["short"].pods[0].state is State.HEALTHY)
        record_timing("Stalled -> Healthy after SIGCONT (real vLLM)", took, tier="real vLLM CPU")
        # Not before the stall window: Prometheus's increase() over [stall_s] is 0 once the window has slid past the
        # last scrape that still saw the counter move, and that scrape may precede the stop by up to one scrape
        # interval, so the earliest correct diagnosis is stall_s - SCRAPE_INTERVAL_S after it (CI saw 3.4 s of 4).
        assert stalled_after >= SETTINGS.stall_s - SCRAPE_INTERVAL_S, stalled_after
