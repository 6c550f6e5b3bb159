"""PromQL the health loop and the alerts use, per VLLMDeployment and pool, through the label contract.

Scraped engine series carry `namespace`, `pod`, `vllmdeployment` and `pool` (PodMonitor relabelings; the tests'
Prometheus puts the same labels on file_sd targets); selectors, quoting and ranges are `api.signals`' (the alert
rules use the same). Windows are parameters: seconds in tests, minutes in production.
"""

from __future__ import annotations

from vllm_operator import constants
from vllm_operator.api.signals import Signals, duration
from vllm_operator.constants import (
    METRIC_CACHE_CONFIG_INFO,
    METRIC_GENERATION_TOKENS,
    METRIC_KV_USAGE,
    METRIC_PREEMPTIONS,
    METRIC_RUNNING,
)

BY_POD = "pod, pool"
"""Every per-pod query keeps these labels (and nothing else that could split a pod in two)."""


def for_deployment(namespace: str, deployment: str, *, stall_s: float, window_s: float) -> dict[str, str]:
    """The instant queries of one check, by name; each returns one series per pod (or per pool). The signals the
    alert rules threshold too (up, running_min, generated, kv_usage_avg, finished, finished_length, unresponsive)
    come from `api.signals`, the one definition both read."""
    signals = Signals(namespace, deployment, BY_POD)
    sel, wrapped = signals.vllm, signals.plain
    stall, window = duration(stall_s), duration(window_s)
    return {
        "up": signals.up(),
        "last_sample": f"max by ({BY_POD}) (timestamp({sel(METRIC_GENERATION_TOKENS)}))",
        "running": f"max by ({BY_POD}) ({sel(METRIC_RUNNING)})",
        "running_min": signals.running_min(stall_s),
        "generated": signals.generated(stall_s),
        "samples": f"max by ({BY_POD}) (count_over_time({sel(METRIC_GENERATION_TOKENS)}[{stall}]))",
        "kv_usage": f"max by ({BY_POD}) ({sel(METRIC_KV_USAGE)})",
        "kv_usage_avg": signals.kv_usage_avg(window_s),
        "preemptions": f"sum by ({BY_POD}) (increase({sel(METRIC_PREEMPTIONS)}[{window}]))",
        "kv_tokens": f"max by ({BY_POD}, kv_cache_size_tokens) ({sel(METRIC_CACHE_CONFIG_INFO)})",
        "finished": Signals(namespace, deployment, "pool").finished(window_s),
        "finished_length": Signals(namespace, deployment, "pool").finished(window_s, "length"),
        # one series per pod, with the `phase` label of the phase its start is in (value 1)
        "startup_phase": f"max by ({BY_POD}, phase) ({wrapped(constants.METRIC_STARTUP_PHASE)} == 1)",
        # the sample time of the wrapper's series: how fresh the start-up facts are
        "startup_sample": f"max by ({BY_POD}) (timestamp({wrapped(constants.METRIC_STARTUP_PHASE_SINCE)}))",
        "startup_since": f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_PHASE_SINCE)})",
        "startup_last_progress": f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_LAST_PROGRESS)})",
        "startup_stalled": f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_STALLED)})",
        "startup_limit": f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_LIMIT)})",
        # the weights cache fetch's own counts and ETA (engine/fetch.py); absent for a download vLLM makes itself
        "startup_download": f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_DOWNLOAD)})",
        "startup_download_total": f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_DOWNLOAD_TOTAL)})",
        "startup_download_files": f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_DOWNLOAD_FILES)})",
        "startup_download_total_files":
            f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_DOWNLOAD_TOTAL_FILES)})",
        "startup_download_eta": f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_DOWNLOAD_ETA)})",
        "startup_kv_tokens": f"max by ({BY_POD}) ({wrapped(constants.METRIC_STARTUP_KV_TOKENS)})",
        "process_start": f"max by ({BY_POD}) ({wrapped(constants.METRIC_PROCESS_START)})",
        # one series per pod and adapter: 1 loaded by the engine wrapper, 0 listed but not (pending or failed)
        "adapters_loaded": f"max by ({BY_POD}, adapter) ({wrapped(constants.METRIC_ADAPTER_LOADED)})",
        # 1 per pod whose wrapper's idle-engine probes keep failing (EngineUnresponsive)
        "unresponsive": signals.unresponsive(),
    }
