"""The health loop's only network code: Prometheus through prometheus-api-client, pods through a `Lister`.

Both readers sit behind small interfaces (`MetricsSource`, `Lister`: a KubeApi or the operator's watch cache) passed
in by the caller, so there is no module-level client and tests can point them at a real Prometheus and the test
control plane. Every failure to read metrics becomes `MetricsSnapshot.error` — a fact for the diagnosis ("Prometheus
unreachable"), never an exception that would make the loop guess — and every metric fact keeps its sample time so
staleness is visible downstream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from vllm_operator import constants, names
from vllm_operator.api.remediation import HealthSettings
from vllm_operator.health import queries
from vllm_operator.health.snapshot import (
    MetricsSnapshot,
    PodFacts,
    PodMetrics,
    PoolFacts,
    PoolMetrics,
    Snapshot,
    pod_facts,
)
from vllm_operator.k8s import DEPLOYMENTS, PDBS, PODS, Resource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    """One series of an instant-query result."""

    labels: Mapping[str, str]
    value: float
    at: float
    """Evaluation time Prometheus reported."""


class MetricsError(Exception):
    """Prometheus could not be asked, or answered with an error."""


class Lister(Protocol):
    """Where pods, Deployments and PDBs are read: a KubeApi, or the operator's watch cache
    (`handlers.watched.WatchedChildren`), which answers the same LISTs from memory."""

    async def list(self, res: Resource, namespace: str | None, label_selector: str | None = None
                   ) -> list[dict[str, Any]]: ...


class MetricsSource(Protocol):
    async def query(self, promql: str) -> list[Sample]:
        """Instant query; raises MetricsError."""
        ...


class PrometheusSource:
    """MetricsSource on prometheus-api-client (synchronous requests, run in a worker thread).

    No retries: a Prometheus that does not answer within `timeout` is reported as unavailable for this check, and
    the next check asks again.
    """

    def __init__(self, url: str, *, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self._timeout = timeout
        self._client = PrometheusConnect(url=self.url, disable_ssl=True, retry=Retry(total=0), timeout=timeout)

    def _query(self, promql: str) -> list[Sample]:
        try:
            raw = self._client.custom_query(promql)
        except Exception as err:  # requests' connection errors, PrometheusApiClientException, bad JSON
            raise MetricsError(f"{type(err).__name__}: {str(err)[:300]}") from err
        out = []
        for item in raw or []:
            try:
                at, value = item["value"]
                out.append(Sample(labels=dict(item.get("metric", {})), value=float(value), at=float(at)))
            except (KeyError, TypeError, ValueError) as err:
                raise MetricsError(f"unreadable result for {promql}: {item!r}") from err
        return out

    async def query(self, promql: str) -> list[Sample]:
        return await asyncio.to_thread(self._query, promql)


def _by_pod(samples: list[Sample]) -> dict[str, Sample]:
    return {s.labels["pod"]: s for s in samples if "pod" in s.labels}


async def read_metrics(source: MetricsSource, namespace: str, deployment: str, settings: HealthSettings,
                       ) -> MetricsSnapshot:
    """Ask Prometheus every per-pod and per-pool question of one check (concurrently)."""
    qs = queries.for_deployment(namespace, deployment, stall_s=settings.stall_s, window_s=settings.window_s)
    started = time.time()
    try:
        results = await asyncio.gather(*(source.query(promql) for promql in qs.values()))
    except MetricsError as err:
        log.warning("Could not read metrics of VLLMDeployment %s/%s: %s", namespace, deployment, err)
        return MetricsSnapshot(fetched_at=started, error=str(err))
    r = dict(zip(qs, results, strict=True))
    pods: dict[str, dict[str, Any]] = {}
    pools: dict[str, str] = {}
    renamed = {"last_sample": "last_sample_at", "startup_sample": "startup_sample_at",
               "startup_limit": "startup_limit_s", "startup_download": "startup_download_bytes",
               "startup_download_total": "startup_download_total_bytes",
               "startup_download_eta": "startup_download_eta_s"}
    for key, samples in r.items():
        if key in ("finished", "finished_length", "adapters_loaded"):
            continue  # per pool, or per pod and adapter: read below
        for pod, sample in _by_pod(samples).items():
            pools[pod] = sample.labels.get("pool", pools.get(pod, ""))
            entry = pods.setdefault(pod, {})
            if key == "up":
                entry["up"] = sample.value >= 1
            elif key == "samples":
                entry["samples"] = int(sample.value)
            elif key == "startup_phase":
                entry["startup_phase"] = sample.labels.get("phase") or None
            elif key in ("startup_stalled", "unresponsive"):
                entry[key] = sample.value >= 1
            elif key in ("startup_kv_tokens", "startup_download_files", "startup_download_total_files"):
                entry[key] = int(sample.value)
            elif key == "kv_tokens":
                tokens = sample.labels.get("kv_cache_size_tokens", "")
                if tokens.isdigit():
                    entry["kv_cache_tokens"] = int(tokens)
            else:
                entry[renamed.get(key, key)] = sample.value
    for sample in r["adapters_loaded"]:
        pod, adapter = sample.labels.get("pod", ""), sample.labels.get("adapter", "")
        if pod and adapter:
            entry = pods.setdefault(pod, {})
            entry["adapters"] = tuple(sorted((*entry.get("adapters", ()), (adapter, sample.value >= 1))))
            pools.setdefault(pod, sample.labels.get("pool", ""))
    pod_metrics = {pod: PodMetrics(pod=pod, pool=pools.get(pod, ""), **values) for pod, values in pods.items()}
    finished = {s.labels.get("pool", ""): s.value for s in r["finished"]}
    length = {s.labels.get("pool", ""): s.value for s in r["finished_length"]}
    pool_metrics = {p: PoolMetrics(finished=finished[p], finished_length=length.get(p, 0.0)) for p in finished}
    return MetricsSnapshot(fetched_at=started, pods=pod_metrics, pools=pool_metrics)


def engine_selector(deployment: str) -> str:
    return (f"{constants.LABEL_NAME}={constants.APP_NAME},{constants.LABEL_DEPLOYMENT}={deployment},"
            f"{constants.LABEL_COMPONENT}={constants.COMPONENT_ENGINE}")


async def read_pods(kube: Lister, namespace: str, deployment: str) -> tuple[PodFacts, ...]:
    pods = await kube.list(PODS, namespace, engine_selector(deployment))
    return tuple(sorted((pod_facts(p) for p in pods), key=lambda f: f.name))


async def read_pools(kube: Lister, namespace: str, deployment: str, enabled: Mapping[str, int]
                     ) -> dict[str, PoolFacts]:
    """Desired replicas from each pool's Deployment (the plan's count when absent) and maxUnavailable from its
    PodDisruptionBudget (1, the rendered value, when absent or given as a percentage).

    Two LISTs by the children's labels, whatever the number of pools: a GET per pool and kind made this four of
    the six requests of every check; with 500 VLLMDeployments on a 30 s interval the checks alone kept the API
    client's threads busy and new VLLMDeployments waited behind them (benchmarks/scale)."""
    selector = f"{constants.LABEL_NAME}={constants.APP_NAME},{constants.LABEL_DEPLOYMENT}={names.dns_label(deployment)}"
    deployments, pdbs = await asyncio.gather(kube.list(DEPLOYMENTS, namespace, selector),
                                             kube.list(PDBS, namespace, selector))
    by_name = {(kind, o.get("metadata", {}).get("name")): o
               for kind, items in (("deployment", deployments), ("pdb", pdbs)) for o in items}
    out: dict[str, PoolFacts] = {}
    for pool, planned in enabled.items():
        name = names.pool(deployment, pool)
        dep, pdb = by_name.get(("deployment", name)), by_name.get(("pdb", name))
        replicas = planned
        if dep is not None and isinstance(dep.get("spec", {}).get("replicas"), int):
            replicas = int(dep["spec"]["replicas"])
        max_unavailable = 1
        raw = (pdb or {}).get("spec", {}).get("maxUnavailable")
        if isinstance(raw, int):
            max_unavailable = raw
        out[pool] = PoolFacts(name=pool, desired_replicas=replicas, max_unavailable=max_unavailable)
    return out


async def take_snapshot(kube: Lister, source: MetricsSource | None, namespace: str, deployment: str,
                        settings: HealthSettings, enabled_pools: Mapping[str, int]) -> Snapshot:
    """Pods and pools from the API, series from Prometheus (None when no Prometheus is configured)."""
    taken = time.time()
    pods_task = read_pods(kube, namespace, deployment)
    pools_task = read_pools(kube, namespace, deployment, enabled_pools)
    metrics = await read_metrics(source, namespace, deployment, settings) if source is not None else None
    pods, pools = await asyncio.gather(pods_task, pools_task)
    return Snapshot(namespace=namespace, deployment=deployment, taken_at=taken, pools=pools, pods=pods,
                    metrics=metrics)
