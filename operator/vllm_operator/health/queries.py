"""PromQL the health loop and the alerts use, per VLLMDeployment and pool, through the label contract.

Scraped engine series carry `namespace`, `pod`, `vllmdeployment` and `pool` (PodMonitor relabelings; the tests'
Prometheus puts the same labels on file_sd targets). vLLM names its metrics `vllm:foo`, but depending on the
client and Prometheus versions the stored name can be `vllm_foo` (OpenMetrics escaping), so every engine series is
selected by `__name__=~"vllm[:_]foo"` and works with either spelling. Windows are parameters: seconds in tests,
minutes in production.
"""

from __future__ import annotations

from dataclasses import dataclass

RUNNING = "num_requests_running"
GENERATION_TOKENS = "generation_tokens_total"
KV_USAGE = "kv_cache_usage_perc"
PREEMPTIONS = "num_preemptions_total"
REQUEST_SUCCESS = "request_success_total"
CACHE_CONFIG_INFO = "cache_config_info"

BY_POD = "pod, pool"
"""Every per-pod query keeps these labels (and nothing else that could split a pod in two)."""


def metric_name(metric: str) -> str:
    """A `__name__` matcher for a vLLM metric in either spelling."""
    return f'__name__=~"vllm[:_]{metric}"'


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def selector(metric: str, namespace: str, deployment: str, **labels: str) -> str:
    """`{__name__=~"vllm[:_]metric", namespace="ns", vllmdeployment="d", ...}`."""
    parts = [metric_name(metric), f"namespace={_quote(namespace)}", f"vllmdeployment={_quote(deployment)}"]
    parts += [f"{k}={_quote(v)}" for k, v in sorted(labels.items())]
    return "{" + ", ".join(parts) + "}"


def duration(seconds: float) -> str:
    """A PromQL range, whole seconds (at least 1s)."""
    return f"{max(1, round(seconds))}s"


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


def for_deployment(namespace: str, deployment: str, *, stall_s: float, window_s: float) -> DeploymentQueries:
    def sel(metric: str, **labels: str) -> str:
        return selector(metric, namespace, deployment, **labels)

    stall, window = duration(stall_s), duration(window_s)
    up = "up{" + f"namespace={_quote(namespace)}, vllmdeployment={_quote(deployment)}" + "}"
    return DeploymentQueries(
        up=f"max by ({BY_POD}) ({up})",
        last_sample=f"max by ({BY_POD}) (timestamp({sel(GENERATION_TOKENS)}))",
        running=f"max by ({BY_POD}) ({sel(RUNNING)})",
        running_min=f"min by ({BY_POD}) (min_over_time({sel(RUNNING)}[{stall}]))",
        generated=f"sum by ({BY_POD}) (increase({sel(GENERATION_TOKENS)}[{stall}]))",
        samples=f"max by ({BY_POD}) (count_over_time({sel(GENERATION_TOKENS)}[{stall}]))",
        kv_usage=f"max by ({BY_POD}) ({sel(KV_USAGE)})",
        kv_usage_avg=f"max by ({BY_POD}) (avg_over_time({sel(KV_USAGE)}[{window}]))",
        preemptions=f"sum by ({BY_POD}) (increase({sel(PREEMPTIONS)}[{window}]))",
        kv_tokens=f"max by ({BY_POD}, kv_cache_size_tokens) ({sel(CACHE_CONFIG_INFO)})",
        finished=f"sum by (pool) (increase({sel(REQUEST_SUCCESS)}[{window}]))",
        finished_length=f"sum by (pool) (increase({sel(REQUEST_SUCCESS, finished_reason='length')}[{window}]))",
    )
