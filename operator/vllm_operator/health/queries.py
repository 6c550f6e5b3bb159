"""PromQL the health loop and the alerts use, per VLLMDeployment and pool, through the label contract.

Scraped engine series carry `namespace`, `pod`, `vllmdeployment` and `pool` (PodMonitor relabelings; the tests'
Prometheus puts the same labels on file_sd targets). vLLM names its metrics `vllm:foo`, but depending on the
client and Prometheus versions the stored name can be `vllm_foo` (OpenMetrics escaping), so every engine series is
selected by `__name__=~"vllm[:_]foo"` and works with either spelling. Windows are parameters: seconds in tests,
minutes in production.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_operator import constants
from vllm_operator.constants import (
    METRIC_CACHE_CONFIG_INFO,
    METRIC_GENERATION_TOKENS,
    METRIC_KV_USAGE,
    METRIC_PREEMPTIONS,
    METRIC_REQUEST_SUCCESS,
    METRIC_RUNNING,
)

BY_POD = "pod, pool"
"""Every per-pod query keeps these labels (and nothing else that could split a pod in two)."""


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def selector(metric: str, namespace: str, deployment: str, **labels: str) -> str:
    """`{__name__=~"vllm[:_]metric", namespace="ns", vllmdeployment="d", ...}`."""
    parts = [constants.metric_name(metric), f"namespace={_quote(namespace)}", f"vllmdeployment={_quote(deployment)}"]
    parts += [f"{k}={_quote(v)}" for k, v in sorted(labels.items())]
    return "{" + ", ".join(parts) + "}"


def duration(seconds: float) -> str:
    """A PromQL range, whole seconds (at least 1s)."""
    return f"{max(1, round(seconds))}s"


def wrapper_selector(metric: str, namespace: str, deployment: str) -> str:
    """`vllm_operator_engine_…{namespace="ns", vllmdeployment="d"}`: the engine wrapper's own series (start-up
    phases, scraped from its `status` port) have plain names, no `vllm:`."""
    return metric + "{" + f"namespace={_quote(namespace)}, vllmdeployment={_quote(deployment)}" + "}"


@dataclass(frozen=True)
class DeploymentQueries:
    """The instant queries of one health check; each returns one series per pod (or per pool)."""

    up: str
    last_sample: str
    running: str
    running_min: str
    generated: str
    samples: str
    kv_usage: str
    kv_usage_avg: str
    preemptions: str
    kv_tokens: str
    finished: str
    finished_length: str
    startup_phase: str
    """One series per pod with the `phase` label of the phase its start is in (value 1)."""
    startup_sample: str
    """Sample time of the wrapper's series: how fresh the start-up facts are."""
    startup_since: str
    startup_last_progress: str
    startup_stalled: str
    startup_limit: str
    startup_download: str
    startup_download_total: str
    startup_kv_tokens: str
    process_start: str
    adapters_loaded: str
    """One series per pod and adapter: 1 loaded by the engine wrapper, 0 listed but not (pending or failed)."""


def for_deployment(namespace: str, deployment: str, *, stall_s: float, window_s: float) -> DeploymentQueries:
    def sel(metric: str, **labels: str) -> str:
        return selector(metric, namespace, deployment, **labels)

    def wrapped(metric: str) -> str:
        return wrapper_selector(metric, namespace, deployment)

    stall, window = duration(stall_s), duration(window_s)
    up = "up{" + f"namespace={_quote(namespace)}, vllmdeployment={_quote(deployment)}" + "}"
    return DeploymentQueries(
        up=f"min by ({BY_POD}) ({up})",  # every endpoint of the pod (vLLM's and the wrapper's) answered
        last_sample=f"max by ({BY_POD}) (timestamp({sel(METRIC_GENERATION_TOKENS)}))",
        running=f"max by ({BY_POD}) ({sel(METRIC_RUNNING)})",
        running_min=f"min by ({BY_POD}) (min_over_time({sel(METRIC_RUNNING)}[{stall}]))",
        generated=f"sum by ({BY_POD}) (increase({sel(METRIC_GENERATION_TOKENS)}[{stall}]))",
        samples=f"max by ({BY_POD}) (count_over_time({sel(METRIC_GENERATION_TOKENS)}[{stall}]))",
        kv_usage=f"max by ({BY_POD}) ({sel(METRIC_KV_USAGE)})",
        kv_usage_avg=f"max by ({BY_POD}) (avg_over_time({sel(METRIC_KV_USAGE)}[{window}]))",
        preemptions=f"sum by ({BY_POD}) (increase({sel(METRIC_PREEMPTIONS)}[{window}]))",
        kv_tokens=f"max by ({BY_POD}, kv_cache_size_tokens) ({sel(METRIC_CACHE_CONFIG_INFO)})",
        finished=f"sum by (pool) (increase({sel(METRIC_REQUEST_SUCCESS)}[{window}]))",
        finished_length=f"sum by (pool) (increase({sel(METRIC_REQUEST_SUCCESS, finished_reason='length')}[{window}]))",
        startup_phase=f"max by ({BY_POD}, phase) ({wrapped(constants.METRIC_STARTUP_PHASE)} == 1)",
        startup_sample=f"max by ({BY_POD}) (timestamp({wrapped(constants.METRIC_STARTUP_PHASE_SINCE)}))",
        startup_since=f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_PHASE_SINCE)})",
        startup_last_progress=f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_LAST_PROGRESS)})",
        startup_stalled=f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_STALLED)})",
        startup_limit=f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_LIMIT)})",
        startup_download=f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_DOWNLOAD)})",
        startup_download_total=f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_DOWNLOAD_TOTAL)})",
        startup_kv_tokens=f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_KV_TOKENS)})",
        process_start=f"max by ({BY_POD}) ({wrapped(constants.METRIC_PROCESS_START)})",
        adapters_loaded=f"max by ({BY_POD}, adapter) ({wrapped(constants.METRIC_ADAPTER_LOADED)})",
    )
